"""The run directory: one run at a time, torn metric logs, and what a resumed run may change."""

import json
import logging
import os

import pytest

from prvr_jax import train
from prvr_jax.train import logs
from prvr_jax.train import workdir as workdir_lib
import support


def test_a_second_run_on_a_locked_workdir_is_refused_naming_the_first(tmp_path):
  support.require_tensorflow()
  with workdir_lib.lock(str(tmp_path)):
    holder = json.loads((tmp_path / workdir_lib.LOCK_FILE).read_text())
    assert holder['pid'] == os.getpid()
    with pytest.raises(workdir_lib.WorkdirBusyError, match=rf'in use by another training run '
                       rf'\(.*"pid": {os.getpid()}'):
      with workdir_lib.lock(str(tmp_path)):
        pass
    config = support.load_config('gmmformer', 'tiny')
    with pytest.raises(workdir_lib.WorkdirBusyError, match='use another --workdir'):
      train.train_and_evaluate(config, str(tmp_path))
  with workdir_lib.lock(str(tmp_path)):  # released when the first run ends
    pass


def test_a_planted_link_is_not_followed_by_the_lock(tmp_path):
  victim = tmp_path / 'victim'
  victim.write_text('precious')
  os.symlink(victim, tmp_path / workdir_lib.LOCK_FILE)
  with pytest.raises(OSError):
    with workdir_lib.lock(str(tmp_path)):
      pass
  assert victim.read_text() == 'precious'


def test_a_torn_last_metrics_line_is_dropped_and_reported(tmp_path, caplog):
  lines = [json.dumps({'step': s, 'split': 'train', 'loss': 1.0}) for s in (1, 2, 3)]
  (tmp_path / logs.METRICS_FILE).write_text('\n'.join(lines) + '\n{"step": 4, "spl')
  writer = logs.MetricWriter(str(tmp_path), enabled=True)
  with caplog.at_level(logging.WARNING):
    writer.truncate_after(2)
  writer.close()
  assert 'dropped 1 line(s) that are not whole records' in caplog.text
  assert (tmp_path / logs.METRICS_FILE).read_text() == '\n'.join(lines[:2]) + '\n'


def test_config_changes_are_sorted_into_breaking_and_other():
  saved = support.load_config('gmmformer', 'tiny').to_dict()
  config = support.load_config('gmmformer', 'tiny')
  config.train.batch_size = 9            # the data stream
  config.model.dropout = 0.5             # the model
  config.optim.lr = 0.05                 # training, not the stream
  config.train.log_every_steps = 7       # operational: no change at all
  config.data.dir = '/elsewhere'
  breaking, other = workdir_lib.resume_config_changes(saved, config.to_dict())
  assert breaking == ['model.dropout: 0.2 -> 0.5', 'train.batch_size: 8 -> 9']
  assert other == ['optim.lr: 0.0003 -> 0.05']


def test_fields_added_since_a_workdir_was_written_count_as_what_it_did():
  config = support.load_config('gmmformer', 'tiny')
  saved = config.to_dict()
  del saved['data']['placement'], saved['train']['kernels']  # a workdir from before them
  assert workdir_lib.resume_config_changes(saved, config.to_dict()) == ([], [])
  config.data.placement, config.train.kernels = 'device', 'plain'
  assert workdir_lib.resume_config_changes(saved, config.to_dict()) == (
      ["data.placement: 'stream' -> 'device'"], ["train.kernels: 'auto' -> 'plain'"])


@pytest.mark.parametrize('model,added', [('protoprvr', ('model', 'prototype_update')),
                                         ('tmass', ('model', 'noise')),
                                         ('tmass', ('eval', 'tmass_official_leak'))])
def test_a_models_added_field_counts_as_what_it_did_and_only_for_that_model(model, added):
  """A field added to one model's config: its workdirs from before resume unchanged; another
  model's workdir is not given the field."""
  config = support.load_config(model, 'tiny')
  saved = config.to_dict()
  del saved[added[0]][added[1]]
  assert workdir_lib.resume_config_changes(saved, config.to_dict()) == ([], [])
  other = support.load_config('gmmformer', 'tiny').to_dict()
  assert workdir_lib.resume_config_changes(other, other) == ([], [])


def test_record_config_keeps_a_history(tmp_path):
  config = support.load_config('gmmformer', 'tiny').to_dict()
  workdir_lib.record_config(str(tmp_path), config, 0, [])
  workdir_lib.record_config(str(tmp_path), config, 6, ['optim.lr: 0.0003 -> 0.05'])
  history = support.read_jsonl(tmp_path / workdir_lib.CONFIG_HISTORY_FILE)
  assert [(h['step'], h['changes']) for h in history] == [
      (0, []), (6, ['optim.lr: 0.0003 -> 0.05'])]
  assert workdir_lib.read_saved_config(str(tmp_path)) == history[-1]['config']


def test_workdir_must_be_new_empty_or_a_workdir(tmp_path):
  support.require_tensorflow()
  home = tmp_path / 'home'
  home.mkdir()
  (home / 'thesis.tex').write_text('precious')
  config = support.load_config('gmmformer', 'tiny')
  with pytest.raises(ValueError, match='non-empty folder that is not a training workdir'):
    train.train_and_evaluate(config, str(home))
  assert os.listdir(home) == ['thesis.tex']
  with pytest.raises(ValueError, match='is a file, not a folder'):
    train.train_and_evaluate(config, str(home / 'thesis.tex'))
  workdir_lib.check_is_workdir(str(tmp_path / 'new'))
  (tmp_path / 'run').mkdir()
  workdir_lib.record_config(str(tmp_path / 'run'), config.to_dict(), 0, [])
  workdir_lib.check_is_workdir(str(tmp_path / 'run'))


def test_checkpoints_written_before_fields_were_added_still_match_their_model():
  """A checkpoint fingerprinted before the probabilistic plug-in's fields (and ProtoPRVR's
  `prototype_update`) existed matches today's config at their added values, and only there."""
  from prvr_jax import checkpoint, models  # pylint: disable=g-import-not-at-top
  for name, added in (('gmmformer', ('probabilistic', 'num_samples', 'support_slots')),
                      ('protoprvr', ('probabilistic', 'num_samples', 'support_slots',
                                     'prototype_update'))):
    config = support.load_config(name, 'tiny')
    spec = models.get_spec(config.model)
    old = config.model.copy_and_resolve_references()
    for n in (added, added[-1:]):  # written before all of them, or before the last one
      older = config.model.copy_and_resolve_references()
      with older.unlocked():
        for key in n:
          del older[key]
      checkpoint.check_fingerprint(checkpoint.model_fingerprint(older, spec), config, spec, 'x')
    checkpoint.check_fingerprint(checkpoint.model_fingerprint(old, spec), config, spec, 'x')
    config.model.probabilistic = True  # not what the old checkpoint trained
    with pytest.raises(checkpoint.CheckpointError, match='holds a checkpoint of model'):
      checkpoint.check_fingerprint(checkpoint.model_fingerprint(older, spec), config, spec, 'x')
