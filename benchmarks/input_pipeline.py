r"""Training input pipeline throughput next to one GMMFormer v2 training step.

  python benchmarks/input_pipeline.py [--videos=512] [--batch=128] [--batches=24]

Generates a TVR-like shard set in a temporary folder (3072-d frame and 768-d token
features, 5 captions per video, 30-150 frames, through the real release -> prepare
path), reads it with `pipeline.train_iterator` at the paper's batch (128 videos),
and reports batches/s after a warm-up. It then times one jitted training step of
GMMFormer v2 (`configs/gmmformer_v2.py:tvr`, `train_lib.make_train_step`) on the
first of those batches, and prints step time / batch time: the pipeline must not be
the bottleneck (target: at least 3x).
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
from prvr_jax.data import synthetic

_VIDEOS = flags.DEFINE_integer('videos', 512, 'Training videos in the generated shard set.')
_BATCH = flags.DEFINE_integer('batch', 128, 'Videos per batch.')
_BATCHES = flags.DEFINE_integer('batches', 24, 'Timed batches (after --warmup).')
_WARMUP = flags.DEFINE_integer('warmup', 4, 'Untimed batches first.')
_STEPS = flags.DEFINE_integer('steps', 2, 'Timed training steps (0: skip the step).')
_CONFIG = config_flags.DEFINE_config_file('config', 'configs/gmmformer_v2.py:tvr',
                                          'Model config file[:variant].')

TVR_LIKE = dict(visual_dim=3072, query_dim=768, queries_per_video=(5, 5), frames=(30, 150),
                query_tokens=(8, 30))


def time_pipeline(shards: pipeline.ShardDataset) -> tuple[float, dict[str, np.ndarray]]:
  """Seconds per batch of the training iterator, and its first batch."""
  it = pipeline.train_iterator(shards, global_batch_size=_BATCH.value, seed=0,
                               process_index=0, process_count=1)
  first = next(it)
  for _ in range(_WARMUP.value - 1):
    next(it)
  start = time.perf_counter()
  for _ in range(_BATCHES.value):
    next(it)
  return (time.perf_counter() - start) / _BATCHES.value, first


def time_train_step(batch: dict[str, np.ndarray]) -> tuple[float, str]:
  """Median seconds of one jitted GMMFormer v2 training step on `batch`."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from prvr_jax import models, parallel, train_lib  # pylint: disable=g-import-not-at-top

  config = _CONFIG.value
  mesh = parallel.make_mesh()
  model = models.get_model(config.model)
  tx, schedule = train_lib.make_optimizer(config, total_steps=1000)
  state = train_lib.create_train_state(config, model, tx, mesh)
  step = train_lib.make_train_step(config, model, tx, schedule, mesh)
  batch = parallel.global_batch(batch, mesh)
  hard = jnp.asarray(False)
  state, metrics = step(state, batch, hard)  # compile + first run
  jax.block_until_ready(metrics)
  times = []
  for _ in range(_STEPS.value):
    start = time.perf_counter()
    state, metrics = step(state, batch, hard)
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
    batch_s, batch = time_pipeline(shards)
  print(f'input pipeline: {1 / batch_s:.2f} batches/s ({1000 * batch_s:.0f} ms/batch of '
        f'{_BATCH.value} videos, {batch["query_feats"].shape[0]} query slots), '
        f'{os.cpu_count()} CPUs visible')
  if not _STEPS.value:
    return
  step_s, device = time_train_step(batch)
  ratio = step_s / batch_s
  print(f'{_CONFIG.value.model.name} train step (hidden {_CONFIG.value.model.hidden_dim}, '
        f'batch {_BATCH.value}) on {device}: '
        f'{1000 * step_s:.0f} ms/step')
  print(f'step time / batch time = {ratio:.1f}x '
        f'({"OK" if ratio >= 3 else "BELOW"} the 3x target)')


if __name__ == '__main__':
  app.run(main)
