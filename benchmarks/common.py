"""What the benchmarks share: the machine they ran on, its measured peaks, and the models'
paper-size configs."""

from collections.abc import Mapping, Sequence
import datetime
import importlib.util
import json
import math
import os
import platform
import subprocess
import time
from typing import Any

from flax.traverse_util import unflatten_dict
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from prvr_jax.eval.evaluator import score_keys
from prvr_jax.models.spec import ModelSpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The paper-size variant of each model's config file ('tvr' for the others).
VARIANTS = {'tmass': 'msrvtt_features'}
DEFAULT_VARIANT = 'tvr'
# CPU flags that decide the float32 / bfloat16 matmul peak of an x86 CPU.
MATMUL_FLAGS = ('avx2', 'fma', 'avx512f', 'avx512_bf16', 'amx_bf16', 'amx_tile')


def usable_cores() -> int:
  """The cores this process may run on (`taskset` and cgroup CPU sets count; `os.cpu_count()`
  does not): XLA:CPU sizes its thread pool by them, and torch is given as many threads."""
  try:
    return len(os.sched_getaffinity(0))
  except AttributeError:  # not Linux
    return os.cpu_count() or 1


def core_sets(size: int) -> list[list[int]]:
  """Disjoint sets of `size` logical CPUs out of those this process may run on, each on
  `size` different physical cores of one socket (a core's other hardware threads left idle),
  so that measurements run at once on different sets share no core."""
  first_thread: dict[tuple[int, int], int] = {}
  for cpu in sorted(os.sched_getaffinity(0)):
    topology = f'/sys/devices/system/cpu/cpu{cpu}/topology'
    try:
      with open(f'{topology}/physical_package_id', encoding='utf-8') as f:
        socket = int(f.read())
      with open(f'{topology}/core_id', encoding='utf-8') as f:
        core = int(f.read())
    except (OSError, ValueError):  # no topology: every logical CPU its own core
      socket, core = 0, cpu
    first_thread.setdefault((socket, core), cpu)
  by_socket: dict[int, list[int]] = {}
  for (socket, _), cpu in sorted(first_thread.items()):
    by_socket.setdefault(socket, []).append(cpu)
  return [cpus[i:i + size] for cpus in by_socket.values()
          for i in range(0, len(cpus) - size + 1, size)]


def machine() -> dict[str, Any]:
  """Device, CPU model, its matmul-relevant flags and core count, versions, date, load."""
  cpu = platform.processor() or platform.machine()
  flags: list[str] = []
  try:
    for line in subprocess.run(['lscpu'], capture_output=True, text=True,
                               check=True).stdout.splitlines():
      if line.startswith('Model name:'):
        cpu = line.split(':', 1)[1].strip()
      elif line.startswith('Flags:'):
        present = set(line.split(':', 1)[1].split())
        flags = [f for f in MATMUL_FLAGS if f in present]
  except (OSError, subprocess.CalledProcessError):
    pass
  device = jax.devices()[0]
  return {'platform': device.platform, 'device': device.device_kind,
          'device_count': jax.device_count(), 'cpu': cpu, 'cpu_flags': flags,
          'cpu_count': usable_cores(), 'jax': jax.__version__,
          'python': platform.python_version(), 'load_average_at_start': os.getloadavg()[0],
          'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}


def best_seconds(fn, repeats: int) -> float:
  """The fastest of `repeats` calls of `fn`, in seconds."""
  best = math.inf
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - start)
  return best


def matmul_peak_gflops(size: int = 2048, repeats: int = 10, dtype: Any = jnp.float32,
                       precision: str = 'float32') -> float:
  """Throughput of a jitted `size`^2 matmul in `dtype` (float32 accumulation) at `precision`
  ('float32': no TF32 on GPUs; 'tensorfloat32'), GFLOP/s, best of 3 runs of `repeats` calls."""
  a = jnp.ones((size, size), dtype)
  matmul = jax.jit(lambda x: jnp.matmul(x, x, precision=precision,
                                        preferred_element_type=jnp.float32))
  matmul(a).block_until_ready()

  def run():
    for _ in range(repeats):
      out = matmul(a)
    out.block_until_ready()
  return 2 * size**3 * repeats / best_seconds(run, 3) / 1e9


def memory_bandwidth(gib: float = 1.0, repeats: int = 3) -> dict[str, float]:
  """STREAM-like bandwidth in GB/s over `gib` GiB (far beyond the caches), best of `repeats`:
  a read (sum) and a copy (read + write counted) with numpy on the host; on an accelerator a
  jitted sum and copy on the device."""
  size = int(gib * (1 << 30)) // 4
  if jax.devices()[0].platform == 'cpu':
    a = np.ones(size, np.float32)
    b = np.empty_like(a)
    read = best_seconds(a.sum, repeats)
    copy = best_seconds(lambda: np.copyto(b, a), repeats)
  else:
    a = jnp.ones(size, jnp.float32)
    total, double = jax.jit(jnp.sum), jax.jit(lambda x: x * 2)
    jax.block_until_ready((total(a), double(a)))
    read = best_seconds(lambda: total(a).block_until_ready(), repeats)
    copy = best_seconds(lambda: double(a).block_until_ready(), repeats)
  nbytes = 4 * size
  return {'read_gbs': nbytes / read / 1e9, 'copy_gbs': 2 * nbytes / copy / 1e9,
          'gbs': max(nbytes / read, 2 * nbytes / copy) / 1e9}


def load_config(name: str, overrides: Sequence[str] = (), variant: str | None = None
                ) -> ml_collections.ConfigDict:
  """configs/<name>.py at `variant` (default: its paper-size variant), with `key=value`
  overrides (each value typed like the key's current value; JSON for the others)."""
  path = os.path.join(ROOT, 'configs', f'{name}.py')
  if not os.path.exists(path):
    raise ValueError(f'--models: no config {path} for model {name!r}.')
  spec = importlib.util.spec_from_file_location(f'config_{name}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config(variant or VARIANTS.get(name, DEFAULT_VARIANT))
  for item in overrides:
    key, sep, text = item.partition('=')
    if not sep:
      raise ValueError(f'--set={item!r}: expected key=value.')
    parent, _, leaf = key.rpartition('.')
    node = config
    for part in filter(None, parent.split('.')):
      node = node[part]
    if leaf not in node:
      raise ValueError(f'--set={item!r}: the config has no key {key!r}.')
    old = node[leaf]
    node[leaf] = type(old)(text) if isinstance(old, (int, float, str)) else json.loads(text)
  return config


def compiled_flops(compiled: Any) -> float:
  """XLA's FLOP count (cost analysis) of a compiled program (one dict, or a list of one)."""
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  return float(cost['flops'])


def flops_per_query(spec: ModelSpec, config_model: Any, params: Any,
                    queries: Mapping[str, np.ndarray], size: int) -> float:
  """Matching FLOPs per query against `size` videos: XLA's cost analysis of the jitted `score`.

  XLA counts a loop body once, so the count is taken at `score_query_chunk` queries (MS-SL's
  `lax.map` over query chunks then runs once) and divided by that number."""
  module = spec.build(config_model)
  count = min(len(next(iter(queries.values()))),
              config_model.get('score_query_chunk', 1 << 30))
  encoded = jax.eval_shape(
      lambda p, q: module.apply({'params': p}, q, method='encode_queries'), params,
      {k: jax.ShapeDtypeStruct((count,) + v.shape[1:], v.dtype) for k, v in queries.items()})
  stored = unflatten_dict({name: jax.ShapeDtypeStruct((size,) + s.shape, s.dtype)
                           for name, s in spec.stored_per_video(config_model).items()}, sep='/')
  rngs = score_keys(spec, 0)
  score = jax.jit(lambda p, q, s: module.apply({'params': p}, q, s, method='score', rngs=rngs))
  return compiled_flops(score.lower(params, encoded, stored).compile()) / count
