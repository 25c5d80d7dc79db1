"""Training data held in device memory (`config.data.placement='device'`).

The training split of a shard folder is read once, packed without padding (frames and caption
tokens flat, with offsets) and put on every device; each step's batch is gathered there by a
jitted function from the step's video indices, so an epoch costs its steps and no host input
pipeline runs during training. Evaluation reads the shards as `ShardData` does.

Epoch `e` visits the training videos in the order `numpy.random.default_rng([seed, e])`
permutes them, in consecutive batches of the global batch size, the last padded with masked
videos; resuming at a step replays exactly the batches of an uninterrupted run. This is another
order than the `tf.data` stream's (`pipeline.train_iterator`), with the same batch contract,
steps per epoch and query slots. Each device holds the whole split (TVR's training features
are about 14 GB in float32); the host holds it twice while it is packed.
"""

import dataclasses
import functools
import logging
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
import numpy as np

from prvr_jax import parallel
from prvr_jax.data import pipeline
from prvr_jax.data import protocol

_log = logging.getLogger(__name__)


def pack_split(shards: pipeline.ShardDataset, split: str) -> dict[str, np.ndarray]:
  """The split's records packed into flat arrays, rows in video order (`video_order`).

  Returns `clips [N, Lc, Dv]`, `frames [F, Dv]` with `frame_start`, `num_frames` `[N]`;
  `tokens [T, Dq]` with `token_start`, `num_tokens` `[C]` (captions of a video contiguous);
  `caption_start`, `num_captions` `[N]`. Offsets are int32 (row counts below 2**31).
  """
  s = shards.split(split)
  records: list[dict[str, np.ndarray] | None] = [None] * s.num_videos
  for record in pipeline.split_records(shards, split):
    order = int(record['video_order'])
    if not 0 <= order < s.num_videos or records[order] is not None:
      raise ValueError(f'split {split!r} of {shards.manifest_path}: a record holds video order '
                       f'{order}, outside [0, {s.num_videos}) or twice')
    records[order] = record
  missing = [i for i, r in enumerate(records) if r is None]
  if missing:
    raise ValueError(f'split {split!r} of {shards.manifest_path}: {len(missing)} of '
                     f'{s.num_videos} videos have no record (first: video order {missing[0]})')
  num_frames = np.array([len(r['frame_feats']) for r in records], np.int64)
  lengths = [r['query_mask'].sum(axis=1).astype(np.int64) for r in records]
  num_captions = np.array([len(x) for x in lengths], np.int64)
  num_tokens = np.concatenate(lengths)
  for name, counts in (('frames', num_frames), ('caption tokens', num_tokens)):
    if counts.sum() >= 2**31:
      raise ValueError(f'split {split!r} of {shards.manifest_path} holds {counts.sum()} '
                       f'{name}, more than int32 offsets address')
  tokens = np.concatenate([q[:n] for r, ls in zip(records, lengths)
                           for q, n in zip(r['query_feats'], ls)])
  starts = lambda counts: (np.cumsum(counts) - counts).astype(np.int32)
  return {
      'clips': np.stack([r['clip_feats'] for r in records]),
      'frames': np.concatenate([r['frame_feats'] for r in records]),
      'frame_start': starts(num_frames), 'num_frames': num_frames.astype(np.int32),
      'tokens': tokens, 'token_start': starts(num_tokens),
      'num_tokens': num_tokens.astype(np.int32),
      'caption_start': starts(num_captions), 'num_captions': num_captions.astype(np.int32),
  }


def gather_batch(packed: dict[str, jax.Array], videos: jax.Array, *, max_frames: int,
                 max_query_len: int, num_slots: int) -> dict[str, jax.Array]:
  """The training batch (batch contract, docs/design.md) of `videos [B]` (rows of `packed`,
  -1 = padding): frames padded to `max_frames`, the videos' captions in video order in
  `num_slots` query slots of `max_query_len` tokens, the rest masked."""
  valid = videos >= 0
  v = jnp.maximum(videos, 0)

  def rows(start, count, length):
    """`[n, length]` rows start + t, t < count (clamped in range), and the float mask."""
    t = jnp.arange(length)[None]
    mask = t < count[:, None]
    return start[:, None] + jnp.minimum(t, jnp.maximum(count[:, None] - 1, 0)), mask

  num_frames = jnp.where(valid, packed['num_frames'][v], 0)
  frame_rows, frame_mask = rows(packed['frame_start'][v], num_frames, max_frames)
  frame_feats = jnp.where(frame_mask[..., None], packed['frames'][frame_rows], 0)
  clip_feats = jnp.where(valid[:, None, None], packed['clips'][v], 0)

  num_captions = jnp.where(valid, packed['num_captions'][v], 0)
  ends = jnp.cumsum(num_captions)
  slots = jnp.arange(num_slots)
  query_valid = slots < ends[-1]
  owner = jnp.minimum(jnp.searchsorted(ends, slots, side='right'), videos.shape[0] - 1)
  caption = packed['caption_start'][v[owner]] + slots - (ends[owner] - num_captions[owner])
  caption = jnp.where(query_valid, caption, 0)
  num_tokens = jnp.where(query_valid, packed['num_tokens'][caption], 0)
  token_rows, query_mask = rows(packed['token_start'][caption], num_tokens, max_query_len)
  return {
      'clip_feats': clip_feats,
      'frame_feats': frame_feats,
      'frame_mask': frame_mask.astype(jnp.float32),
      'video_valid': valid,
      'query_feats': jnp.where(query_mask[..., None], packed['tokens'][token_rows], 0),
      'query_mask': query_mask.astype(jnp.float32),
      'query_valid': query_valid,
      'query_video': jnp.where(query_valid, owner, 0).astype(jnp.int32),
  }


def epoch_order(num_videos: int, seed: int, epoch: int, batch_size: int) -> np.ndarray:
  """`[steps, batch_size]` video rows of epoch `epoch`: a permutation seeded by
  `(seed, epoch)`, the last batch padded with -1."""
  order = np.random.default_rng([seed, epoch]).permutation(num_videos)
  steps = -(-num_videos // batch_size)
  return np.concatenate([order, np.full(steps * batch_size - num_videos, -1)]).reshape(
      steps, batch_size).astype(np.int32)


@dataclasses.dataclass
class DeviceShardData(protocol.ShardData):
  """`ShardData` whose training split lives in device memory (module docstring)."""

  _packed: dict[str, jax.Array] | None = dataclasses.field(default=None, init=False, repr=False)
  _num_captions: np.ndarray | None = dataclasses.field(default=None, init=False, repr=False)

  @property
  def steps_per_epoch(self) -> int:
    return pipeline.steps_per_epoch(self.shards.split(self.batching.split('train')),
                                    self.batching.batch_size)

  def _num_slots(self) -> int:
    split = self.shards.split(self.batching.split('train'))
    return self.max_queries_per_batch or split.max_queries(self.batching.batch_size)

  def _device_split(self, mesh: Mesh) -> dict[str, jax.Array]:
    if self._packed is None:
      name = self.batching.split('train')
      packed = pack_split(self.shards, name)
      _log.info('training split %r on every device: %.1f MB', name,
                sum(x.nbytes for x in packed.values()) / 2**20)
      self._packed = parallel.replicate(packed, mesh)
      self._num_captions = packed['num_captions']
    return self._packed

  def train_batches(self, start_step: int, mesh: Mesh) -> Iterator[dict[str, jax.Array]]:
    packed = self._device_split(mesh)
    batch_size = self.batching.batch_size
    slots = self._num_slots()
    # Rows a multiple of the device count, as `parallel.shard_global_view` pads them.
    video_rows, slot_rows = (parallel.round_up(n, mesh.size) for n in (batch_size, slots))
    counts = self._num_captions
    gather = jax.jit(functools.partial(
        gather_batch, max_frames=self.shards.max_frames,
        max_query_len=self.shards.max_query_len, num_slots=slot_rows),
        out_shardings=parallel.sharded(mesh))
    spe = self.steps_per_epoch
    epoch, skip = divmod(start_step, spe)
    while True:
      order = epoch_order(len(counts), self.batching.seed, epoch, batch_size)
      for videos in order[skip:]:
        captions = int(counts[videos[videos >= 0]].sum())
        if captions > slots:
          raise ValueError(
              f'a training batch has {captions} captions, more than config.data.'
              f'max_queries_per_batch={slots}; raise it, or set it to 0 (automatic: enough '
              'for any batch). Captions are never dropped.')
        rows = parallel.pad_rows(videos, video_rows, value=-1)
        yield gather(packed, parallel.replicate(rows, mesh))
      epoch, skip = epoch + 1, 0

