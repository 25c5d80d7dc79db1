"""A run's data as annotations plus frame folders (`config.data.source='frames'`): models that
train a CLIP backbone end to end (T-MASS) read pixels and tokens instead of feature shards.

  config.data.collection    'msrvtt' | 'didemo' | 'lsmdc' (the annotation reader)
  config.data.annotations   the annotation folder (`prvr_jax.data.text_video.read_split`)
  config.data.frames_dir    `<frames_dir>/<video_id>/*.jpg`
  config.data.clip_vocab    the CLIP BPE vocabulary ('' = `clip.default_vocab_path()`)

Training batches are (video, caption) pairs, one per caption, shuffled every epoch (the
official items); batch row i is caption i with its own video. Evaluation encodes each video
of a split once and every caption once (`EvalSplit`), so it ranks like every other model.
"""

import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
from jax.sharding import Mesh
import numpy as np

from prvr_jax import clip
from prvr_jax import parallel
from prvr_jax.data import text_video

SPLITS = ('train', 'val', 'test')


@dataclasses.dataclass
class FrameData:
  """The splits of a text-video dataset, its frame folders and its tokenizer.

  Attributes:
    dir: the frame folder (named in messages, like a shard folder's `dir`).
    splits: our split name ('train', 'val', 'test') -> its annotations.
    tokenize: captions -> `[N, context_length]` int32 CLIP tokens.
    annotations: the annotation folder.
    image_size: the backbone's input side (frames are resized and cropped to it).
  """
  dir: str
  splits: dict[str, text_video.TextVideoSplit]
  tokenize: Callable[[list[str]], np.ndarray]
  annotations: str
  image_size: int

  def identity(self) -> dict[str, Any]:
    """What a checkpoint records of its data (compared when a run resumes)."""
    return {'source': 'frames', 'frames_dir': os.path.abspath(self.dir),
            'annotations': os.path.abspath(self.annotations),
            'splits': {name: {'dataset': s.dataset, 'official_split': s.name,
                              'videos': len(s.video_ids), 'captions': len(s.captions)}
                       for name, s in self.splits.items()}}

  def split(self, name: str) -> text_video.TextVideoSplit:
    if name not in self.splits:
      raise ValueError(f'no split {name!r} in {self.annotations}; it has {sorted(self.splits)}')
    return self.splits[name]


def open_frame_data(config: Any) -> FrameData:
  """The `FrameData` of `config.data`, with the tokenizer of `config.model.backbone`."""
  data = config.data
  for flag in ('annotations', 'frames_dir'):
    if not data.get(flag):
      raise ValueError(f'config.data.source=frames needs --config.data.{flag}')
  if not os.path.isdir(data.frames_dir):
    raise FileNotFoundError(f'config.data.frames_dir={data.frames_dir} does not exist')
  tokenizer = clip.Tokenizer(data.get('clip_vocab') or None)
  backbone = clip.backbone_config(config.model.backbone)
  names = {name: data.get(f'{name}_split', name) for name in SPLITS}
  official = {name: text_video.DEFAULT_SPLITS.get(split, split) for name, split in names.items()}
  splits = text_video.read_splits(data.collection, data.annotations, official)
  return FrameData(data.frames_dir, splits,
                   lambda texts: tokenizer(texts, context_length=backbone.context_length),
                   data.annotations, backbone.image_size)


def steps_per_epoch(config: Any, data: FrameData) -> int:
  """ceil(training pairs / global batch)."""
  return -(-len(data.split('train').captions) // config.train.batch_size)


def train_batches(config: Any, data: FrameData, start_step: int, mesh: Mesh
                  ) -> Iterator[dict[str, jax.Array]]:
  """Global training batches from global step `start_step` on (earlier batches are read and
  dropped: resuming re-reads their frames), every host reading the whole stream."""
  batches = text_video.frame_dataset(
      data.split('train'), data.dir, tokenize=data.tokenize, batch_size=config.train.batch_size,
      num_frames=config.model.num_frames, train_augment=True, shuffle=True,
      seed=config.train.seed, num_epochs=None, size=data.image_size)
  return global_pair_batches(({'frames': b['frames'], 'tokens': b['tokens'], 'valid': b['valid']}
                              for b in batches), start_step, mesh)


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


def eval_streams(config: Any, data: FrameData, split: str
                 ) -> tuple[Callable[[], Iterator[dict[str, np.ndarray]]],
                            Callable[[], Iterator[dict[str, np.ndarray]]], list[str], list[str]]:
  """(video_batches, query_batches, video_ids, caption_ids) of `split` ('val' / 'test') for an
  `eval.EvalSplit`: every video once, every caption once."""
  s = data.split(split)
  # One pair per video (its first caption) yields each video's frames once, in split order.
  first = {}
  for caption in s.captions:
    first.setdefault(caption[1], caption)
  videos = dataclasses.replace(s, captions=[first[v] for v in s.video_ids])
  caption_video = s.caption_video_index().astype(np.int64)
  tokens = data.tokenize([text for _, _, text in s.captions])

  def video_batches():
    for batch in text_video.frame_dataset(videos, data.dir, tokenize=data.tokenize,
                                          batch_size=config.eval.video_batch_size,
                                          num_frames=config.model.num_frames,
                                          size=data.image_size):
      yield {'frames': batch['frames'],
             'video_index': np.where(batch['valid'], batch['video_index'], -1).astype(np.int64)}

  def query_batches():
    size = config.eval.query_batch_size
    for start in range(0, len(tokens), size):
      rows = np.arange(start, min(start + size, len(tokens)))
      yield {'tokens': tokens[rows], 'query_index': rows,
             'query_video_index': caption_video[rows]}

  return video_batches, query_batches, list(s.video_ids), s.caption_ids
