"""The one protocol a run reads its data through, whatever the source (`RunData`).

  data = run_data.open_run_data(config, workdir)      # after run_data.prepare_run_data
  data.identity()                       # what a checkpoint records of its data
  data.steps_per_epoch                  # optimizer steps in one pass over the training items
  data.train_batches(start_step, mesh)  # global training batches from that step on
  data.eval_split('val')                # the evaluator's EvalSplit ('val', 'test' or a name)

Sources: `ShardData` (TFRecord shards of a feature release, one item per video),
`FeaturePairData` (shards for evaluation, (video, caption) pairs of a text-video feature
release for training) and `frame_data.FrameData` (annotations and frame folders). The batch
sizes and seed of `config.train` / `config.eval` are read once, into `Batching`.
"""

import abc
import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

import jax
from jax.sharding import Mesh
import numpy as np

from prvr_jax import parallel
from prvr_jax.data import pipeline
from prvr_jax.data import text_video
from prvr_jax.data import text_video_features
from prvr_jax.eval.splits import EvalSplit

ROLES = ('train', 'val', 'test')


@dataclasses.dataclass(frozen=True)
class Batching:
  """How a run batches its data: the one place `config.train.batch_size` is read.

  `batch_size` is the global training batch (videos for `ShardData`, pairs for pair sources),
  `seed` the training shuffle's, `video_batch_size` / `query_batch_size` the global evaluation
  batches; `split_names` maps 'train' / 'val' / 'test' to `config.data.{role}_split`.
  """
  batch_size: int
  seed: int
  video_batch_size: int
  query_batch_size: int
  split_names: dict[str, str]

  @classmethod
  def from_config(cls, config: Any) -> 'Batching':
    return cls(batch_size=int(config.train.batch_size), seed=int(config.train.seed),
               video_batch_size=int(config.eval.video_batch_size),
               query_batch_size=int(config.eval.query_batch_size),
               split_names={role: config.data.get(f'{role}_split', role) for role in ROLES})

  def split(self, name: str) -> str:
    """The source's name of split `name` ('train' / 'val' / 'test', or already a name)."""
    return self.split_names.get(name, name)


class RunData(abc.ABC):
  """What training and evaluation read, whatever the source.

  Attributes:
    dir: the folder the data lies in (named in messages).
    batching: batch sizes, seed and split names (`Batching`).
  """
  dir: str
  batching: Batching

  @abc.abstractmethod
  def identity(self) -> dict[str, Any]:
    """What the data is, independent of where it lies (recorded in checkpoints, compared on
    resume and evaluation)."""

  @property
  @abc.abstractmethod
  def steps_per_epoch(self) -> int:
    """Global training batches in one epoch."""

  @abc.abstractmethod
  def train_batches(self, start_step: int, mesh: Mesh) -> Iterator[dict[str, jax.Array]]:
    """Global training batches (sharded on `data`, the batch contract of docs/design.md) from
    global step `start_step` on; resuming at a step yields what an uninterrupted run would."""

  @abc.abstractmethod
  def eval_split(self, split: str) -> EvalSplit:
    """Split `split` ('val', 'test' or a split name of the source) as the evaluator reads it:
    every host reads every batch (global view) and feeds its block."""

  @property
  def max_captions_per_video(self) -> int | None:
    """The most captions of one training video in one batch row (None: one per row)."""
    return None

  def moments(self, split: str) -> dict[str, np.ndarray]:
    """{'spans': [Nq, 2], 'durations': [Nq]} of `split` where the source annotates moments
    (in `EvalSplit.caption_ids` order), else {}."""
    del split
    return {}


def global_pair_batches(pairs: Iterable[dict[str, np.ndarray]], start_step: int, mesh: Mesh
                        ) -> Iterator[dict[str, jax.Array]]:
  """(video, caption) pair batches in the batch contract, from step `start_step` on (earlier
  ones are read and dropped), sharded on `mesh`.

  `pairs` yields the model's inputs plus `valid [B]`; row i is caption i with its own video.
  """
  for step, batch in enumerate(pairs):
    if step < start_step:
      continue
    valid = batch.pop('valid')
    rows = np.arange(len(valid), dtype=np.int32)
    yield parallel.shard_global_view(
        {**batch, 'query_video': rows, 'query_valid': valid, 'video_valid': valid}, mesh)


@dataclasses.dataclass
class ShardData(RunData):
  """TFRecord shards (`pipeline.ShardDataset`), one training item per video.

  `shuffle_buffer`, `max_queries_per_batch` (0: enough for any batch) and
  `host_sharded_reading` are `config.data`'s: with the latter each host reads its own shard
  files (the batches then depend on the host count), else every host reads the single-host
  stream and feeds its block.
  """
  shards: pipeline.ShardDataset
  batching: Batching
  shuffle_buffer: int = 1024
  max_queries_per_batch: int = 0
  host_sharded_reading: bool = False

  @property
  def dir(self) -> str:
    return self.shards.dir

  def identity(self) -> dict[str, Any]:
    return self.shards.identity()

  @property
  def _readers(self) -> int:
    return jax.process_count() if self.host_sharded_reading else 1

  @property
  def steps_per_epoch(self) -> int:
    """ceil(#train videos / global batch), the official t_total per epoch (with host-sharded
    reading: of the busiest host)."""
    return pipeline.steps_per_epoch(self.shards.split(self.batching.split('train')),
                                    self.batching.batch_size, self._readers)

  @property
  def max_captions_per_video(self) -> int | None:
    return self.shards.split(self.batching.split('train')).max_captions_per_video

  def train_batches(self, start_step: int, mesh: Mesh) -> Iterator[dict[str, jax.Array]]:
    common = dict(global_batch_size=self.batching.batch_size, seed=self.batching.seed,
                  start_step=start_step, shuffle_buffer=self.shuffle_buffer)
    split = self.batching.split('train')
    slots = self.max_queries_per_batch
    if self.host_sharded_reading:
      it = pipeline.train_iterator(self.shards, split, max_queries_per_batch=slots, **common)
      return (parallel.global_batch(b, mesh) for b in it)
    it = pipeline.train_iterator(self.shards, split, process_index=0, process_count=1,
                                 max_queries_per_batch=slots * jax.process_count(), **common)
    return (parallel.shard_global_view(b, mesh) for b in it)

  def eval_split(self, split: str) -> EvalSplit:
    """`split` of the shard folder, videos in the official evaluation chunks."""
    name = self.batching.split(split)
    index = pipeline.eval_index(self.shards, name)
    hosts = dict(process_index=0, process_count=1)
    return EvalSplit(
        video_batches=lambda: pipeline.eval_videos(
            self.shards, name, global_batch_size=self.batching.video_batch_size, **hosts),
        query_batches=lambda: pipeline.eval_queries(
            self.shards, name, global_batch_size=self.batching.query_batch_size, **hosts),
        video_ids=index.video_ids, caption_ids=index.caption_ids,
        moment_ratio=index.moment_ratio)

  def moments(self, split: str) -> dict[str, np.ndarray]:
    index = pipeline.eval_index(self.shards, self.batching.split(split))
    return dict(spans=index.spans, durations=index.durations) if index.has_spans else {}


@dataclasses.dataclass
class FeaturePairData(ShardData):
  """T-MASS on a text-video feature release (`config.data.train_pairs=True`): evaluation
  reads the shards, training reads (video, caption) pairs of the release, one per caption and
  shuffled every epoch, as the official text-video loaders do.

  Attributes:
    release_dir, collection: the feature release (`text_video_features.feature_pairs`).
  """
  release_dir: str = ''
  collection: str = ''

  @property
  def steps_per_epoch(self) -> int:
    """ceil(#train captions / global batch)."""
    return text_video.pair_steps(self.shards.split(self.batching.split('train')).num_captions,
                                 self.batching.batch_size)

  def train_batches(self, start_step: int, mesh: Mesh) -> Iterator[dict[str, jax.Array]]:
    pairs = text_video_features.feature_pairs(
        self.release_dir, self.collection, self.batching.split('train'),
        batch_size=self.batching.batch_size, shuffle=True, seed=self.batching.seed,
        num_epochs=None)
    return global_pair_batches(
        ({'clip_feats': b['video_feats'], 'query_feats': b['text_feats'][:, None],
          'valid': b['valid']} for b in pairs), start_step, mesh)
