"""evaluate.py's outputs: written atomically without following links, and published together."""

import hashlib
import json
import os

import numpy as np
import pytest

from prvr_jax import files
from prvr_jax.eval import EvalResult, write_outputs


def _result(value: float) -> EvalResult:
  return EvalResult({'sumr': value}, np.full((3, 2), value, np.float32), np.ones(3, np.int64))


def test_links_planted_in_the_output_folder_are_replaced_not_followed(tmp_path):
  out, outside = tmp_path / 'out', tmp_path / 'outside'
  out.mkdir()
  outside.mkdir()
  for name in ('scores.npy', 'metrics.json', 'metrics.json.tmp', 'scores.npy.tmp'):
    (outside / name).write_text('precious')
    os.symlink(outside / name, out / name)
  write_outputs(str(out), _result(1.0), {'split': 'test'})
  assert all((outside / n).read_text() == 'precious' for n in os.listdir(outside))
  assert not (out / 'scores.npy').is_symlink() and not (out / 'metrics.json').is_symlink()
  np.testing.assert_array_equal(np.load(out / 'scores.npy'), _result(1.0).scores)
  assert json.loads((out / 'metrics.json').read_text())['split'] == 'test'


def test_outputs_appear_together_or_not_at_all(tmp_path, monkeypatch):
  out = tmp_path / 'out'
  write_outputs(str(out), _result(1.0), {'split': 'val'})
  metrics = json.loads((out / 'metrics.json').read_text())
  assert metrics['scores_sha256'] == hashlib.sha256((out / 'scores.npy').read_bytes()).hexdigest()

  # Interrupted after the new scores are in place: no metrics.json presents them as a result.
  replace = os.replace
  calls = []

  def interrupted_replace(src, dst):
    calls.append(dst)
    if len(calls) == 2:
      raise KeyboardInterrupt  # e.g. SIGTERM's handler
    replace(src, dst)

  monkeypatch.setattr(os, 'replace', interrupted_replace)
  with pytest.raises(KeyboardInterrupt):
    write_outputs(str(out), _result(2.0), {'split': 'test'})
  monkeypatch.undo()
  assert not (out / 'metrics.json').exists()
  assert sorted(os.listdir(out)) == ['.evaluate.lock', 'scores.npy']  # no temporary file left

  # Interrupted while writing (before any rename): the old complete set stays.
  write_outputs(str(out), _result(1.0), {'split': 'val'})

  def failing_writer(f):
    raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    files.publish(str(out), {'scores.npy': files.npy_writer(np.zeros(3)),
                             'metrics.json': failing_writer}, marker='metrics.json')
  assert json.loads((out / 'metrics.json').read_text())['split'] == 'val'
  np.testing.assert_array_equal(np.load(out / 'scores.npy'), _result(1.0).scores)
  assert sorted(os.listdir(out)) == ['.evaluate.lock', 'metrics.json', 'scores.npy']


def test_provenance_names_checkpoint_step_parameters_config_and_data():
  import support  # pylint: disable=g-import-not-at-top
  from prvr_jax import config_lib  # pylint: disable=g-import-not-at-top
  from prvr_jax.eval import outputs  # pylint: disable=g-import-not-at-top
  config = support.load_config('gmmformer', 'tiny')
  info = {'source': 'prvr_jax', 'path': '/w/best/6', 'workdir': '/w', 'step': 6,
          'data': {'collection': 'a'}, 'params_sha256': 'f' * 64}
  got = outputs.provenance(config, info, {'collection': 'b'})
  assert got == {'checkpoint': '/w/best/6', 'checkpoint_source': 'prvr_jax',
                 'checkpoint_step': 6, 'params_sha256': 'f' * 64, 'model': 'gmmformer',
                 'model_config_hash': got['model_config_hash'],
                 'config_sha256': config_lib.config_fingerprint(config),
                 'data': {'collection': 'b'}, 'trained_on': {'collection': 'a'}}
  assert len(got['model_config_hash']) == 16
  # A source that records no step or parameter digest (an index): None, not absent.
  index = outputs.provenance(config, {'source': 'index', 'path': '/i', 'data': None}, {})
  assert index['checkpoint_step'] is None and index['params_sha256'] is None
