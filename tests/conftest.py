"""Session-wide settings of the test suite; pytest loads this before any test module."""

import os
import sys

# Full float32 matmuls everywhere. On GPUs JAX's default float32 matmul precision is TF32
# (a 10-bit mantissa, ~1e-3 relative), which no float32 tolerance of this suite is meant to
# absorb; on CPUs it is float32 already. float32 is also what training and evaluation use by
# default (`config.train.matmul_precision`, `config.eval.matmul_precision`). Set in the
# environment, before jax is imported, so that the CLI subprocesses of test_train.py,
# test_multihost.py, test_evaluate.py, test_matching.py and test_convert.py (which copy
# os.environ) inherit it too. A value set by the caller is kept.
os.environ.setdefault('JAX_DEFAULT_MATMUL_PRECISION', 'float32')
if 'jax' in sys.modules:  # imported by a plugin before this file: set it there too
  sys.modules['jax'].config.update('jax_default_matmul_precision',
                                   os.environ['JAX_DEFAULT_MATMUL_PRECISION'])
