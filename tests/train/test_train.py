"""train.py end to end on the tiny synthetic benchmark: outputs, resume, NaN stop, model guard.

Runs are processes of the real CLI (GMMFormer `tiny`, 2 epochs of 3 steps; `support.run_cli`).
They share a persistent XLA compilation cache, so the programs compile once per test session.
"""

import json
import os
import shutil

import jax
import numpy as np
import pytest

import support
from support import load_config, load_latest_params, read_jsonl, run_cli

STEPS_PER_EPOCH, EPOCHS = 3, 2  # 24 train videos / batch 8; config 'tiny'


def comparable(records: list[dict]) -> list[dict]:
  return [{k: v for k, v in r.items() if k != 'steps_per_sec'} for r in records]


def tiny_test_index(tiny_data: str):
  from prvr_jax.data import pipeline  # pylint: disable=g-import-not-at-top
  return pipeline.eval_index(pipeline.open_shards(tiny_data), 'test')


def test_outputs(reference_run, tiny_data):
  workdir = reference_run
  test = json.loads((workdir / 'test_metrics.json').read_text())
  for key in ('r1', 'r5', 'r10', 'r100', 'sumr', 'v2t_r1', 'v2t_sumr', 'best_epoch', 'step'):
    assert key in test
  assert test['sumr'] == pytest.approx(test['r1'] + test['r5'] + test['r10'] + test['r100'])
  index = tiny_test_index(tiny_data)
  assert test['num_queries'] == len(index.caption_ids)
  assert test['num_videos'] == len(index.video_ids)
  assert any(k.startswith('mv_') and k.endswith('_sumr') for k in test)  # spans are known
  assert sorted(os.listdir(workdir / 'checkpoints')) == [str(STEPS_PER_EPOCH * EPOCHS)]
  assert os.listdir(workdir / 'best') == [str(STEPS_PER_EPOCH * (test['best_epoch'] + 1))]
  assert json.loads((workdir / 'config.json').read_text())['model']['name'] == 'gmmformer'

  records = read_jsonl(workdir / 'metrics.jsonl')
  train = [r for r in records if r['split'] == 'train']
  val = [r for r in records if r['split'] == 'val']
  assert [r['step'] for r in train] == list(range(1, STEPS_PER_EPOCH * EPOCHS + 1))
  for key in ('loss', 'clip_nce', 'clip_triplet', 'frame_nce', 'frame_triplet', 'qdl', 'lr',
              'grad_norm'):
    assert all(np.isfinite(r[key]) for r in train), key
  assert train[0]['lr'] == 0.0 and train[1]['lr'] > 0  # official warmup: first update lr 0
  assert [r['epoch'] for r in val] == list(range(EPOCHS))
  assert all(r['sumr'] == pytest.approx(r['r1'] + r['r5'] + r['r10'] + r['r100']) for r in val)
  assert [r['split'] for r in records].count('test') == 1

  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tags = set()
  for event_file in (workdir / 'tensorboard').iterdir():
    for event in tf.compat.v1.train.summary_iterator(str(event_file)):
      tags.update(v.tag for v in event.summary.value)
  assert {'train/loss', 'train/lr', 'train/grad_norm', 'train/qdl', 'val/sumr',
          'test/r1'} <= tags


def test_evaluate_cli_on_workdir(reference_run, config_path, tiny_data, xla_cache, tmp_path):
  out = tmp_path / 'eval_out'  # the reference run is shared: read only
  plots = ['--plots'] if support.HAS_MATPLOTLIB else []
  run_cli('evaluate.py', f'--config={config_path}', f'--config.data.dir={tiny_data}',
          f'--checkpoint={reference_run}', f'--output_dir={out}', *plots, cache_dir=xla_cache)
  for name in support.PICTURES if plots else ():
    support.assert_png(out / f'{name}.png', name)
  metrics = json.loads((out / 'metrics.json').read_text())
  test = json.loads((reference_run / 'test_metrics.json').read_text())
  # Exact: the same eval programs on the same checkpoint, on the same machine.
  for key in ('r1', 'r5', 'r10', 'r100', 'sumr', 'v2t_sumr'):
    assert metrics[key] == test[key]
  assert metrics['checkpoint'].endswith(f'best/{test["step"]}')
  # metrics.json names what produced it, as the run's test_metrics.json does.
  assert metrics['checkpoint_step'] == test['step']
  for key in ('params_sha256', 'model', 'model_config_hash', 'config_sha256', 'data'):
    assert metrics[key] == test[key], key
  assert metrics['trained_on'] == test['data']
  scores = np.load(out / 'scores.npy')
  index = tiny_test_index(tiny_data)
  assert scores.shape == (len(index.caption_ids), len(index.video_ids))
  assert scores.dtype == np.float32


@pytest.fixture(scope='module')
def stopped_run(tmp_path_factory, config_path, tiny_data, xla_cache):
  """The tiny run stopped after its first step (`train.stop_after_steps=1`); tests copy it."""
  workdir = tmp_path_factory.mktemp('stopped') / 'run'
  run_cli('train.py', f'--config={config_path}', f'--config.data.dir={tiny_data}',
          f'--workdir={workdir}', '--config.train.stop_after_steps=1', cache_dir=xla_cache)
  return workdir


def test_resume_after_stop_and_torn_checkpoint(reference_run, stopped_run, config_path,
                                               tiny_data, xla_cache, tmp_path):
  """Stopped mid-epoch, then a later checkpoint write 'killed' half way: the resumed run
  uses the last complete checkpoint and ends bit-identical to the uninterrupted run."""
  workdir = tmp_path / 'resumed'
  shutil.copytree(stopped_run, workdir)
  args = (f'--config={config_path}', f'--config.data.dir={tiny_data}', f'--workdir={workdir}')
  assert os.listdir(workdir / 'checkpoints') == ['1']
  assert not (workdir / 'test_metrics.json').exists()
  # What a kill during an Orbax write leaves behind: an unfinished tmp folder.
  torn = workdir / 'checkpoints' / '4.orbax-checkpoint-tmp-1234567'
  (torn / 'state').mkdir(parents=True)
  (torn / 'state' / 'partial').write_bytes(b'\0' * 100)

  resumed_run = run_cli('train.py', *args, cache_dir=xla_cache,
                        env={'JAX_DEBUG_LOG_MODULES': 'jax._src.compiler'})
  # The train step (compiled by the reference run) comes from the persistent cache.
  assert "Persistent compilation cache hit for 'jit_step'" in resumed_run.stderr
  # Exact: the same programs on the same machine replay the same steps (bit-identical resume).
  assert (json.loads((workdir / 'test_metrics.json').read_text())
          == json.loads((reference_run / 'test_metrics.json').read_text()))
  assert (comparable(read_jsonl(workdir / 'metrics.jsonl'))
          == comparable(read_jsonl(reference_run / 'metrics.jsonl')))
  resumed, step = load_latest_params(workdir, config_path)
  reference, ref_step = load_latest_params(reference_run, config_path)
  assert step == ref_step == STEPS_PER_EPOCH * EPOCHS
  for a, b in zip(jax.tree.leaves(resumed), jax.tree.leaves(reference)):
    np.testing.assert_array_equal(a, b)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(reference_run, stopped_run, config_path,
                                                       tiny_data, xla_cache, tmp_path):
  """A real divergence: resumed from step 1 with lr 1e30 (a valid config; the change needs
  --allow_config_change), the second update makes the parameters overflow and the run stops
  at the next loss, before saving; resuming with the original config gives the reference."""
  workdir = tmp_path / 'nan'
  shutil.copytree(stopped_run, workdir)
  args = (f'--config={config_path}', f'--config.data.dir={tiny_data}', f'--workdir={workdir}')
  refused = run_cli('train.py', *args, '--config.optim.lr=1e30', cache_dir=xla_cache,
                    check=False)
  assert refused.returncode != 0
  assert 'changed configuration: optim.lr: 0.0003 -> 1e+30' in refused.stderr
  assert '--allow_config_change' in refused.stderr
  proc = run_cli('train.py', *args, '--config.optim.lr=1e30', '--allow_config_change',
                 cache_dir=xla_cache, check=False)
  assert proc.returncode != 0
  assert 'Non-finite loss at step 3 (epoch 0)' in proc.stderr
  assert 'loss=nan' in proc.stderr and 'clip_nce=nan' in proc.stderr
  assert 'last good checkpoint (step 1)' in proc.stderr
  assert os.listdir(workdir / 'checkpoints') == ['1']
  params, _ = load_latest_params(workdir, config_path)
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))
  history = read_jsonl(workdir / 'config_history.jsonl')
  assert [h['changes'] for h in history] == [[], ['optim.lr: 0.0003 -> 1e+30']]
  # The checkpoint holds the config that wrote it: the original lr resumes without a flag.
  shutil.rmtree(workdir / 'tensorboard')
  run_cli('train.py', *args, cache_dir=xla_cache)
  assert (json.loads((workdir / 'test_metrics.json').read_text())
          == json.loads((reference_run / 'test_metrics.json').read_text()))


def test_resume_refuses_changes_an_exact_resume_cannot_absorb(reference_run, config_path,
                                                              tmp_path_factory):
  """Batch 10 gives the same 3 steps per epoch as 8 on 24 videos but another data stream; other
  data under the same config is another run too. Both are refused before any training."""
  from prvr_jax import train  # pylint: disable=g-import-not-at-top
  from prvr_jax.data import synthetic  # pylint: disable=g-import-not-at-top
  config = load_config(config_path)
  saved = (reference_run / 'config.json').read_text()
  config.data.dir = str(reference_run / 'synthetic' / 'tiny-seed0')
  config.train.batch_size = 10
  with pytest.raises(ValueError, match=r'train.batch_size: 8 -> 10.*Use a new --workdir'):
    train.train_and_evaluate(config, str(reference_run), allow_config_change=True)
  config.train.batch_size = 8
  config.data.dir = synthetic.ensure('tiny', str(tmp_path_factory.mktemp('other')), seed=1)
  with pytest.raises(ValueError, match=r'was trained on other data than config.data.dir gives '
                     r"now \(splits: \{'test': '[0-9a-f]+', 'train'"):
    train.train_and_evaluate(config, str(reference_run))
  # A refused resume records nothing: the workdir still holds the config of its run.
  assert (reference_run / 'config.json').read_text() == saved


def test_evaluating_on_other_data_needs_cross_dataset(reference_run, config_path, xla_cache,
                                                      tmp_path):
  from prvr_jax.data import synthetic  # pylint: disable=g-import-not-at-top
  other = synthetic.ensure('tiny', str(tmp_path / 'other'), seed=1)
  args = (f'--config={config_path}', f'--config.data.dir={other}',
          f'--checkpoint={reference_run}', f'--output_dir={tmp_path / "out"}')
  proc = run_cli('evaluate.py', *args, cache_dir=xla_cache, check=False)
  assert proc.returncode != 0
  assert 'was trained with other data than the evaluation data' in proc.stderr
  assert '--cross_dataset' in proc.stderr and not (tmp_path / 'out').exists()
  assert '--cross_dataset' in proc.stderr.strip().splitlines()[-1]
  assert 'Traceback' not in proc.stderr
  run_cli('evaluate.py', *args, '--cross_dataset', cache_dir=xla_cache)
  metrics = json.loads((tmp_path / 'out' / 'metrics.json').read_text())
  assert metrics['cross_dataset'] is True
  assert metrics['trained_on']['splits']['test'] != metrics['data']['splits']['test']


def test_workdir_of_another_model_errors(reference_run, tmp_path):
  from prvr_jax import checkpoint, parallel, train  # pylint: disable=g-import-not-at-top
  config = load_config('gmmformer_v2', 'tiny')
  with pytest.raises(ValueError, match="holds a checkpoint of model 'gmmformer'.*gmmformer_v2"):
    train.train_and_evaluate(config, str(reference_run))
  with pytest.raises(ValueError, match="holds a checkpoint of model 'gmmformer'"):
    checkpoint.load_params(str(reference_run), config, parallel.make_mesh())
  # A changed model field of the same model is another model too.
  config = load_config('gmmformer', 'tiny')
  config.model.hidden_dim = 64
  with pytest.raises(ValueError, match='model config hash'):
    train.train_and_evaluate(config, str(reference_run))
