"""Where train.py and evaluate.py keep compiled programs: the flag wins, then the environment
(empty: off), then the default folder, which multi-process CPU runs do not get. (That the train
step really comes from the cache is checked by test_train.py's resumed run.)"""

import jax
import pytest

from prvr_jax.runtime import compilation_cache


@pytest.fixture
def updates(monkeypatch):
  """The `jax.config.update` calls of a test (not applied to this process)."""
  calls = []
  monkeypatch.setattr(jax.config, 'update', lambda name, value: calls.append((name, value)))
  monkeypatch.delenv(compilation_cache.ENV, raising=False)
  return calls


def test_flag_then_environment_then_default(updates, monkeypatch, tmp_path):
  assert compilation_cache.enable(str(tmp_path / 'flag')) == str(tmp_path / 'flag')
  assert (tmp_path / 'flag').is_dir()
  monkeypatch.setenv(compilation_cache.ENV, str(tmp_path / 'env'))
  assert compilation_cache.enable() == str(tmp_path / 'env')
  assert compilation_cache.enable(str(tmp_path / 'flag')) == str(tmp_path / 'flag')
  monkeypatch.setenv(compilation_cache.ENV, '')
  assert compilation_cache.enable() is None
  monkeypatch.delenv(compilation_cache.ENV)
  default = compilation_cache.DEFAULT_DIR
  monkeypatch.setattr(compilation_cache, 'DEFAULT_DIR', str(tmp_path / 'default'))
  assert compilation_cache.enable() == str(tmp_path / 'default')
  assert compilation_cache.enable(multi_process_cpu=True) is None
  assert compilation_cache.enable(str(tmp_path / 'flag'), multi_process_cpu=True)
  assert compilation_cache.enable('') is None
  assert [value for _, value in updates] == [
      str(tmp_path / 'flag'), str(tmp_path / 'env'), str(tmp_path / 'flag'), None,
      str(tmp_path / 'default'), None, str(tmp_path / 'flag'), None]
  assert {name for name, _ in updates} == {'jax_compilation_cache_dir'}
  assert default.endswith('prvr_jax/jax_compilation_cache')


def test_a_folder_that_cannot_be_made_is_named(updates, tmp_path):
  blocker = tmp_path / 'file'
  blocker.write_text('')
  with pytest.raises(ValueError, match=f'--compilation_cache_dir={blocker}/cache'):
    compilation_cache.enable(str(blocker / 'cache'))
  assert not updates
