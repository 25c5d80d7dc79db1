"""Hands the memory XLA's compiler freed back to the operating system after every compile.

Compiling a train step, XLA allocates some hundreds of MB in small pieces and frees them when
it is done. glibc's malloc keeps the freed pages in its arenas, and the step's own buffers
(large allocations, mapped apart from the arenas) never reuse them, so without a trim a
training process holds the compiler's high-water mark on top of the step's memory for the rest
of its life. `trim_after_compiles()` ends every XLA backend compile with glibc's
`malloc_trim(0)`. train.py, evaluate.py and the benchmarks turn it on; measured in
docs/training.md ("Memory after compiling").
"""

from collections.abc import Callable
import ctypes
import ctypes.util
import functools
from typing import Any

import jax

# What JAX records (`jax.monitoring`) when XLA has compiled a program (jax/_src/dispatch.py).
BACKEND_COMPILE_EVENT = '/jax/core/compile/backend_compile_duration'


def glibc_malloc_trim() -> Callable[[int], int] | None:
  """glibc's `malloc_trim`, or None where the C library has none (macOS, musl)."""
  try:
    return ctypes.CDLL(ctypes.util.find_library('c')).malloc_trim
  except (OSError, AttributeError, TypeError):
    return None


def trim_listener(trim: Callable[[int], Any]) -> Callable[..., None]:
  """A `jax.monitoring` duration listener that calls `trim(0)` after each backend compile."""

  def listener(event: str, duration_secs: float, **kwargs: Any) -> None:
    del duration_secs, kwargs
    if event == BACKEND_COMPILE_EVENT:
      trim(0)

  return listener


@functools.cache
def trim_after_compiles() -> bool:
  """From now on, every XLA compile in this process ends with `malloc_trim(0)`; idempotent.
  Returns False (and does nothing) without glibc."""
  trim = glibc_malloc_trim()
  if trim is None:
    return False
  jax.monitoring.register_event_duration_secs_listener(trim_listener(trim))
  return True
