"""Caption tokens beside a feature release's shards (`config.data.query_tokens`): the
evaluation splits of a CLIP feature release with each query's caption, from the release's
`TextData/<collection><split>.caption.txt`, tokenised for CLIP's text tower (`tokens [Q, C]`,
as `prvr_jax.clip.Tokenizer` writes them), beside the released sentence vectors. For models
that run CLIP's text tower on a release (zero-shot CLIP); evaluation only.
"""

import dataclasses
from collections.abc import Callable, Iterator
import os
from typing import Any

import jax
from jax.sharding import Mesh
import numpy as np

from prvr_jax.data import protocol
from prvr_jax.data import release
from prvr_jax.eval.splits import QUERY_KEY, EvalSplit
from prvr_jax.files import short

TOKENS = 'tokens'


@dataclasses.dataclass
class CaptionTokenData(protocol.RunData):
  """`inner`'s data, its evaluation query batches with `tokens` of their captions.

  Attributes:
    inner: the release's prepared shards (`protocol.ShardData`).
    release_dir: the release folder (`config.data.dir`), holding the caption files.
    collection: `config.data.collection`.
    tokenize: captions -> `[N, context_length]` int32 token rows.
  """
  inner: protocol.RunData
  release_dir: str
  collection: str
  tokenize: Callable[[list[str]], np.ndarray]

  @property
  def dir(self) -> str:
    return self.inner.dir

  @property
  def batching(self) -> protocol.Batching:
    return self.inner.batching

  def identity(self) -> dict[str, Any]:
    return {**self.inner.identity(), 'query_tokens': True}

  @property
  def steps_per_epoch(self) -> int:
    return self.inner.steps_per_epoch

  def train_batches(self, start_step: int, mesh: Mesh) -> Iterator[dict[str, jax.Array]]:
    raise ValueError('config.data.query_tokens tokenises the captions of evaluation splits '
                     'only: set config.data.query_tokens=False to train')

  def moments(self, split: str) -> dict[str, np.ndarray]:
    return self.inner.moments(split)

  def caption_file(self, split: str) -> str:
    """The release's caption file of `split` ('val' / 'test' or a split name)."""
    collection_dir, collection = release._resolve_collection(  # pylint: disable=protected-access
        self.release_dir, self.collection)
    return os.path.join(collection_dir, 'TextData',
                        f'{collection}{self.batching.split(split)}.caption.txt')

  def eval_split(self, split: str) -> EvalSplit:
    """`inner`'s split; every query batch also holds `tokens [Q, C]` (zeros at padding)."""
    inner = self.inner.eval_split(split)
    path = self.caption_file(split)
    if not os.path.isfile(path):
      raise FileNotFoundError(f'config.data.query_tokens: no caption file {path} for split '
                              f'{split!r} in config.data.dir={self.release_dir}')
    text = dict(release.read_captions(path))
    missing = [c for c in inner.caption_ids if c not in text]
    if missing:
      raise release.DataError(f'{len(missing)} captions of the prepared split {split!r} are '
                              f'not in {path} (first: {short(missing[:3])})')
    tokens = np.asarray(self.tokenize([text[c] for c in inner.caption_ids]), np.int32)

    def query_batches():
      for batch in inner.query_batches():
        rows = np.asarray(batch[QUERY_KEY])
        rows_tokens = np.where((rows >= 0)[:, None], tokens[np.maximum(rows, 0)], 0)
        yield {**batch, TOKENS: rows_tokens.astype(np.int32)}

    return dataclasses.replace(inner, query_batches=query_batches)
