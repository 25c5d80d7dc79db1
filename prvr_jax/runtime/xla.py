"""XLA flags that the command-line programs set by default, unless `XLA_FLAGS` sets them.

* `--xla_gpu_enable_triton_gemm=false`: on GPUs, matmuls go to cuBLAS instead of Triton GEMM
  fusions, so XLA does not autotune a Triton kernel for each of the step's matmuls: the step
  compiles several times faster, runs a little faster and takes a little more device memory
  (docs/benchmarks.md). CPUs ignore it.

A user's own setting always wins: `XLA_FLAGS=--xla_gpu_enable_triton_gemm=true python train.py
...` keeps Triton. XLA reads `XLA_FLAGS` once, when the first backend starts, so `apply()` must
run before anything touches a device.
"""

import os
import re

DEFAULTS = {'xla_gpu_enable_triton_gemm': 'false'}
ENV = 'XLA_FLAGS'


def sets(name: str, xla_flags: str | None = None) -> bool:
  """Whether `xla_flags` (an `XLA_FLAGS` value; None: the environment's) sets `--name`."""
  xla_flags = os.environ.get(ENV, '') if xla_flags is None else xla_flags
  return re.search(rf'--{name}(=|\s|$)', xla_flags) is not None


def with_defaults(xla_flags: str) -> str:
  """`xla_flags` (an `XLA_FLAGS` value) with every `DEFAULTS` flag it does not set appended."""
  missing = [f'--{name}={value}' for name, value in DEFAULTS.items()
             if not sets(name, xla_flags)]
  return ' '.join([xla_flags.strip(), *missing]).strip()


def apply() -> str:
  """Adds the defaults to `os.environ['XLA_FLAGS']` (call before any device use); returns it."""
  os.environ[ENV] = with_defaults(os.environ.get(ENV, ''))
  return os.environ[ENV]
