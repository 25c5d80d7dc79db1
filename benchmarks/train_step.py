r"""Times one jitted training step at TVR dims and reports achieved GFLOP/s.

  python benchmarks/train_step.py [--config=configs/gmmformer_v2.py:tvr] [--videos=16,32]

For each batch size (videos, 5 captions each, frames padded to 128, 30-token captions) it
prints the median step time over `--steps` steps after `--warmup` steps, the step's FLOPs from
XLA's cost analysis, the achieved GFLOP/s, and that as a fraction of a float32 matmul peak
measured in the same run. Compare against the official PyTorch step on the same shapes by
running it beside this script (see the numbers recorded in docs/benchmarks.md).
"""

import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
from ml_collections import config_flags

from prvr_jax import models, parallel, train

_CONFIG = config_flags.DEFINE_config_file('config', 'configs/gmmformer_v2.py:tvr',
                                          'Model config file[:variant].')
_VIDEOS = flags.DEFINE_list('videos', ['16', '32'], 'Batch sizes (videos) to time.')
_CAPTIONS = flags.DEFINE_integer('captions', 5, 'Captions per video.')
_STEPS = flags.DEFINE_integer('steps', 5, 'Timed steps per batch size.')
_WARMUP = flags.DEFINE_integer('warmup', 2, 'Untimed steps after compilation.')


def random_batch(config_model, num_videos: int, captions: int, seed: int = 0):
  """Full-length videos, captions of 8..max_query_len tokens."""
  rng = np.random.default_rng(seed)
  query_lengths = rng.integers(8, config_model.max_query_len + 1, size=num_videos * captions)
  return models.random_batch(config_model, rng, (config_model.max_frames,) * num_videos,
                             tuple(query_lengths), captions)


def build(config, mesh):
  """(fresh train state, jitted train step) of `config` on `mesh`."""
  tx, schedule = train.make_optimizer(config, total_steps=1000)
  state = train.create_train_state(config, tx, mesh)
  step = train.make_train_step(config, models.get_spec(config.model), tx, schedule, mesh)
  return state, step


def matmul_peak_gflops(size: int = 2048, repeats: int = 10) -> float:
  """float32 matmul throughput of this machine, in GFLOP/s."""
  a = jnp.ones((size, size), jnp.float32)
  matmul = jax.jit(lambda x: x @ x)
  matmul(a).block_until_ready()
  start = time.perf_counter()
  for _ in range(repeats):
    out = matmul(a)
  out.block_until_ready()
  return 2 * size**3 * repeats / (time.perf_counter() - start) / 1e9


def time_step(config, num_videos: int) -> dict[str, float]:
  mesh = parallel.make_mesh()
  state, step = build(config, mesh)
  batch = parallel.global_batch(random_batch(config.model, num_videos, _CAPTIONS.value), mesh)
  epoch = np.int32(0)  # before the hard-negative epoch
  compiled = step.lower(state, batch, epoch).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  flops = float(cost.get('flops', 0.0))
  for _ in range(_WARMUP.value):
    state, metrics = step(state, batch, epoch)
  jax.block_until_ready(metrics)
  times = []
  for _ in range(_STEPS.value):
    start = time.perf_counter()
    state, metrics = step(state, batch, epoch)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  seconds = float(np.median(times))
  return {'seconds': seconds, 'gflop': flops / 1e9, 'gflops': flops / seconds / 1e9}


def main(argv):
  del argv
  config = _CONFIG.value
  peak = matmul_peak_gflops()
  print(f'device: {jax.devices()[0].device_kind} x{jax.device_count()}; '
        f'float32 matmul peak {peak:.1f} GFLOP/s')
  for videos in map(int, _VIDEOS.value):
    result = time_step(config, videos)
    print(f'{config.model.name} batch {videos} videos x {_CAPTIONS.value} captions: '
          f'{1000 * result["seconds"]:.0f} ms/step, {result["gflop"]:.1f} GFLOP/step, '
          f'{result["gflops"]:.1f} GFLOP/s ({100 * result["gflops"] / peak:.0f}% of matmul peak)')


if __name__ == '__main__':
  app.run(main)
