"""Programs with host callbacks in JAX's persistent compilation cache.

JAX writes no cache entry for a program with a host callback: its executable refers to Python
callables (GMMFormer v2's and ProtoPRVR's train steps call the Hungarian matching on the host
through `jax.pure_callback`), so every run and every resume compiled them again. On CPUs and
GPUs such a program refers to each callback by its index in the list the executable is loaded
with, so an executable serialised once can be loaded again with the callbacks of a new lowering
of the same program. `install` wraps JAX's compile-or-load step
(`jax._src.compiler.compile_or_get_cached`) for these programs alone:

* the key is the one JAX computes for the program (its text, devices, compile options, XLA's
  flags, the versions), with `SUFFIX` appended, so that JAX itself never reads such an entry
  without the callbacks;
* an entry is written where JAX would write one (process 0, a compile of at least
  `jax_persistent_cache_min_compile_time_secs`) and loaded with this lowering's callbacks;
* a JAX whose internals differ, auto-PGLE, another backend, or any failure to read or write an
  entry leaves the program to JAX, which compiles it as before.
"""

import functools
import inspect
import logging
import time
from typing import Any

import jax

_log = logging.getLogger(__name__)

SUFFIX = '-host-callbacks'
_PLATFORMS = ('cpu', 'cuda', 'rocm', 'gpu')
_PARAMETERS = ('backend', 'computation', 'devices', 'compile_options', 'host_callbacks',
               'executable_devices')
_MARK = '_prvr_host_callback_cache'


def _internals() -> tuple[Any, Any] | None:
  """(jax._src.compiler, jax._src.compilation_cache) where they have what `install` uses."""
  try:
    from jax._src import compilation_cache  # pylint: disable=g-import-not-at-top
    from jax._src import compiler  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  needed = {compiler: ('compile_or_get_cached', '_get_cache_key', 'backend_compile_and_load'),
            compilation_cache: ('_get_cache', 'compress_executable', 'decompress_executable',
                                'combine_executable_and_time', 'extract_executable_and_time')}
  if not all(hasattr(module, name) for module, names in needed.items() for name in names):
    return None
  parameters = tuple(inspect.signature(compiler.compile_or_get_cached).parameters)
  return (compiler, compilation_cache) if parameters[:6] == _PARAMETERS else None


def install() -> bool:
  """Caches the programs with host callbacks from now on (module docstring); returns whether
  it could (False: this JAX's internals differ, and JAX compiles them as before)."""
  internals = _internals()
  if internals is None:
    return False
  compiler, cache_lib = internals
  original = compiler.compile_or_get_cached
  if getattr(original, _MARK, False):
    return True

  @functools.wraps(original)
  def compile_or_get_cached(backend, computation, devices, compile_options, host_callbacks,
                            executable_devices, *args, **kwargs):
    cached = None
    if host_callbacks and backend.platform in _PLATFORMS and not _pgle():
      cached = _cached(compiler, cache_lib, backend, computation, devices, compile_options,
                       host_callbacks, executable_devices)
    if cached is not None:
      return cached
    return original(backend, computation, devices, compile_options, host_callbacks,
                    executable_devices, *args, **kwargs)

  setattr(compile_or_get_cached, _MARK, True)
  compiler.compile_or_get_cached = compile_or_get_cached
  return True


def _pgle() -> bool:
  config = jax.config
  return bool(getattr(config, 'jax_enable_pgle', False)
              or getattr(config, 'jax_compilation_cache_expect_pgle', False))


def _cached(compiler: Any, cache_lib: Any, backend: Any, computation: Any, devices: Any,
            compile_options: Any, host_callbacks: Any, executable_devices: Any) -> Any:
  """The executable, loaded from the cache or compiled and written to it; None where the
  cache is off or its key cannot be made (JAX then compiles as it would)."""
  try:
    key = compiler._get_cache_key(compile_options, backend, computation, devices)  # pylint: disable=protected-access
    cache = cache_lib._get_cache(backend) if key else None  # pylint: disable=protected-access
  except Exception as e:  # pylint: disable=broad-except
    _log.warning('Persistent compilation cache: no key for a program with host callbacks (%s); '
                 'it is compiled', e)
    return None
  if cache is None:
    return None
  key += SUFFIX
  name = _module_name(computation)
  try:
    entry = cache.get(key)
    if entry is not None:
      serialized, _ = cache_lib.extract_executable_and_time(cache_lib.decompress_executable(entry))
      executable = backend.deserialize_executable(serialized, executable_devices, compile_options,
                                                  host_callbacks=host_callbacks)
      _log.info("Persistent compilation cache hit for '%s' (host callbacks)", name)
      return executable
  except Exception as e:  # pylint: disable=broad-except
    _log.warning("Persistent compilation cache: could not load '%s' (host callbacks): %s; it is "
                 'compiled again', name, e)
  start = time.monotonic()
  executable = compiler.backend_compile_and_load(backend, computation, executable_devices,
                                                 compile_options, host_callbacks)
  seconds = time.monotonic() - start
  if (jax.process_index() == 0
      and seconds >= jax.config.jax_persistent_cache_min_compile_time_secs):
    try:
      serialized = backend.serialize_executable(executable)
      cache.put(key, cache_lib.compress_executable(
          cache_lib.combine_executable_and_time(serialized, int(seconds))))
    except Exception as e:  # pylint: disable=broad-except
      _log.warning("Persistent compilation cache: could not write '%s' (host callbacks): %s",
                   name, e)
  return executable


def _module_name(computation: Any) -> str:
  try:
    return str(computation.operation.attributes['sym_name']).strip('"')
  except Exception:  # pylint: disable=broad-except
    return '<program>'
