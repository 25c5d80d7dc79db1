"""Host memory of a training process: the compiler's freed heap, and huge pages for the step.

* `trim_after_compiles()`: hands the memory XLA's compiler freed back to the operating system
  after every compile.
* `restart_with_huge_page_malloc()`: backs glibc's large blocks with transparent huge pages.

Compiling a train step, XLA allocates much memory in small pieces and frees it when it is
done. glibc's malloc keeps the freed pages in its arenas, and the step's own buffers
(large allocations, mapped apart from the arenas) never reuse them, so without a trim a
training process holds the compiler's high-water mark on top of the step's memory for the rest
of its life. `trim_after_compiles()` ends every XLA backend compile with glibc's
`malloc_trim(0)`. `prvr_jax.runtime.start` turns it on (docs/training.md, "Memory after
compiling").

On a CPU backend every large buffer of a step (XLA's outputs and temporaries) is a fresh
`mmap` that glibc unmaps when it is freed, so each step faults in every page it writes, 4 KiB
at a time, and the kernel zeroes each one. With the kernel's transparent huge pages in
`madvise` mode (the common default), glibc's `glibc.malloc.hugetlb=1` tunable asks for 2 MiB
pages for those mappings: 512 times fewer faults. glibc reads tunables only when a process
starts, so `restart_with_huge_page_malloc()` re-executes the script with the tunable set.
`prvr_jax.runtime.run` does so (docs/training.md, "Huge pages for the step's buffers").
"""

from collections.abc import Callable, Mapping
import ctypes
import ctypes.util
import functools
import os
import re
import sys
from typing import Any

import jax

GLIBC_TUNABLES = 'GLIBC_TUNABLES'
HUGE_PAGE_MALLOC = 'glibc.malloc.hugetlb=1'
THP_MODE_FILE = '/sys/kernel/mm/transparent_hugepage/enabled'
# The first glibc with the `glibc.malloc.hugetlb` tunable.
HUGE_PAGE_GLIBC = (2, 35)

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


def transparent_huge_page_mode(path: str = THP_MODE_FILE) -> str | None:
  """The kernel's transparent-huge-page mode ('always', 'madvise' or 'never'); None where the
  kernel has none (not Linux) or does not say."""
  try:
    with open(path, encoding='ascii') as f:
      chosen = re.search(r'\[(\w+)\]', f.read())
  except OSError:
    return None
  return chosen.group(1) if chosen else None


def glibc_version() -> tuple[int, int] | None:
  """(major, minor) of the running glibc; None with another C library."""
  try:
    name, version = os.confstr('CS_GNU_LIBC_VERSION').split()  # e.g. 'glibc 2.36'
    major, minor = version.split('.')[:2]
    return (int(major), int(minor)) if name == 'glibc' else None
  except (AttributeError, OSError, ValueError):
    return None


def with_huge_page_malloc(environ: Mapping[str, str], thp_mode: str | None,
                          glibc: tuple[int, int] | None) -> dict[str, str] | None:
  """`environ` with `HUGE_PAGE_MALLOC` added to `GLIBC_TUNABLES`, or None where that would
  change nothing: the kernel's mode is not 'madvise' ('always' gives huge pages without asking,
  'never' refuses them), the C library is not a glibc that has the tunable, or
  `GLIBC_TUNABLES` already sets it (the user's choice wins: `glibc.malloc.hugetlb=0` opts out).
  """
  tunables = environ.get(GLIBC_TUNABLES, '')
  if (thp_mode != 'madvise' or glibc is None or glibc < HUGE_PAGE_GLIBC
      or re.search(r'(^|:)glibc\.malloc\.hugetlb=', tunables)):
    return None
  return {**environ, GLIBC_TUNABLES: ':'.join(filter(None, [tunables, HUGE_PAGE_MALLOC]))}


def huge_page_environ(environ: Mapping[str, str]) -> dict[str, str] | None:
  """`with_huge_page_malloc` for this machine's kernel and C library."""
  return with_huge_page_malloc(environ, transparent_huge_page_mode(), glibc_version())


def restart_with_huge_page_malloc() -> None:
  """Re-executes this process (same interpreter, options and arguments; same pid) with
  `huge_page_environ`'s environment where that changes anything, else returns. Call it first
  in a script's `if __name__ == '__main__':` block, before any device starts.
  """
  environ = huge_page_environ(os.environ)
  if environ is None or not sys.executable:
    return
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environ)
