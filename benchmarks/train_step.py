r"""Our jitted training step against the authors' official PyTorch step, side by side.

  python3 benchmarks/train_step.py [--models=gmmformer_v2,ms_sl] [--videos=16,32,64,128] \
      [--official=PATH] [--official_python=/tmp/torchvenv/bin/python] [--rounds=N] \
      [--cores_per_point=N] [--compilation_cache_dir=DIR] [--profile] \
      [--set=train.matmul_precision=bfloat16] [--ours_malloc=PATH] [--kernels=fast,plain] \
      [--output=benchmarks/results/train_step.json]

For every model (its config's paper-size variant: 'tvr', T-MASS 'msrvtt_features') and batch
size (videos, `--captions` captions each, T-MASS one; full-length videos, captions of 8..30
tokens; the same batch on both sides) it runs, each in a fresh subprocess so that its peak RSS
is its own:

* ours: the jitted train step of `train.make_train_step` (forward, loss, backward, optimiser,
  the state donated) at epoch 0: compile time, the median of at least `--steps` steps and
  `--min_seconds` of them after `--warmup`,
  FLOPs per step from XLA's cost analysis (on GPUs it leaves out the cuBLAS matmuls), the
  matmul FLOPs of the step's jaxpr and their achieved rate, the program's size
  (`step_profile.program_size`: ops, fusions, loops, instructions by phase); with `--profile`, where
  the step's time goes by operation kind and phase (`step_profile.py`);
* the official step (with `--official`), from a checkout of the authors' code outside this
  repo (`official_train_step.py`: `model.train()`, forward, loss, backward, optimiser step),
  with `--official_python` (a Python with torch), on as many torch threads as XLA has cores;
  MS-SL's in autograd anomaly mode as its released loop runs it (`--noofficial_anomaly`:
  without).

With `--cores_per_point=N` (CPUs) several points run at once, each on its own N physical cores
(its workers pinned to them), the largest batches first: a full table on a many-core machine in
a fraction of the time, the points sharing the caches and the memory bandwidth.

With `--compilation_cache_dir=DIR` ours uses JAX's persistent compilation cache as train.py does
by default: the second run of the same command loads the step instead of compiling it, which is
what every run of a job after its first does (its compile time is then the load, and its peak
memory has no compiler in it).

With `--kernels=fast,plain` ours runs once per choice of `train.kernels` (docs/kernels.md), a
row each, back to back for every model and batch size: the CPU-tuned kernels against flax's
plain layers on the same machine in the same run (default: the config's, `auto`).

With `--rounds=N` each model and batch size is measured N times, both sides back to back in
every round and the order alternating (official first in the odd rounds), so that a shared
machine's slow minutes fall on both sides alike: the table gives the median of the rounds'
medians, the speed-up of those medians with the range of the rounds' own speed-ups, and the
highest peak memory of any round.

Ours runs with glibc's huge-page malloc where train.py would (`runtime.host_memory`), the
official step as its own scripts run it; `--huge_pages=both` gives the official step the same
setting. `--ours_malloc=PATH` preloads another malloc (tcmalloc) into our worker alone.

`--official=PATH`: a checkout of the model's official repo, or a folder holding one checkout
per repo named as the repo (GMMFormer, GMMFormer_v2, ms-sl, AMDNet,
T-MASS-text-video-retrieval, ICCV25-HLFormer, RAL-PRVR, ICML26-Holmes, CVPR26-DreamPRVR;
HLFormer's needs geoopt). Prints the matmul peaks measured in the same run (float32, without
TF32 on GPUs; tensorfloat32; bfloat16), a table per model (ms/step both sides, the speed-up,
matmul GFLOP/s and % of the peak of the precision ours runs at, peak memory both sides) and
writes every number to `--output`, after every run.

On a GPU both sides run there (the official code moves its model and batch with `.cuda()`);
peak memory is then the device allocator's (JAX's `peak_bytes_in_use`, torch's
`max_memory_allocated`), on CPUs the process's peak RSS. Ours runs with the XLA flags train.py
sets by default (`runtime.xla`).
"""

from collections.abc import Iterator, Mapping, Sequence
from concurrent import futures
import json
import os
import queue
import resource
import subprocess
import sys
import time
from typing import Any

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from prvr_jax import checkpoint, config_lib, models, parallel, runtime, train
from prvr_jax.runtime import host_memory, xla

from common import (ROOT, best_seconds, compiled_flops, core_sets, load_config,  # benchmarks/common.py
                    machine, matmul_peak_gflops, usable_cores)
import step_profile  # benchmarks/step_profile.py

# T-MASS pairs each caption with its video (a [Q, Q] similarity on the official side).
CAPTIONS = {'tmass': 1}
RESULT = 'RESULT '  # prefix of a worker's JSON line on stdout
# The driver measures the matmul peaks without taking most of the GPU's memory up front (JAX's
# default), which would leave the workers too little (XLA then fails to autotune the step's
# matmuls: "BlasLt is unavailable"); the workers get the user's setting.
PREALLOCATE = 'XLA_PYTHON_CLIENT_PREALLOCATE'
LD_PRELOAD = 'LD_PRELOAD'
_USER_PREALLOCATE = os.environ.get(PREALLOCATE)

_MODELS = flags.DEFINE_list('models', ['gmmformer_v2'], 'Models (configs/<name>.py) to time.')
_VIDEOS = flags.DEFINE_list('videos', ['16', '32', '64', '128'], 'Batch sizes (videos).')
_CAPTIONS = flags.DEFINE_integer('captions', 5, 'Captions per video.')
_STEPS = flags.DEFINE_integer('steps', 3, 'Timed steps per measurement (median); at least.')
_MIN_SECONDS = flags.DEFINE_float('min_seconds', 3.0, 'More timed steps until they add up to '
                                  'this many seconds (short steps are noisy on a shared machine).')
_WARMUP = flags.DEFINE_integer('warmup', 1, 'Untimed steps after compilation.')
_ROUNDS = flags.DEFINE_integer('rounds', 1, 'Measurements per model and batch size, each side in '
                               'a fresh process, back to back, the order alternating from round '
                               'to round; the table gives the median of the rounds\' medians.',
                               lower_bound=1)
_CORES_PER_POINT = flags.DEFINE_integer(
    'cores_per_point', 0, 'CPUs: measure several points (model, batch size) at once, each on its '
    'own set of this many physical cores (`common.core_sets`), the largest batches first; the '
    'matmul peaks are measured on one set before they start. 0: one point at a time on every '
    'core.', lower_bound=0)
_CACHE = flags.DEFINE_string(
    'compilation_cache_dir', None, 'Ours with JAX\'s persistent compilation cache in this '
    'folder, as train.py runs by default (`runtime.compilation_cache`): run twice, the second '
    'run measures a later run of the same job, which loads its step instead of compiling it. '
    'Default: no cache, every run compiles.')
_OFFICIAL = flags.DEFINE_string('official', None, 'Checkout of the official code, or a folder '
                                'of checkouts named as the repos; without it ours runs alone.')
_OFFICIAL_PYTHON = flags.DEFINE_string('official_python', sys.executable, 'Python (with torch) '
                                       'that runs the official step.')
_ANOMALY = flags.DEFINE_bool('official_anomaly', True, 'Run MS-SL\'s official step in autograd '
                              'anomaly mode, as its released training loop does.')
_HUGE_PAGES = flags.DEFINE_enum(
    'huge_pages', 'ours', ['ours', 'both', 'none'], 'Which side runs with glibc\'s huge-page '
    'malloc (`host_memory.huge_page_environ`): ours as train.py runs it, both sides, or '
    'neither.')
_OURS_MALLOC = flags.DEFINE_string(
    'ours_malloc', None, 'A malloc library that our worker runs with (LD_PRELOAD), e.g. '
    'tcmalloc\'s libtcmalloc_minimal.so.4 (docs/training.md, "Another malloc"); the official '
    'step keeps glibc\'s.')
_PROFILE = flags.DEFINE_bool('profile', False, 'Also break our step time down by op kind.')
_KERNELS = flags.DEFINE_list('kernels', [], 'Time ours once per `train.kernels` choice (e.g. '
                             'fast,plain), a row each; default: the config\'s.')
_SET = flags.DEFINE_multi_string('set', [], 'Config override key=value (e.g. '
                                 'train.matmul_precision=bfloat16), applied to ours; repeatable.')
_OUTPUT = flags.DEFINE_string('output', None, 'JSON of every number.')
_WORKER = flags.DEFINE_enum('worker', None, ['ours', 'official'], 'Internal: run one side.')
_MODEL = flags.DEFINE_string('model', None, 'Internal: the worker\'s model.')
_BATCH = flags.DEFINE_integer('batch', None, 'Internal: the worker\'s batch size.')
_CPUS = flags.DEFINE_list('cpus', None, 'Internal: the logical CPUs the worker runs on.')


def benchmark_batch(name: str, config_model: Any, num_videos: int, seed: int = 0
                    ) -> dict[str, np.ndarray]:
  """Full-length videos, `--captions` captions each (T-MASS: 1) of 8..max_query_len tokens,
  the same on both sides."""
  captions = CAPTIONS.get(name, _CAPTIONS.value)
  rng = np.random.default_rng(seed)
  longest = config_model.max_query_len  # 1 for sentence-feature models (AMDNet, T-MASS)
  query_lengths = rng.integers(min(8, longest), longest + 1, size=num_videos * captions)
  return models.random_batch(config_model, rng, (config_model.max_frames,) * num_videos,
                             tuple(query_lengths), captions)


def peak_rss_mb() -> float:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_device_mb() -> float | None:
  """The accelerator allocator's peak bytes in use, in MB; None on CPUs."""
  device = jax.devices()[0]
  stats = device.memory_stats() if device.platform != 'cpu' else None
  return stats['peak_bytes_in_use'] / 2**20 if stats and 'peak_bytes_in_use' in stats else None


def timed(run, warmup: int, steps: int, min_seconds: float) -> list[float]:
  """Seconds of each call of `run` (each blocking) after `warmup` calls: at least `steps`
  calls, and more until they add up to `min_seconds`."""
  for _ in range(warmup):
    run()
  times = []
  while len(times) < steps or sum(times) < min_seconds:
    start = time.perf_counter()
    run()
    times.append(time.perf_counter() - start)
  return times


# ------------------------------------------------------------------------------------ workers

def malloc_settings() -> dict[str, str]:
  """How this worker's malloc was set up: glibc's tunables and any preloaded library."""
  return {'glibc_tunables': os.environ.get(host_memory.GLIBC_TUNABLES, ''),
          'ld_preload': os.environ.get(LD_PRELOAD, '')}


def run_ours(name: str, num_videos: int) -> dict[str, Any]:
  config = load_config(name, _SET.value)
  mesh = parallel.make_mesh()
  spec = models.get_spec(config.model)
  tx, schedule = train.make_model_optimizer(config, spec, total_steps=1000)
  state = train.create_train_state(config, spec, tx, mesh)
  step = train.make_train_step(config, spec, tx, schedule, mesh)
  batch = parallel.global_batch(benchmark_batch(name, config.model, num_videos), mesh)
  epoch = np.int32(0)
  start = time.perf_counter()
  lowered = step.lower(state, batch, epoch)
  compiled = lowered.compile()
  compile_s = time.perf_counter() - start
  holder = {'state': state}

  def run():
    holder['state'], metrics = compiled(holder['state'], batch, epoch)
    return jax.block_until_ready(metrics)

  times = timed(run, _WARMUP.value, _STEPS.value, _MIN_SECONDS.value)
  result = {'step_s': times, 'compile_s': compile_s, 'gflop': compiled_flops(compiled) / 1e9,
            'matmul_gflop': step_profile.matmul_gflop(jax.make_jaxpr(step)(state, batch, epoch)),
            'loss': float(run()['loss']), 'params': models.count_params(holder['state'].params),
            'matmul_precision': config.train.matmul_precision,
            'program': step_profile.program_size(lowered, compiled)}
  if _PROFILE.value:
    result['profile'] = step_profile.breakdown(compiled, run)
  result['checks_s'] = checks_seconds(holder['state'])
  result['peak_rss_mb'] = peak_rss_mb()
  result['peak_device_mb'] = peak_device_mb()
  result['xla_flags'] = os.environ.get(xla.ENV, '')
  return {**result, **malloc_settings()}


def checks_seconds(state: Any) -> dict[str, float]:
  """Seconds of the checks the training path adds beside its steps (docs/reliability.md): the
  digests a checkpoint save records (the whole state and the parameters), and the finite check
  and digest of the parameters a restore and an evaluation run."""
  return {'save_digests': best_seconds(
              lambda: (checkpoint.tree_digest(state), checkpoint.tree_digest(state.params)), 3),
          'params_finite_and_digest': best_seconds(
              lambda: (checkpoint.check_finite(state.params, 'benchmark'),
                       checkpoint.tree_digest(state.params)), 3)}


def official_checkout(path: str, name: str) -> str:
  """The checkout of `name`'s official repo: PATH itself or PATH/<repo name>."""
  import official_train_step  # pylint: disable=import-outside-toplevel
  repo = official_train_step.OFFICIAL_REPOS[name].split('/')[-1]
  inside = os.path.join(path, repo)
  return inside if os.path.isdir(inside) else path


def run_official(name: str, num_videos: int) -> dict[str, Any]:
  import official_train_step  # pylint: disable=import-outside-toplevel
  config = load_config(name)
  batch = benchmark_batch(name, config.model, num_videos)
  step, info = official_train_step.make_step(
      name, official_checkout(_OFFICIAL.value, name), config, batch, epoch=0,
      threads=usable_cores(), detect_anomaly=_ANOMALY.value)
  times = timed(step, _WARMUP.value, _STEPS.value, _MIN_SECONDS.value)
  return {'step_s': times, 'loss': float(step()), **info, 'peak_rss_mb': peak_rss_mb(),
          'peak_device_mb': official_train_step.peak_device_mb(),
          'matmul_gflop': official_train_step.matmul_gflop(step),
          **malloc_settings()}


# --------------------------------------------------------------------------------- the driver

def spawn(side: str, name: str, num_videos: int, cpus: Sequence[int] | None = None,
          kernels: str | None = None) -> dict[str, Any]:
  """Runs one worker in a fresh process (on `cpus` where given; ours with `train.kernels`
  set to `kernels` where given); its result, or {'error': ...}."""
  python = _OFFICIAL_PYTHON.value if side == 'official' else sys.executable
  command = [python, os.path.abspath(__file__), f'--worker={side}', f'--model={name}',
             f'--batch={num_videos}', f'--captions={_CAPTIONS.value}',
             f'--steps={_STEPS.value}', f'--min_seconds={_MIN_SECONDS.value}',
             f'--warmup={_WARMUP.value}']
  command += [f'--set={item}' for item in _SET.value]
  if side == 'ours' and kernels:
    command.append(f'--set=train.kernels={kernels}')
  if _PROFILE.value:
    command.append('--profile')
  if not _ANOMALY.value:
    command.append('--noofficial_anomaly')
  if _OFFICIAL.value:
    command.append(f'--official={_OFFICIAL.value}')
  if cpus:
    command.append(f'--cpus={",".join(map(str, cpus))}')
  if _CACHE.value:
    command.append(f'--compilation_cache_dir={_CACHE.value}')
  env = {**os.environ, 'PYTHONPATH': os.pathsep.join(
      filter(None, [ROOT, os.environ.get('PYTHONPATH')]))}
  env.pop(PREALLOCATE, None)
  if _USER_PREALLOCATE is not None:
    env[PREALLOCATE] = _USER_PREALLOCATE
  if _HUGE_PAGES.value in ('both', side):
    env = host_memory.huge_page_environ(env) or env
  if side == 'ours' and _OURS_MALLOC.value:
    env[LD_PRELOAD] = _OURS_MALLOC.value
  done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
  for line in done.stdout.splitlines():
    if line.startswith(RESULT):
      return json.loads(line[len(RESULT):])
  return {'error': f'{side} worker exited {done.returncode}: {done.stderr.strip()[-2000:]}'}


def combine(rounds: list[dict[str, Any]]) -> dict[str, Any]:
  """One side's rounds as one result: the last round's, with `round_medians_s` (each round's
  median step), `median_s` (their median), `step_s` (every timed step), the highest peak memory
  and the median compile time; the first error where a round failed."""
  for result in rounds:
    if 'error' in result:
      return result
  combined = dict(rounds[-1])
  combined['round_medians_s'] = [float(np.median(r['step_s'])) for r in rounds]
  combined['median_s'] = float(np.median(combined['round_medians_s']))
  combined['step_s'] = [t for r in rounds for t in r['step_s']]
  combined['peak_rss_mb'] = max(r['peak_rss_mb'] for r in rounds)
  device = [r['peak_device_mb'] for r in rounds if r.get('peak_device_mb') is not None]
  combined['peak_device_mb'] = max(device) if device else None
  if 'compile_s' in combined:
    combined['compile_s'] = float(np.median([r['compile_s'] for r in rounds]))
  return combined


Point = tuple[str, int, str | None]  # model, videos, `train.kernels` (None: the config's)


def measure_point(name: str, videos: int, kernels: str | None = None,
                  cpus: Sequence[int] | None = None) -> dict[str, Any]:
  """Both sides of one model and batch size over `--rounds` rounds (on `cpus` where given);
  the official side only with the first of several `--kernels`."""
  official = bool(_OFFICIAL.value) and kernels in (None, *_KERNELS.value[:1])
  sides = ('official', 'ours') if official else ('ours',)
  measured: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
  for index in range(_ROUNDS.value):
    for side in (sides if index % 2 == 0 else sides[::-1]):
      measured[side].append(spawn(side, name, videos, cpus, kernels))
  run = {'model': name, 'videos': videos, 'kernels': kernels,
         'ours': combine(measured['ours']),
         'official': combine(measured['official']) if official else None}
  if cpus:
    run['cpus'] = list(cpus)
  return run


def measure_at_once(points: Sequence[Point], sets: Sequence[Sequence[int]]
                    ) -> Iterator[dict[str, Any]]:
  """Yields `measure_point` of every point as each finishes, up to `len(sets)` at once, each
  on a set of CPUs no other running point uses; the largest batches start first."""
  free: queue.SimpleQueue = queue.SimpleQueue()
  for cpus in sets:
    free.put(cpus)

  def on_free_cores(point: Point) -> dict[str, Any]:
    cpus = free.get()
    try:
      return measure_point(*point, cpus=cpus)
    finally:
      free.put(cpus)

  with futures.ThreadPoolExecutor(len(sets)) as pool:
    pending = [pool.submit(on_free_cores, point)
               for point in sorted(points, key=lambda point: -point[1])]
    for done in futures.as_completed(pending):
      yield done.result()


def speed_up(official: Mapping[str, Any], ours: Mapping[str, Any]) -> str:
  """`official / ours` of the medians, and over several rounds the range of the rounds'
  ratios."""
  ratio = f'{official["median_s"] / ours["median_s"]:.2f}x'
  pairs = list(zip(official['round_medians_s'], ours['round_medians_s']))
  if len(pairs) < 2:
    return ratio
  ratios = [theirs / mine for theirs, mine in pairs]
  return f'{ratio} ({min(ratios):.2f}-{max(ratios):.2f})'


def label(run: Mapping[str, Any]) -> str:
  """A row's model, with its `train.kernels` where `--kernels` set it."""
  return f'{run["model"]} ({run["kernels"]})' if run['kernels'] else run['model']


def milliseconds(ms: float) -> str:
  return f'{ms:.0f}' if ms >= 100 else f'{ms:.3g}'


def peak_memory_mb(side: Mapping[str, Any]) -> float:
  """A worker's peak memory: the accelerator's where it ran on one, else the process's RSS."""
  device = side.get('peak_device_mb')
  return side['peak_rss_mb'] if device is None else device


def row(name: str, videos: int, ours: Mapping[str, Any], official: Mapping[str, Any] | None,
        peaks: Mapping[str, float]) -> str:
  if 'error' in ours:
    return f'| {name} | {videos} | ours failed: {ours["error"][-300:]} |'
  ms = 1e3 * ours['median_s']
  gflops = ours['matmul_gflop'] / ours['median_s']
  peak = peaks[ours['matmul_precision']]
  if official is None or 'error' in official:
    failed = '-' if official is None else f'failed: {official["error"][-200:]}'
    timing = [failed, milliseconds(ms), '-']
    official_cells = [f'- / {ours["matmul_gflop"]:.0f}', '-', '-']
  else:
    official_s = official['median_s']
    official_rate = official['matmul_gflop'] / official_s
    timing = [milliseconds(1e3 * official_s), milliseconds(ms), speed_up(official, ours)]
    official_cells = [f'{official["matmul_gflop"]:.0f} / {ours["matmul_gflop"]:.0f}',
                      f'{official_rate:.0f} ({100 * official_rate / peaks["float32"]:.0f}%)',
                      f'{peak_memory_mb(official):.0f}']
  cells = [name, str(videos), *timing, f'{ours["gflop"]:.0f}',
           f'{gflops:.0f} ({100 * gflops / peak:.0f}%)', *official_cells,
           f'{peak_memory_mb(ours):.0f}', f'{ours["compile_s"]:.0f}']
  return '| ' + ' | '.join(cells) + ' |'


HEADER = ('| model | videos | official ms/step | ours ms/step | speed-up | XLA GFLOP/step | '
          'matmul GFLOP/s (% of peak) | matmul GFLOP/step official / ours | official matmul GFLOP/s '
          '(% of peak) | official peak MB | ours peak MB | ours compile s |\n'
          '| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |')


def write_report(report: Mapping[str, Any]) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(_OUTPUT.value)), exist_ok=True)
  with open(_OUTPUT.value, 'w', encoding='utf-8') as f:
    json.dump(report, f, indent=1)


def main(argv):
  del argv
  # As train.py starts, before any device is used; the cache for our worker alone, and only
  # with --compilation_cache_dir ('' is off; None would be train.py's default folder, whose
  # entries from earlier runs would turn the compile measured into a load).
  runtime.start(compilation_cache_dir=(_CACHE.value or '') if _WORKER.value == 'ours' else '')
  if _WORKER.value:
    if _CPUS.value:  # before JAX or torch size their thread pools by it
      os.sched_setaffinity(0, [int(cpu) for cpu in _CPUS.value])
    result = (run_ours if _WORKER.value == 'ours' else run_official)(_MODEL.value, _BATCH.value)
    print(RESULT + json.dumps(result), flush=True)
    return
  sets = core_sets(_CORES_PER_POINT.value) if _CORES_PER_POINT.value else None
  if _OURS_MALLOC.value and not os.path.isfile(_OURS_MALLOC.value):
    raise app.UsageError(f'--ours_malloc: no such file: {_OURS_MALLOC.value}')
  if sets is not None:
    if not sets:
      raise app.UsageError(f'--cores_per_point={_CORES_PER_POINT.value}: no socket has that '
                           f'many physical cores among the {usable_cores()} logical CPUs this '
                           'process may run on.')
    os.sched_setaffinity(0, sets[0])  # the peaks of one set, before JAX starts its threads
  os.environ[PREALLOCATE] = 'false'
  info = machine()
  if sets is not None and info['platform'] != 'cpu':
    raise app.UsageError('--cores_per_point is for CPUs: the points would share the '
                         f'{info["device"]}.')
  size = 2048 if info['platform'] == 'cpu' else 8192
  peaks = {'float32': matmul_peak_gflops(size),
           'tensorfloat32': matmul_peak_gflops(size, precision='tensorfloat32'),
           'bfloat16': matmul_peak_gflops(size, dtype=jnp.bfloat16)}
  print(f'{info["cpu"]} ({", ".join(info["cpu_flags"])}), {info["cpu_count"]} cores, '
        f'{info["device"]}; matmul peak GFLOP/s ' + ', '.join(
            f'{k} {v:.0f}' for k, v in peaks.items()) +
        f'; load {info["load_average_at_start"]:.1f}; peak memory: '
        f'{"RSS" if info["platform"] == "cpu" else "device"}'
        + (f'; {len(sets)} points at once on CPUs {sets}' if sets else ''), flush=True)
  report: dict[str, Any] = {'machine': info, 'matmul_peak_gflops': peaks,
                            'settings': {'captions': _CAPTIONS.value, 'steps': _STEPS.value,
                                         'min_seconds': _MIN_SECONDS.value,
                                         'official_anomaly': _ANOMALY.value,
                                         'warmup': _WARMUP.value, 'rounds': _ROUNDS.value,
                                         'set': _SET.value, 'kernels': _KERNELS.value,
                                         'huge_pages': _HUGE_PAGES.value,
                                         'ours_malloc': _OURS_MALLOC.value,
                                         'official': _OFFICIAL.value,
                                         'cores_per_point': _CORES_PER_POINT.value,
                                         'compilation_cache_dir': _CACHE.value},
                            'runs': []}
  for name in _MODELS.value:
    load_config(name)  # a bad --models name fails before any run
  for kernels in _KERNELS.value:
    if kernels not in config_lib.KERNEL_CHOICES:
      raise app.UsageError(f'--kernels: {kernels!r} is none of '
                           f'{", ".join(config_lib.KERNEL_CHOICES)}.')
  points = [(name, int(videos), kernels) for name in _MODELS.value
            for videos in _VIDEOS.value for kernels in (_KERNELS.value or [None])]
  runs = (measure_at_once(points, sets) if sets else (measure_point(*point) for point in points))
  for run in runs:
    report['runs'].append(run)
    if _OUTPUT.value:  # after every run: a run cut short keeps what it measured
      write_report(report)
    ours = run['ours']
    print(row(label(run), run['videos'], ours, run['official'], peaks), flush=True)
    if 'error' in ours:
      continue
    program = ours['program']
    print(f'  program: {program["stablehlo_ops"]:,} StableHLO ops ({program["dot_generals"]} '
          f'dot_general), optimised {program["fusions"]:,} fusions, {program["while_loops"]} '
          f'while loops, {program["custom_calls"]} custom calls; instructions by phase '
          f'{program["instructions_by_phase"]}', flush=True)
    checks = ours['checks_s']
    print('  checks: ' + ', '.join(f'{k} {1e3 * v:.0f} ms ({100 * v / ours["median_s"]:.1f}% of '
                                   'a step)' for k, v in checks.items()), flush=True)
    if _PROFILE.value and 'profile' in ours:
      print(step_profile.format_breakdown(ours['profile']), flush=True)
  report['runs'].sort(key=lambda run: points.index((run['model'], run['videos'], run['kernels'])))
  report['machine']['load_average_at_end'] = os.getloadavg()[0]
  print(HEADER + '\n' + '\n'.join(
      row(label(run), run['videos'], run['ours'], run['official'], peaks)
      for run in report['runs']))
  if _OUTPUT.value:
    write_report(report)
    print(f'wrote {_OUTPUT.value}')


if __name__ == '__main__':
  app.run(main)
