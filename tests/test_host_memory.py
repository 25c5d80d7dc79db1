"""The compile-time heap trim (prvr_jax.host_memory)."""

import jax
import jax.numpy as jnp

from prvr_jax import host_memory


def test_listener_trims_after_backend_compiles_only():
  calls = []
  listener = host_memory.trim_listener(calls.append)
  listener('/jax/compilation_cache/compile_time_saved_sec', 1.0)
  assert not calls
  listener(host_memory.BACKEND_COMPILE_EVENT, 2.5, fun_name='step')
  assert calls == [0]


def test_jax_reports_each_backend_compile_under_the_event_we_listen_for():
  """Guards against JAX renaming the event, which would silently turn the trim off."""
  events = []

  def record(event, duration_secs, **kwargs):
    del kwargs
    events.append((event, duration_secs))

  jax.monitoring.register_event_duration_secs_listener(record)
  try:
    jax.jit(lambda x: jnp.sin(x) * 3.0 + 0.123456)(jnp.arange(7.0)).block_until_ready()
  finally:
    jax.monitoring.unregister_event_duration_listener(record)
  compiles = [seconds for event, seconds in events if event == host_memory.BACKEND_COMPILE_EVENT]
  assert compiles and all(seconds >= 0 for seconds in compiles)


def test_trim_after_compiles_is_idempotent_and_finds_glibc_on_linux():
  first = host_memory.trim_after_compiles()
  assert host_memory.trim_after_compiles() is first
  assert first == (host_memory.glibc_malloc_trim() is not None)
  if first:
    assert host_memory.glibc_malloc_trim()(0) in (0, 1)
