r"""From `python train.py` to the first step done, cold and warm, for every model.

  PYTHONPATH=. python3 benchmarks/startup.py [--models=gmmformer_v2,ms_sl] [--variant=synthetic] \
      [--root=/tmp/startup] [--output=benchmarks/results/startup.json]

For every model, `train.py --config=configs/<model>.py:V` (default V: synthetic, the embedded
benchmark that `python train.py --config=...` runs) with `--config.train.stop_after_steps=1`,
twice, each in a fresh workdir on data prepared beforehand (not timed; `--config.data.dir`):

* cold: an empty persistent compilation cache, so every program compiles;
* warm: the cache the cold run filled, as every later run of a job finds it.

Each run gives the wall-clock seconds from the spawn of `python train.py` to its log line
`logs.FIRST_STEP_LOG` (the first step's completion, read as the line arrives), and from JAX's
compile log (`JAX_LOG_COMPILES=1`) the train step's tracing, lowering and compile-or-load
seconds, the seconds of every XLA compile before the first step, and whether the step came from
the persistent cache (JAX's own entry, or `runtime.host_callback_cache`'s for a step with a
host callback). The goals it checks: on CPUs the step compiling cold in at most 10 s and the
first step done at most 10 s after a warm start; on GPUs 15 s and 5 s (the table and what it
found: docs/benchmarks.md, "Start-up and compile").
"""

from collections.abc import Mapping, Sequence
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from absl import app
from absl import flags

from prvr_jax.data import run_data
from prvr_jax.train import logs

from common import ROOT, load_config, machine  # benchmarks/common.py

MODELS = ('gmmformer_v2', 'gmmformer', 'ms_sl', 'amdnet', 'protoprvr', 'tmass', 'hlformer',
          'ral', 'holmes', 'dreamprvr', 'msc_prvr')
# JAX's compile log (`jax_log_compiles`) of the train step (`train.make_train_step`'s `step`).
_TRACE = re.compile(r'Finished tracing (\S+) for jit in ([\d.]+) sec')
_LOWER = re.compile(r'Finished jaxpr to MLIR module conversion jit\((\w+)\) in ([\d.]+) sec')
_COMPILE = re.compile(r'Finished XLA compilation of jit\((\w+)\) in ([\d.]+) sec')
_HIT = re.compile(r"Persistent compilation cache hit for 'jit_(\w+)'")
_FIRST = re.compile(re.escape(logs.FIRST_STEP_LOG) + r'.*?(?:, ([\d.]+) s after the process '
                    r'started)?\.$')
STEP = 'step'

_MODELS = flags.DEFINE_list('models', list(MODELS), 'Models (configs/<name>.py) to start.')
_VARIANT = flags.DEFINE_string('variant', 'synthetic', 'Config variant (every config\'s default: '
                               'synthetic, the embedded benchmark).')
_ROOT = flags.DEFINE_string('root', '/tmp/prvr_startup', 'Folder for the prepared data (kept '
                            'and reused) and, in a new subfolder per invocation, the caches and '
                            'workdirs.')
_TIMEOUT = flags.DEFINE_integer('timeout', 900, 'Seconds one run may take.')
_KEEP_LOGS = flags.DEFINE_bool('keep_logs', False, 'Also write each run\'s whole log, every line '
                                'with its seconds since the spawn, into the JSON.')
_OUTPUT = flags.DEFINE_string('output', None, 'JSON of every number.')


def parse_log(lines: Sequence[tuple[float, str]]) -> dict[str, Any]:
  """`(seconds since the spawn, line)` of a run's log -> the first step's time (`first_step_s`,
  and the process's own figure `process_age_s`), the step's `trace_s`, `lower_s`,
  `compile_s` and `cache_hit`, and `compiles_s`: every XLA compile (or cache load) logged
  before the first step. Missing figures are None."""
  out: dict[str, Any] = {'first_step_s': None, 'process_age_s': None, 'trace_s': None,
                         'lower_s': None, 'compile_s': None, 'cache_hit': False,
                         'compiles_s': 0.0}
  for seconds, line in lines:
    if (match := _FIRST.search(line)):
      out['first_step_s'] = seconds
      out['process_age_s'] = float(match.group(1)) if match.group(1) else None
      break
    for key, pattern in (('trace_s', _TRACE), ('lower_s', _LOWER), ('compile_s', _COMPILE)):
      if (match := pattern.search(line)) and match.group(1) == STEP:
        out[key] = float(match.group(2))
    if (match := _COMPILE.search(line)):
      out['compiles_s'] += float(match.group(2))
    if (match := _HIT.search(line)) and match.group(1) == STEP:
      out['cache_hit'] = True
  return out


def prepared_data(name: str, variant: str, root: str) -> str:
  """The shard folder of the model's config, prepared under `<root>/data` (the synthetic
  benchmark's folders there are per size, seed and text feature: shared by the models)."""
  config = load_config(name, variant=variant)
  if config.data.dir:
    return config.data.dir
  workdir = os.path.join(root, 'data')
  run_data.prepare_run_data(config, workdir)
  return run_data.shard_dir(config, workdir)


def start(name: str, variant: str, data_dir: str, cache_dir: str, workdir: str
          ) -> dict[str, Any]:
  """One `python train.py` to its first step; its log parsed (`parse_log`), its exit code."""
  config = f'configs/{name}.py:{variant}'
  command = [sys.executable, 'train.py', f'--config={config}', f'--config.data.dir={data_dir}',
             '--config.train.stop_after_steps=1', f'--workdir={workdir}',
             f'--compilation_cache_dir={cache_dir}']
  env = {**os.environ, 'JAX_LOG_COMPILES': '1'}
  lines = []
  begin = time.perf_counter()
  with subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True) as process:
    watchdog = threading.Timer(_TIMEOUT.value, process.kill)  # a silent hang too
    watchdog.start()
    try:
      for line in process.stdout:
        lines.append((time.perf_counter() - begin, line.rstrip('\n')))
      code = process.wait()
    finally:
      watchdog.cancel()
  result = {**parse_log(lines), 'exit_code': code}
  if code or result['first_step_s'] is None:
    result['log_tail'] = [line for _, line in lines[-20:]]
  if _KEEP_LOGS.value:
    result['log'] = [f'{seconds:8.2f} {line}' for seconds, line in lines]
  return result


def row(name: str, cold: Mapping[str, Any], warm: Mapping[str, Any]) -> str:
  def s(value: float | None) -> str:
    return '-' if value is None else f'{value:.1f}'
  return (f'| {name} | {s(cold["first_step_s"])} | {s(cold["trace_s"])} / {s(cold["lower_s"])} '
          f'/ {s(cold["compile_s"])} | {s(warm["first_step_s"])} | '
          f'{"hit" if warm["cache_hit"] else "miss"}, {s(warm["compile_s"])} |')


def main(argv: Sequence[str]) -> None:
  del argv
  root = _ROOT.value
  os.makedirs(root, exist_ok=True)
  scratch = tempfile.mkdtemp(prefix='startup-', dir=root)
  report: dict[str, Any] = {'machine': machine(), 'variant': _VARIANT.value, 'scratch': scratch,
                            'runs': []}
  print('| model | cold: first step s | step trace / lower / compile s | warm: first step s | '
        'warm step: cache, load s |\n| --- | ---: | ---: | ---: | ---: |', flush=True)
  for name in _MODELS.value:
    data_dir = prepared_data(name, _VARIANT.value, root)
    cache = os.path.join(scratch, 'cache', name)
    runs = {kind: start(name, _VARIANT.value, data_dir, cache,
                        os.path.join(scratch, f'{name}-{kind}'))
            for kind in ('cold', 'warm')}
    report['runs'].append({'model': name, **runs})
    print(row(name, runs['cold'], runs['warm']), flush=True)
    for kind, run in runs.items():
      if 'log_tail' in run:
        print(f'  {kind} run exited {run["exit_code"]}:\n    ' + '\n    '.join(run['log_tail']),
              flush=True)
    if _OUTPUT.value:
      with open(_OUTPUT.value, 'w', encoding='utf-8') as f:
        json.dump(report, f, indent=1)


if __name__ == '__main__':
  app.run(main)
