"""Training batches of a run: steps per epoch and the global, sharded batch stream."""

from collections.abc import Iterator

import jax
from jax.sharding import Mesh
import ml_collections

from prvr_jax import parallel
from prvr_jax.data import frame_data
from prvr_jax.data import pipeline
from prvr_jax.data import text_video


def steps_per_epoch(config: ml_collections.ConfigDict,
                    shards: pipeline.ShardDataset | frame_data.FrameData) -> int:
  """ceil(#train videos / global batch), the official t_total per epoch (with host-sharded
  reading: of the busiest host); for frame data, ceil(#train pairs / global batch)."""
  if isinstance(shards, frame_data.FrameData):
    return frame_data.steps_per_epoch(config, shards)
  if config.data.get('train_pairs'):
    return -(-shards.split(config.data.train_split).num_captions // config.train.batch_size)
  readers = jax.process_count() if config.data.host_sharded_reading else 1
  return pipeline.steps_per_epoch(shards.split(config.data.train_split),
                                  config.train.batch_size, readers)


def check_matching_bound(config: ml_collections.ConfigDict,
                         shards: pipeline.ShardDataset | frame_data.FrameData) -> None:
  """Raises where `loss.om_solver='device'` would meet a training video with more captions
  than `model.num_clips` (the device solver matches at most that many queries per video)."""
  if (config.loss.get('om_solver', 'host') != 'device' or not config.loss.get('om', 0)
      or isinstance(shards, frame_data.FrameData)):
    return
  split = shards.split(config.data.train_split)
  if split.max_captions_per_video > config.model.num_clips:
    raise ValueError(
        f'--config.loss.om_solver=device matches at most config.model.num_clips='
        f'{config.model.num_clips} captions per video, but a video of split {split.name!r} of '
        f'{shards.dir} has {split.max_captions_per_video}. Use --config.loss.om_solver=host.')


def train_batches(config: ml_collections.ConfigDict,
                  shards: pipeline.ShardDataset | frame_data.FrameData,
                  start_step: int, mesh: Mesh) -> Iterator[dict[str, jax.Array]]:
  """Global training batches (sharded on `data`) from global step `start_step` on.

  By default every process reads the single-host batch stream and feeds its block of rows,
  so the global batches (and their layout) are the same for any number of devices and
  hosts. `config.data.host_sharded_reading=True` instead has each host read its own shard
  files (less I/O on large pods; the batches then depend on the host count).
  `config.data.max_queries_per_batch` counts query slots per host. Frame data: see
  `frame_data.train_batches`. `config.data.train_pairs=True` (T-MASS on a text-video feature
  release, `config.data.dir` its release folder) trains on (video, caption) pairs instead, one
  per caption and shuffled every epoch, as the official text-video loaders do.
  """
  if isinstance(shards, frame_data.FrameData):
    return frame_data.train_batches(config, shards, start_step, mesh)
  if config.data.get('train_pairs'):
    return _feature_pairs(config, start_step, mesh)
  common = dict(global_batch_size=config.train.batch_size, seed=config.train.seed,
                start_step=start_step, shuffle_buffer=config.data.shuffle_buffer)
  slots = config.data.max_queries_per_batch
  if config.data.host_sharded_reading:
    it = pipeline.train_iterator(shards, config.data.train_split,
                                 max_queries_per_batch=slots, **common)
    return (parallel.global_batch(b, mesh) for b in it)
  it = pipeline.train_iterator(shards, config.data.train_split, process_index=0,
                               process_count=1, max_queries_per_batch=slots * jax.process_count(),
                               **common)
  return (parallel.shard_global_view(b, mesh) for b in it)


def _feature_pairs(config: ml_collections.ConfigDict, start_step: int, mesh: Mesh
                   ) -> Iterator[dict[str, jax.Array]]:
  """Pair batches of a feature release (`text_video.feature_pairs`) in the batch contract."""
  pairs = text_video.feature_pairs(config.data.dir, config.data.collection,
                                   config.data.train_split, batch_size=config.train.batch_size,
                                   shuffle=True, seed=config.train.seed, num_epochs=None)
  return frame_data.global_pair_batches(
      ({'clip_feats': b['video_feats'], 'query_feats': b['text_feats'][:, None],
        'valid': b['valid']} for b in pairs), start_step, mesh)
