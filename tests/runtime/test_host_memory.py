"""Host memory (prvr_jax.runtime.host_memory): the compile-time heap trim, huge-page malloc."""

import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

import support
from prvr_jax.runtime import host_memory


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


def test_huge_page_malloc_is_added_only_where_it_changes_something():
  glibc = (2, 36)
  added = host_memory.with_huge_page_malloc({'HOME': '/root'}, 'madvise', glibc)
  assert added == {'HOME': '/root', 'GLIBC_TUNABLES': 'glibc.malloc.hugetlb=1'}
  assert host_memory.with_huge_page_malloc(
      {'GLIBC_TUNABLES': 'glibc.malloc.arena_max=2'}, 'madvise', glibc) == {
          'GLIBC_TUNABLES': 'glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1'}
  # The user's own setting wins, also an opt-out; a tunable whose name merely ends alike not.
  assert host_memory.with_huge_page_malloc(
      {'GLIBC_TUNABLES': 'glibc.malloc.hugetlb=0'}, 'madvise', glibc) is None
  assert host_memory.with_huge_page_malloc(
      {'GLIBC_TUNABLES': 'x.glibc.malloc.hugetlb=0'}, 'madvise', glibc) is not None
  for mode in ('always', 'never', None):
    assert host_memory.with_huge_page_malloc({}, mode, glibc) is None
  assert host_memory.with_huge_page_malloc({}, 'madvise', (2, 34)) is None
  assert host_memory.with_huge_page_malloc({}, 'madvise', None) is None


def test_transparent_huge_page_mode_reads_the_bracketed_choice(tmp_path):
  mode_file = tmp_path / 'enabled'
  mode_file.write_text('always [madvise] never\n', encoding='ascii')
  assert host_memory.transparent_huge_page_mode(str(mode_file)) == 'madvise'
  assert host_memory.transparent_huge_page_mode(str(tmp_path / 'absent')) is None


RESTART_SCRIPT = """
import json, os, sys
from prvr_jax.runtime import host_memory
host_memory.restart_with_huge_page_malloc()
print(json.dumps({'pid': os.getpid(), 'argv': sys.argv,
                  'tunables': os.environ.get('GLIBC_TUNABLES')}), flush=True)
"""


@pytest.mark.parametrize('tunables', [None, 'glibc.malloc.hugetlb=0'])
def test_restart_re_executes_once_with_the_same_pid_and_arguments(tmp_path, tunables):
  script = tmp_path / 'script.py'
  script.write_text(RESTART_SCRIPT, encoding='utf-8')
  env = {key: value for key, value in support.subprocess_env().items()
         if key != 'GLIBC_TUNABLES'}
  if tunables is not None:
    env['GLIBC_TUNABLES'] = tunables
  expected = host_memory.huge_page_environ(env) or env
  child = subprocess.Popen([sys.executable, '-u', str(script), '--flag=a b', 'x'], env=env,
                           stdout=subprocess.PIPE, text=True)
  out, _ = child.communicate(timeout=120)
  assert child.returncode == 0
  lines = out.splitlines()
  assert len(lines) == 1, out  # restarted at most once
  seen = json.loads(lines[0])
  assert seen['pid'] == child.pid
  assert seen['argv'] == [str(script), '--flag=a b', 'x']
  assert seen['tunables'] == expected.get('GLIBC_TUNABLES')
