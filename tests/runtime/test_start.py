"""`runtime.start`: the compilation cache's folder from the argument, else the program's
`--compilation_cache_dir`, else the default; single-process without the multi-process flags."""

import os
import subprocess
import sys
import time

from absl import flags
import jax
import pytest

from prvr_jax import runtime
from prvr_jax.runtime import compilation_cache


@pytest.fixture
def program(monkeypatch):
  """A program's flags (empty: it called no `define_flags`); `jax.config.update` recorded, not
  applied, and `XLA_FLAGS` restored after the test."""
  flag_values = flags.FlagValues()
  monkeypatch.setattr(flags, 'FLAGS', flag_values)
  monkeypatch.setenv('XLA_FLAGS', '')
  monkeypatch.delenv(compilation_cache.ENV, raising=False)
  calls = []
  monkeypatch.setattr(jax.config, 'update', lambda name, value: calls.append((name, value)))
  return flag_values, calls


def test_the_argument_then_the_flag_then_the_default(program, tmp_path, monkeypatch):
  flag_values, calls = program
  monkeypatch.setattr(compilation_cache, 'DEFAULT_DIR', str(tmp_path / 'default'))
  assert runtime.start('') is None
  assert runtime.start() == str(tmp_path / 'default')  # no --compilation_cache_dir defined
  flags.DEFINE_string(compilation_cache.FLAG, None, 'test', flag_values=flag_values)
  flag_values([''])
  assert runtime.start() == str(tmp_path / 'default')
  flag_values[compilation_cache.FLAG].value = str(tmp_path / 'flag')
  assert runtime.start() == str(tmp_path / 'flag')
  assert runtime.start(str(tmp_path / 'arg')) == str(tmp_path / 'arg')
  assert [value for _, value in calls] == [
      None, str(tmp_path / 'default'), str(tmp_path / 'default'), str(tmp_path / 'flag'),
      str(tmp_path / 'arg')]


def test_xla_defaults_are_set(program):
  del program
  runtime.start('')
  assert os.environ['XLA_FLAGS'] == '--xla_gpu_enable_triton_gemm=false'


def test_seconds_since_process_start_counts_this_process():
  age = runtime.seconds_since_process_start()
  assert age is not None and age > 0
  time.sleep(0.05)
  assert runtime.seconds_since_process_start() >= age
  # A process that sleeps 0.3 s before asking counts that sleep (clock ticks of 10 ms).
  code = ('import time; time.sleep(0.3); from prvr_jax import runtime; '
          'print(runtime.seconds_since_process_start())')
  child = float(subprocess.run([sys.executable, '-c', code], check=True, capture_output=True,
                               text=True).stdout)
  assert 0.28 <= child < 120


def test_a_program_writes_its_metrics_without_importing_keras(tmp_path):
  """`runtime.run` sets `IMPORT_ENVIRONMENT`: the data pipeline's TensorFlow and the metric
  writer's event files then load without Keras (and what Keras pulls in)."""
  code = ('import sys\nfrom prvr_jax import runtime\n'
          'def main(argv):\n'
          '  from prvr_jax.data import pipeline\n'
          '  from prvr_jax.train import logs\n'
          f'  writer = logs.MetricWriter({str(tmp_path)!r}, enabled=True)\n'
          '  writer.write(1, "train", {"loss": 1.0})\n'
          '  writer.close()\n'
          '  print(sorted(m for m in ("keras", "tensorflow") if m in sys.modules))\n'
          'runtime.run(main, huge_pages=False)\n')
  env = {k: v for k, v in os.environ.items() if k not in runtime.IMPORT_ENVIRONMENT}
  env['TF_CPP_MIN_LOG_LEVEL'] = '2'
  out = subprocess.run([sys.executable, '-c', code], check=True, capture_output=True, text=True,
                       env=env).stdout
  assert out.strip().splitlines()[-1] == "['tensorflow']"
  assert len(os.listdir(tmp_path / 'tensorboard')) == 1  # the event file
