"""The XLA flags command-line programs set by default (prvr_jax.runtime.xla)."""

import os
import subprocess
import sys

from prvr_jax.runtime import xla


def test_defaults_are_appended_to_what_the_user_set():
  assert xla.with_defaults('') == '--xla_gpu_enable_triton_gemm=false'
  assert (xla.with_defaults(' --xla_force_host_platform_device_count=2 ')
          == '--xla_force_host_platform_device_count=2 --xla_gpu_enable_triton_gemm=false')


def test_a_flag_the_user_set_is_kept_as_set():
  for user in ('--xla_gpu_enable_triton_gemm=true', '--xla_gpu_enable_triton_gemm',
               '--xla_gpu_enable_triton_gemm=true --xla_backend_optimization_level=0'):
    assert xla.with_defaults(user) == user
  # Another flag whose name starts with the same words is not the same flag.
  assert xla.with_defaults('--xla_gpu_enable_triton_gemm_int4=false').endswith(
      '--xla_gpu_enable_triton_gemm=false')


def test_apply_sets_the_environment(monkeypatch):
  monkeypatch.setenv('XLA_FLAGS', '--xla_backend_optimization_level=0')
  assert xla.apply() == os.environ['XLA_FLAGS']
  assert os.environ['XLA_FLAGS'] == ('--xla_backend_optimization_level=0 '
                                     '--xla_gpu_enable_triton_gemm=false')


def test_this_xla_accepts_the_defaults():
  """XLA aborts the process on a flag it does not know; the defaults must parse here too."""
  code = 'import jax, jax.numpy as jnp; print(float((jnp.ones(3) + 1).sum()))'
  env = {**os.environ, 'XLA_FLAGS': xla.with_defaults('')}
  done = subprocess.run([sys.executable, '-c', code], env=env, capture_output=True, text=True,
                        timeout=120, check=False)
  assert done.returncode == 0, done.stderr[-2000:]
  assert done.stdout.strip().splitlines()[-1] == '6.0'
