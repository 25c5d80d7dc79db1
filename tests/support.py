"""Float comparisons for the test suite whose tolerances scale with the values compared.

float32 results differ in their last bits between CPU kinds (AVX2, AVX-512, AMX: other vector
widths, other oneDNN / Eigen / XLA tilings, FMA or not) and GPUs, because the terms of every
reduction are summed in another order. Those differences are relative to the magnitude of the
values, so a bare absolute tolerance that passes for values of magnitude 1 fails for values of
magnitude 10. See docs/testing.md.
"""

import math

import numpy as np

F32_EPS = float(np.finfo(np.float32).eps)  # 2**-23 ~ 1.19e-7


def f32_rtol(reduction_length: int, ops: int = 1) -> float:
  """A relative tolerance for float32 results: `10 * ops * sqrt(reduction_length) * F32_EPS`.

  Each of `ops` chained reductions of `reduction_length` terms (a matmul's contraction, a
  softmax or LayerNorm over an axis, a mean) may round differently on another CPU kind or on
  GPU; the rounding error of a sum of n terms grows like sqrt(n) * eps relative to the
  operands' magnitude. The factor 10 is a safety margin. Elementwise-only results use
  `reduction_length=1`.
  """
  return 10 * ops * math.sqrt(reduction_length) * F32_EPS


def assert_close(actual, expected, rtol: float, *, scale=None, err_msg: str = '') -> None:
  """Asserts equal shapes and `|actual - expected| <= rtol * (|expected| + scale)` elementwise.

  `scale` is the magnitude of the values compared, a scalar. By default it is `max|expected|`
  over the whole (finite part of the) array, so entries near 0 -- produced by cancellation, or
  a softmax's small weights -- are held to `rtol` of the array's magnitude rather than to a
  relative error of their own, which rounding cannot meet. Pass `scale` when the magnitude of
  the rounding error is set by something else (the operands of a difference, the terms of a
  sum, a learning rate). Only when `scale` is not passed and `expected` is all zero (or empty)
  is `scale` taken as 1.0: then `|actual| <= rtol` is required. An explicit `scale=0` makes the
  check purely relative.
  """
  actual = np.asarray(actual, np.float64)
  expected = np.asarray(expected, np.float64)
  assert actual.shape == expected.shape, f'{err_msg} shapes {actual.shape} != {expected.shape}'
  if scale is None:
    finite = np.abs(expected[np.isfinite(expected)])
    scale = float(finite.max()) if finite.size else 0.0
    if scale == 0.0:
      scale = 1.0
  np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * float(scale),
                             err_msg=err_msg)
