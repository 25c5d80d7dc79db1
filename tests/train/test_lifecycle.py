"""The lifecycle of a run: resuming a finished run extends it, does nothing, or is refused,
never claiming in config.json epochs or settings that were not trained; and test_metrics.json
names what produced it. Uses copies of the session's reference run (2 epochs of 3 steps,
finished); one test trains a third epoch."""

import json
import shutil

import pytest

from support import load_config, read_jsonl, run_cli

STEPS_PER_EPOCH, EPOCHS = 3, 2  # the reference run: 24 train videos / batch 8; config 'tiny'


def _meta(**overrides):
  meta = {'epochs_done': 2, 'es_count': 0, 'finished': True}
  return {**meta, **overrides}


def _config(num_epochs=2, patience=100):
  config = load_config('gmmformer', 'tiny')
  config.train.num_epochs, config.train.patience = num_epochs, patience
  return config


def test_resume_plan_of_every_lifecycle_case(tmp_path):
  from prvr_jax.train import loop  # pylint: disable=g-import-not-at-top
  w = str(tmp_path)
  # Unfinished: trains; at its new bound already: tests.
  assert loop._resume_plan(_config(5), _meta(finished=False), w, []) == 'train'
  assert loop._resume_plan(_config(2), _meta(finished=False), w, ['n']) == 'test'
  # Finished, extended: trains the new epochs.
  assert loop._resume_plan(_config(3), _meta(), w, ['train.num_epochs: 2 -> 3']) == 'train'
  # Finished unchanged: nothing to do once its test metrics are there, else tests again.
  assert loop._resume_plan(_config(2), _meta(), w, []) == 'test'
  (tmp_path / 'test_metrics.json').write_text('{}')
  assert loop._resume_plan(_config(2), _meta(), w, []) == 'done'
  # Test-only changes: tested again.
  assert loop._resume_plan(_config(2), _meta(), w, ['eval.score_seed: 0 -> 1']) == 'test'
  # A change that would train nothing, or record fewer epochs than trained: refused.
  with pytest.raises(ValueError, match=r'holds a finished run \(it trained all 2 epochs\), so '
                     r'these changes would train nothing: optim.lr: 1 -> 2\. To train more '
                     r'epochs, resume with --config.train.num_epochs above 2 .*new --workdir\.$'):
    loop._resume_plan(_config(2), _meta(), w, ['optim.lr: 1 -> 2'])
  with pytest.raises(ValueError, match=r'has trained 2 epochs: --config.train.num_epochs=1 '
                     r'would record fewer epochs than were trained.*new --workdir\.$'):
    loop._resume_plan(_config(1), _meta(finished=False), w, ['train.num_epochs: 2 -> 1'])
  # Stopped early: more epochs alone train nothing (the patience stops it again) ...
  early = _meta(es_count=4, epochs_done=6)
  with pytest.raises(ValueError, match=r'it stopped early after 6 epochs \(val SumR did not '
                     r'improve for 4 epochs, more than --config.train.patience=3\).*'
                     r'--config.train.num_epochs above 6 and --config.train.patience of 4 or '
                     r'more, or -1'):
    loop._resume_plan(_config(10, patience=3), early, w, ['train.num_epochs: 6 -> 10'])
  # ... a patience that lets it go on does.
  assert loop._resume_plan(_config(10, patience=-1), early, w, ['p']) == 'train'
  assert loop._resume_plan(_config(10, patience=4), early, w, ['p']) == 'train'


def _copy(reference_run, tmp_path):
  workdir = tmp_path / 'run'
  shutil.copytree(reference_run, workdir)
  return workdir


def _reference_config(reference_run, config_path, tiny_data):
  config = load_config(config_path)
  config.data.dir = tiny_data
  config.train.plots = json.loads((reference_run / 'config.json').read_text())['train']['plots']
  return config


def test_a_finished_run_resumed_unchanged_does_nothing_and_says_so(
    reference_run, config_path, tiny_data, tmp_path, caplog):
  from prvr_jax import train  # pylint: disable=g-import-not-at-top
  workdir = _copy(reference_run, tmp_path)
  before = {name: (workdir / name).read_bytes()
            for name in ('test_metrics.json', 'metrics.jsonl', 'config.json',
                         'config_history.jsonl')}
  config = _reference_config(reference_run, config_path, tiny_data)
  config.train.plots = False  # drawing again would be work to do
  out = train.train_and_evaluate(config, str(workdir))
  assert out == json.loads(before['test_metrics.json'])
  assert 'holds a finished run (it trained all 2 epochs); nothing to train' in caplog.text
  assert {name: (workdir / name).read_bytes() for name in before} == before
  # test_metrics.json of another step than the best checkpoint's is not taken as the result.
  stale = {**json.loads(before['test_metrics.json']), 'step': 1, 'sumr': -1.0}
  (workdir / 'test_metrics.json').write_text(json.dumps(stale))
  out = train.train_and_evaluate(config, str(workdir))
  original = json.loads(before['test_metrics.json'])
  for key in ('step', 'params_sha256', 'config_sha256', 'data', 'num_queries'):
    assert out[key] == original[key], key
  assert out['sumr'] == pytest.approx(original['sumr'])  # this process has 2 devices
  assert json.loads((workdir / 'test_metrics.json').read_text()) == out


def test_changes_to_a_finished_run_that_train_nothing_are_refused(
    reference_run, config_path, tiny_data, tmp_path, xla_cache):
  from prvr_jax import train  # pylint: disable=g-import-not-at-top
  workdir = _copy(reference_run, tmp_path)
  saved = (workdir / 'config.json').read_text()
  history = (workdir / 'config_history.jsonl').read_text()
  config = _reference_config(reference_run, config_path, tiny_data)
  config.optim.lr = 0.5
  with pytest.raises(ValueError, match=r'so these changes would train nothing: optim.lr: '
                     r'0.0003 -> 0.5\. To train more epochs'):
    train.train_and_evaluate(config, str(workdir), allow_config_change=True)
  # Through the CLI: fewer epochs than trained; the last line names the flag at fault.
  proc = run_cli('train.py', f'--config={config_path}', f'--config.data.dir={tiny_data}',
                 f'--workdir={workdir}', '--config.train.num_epochs=1', '--allow_config_change',
                 cache_dir=xla_cache, check=False)
  assert proc.returncode != 0
  last = proc.stderr.strip().splitlines()[-1]
  assert f'{workdir} has trained 2 epochs: --config.train.num_epochs=1 would record' in last
  assert last.endswith('new --workdir.') and 'Traceback' not in proc.stderr
  # A refused resume records nothing.
  assert (workdir / 'config.json').read_text() == saved
  assert (workdir / 'config_history.jsonl').read_text() == history


@pytest.mark.end_to_end
def test_extending_a_finished_run_trains_the_new_epochs(reference_run, config_path, tiny_data,
                                                         xla_cache, tmp_path):
  workdir = _copy(reference_run, tmp_path)
  args = (f'--config={config_path}', f'--config.data.dir={tiny_data}', f'--workdir={workdir}',
          '--config.train.plots=False')
  refused = run_cli('train.py', *args, '--config.train.num_epochs=3', cache_dir=xla_cache,
                    check=False)
  assert refused.returncode != 0
  last = refused.stderr.strip().splitlines()[-1]
  assert 'train.num_epochs: 2 -> 3' in last and '--allow_config_change' in last
  run_cli('train.py', *args, '--config.train.num_epochs=3', '--allow_config_change',
          cache_dir=xla_cache)
  assert sorted((workdir / 'checkpoints').iterdir())[-1].name == str(STEPS_PER_EPOCH * 3)
  records = read_jsonl(workdir / 'metrics.jsonl')
  assert [r['epoch'] for r in records if r['split'] == 'val'] == [0, 1, 2]
  assert [r['step'] for r in records if r['split'] == 'train'] == list(
      range(1, STEPS_PER_EPOCH * 3 + 1))
  assert json.loads((workdir / 'config.json').read_text())['train']['num_epochs'] == 3
  history = read_jsonl(workdir / 'config_history.jsonl')
  assert history[-1]['changes'] == ['train.num_epochs: 2 -> 3']
  assert history[-1]['step'] == STEPS_PER_EPOCH * EPOCHS
  test = json.loads((workdir / 'test_metrics.json').read_text())
  reference = json.loads((reference_run / 'test_metrics.json').read_text())
  assert test['step'] in (reference['step'], STEPS_PER_EPOCH * 3)
  assert test['config_sha256'] != reference['config_sha256']  # 3 epochs are another config


def test_test_metrics_name_what_produced_them(reference_run, config_path, tiny_data):
  from prvr_jax import checkpoint, config_lib, parallel  # pylint: disable=g-import-not-at-top
  from prvr_jax.data import pipeline  # pylint: disable=g-import-not-at-top
  test = json.loads((reference_run / 'test_metrics.json').read_text())
  config = load_config(config_path)
  params, info = checkpoint.load_params(str(reference_run), config, parallel.make_mesh())
  assert info['step'] == test['step']
  assert test['params_sha256'] == checkpoint.tree_digest(params)
  assert test['model'] == 'gmmformer' and len(test['model_config_hash']) == 16
  saved = json.loads((reference_run / 'config.json').read_text())
  assert test['config_sha256'] == config_lib.config_fingerprint(saved)
  assert test['data'] == pipeline.open_shards(tiny_data).identity() == info['data']
  # Where the data lay and how often the run logged do not change the fingerprint.
  config.data.dir, config.train.log_every_steps = '/elsewhere', 7
  config.train.plots = saved['train']['plots']
  assert config_lib.config_fingerprint(config) == test['config_sha256']
  config.optim.lr *= 2
  assert config_lib.config_fingerprint(config) != test['config_sha256']
