"""Programs with host callbacks in the persistent compilation cache
(`prvr_jax.runtime.host_callback_cache`)."""

import jax
import jax.numpy as jnp
import numpy as np

from prvr_jax.runtime import host_callback_cache


def _doubled_on_the_host(x):
  return (np.asarray(x) * 2).astype(np.float32)


def _program(offset):
  @jax.jit
  def f(x):
    y = jax.pure_callback(_doubled_on_the_host, jax.ShapeDtypeStruct(x.shape, jnp.float32), x)
    return y + offset
  return f


def test_a_program_with_a_host_callback_is_written_once_then_loaded(persistent_compilation_cache,
                                                                    monkeypatch):
  """The session's cache (conftest.py): the first compile writes an entry under JAX's key with
  the suffix; a fresh jit of the same program loads it, with its own callback, and computes
  the same; another program is compiled."""
  from jax._src import compiler  # pylint: disable=g-import-not-at-top
  assert host_callback_cache.install() and host_callback_cache.install()  # idempotent
  x = jnp.arange(5.0)
  compiles = []  # of programs with host callbacks
  compile_and_load = compiler.backend_compile_and_load

  def counted(backend, computation, devices, options, host_callbacks):
    compiles.extend([1] if host_callbacks else [])
    return compile_and_load(backend, computation, devices, options, host_callbacks)
  monkeypatch.setattr(compiler, 'backend_compile_and_load', counted)
  before = {p.name for p in persistent_compilation_cache.iterdir()}
  offset = float(np.random.default_rng().integers(1, 2**20))  # a program no run cached before
  np.testing.assert_array_equal(_program(offset)(x), 2 * np.arange(5.0) + offset)
  written = {p.name for p in persistent_compilation_cache.iterdir()} - before
  assert len(compiles) == 1
  assert any(host_callback_cache.SUFFIX in name for name in written), written
  jax.clear_caches()  # as a new process: nothing compiled in memory
  np.testing.assert_array_equal(_program(offset)(x), 2 * np.arange(5.0) + offset)
  assert len(compiles) == 1  # loaded, not compiled
  np.testing.assert_array_equal(_program(offset + 1)(x), 2 * np.arange(5.0) + offset + 1)
  assert len(compiles) == 2
