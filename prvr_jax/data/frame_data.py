"""A run's data as annotations plus frame folders (`config.data.source='frames'`): models that
train a CLIP backbone end to end (T-MASS) read pixels and tokens instead of feature shards.

`config.data.collection` ('msrvtt', 'didemo', 'lsmdc') and `annotations` name the annotation
reader and folder (`text_video.read_split`), `frames_dir` holds `<video_id>/*.jpg`,
`clip_vocab` the CLIP BPE vocabulary ('' = the default). Training batches are (video,
caption) pairs, one per caption, shuffled every epoch (the official items); evaluation
encodes each video once and every caption once, so it ranks like every other model.
"""

import dataclasses
import os
from collections.abc import Callable, Iterator
from typing import Any

import jax
from jax.sharding import Mesh
import numpy as np

from prvr_jax import clip
from prvr_jax.data import protocol
from prvr_jax.data import text_video
from prvr_jax.data import text_video_frames
from prvr_jax.eval.splits import EvalSplit


@dataclasses.dataclass
class FrameData(protocol.RunData):
  """The splits of a text-video dataset, its frame folders and its tokenizer."""
  dir: str  # the frame folder (named in messages, like a shard folder's `dir`)
  splits: dict[str, text_video.TextVideoSplit]  # our split name -> its annotations
  tokenize: Callable[[list[str]], np.ndarray]  # captions -> `[N, context_length]` int32
  annotations: str  # the annotation folder
  image_size: int  # the backbone's input side (frames are resized and cropped to it)
  num_frames: int  # frames sampled per video (`config.model.num_frames`)
  batching: protocol.Batching

  def identity(self) -> dict[str, Any]:
    return {'source': 'frames', 'frames_dir': os.path.abspath(self.dir),
            'annotations': os.path.abspath(self.annotations),
            'splits': {name: {'dataset': s.dataset, 'official_split': s.name,
                              'videos': len(s.video_ids), 'captions': len(s.captions)}
                       for name, s in self.splits.items()}}

  def split(self, name: str) -> text_video.TextVideoSplit:
    if name not in self.splits:
      raise ValueError(f'no split {name!r} in {self.annotations}; it has {sorted(self.splits)}')
    return self.splits[name]

  @property
  def steps_per_epoch(self) -> int:
    """ceil(training pairs / global batch)."""
    return text_video.pair_steps(len(self.split('train').captions), self.batching.batch_size)

  def train_batches(self, start_step: int, mesh: Mesh) -> Iterator[dict[str, jax.Array]]:
    """Earlier batches are read and dropped (resuming re-reads their frames); every host
    reads the whole stream."""
    batches = text_video_frames.frame_dataset(
        self.split('train'), self.dir, tokenize=self.tokenize,
        batch_size=self.batching.batch_size, num_frames=self.num_frames, train_augment=True,
        shuffle=True, seed=self.batching.seed, num_epochs=None, size=self.image_size)
    return protocol.global_pair_batches(
        ({'frames': b['frames'], 'tokens': b['tokens'], 'valid': b['valid']} for b in batches),
        start_step, mesh)

  def eval_split(self, split: str) -> EvalSplit:
    """`split` ('val' / 'test'): every video once, every caption once."""
    s = self.split(split)
    # One pair per video (its first caption) yields each video's frames once, in split order.
    first = {}
    for caption in s.captions:
      first.setdefault(caption[1], caption)
    videos = dataclasses.replace(s, captions=[first[v] for v in s.video_ids])
    caption_video = s.caption_video_index().astype(np.int64)
    tokens = self.tokenize([text for _, _, text in s.captions])

    def video_batches():
      for batch in text_video_frames.frame_dataset(videos, self.dir, tokenize=self.tokenize,
                                            batch_size=self.batching.video_batch_size,
                                            num_frames=self.num_frames, size=self.image_size):
        yield {'frames': batch['frames'],
               'video_index': np.where(batch['valid'], batch['video_index'], -1).astype(np.int64)}

    def query_batches():
      size = self.batching.query_batch_size
      for start in range(0, len(tokens), size):
        rows = np.arange(start, min(start + size, len(tokens)))
        yield {'tokens': tokens[rows], 'query_index': rows,
               'query_video_index': caption_video[rows]}

    return EvalSplit(video_batches, query_batches, list(s.video_ids), s.caption_ids)


def open_frame_data(config: Any, batching: protocol.Batching) -> FrameData:
  """The `FrameData` of `config.data`, with the tokenizer of `config.model.backbone`."""
  data = config.data
  for flag in ('annotations', 'frames_dir'):
    if not data.get(flag):
      raise ValueError(f'config.data.source=frames needs --config.data.{flag}')
  if not os.path.isdir(data.frames_dir):
    raise FileNotFoundError(f'config.data.frames_dir={data.frames_dir} does not exist')
  tokenizer = clip.Tokenizer(data.get('clip_vocab') or None)
  backbone = clip.backbone_config(config.model.backbone)
  official = {name: text_video.DEFAULT_SPLITS.get(split, split)
              for name, split in batching.split_names.items()}
  splits = text_video.read_splits(data.collection, data.annotations, official)
  return FrameData(data.frames_dir, splits,
                   lambda texts: tokenizer(texts, context_length=backbone.context_length),
                   data.annotations, backbone.image_size, int(config.model.num_frames), batching)
