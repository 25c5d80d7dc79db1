"""XLA flags that train.py and evaluate.py set by default, unless `XLA_FLAGS` sets them.

* `--xla_gpu_enable_triton_gemm=false`: on GPUs, matmuls go to cuBLAS instead of Triton GEMM
  fusions, so XLA does not autotune a Triton kernel for each of the step's ~200 matmuls.
  Measured by the GPU issue on one H100 (JAX 0.11.2, CUDA 13), GMMFormer v2 at TVR dims: the
  train step compiles in 28 s instead of 218 s at 16 videos (23 s instead of 232 s at 128), and
  runs in 15.6 ms instead of 18.1 ms (79 instead of 82 ms), with 11% more peak device memory at
  128 videos. Our H100 run in float32: 28-35 s with it, 180 s without (docs/benchmarks.md).
  CPUs ignore it.

A user's own setting always wins: `XLA_FLAGS=--xla_gpu_enable_triton_gemm=true python train.py
...` keeps Triton. XLA reads `XLA_FLAGS` once, when the first backend starts, so `apply()` must
run before anything touches a device.
"""

import os
import re

DEFAULTS = {'xla_gpu_enable_triton_gemm': 'false'}
ENV = 'XLA_FLAGS'


def with_defaults(xla_flags: str) -> str:
  """`xla_flags` (an `XLA_FLAGS` value) with every `DEFAULTS` flag it does not set appended."""
  missing = [f'--{name}={value}' for name, value in DEFAULTS.items()
             if not re.search(rf'--{name}(=|\s|$)', xla_flags)]
  return ' '.join([xla_flags.strip(), *missing]).strip()


def apply() -> str:
  """Adds the defaults to `os.environ['XLA_FLAGS']` (call before any device use); returns it."""
  os.environ[ENV] = with_defaults(os.environ.get(ENV, ''))
  return os.environ[ENV]
