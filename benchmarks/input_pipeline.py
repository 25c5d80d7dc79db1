r"""Training input throughput, streamed and device-resident, next to one GMMFormer v2 step.

  python benchmarks/input_pipeline.py [--videos=512] [--batch=128] [--batches=24]
  python benchmarks/input_pipeline.py --step_batch=32   # a host too small for the 128 step

Generates a TVR-like shard set in a temporary folder (3072-d frame and 768-d token
features, 5 captions per video, 30-150 frames, through the real release -> prepare
path) and reports batches/s after a warm-up, per usable core too, of both ways a run can
feed its steps at the paper's batch (128 videos): the `tf.data` stream
(`pipeline.train_iterator`, `config.data.placement='stream'`) and the device-resident split
(`resident.DeviceShardData`, `config.data.placement='device'`: packing it into device memory,
then a jitted gather per batch). It then times one jitted training step of GMMFormer v2
(`configs/gmmformer_v2.py:tvr`, `prvr_jax.train.make_train_step`) on the first of those batches,
and prints step time / batch time: the input must not be the bottleneck (target: at least 3x).
The full-size step at 128 videos needs the host memory docs/benchmarks.md lists for it on CPU;
`--step_batch` times the step at a smaller batch instead and compares time per video (step and
input both scale about linearly with it).
"""

import dataclasses
import os
import tempfile
import time

from absl import app
from absl import flags
from ml_collections import config_flags
import numpy as np

from prvr_jax.data import pipeline
from prvr_jax.data import protocol
from prvr_jax.data import resident
from prvr_jax.data import synthetic

_VIDEOS = flags.DEFINE_integer('videos', 512, 'Training videos in the generated shard set.')
_BATCH = flags.DEFINE_integer('batch', 128, 'Videos per batch.')
_BATCHES = flags.DEFINE_integer('batches', 24, 'Timed batches (after --warmup).')
_WARMUP = flags.DEFINE_integer('warmup', 4, 'Untimed batches first.')
_STEPS = flags.DEFINE_integer('steps', 2, 'Timed training steps (0: skip the step).')
_STEP_BATCH = flags.DEFINE_integer('step_batch', None, 'Videos per timed step (default --batch).')
_CONFIG = config_flags.DEFINE_config_file('config', 'configs/gmmformer_v2.py:tvr',
                                          'Model config file[:variant].')

TVR_LIKE = dict(visual_dim=3072, query_dim=768, queries_per_video=(5, 5), frames=(30, 150),
                query_tokens=(8, 30))


def time_batches(batches, block=lambda batch: batch) -> float:
  """Seconds per batch of the iterator `batches` after `--warmup` (each `block`ed on)."""
  for _ in range(_WARMUP.value):
    block(next(batches))
  start = time.perf_counter()
  for _ in range(_BATCHES.value):
    block(next(batches))
  return (time.perf_counter() - start) / _BATCHES.value


def time_stream(shards: pipeline.ShardDataset, batch_size: int) -> float:
  """Seconds per batch of the `tf.data` training iterator."""
  return time_batches(pipeline.train_iterator(shards, global_batch_size=batch_size, seed=0,
                                              process_index=0, process_count=1))


def time_device(shards: pipeline.ShardDataset, batch_size: int) -> tuple[float, float]:
  """(seconds to pack the split into device memory, seconds per gathered batch)."""
  import jax  # pylint: disable=g-import-not-at-top
  from prvr_jax import parallel  # pylint: disable=g-import-not-at-top
  data = resident.DeviceShardData(shards=shards, batching=protocol.Batching(
      batch_size=batch_size, seed=0, video_batch_size=batch_size, query_batch_size=batch_size,
      split_names={'train': 'train'}))
  start = time.perf_counter()
  batches = data.train_batches(0, parallel.make_mesh())
  jax.block_until_ready(next(batches))  # packs, places and compiles the gather
  return time.perf_counter() - start, time_batches(batches, jax.block_until_ready)


def first_batch(shards: pipeline.ShardDataset, batch_size: int) -> dict[str, np.ndarray]:
  return next(pipeline.train_iterator(shards, global_batch_size=batch_size, seed=0,
                                      process_index=0, process_count=1))


def time_train_step(batch: dict[str, np.ndarray]) -> tuple[float, str]:
  """Median seconds of one jitted GMMFormer v2 training step on `batch`."""
  import jax  # pylint: disable=g-import-not-at-top
  from prvr_jax import parallel  # pylint: disable=g-import-not-at-top

  from prvr_jax import models, train  # pylint: disable=g-import-not-at-top

  config = _CONFIG.value
  config.train.batch_size = len(batch['video_valid'])
  mesh = parallel.make_mesh()
  spec = models.get_spec(config.model)
  tx, schedule = train.make_model_optimizer(config, spec, total_steps=1000)
  state = train.create_train_state(config, spec, tx, mesh)
  step = train.make_train_step(config, spec, tx, schedule, mesh)
  batch = parallel.global_batch(batch, mesh)
  epoch = np.int32(0)
  state, metrics = step(state, batch, epoch)  # compile + first run
  jax.block_until_ready(metrics)
  times = []
  for _ in range(_STEPS.value):
    start = time.perf_counter()
    state, metrics = step(state, batch, epoch)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  return float(np.median(times)), f'{jax.devices()[0].device_kind} x{jax.device_count()}'


def main(argv):
  del argv
  spec = dataclasses.replace(synthetic.SIZES['default'], num_videos=(_VIDEOS.value, 1, 1),
                             **TVR_LIKE)
  with tempfile.TemporaryDirectory() as tmp:
    start = time.perf_counter()
    shard_dir = synthetic.write_shards(spec, os.path.join(tmp, 'shards'))
    shards = pipeline.open_shards(shard_dir)
    split = shards.split('train')
    size = sum(s.bytes for s in split.shards) / 2**20
    print(f'generated {split.num_videos} videos / {split.num_captions} captions '
          f'({size:.0f} MiB of shards, Dv={shards.visual_dim}, Dq={shards.query_dim}) '
          f'in {time.perf_counter() - start:.0f} s')
    batch_s = time_stream(shards, _BATCH.value)
    pack_s, device_s = time_device(shards, _BATCH.value)
    step_batch = _STEP_BATCH.value or _BATCH.value
    batch = first_batch(shards, step_batch) if _STEPS.value else None
  cores = len(os.sched_getaffinity(0))
  captions = _BATCH.value * TVR_LIKE['queries_per_video'][0]
  print(f'streamed (tf.data): {1 / batch_s:.2f} batches/s, {1 / batch_s / cores:.2f} per core '
        f'({1000 * batch_s:.0f} ms/batch of {_BATCH.value} videos, {captions} captions), '
        f'{cores} usable cores')
  print(f'device-resident: {1 / device_s:.2f} batches/s ({1000 * device_s:.1f} ms/batch), '
        f'after {pack_s:.1f} s packing {size:.0f} MiB of shards into device memory')
  if not _STEPS.value:
    return
  step_s, device = time_train_step(batch)
  model = _CONFIG.value.model
  print(f'{model.name} train step (hidden {model.hidden_dim}, batch {step_batch}) on {device}: '
        f'{1000 * step_s:.0f} ms/step')
  ratio = (step_s / step_batch) / (batch_s / _BATCH.value)
  per = '' if step_batch == _BATCH.value else ' per video'
  print(f'step time / streamed batch time{per} = {ratio:.1f}x '
        f'({"OK" if ratio >= 3 else "BELOW"} the 3x target)')


if __name__ == '__main__':
  app.run(main)
