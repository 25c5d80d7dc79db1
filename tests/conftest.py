"""Session-wide settings and shared fixtures; pytest loads this before any test module.

Helpers that are not fixtures (tolerances, config loading, CLI subprocesses) are in
`support.py`.
"""

from collections.abc import Callable
import fcntl
import importlib.util
import os
import pathlib
import shutil
import sys

import pytest

import support

# Full float32 matmuls everywhere. On GPUs JAX's default float32 matmul precision is TF32
# (a 10-bit mantissa, ~1e-3 relative), which no float32 tolerance of this suite is meant to
# absorb; on CPUs it is float32 already. float32 is also what training and evaluation use by
# default (`config.train.matmul_precision`, `config.eval.matmul_precision`). Set in the
# environment, before jax is imported, so that the CLI subprocesses (which copy os.environ)
# inherit it too. A value set by the caller is kept.
os.environ.setdefault('JAX_DEFAULT_MATMUL_PRECISION', 'float32')
# The suite runs in 2 pytest-xdist workers (README): on one accelerator each worker (and each
# CLI subprocess) takes memory as it needs it instead of 75% of it up front.
os.environ.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
# Two CPU devices in the test process, so that data parallelism (the contract test's 1 vs 2
# devices, the sharded evaluator) runs in-process; CLI subprocesses set their own count.
# Without a GPU/TPU JAX then runs on these CPU devices. XLA:CPU compiles the suite's many
# programs faster with `support.FAST_COMPILE_FLAGS` (the CLI subprocesses use them too).
_flags = os.environ.get('XLA_FLAGS', '')
if 'xla_force_host_platform_device_count' not in _flags:
  _flags += ' --xla_force_host_platform_device_count=2'
for _flag in support.FAST_COMPILE_FLAGS:
  if _flag.split('=')[0] not in _flags:
    _flags += f' {_flag}'
os.environ['XLA_FLAGS'] = _flags.strip()
if 'jax' in sys.modules:  # imported by a plugin before this file: set it there too
  sys.modules['jax'].config.update('jax_default_matmul_precision',
                                   os.environ['JAX_DEFAULT_MATMUL_PRECISION'])

# The `tiny` GMMFormer config of the CLI tests, on the tiny synthetic benchmark.
TINY_CONFIG = """
from configs import gmmformer

def get_config(arg=None):
  config = gmmformer.get_config('tiny')
  config.eval.video_batch_size = 16  # val and test in one chunk: fewer programs to compile
  return config
"""


def shared_folder(tmp_path_factory, name: str, build: Callable[[pathlib.Path], None]
                  ) -> pathlib.Path:
  """`<run>/<name>`, made by `build(folder)` once per pytest run: the first process that asks
  builds it under a file lock, every other (the other xdist worker) waits for it and reuses it.

  `<run>` is the run's temp folder, which the xdist workers' own temp folders lie in. A build
  that failed is removed and tried again by the next process that asks.
  """
  base = tmp_path_factory.getbasetemp()
  run = base.parent if os.environ.get('PYTEST_XDIST_WORKER') else base
  folder, done = run / name, run / f'{name}.done'
  with open(run / f'{name}.lock', 'w') as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
    if not done.exists():
      shutil.rmtree(folder, ignore_errors=True)
      folder.mkdir()
      build(folder)
      done.touch()
  return folder


@pytest.fixture(scope='session', autouse=True)
def persistent_compilation_cache(tmp_path_factory) -> pathlib.Path:
  """The run's persistent compilation cache, shared by the xdist workers, into which every
  program a test process compiles goes (however fast it compiled): an equal program -- a fresh
  `jax.jit` of the same function in another test, the other worker's -- is loaded instead of
  compiled again. The cache key holds the program, its devices and XLA's flags."""
  folder = shared_folder(tmp_path_factory, 'xla_cache', lambda folder: None)
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=g-import-not-at-top
  jax.config.update('jax_compilation_cache_dir', str(folder))
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  compilation_cache.reset_cache()  # a program compiled at collection time left it unused
  return folder


@pytest.fixture(scope='session')
def xla_cache(persistent_compilation_cache) -> pathlib.Path:
  """The compilation cache of the single-process CLI runs the tests launch: the test
  processes' own, so that a CLI run loads what another compiled for the same devices."""
  return persistent_compilation_cache


@pytest.fixture(scope='session')
def tiny_data(tmp_path_factory) -> str:
  """The tiny synthetic benchmark, generated once per run (what a run would generate itself)."""
  from support import require_tensorflow  # pylint: disable=g-import-not-at-top
  require_tensorflow()
  from prvr_jax.data import synthetic  # pylint: disable=g-import-not-at-top
  folder = shared_folder(tmp_path_factory, 'tiny_data',
                         lambda folder: synthetic.ensure('tiny', str(folder), seed=0))
  return synthetic.ensure('tiny', str(folder), seed=0)


@pytest.fixture(scope='session')
def config_path(tmp_path_factory) -> str:
  """A config file of `TINY_CONFIG`."""
  folder = shared_folder(tmp_path_factory, 'tiny_config',
                         lambda folder: (folder / 'tiny_config.py').write_text(TINY_CONFIG))
  return str(folder / 'tiny_config.py')


@pytest.fixture(scope='session')
def reference_run(tmp_path_factory, config_path, tiny_data, xla_cache) -> pathlib.Path:
  """An uninterrupted tiny run of `TINY_CONFIG` on one device, trained once per pytest run
  (tests only read it); with matplotlib it draws its pictures at the end
  (`config.train.plots`)."""
  from support import run_cli  # pylint: disable=g-import-not-at-top
  plots = importlib.util.find_spec('matplotlib') is not None
  return shared_folder(tmp_path_factory, 'reference', lambda workdir: run_cli(
      'train.py', f'--config={config_path}', f'--config.data.dir={tiny_data}',
      f'--workdir={workdir}', f'--config.train.plots={plots}', cache_dir=xla_cache))


# ----------------------------------------------------------------------------- xdist
# `pytest -n 2` (README) runs in 2 workers, each given one work unit at a time by
# `UnitScheduling`: a test file, or one value of a file's module-scoped parametrized fixture
# (one model of the contract test). The longest units go first, so that the last ones, which
# one worker runs while the other has nothing left, are short.

# A slow test counts as `SLOW_WEIGHT` others: one marked `slow` (a whole training in the test
# process, many large compiles), or one that runs the real CLIs or reads their trained run.
SLOW_FIXTURES = ('xla_cache', 'reference_run')
SLOW_WEIGHT = 20


def _is_slow(item: pytest.Item) -> bool:
  return (item.get_closest_marker('slow') is not None
          or any(name in item.fixturenames for name in SLOW_FIXTURES))


def _work_unit(item: pytest.Item) -> str:
  """The test's file, with the value of each module-scoped parametrized fixture it uses (such a
  fixture is set up once per value, so its values can go to different workers)."""
  file = item.nodeid.split('::', 1)[0]
  callspec = getattr(item, 'callspec', None)
  if callspec is None:
    return file
  values = [f'{name}={callspec.params[name]}' for name in sorted(callspec.params)
            if name in item._fixtureinfo.name2fixturedefs  # pylint: disable=protected-access
            and item._fixtureinfo.name2fixturedefs[name][-1].scope == 'module']  # pylint: disable=protected-access
  # A short name (it is appended to the test ids) without ']' (xdist reads a group after the last).
  return '::'.join([item.path.name, *values]) if values else file


@pytest.hookimpl(tryfirst=True)  # before xdist's hook, which reads the `xdist_group` marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
  """Orders the work units by their weight (tests, slow ones counting `SLOW_WEIGHT`),
  heaviest first, and marks the units that are not whole files with
  `xdist_group` for `UnitScheduling`."""
  units: dict[str, list[pytest.Item]] = {}
  for item in items:
    units.setdefault(_work_unit(item), []).append(item)
  weight = lambda unit: sum(SLOW_WEIGHT if _is_slow(i) else 1 for i in units[unit])
  items[:] = [item for unit in sorted(units, key=weight, reverse=True) for item in units[unit]]
  for unit, unit_items in units.items():
    if '::' in unit:
      for item in unit_items:
        item.add_marker(pytest.mark.xdist_group(unit))


def pytest_xdist_make_scheduler(config: pytest.Config, log):
  """With `--dist loadgroup` (setup.cfg): work units in collection order (`--no-loadscope-reorder`),
  each a file or an `xdist_group` (see `pytest_collection_modifyitems`)."""
  if config.getvalue('dist') != 'loadgroup':
    return None
  from xdist.scheduler import LoadGroupScheduling  # pylint: disable=g-import-not-at-top

  class UnitScheduling(LoadGroupScheduling):

    def _split_scope(self, nodeid: str) -> str:
      if nodeid.rfind('@') > nodeid.rfind(']'):  # xdist appended the test's group
        return nodeid.rsplit('@', 1)[-1]
      return nodeid.split('::', 1)[0]

  return UnitScheduling(config, log)
