"""JAX's persistent compilation cache, on by default in the command-line programs.

A second run, a resume and a re-evaluation of the same config load their compiled programs
from the cache instead of compiling them again (docs/training.md, "Compilation cache"). The
folder is `--compilation_cache_dir`; without the flag, `$JAX_COMPILATION_CACHE_DIR` where it is
set (set and empty: off), else `DEFAULT_DIR`. `--compilation_cache_dir=` turns it off.

JAX writes no entry for a program that compiled in under
`jax_persistent_cache_min_compile_time_secs` (1 s by default), nor for one with a host callback;
`enable` also caches the latter (GMMFormer v2's and ProtoPRVR's train steps, whose Hungarian
matching runs on the host through `jax.pure_callback`) through `host_callback_cache`. On GPUs
JAX also keeps XLA's autotuning results in the folder.
"""

import os

from absl import flags
from absl import logging
import jax

from prvr_jax.runtime import host_callback_cache

DEFAULT_DIR = os.path.join(os.environ.get('XDG_CACHE_HOME') or os.path.join('~', '.cache'),
                           'prvr_jax', 'jax_compilation_cache')
ENV = 'JAX_COMPILATION_CACHE_DIR'
FLAG = 'compilation_cache_dir'


def define_flags() -> None:
  """Defines `--compilation_cache_dir` (`prvr_jax.runtime.define_flags`)."""
  flags.DEFINE_string(
      FLAG, None,
      'Folder of the persistent compilation cache, so that later runs of the same config skip '
      f'compilation; default ${ENV} where set, else {DEFAULT_DIR}. Empty: off. Off by default '
      'in multi-process runs on CPU.')


def enable(path: str | None = None, multi_process_cpu: bool = False) -> str | None:
  """Turns the cache on at `path` (None: the default described in the module docstring).

  `multi_process_cpu`: the run is several processes on CPU devices, where the default is off
  (processes of one gloo job sharing a cache have hung). Returns the folder, or None when off.
  """
  if path is None:
    if ENV in os.environ:
      path = os.environ[ENV]
    elif not multi_process_cpu:
      path = DEFAULT_DIR
  if not path:
    jax.config.update('jax_compilation_cache_dir', None)
    return None
  path = os.path.abspath(os.path.expanduser(path))
  try:
    os.makedirs(path, exist_ok=True)
  except OSError as e:
    raise ValueError(f'--compilation_cache_dir={path}: cannot create the folder ({e}); pass '
                     'another folder, or --compilation_cache_dir= to turn the cache off.') from e
  jax.config.update('jax_compilation_cache_dir', path)
  callbacks = host_callback_cache.install()
  logging.info('Persistent compilation cache: %s%s', path,
               '' if callbacks else ' (programs with host callbacks are compiled every run: '
               "this JAX's internals differ from what prvr_jax.runtime.host_callback_cache knows)")
  return path

