"""Session-wide settings and shared fixtures; pytest loads this before any test module.

Helpers that are not fixtures (tolerances, config loading, CLI subprocesses) are in
`support.py`.
"""

import importlib.util
import os
import pathlib
import sys

import pytest

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
# Without a GPU/TPU JAX then runs on these CPU devices. LLVM -O0 compiles the suite's many
# small programs about a third faster (the CLI subprocesses use it too).
_flags = os.environ.get('XLA_FLAGS', '')
if 'xla_force_host_platform_device_count' not in _flags:
  _flags += ' --xla_force_host_platform_device_count=2'
if 'xla_backend_optimization_level' not in _flags:
  _flags += ' --xla_backend_optimization_level=0'
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


@pytest.fixture(scope='session')
def xla_cache(tmp_path_factory) -> pathlib.Path:
  """One persistent compilation cache for the session's single-process CLI runs."""
  return tmp_path_factory.getbasetemp() / 'xla_cache'


@pytest.fixture(scope='session')
def tiny_data(tmp_path_factory) -> str:
  """The tiny synthetic benchmark, generated once (what a run would generate itself)."""
  from support import require_tensorflow  # pylint: disable=g-import-not-at-top
  require_tensorflow()
  from prvr_jax.data import synthetic  # pylint: disable=g-import-not-at-top
  return synthetic.ensure('tiny', str(tmp_path_factory.getbasetemp() / 'tiny_data'), seed=0)


@pytest.fixture(scope='session')
def config_path(tmp_path_factory) -> str:
  """A config file of `TINY_CONFIG`."""
  path = tmp_path_factory.getbasetemp() / 'tiny_config' / 'tiny_config.py'
  path.parent.mkdir(exist_ok=True)
  path.write_text(TINY_CONFIG)
  return str(path)


@pytest.fixture(scope='session')
def reference_run(tmp_path_factory, config_path, tiny_data, xla_cache) -> pathlib.Path:
  """An uninterrupted tiny run of `TINY_CONFIG` on one device (tests only read it); with
  matplotlib it draws its pictures at the end (`config.train.plots`)."""
  from support import run_cli  # pylint: disable=g-import-not-at-top
  workdir = tmp_path_factory.mktemp('reference')
  plots = importlib.util.find_spec('matplotlib') is not None
  run_cli('train.py', f'--config={config_path}', f'--config.data.dir={tiny_data}',
          f'--workdir={workdir}', f'--config.train.plots={plots}', cache_dir=xla_cache)
  return workdir
