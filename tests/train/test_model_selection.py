"""Model selection sees the validation split only: train.py (the real CLI, tiny config) runs with
a spy that records every evaluation and checkpoint save, scripts the val SumR of each epoch and
replaces the test metrics by random numbers. The checkpoint chosen and the early stop follow
the val SumR, and the test split is evaluated exactly once, after the last save."""

import json
import os

import support

# train.py with the spy: events to $SPY_LOG, one JSON line each.
DRIVER = '''
import json, os, runpy, sys
import numpy as np
from prvr_jax import checkpoint
from prvr_jax.eval import evaluator
from prvr_jax.data import protocol

def record(**event):
  with open(os.environ['SPY_LOG'], 'a') as f:
    f.write(json.dumps(event) + '\\n')

split_of = {}
real_eval_split = protocol.ShardData.eval_split
def eval_split(self, split):
  data = real_eval_split(self, split)
  split_of[id(data)] = split
  return data
protocol.ShardData.eval_split = eval_split

val_sumr = [float(x) for x in os.environ['SCRIPTED_VAL_SUMR'].split(',')]
real_evaluate = evaluator.Evaluator.evaluate
rng = np.random.default_rng()
def evaluate(self, params, data, gallery=None):
  result = real_evaluate(self, params, data, gallery)
  split = split_of[id(data)]
  if split == 'test':  # poisoned: random numbers in place of every float metric
    result.metrics = {k: float(rng.uniform(0, 400)) if isinstance(v, float) else v
                      for k, v in result.metrics.items()}
  else:
    result.metrics['sumr'] = val_sumr.pop(0)
  record(event='evaluate', split=split, metrics=result.metrics)
  return result
evaluator.Evaluator.evaluate = evaluate

for name in ('save_best', 'save_latest'):
  def spy(self, value, meta, real=getattr(checkpoint.Checkpoints, name), name=name):
    record(event=name, step=int(meta['step']))
    return real(self, value, meta)
  setattr(checkpoint.Checkpoints, name, spy)

sys.argv[0] = os.path.join(os.environ['PRVR_REPO'], 'train.py')
runpy.run_path(sys.argv[0], run_name='__main__')
'''
STEPS_PER_EPOCH = 3  # 24 train videos / batch 8


def test_selection_and_early_stopping_see_only_the_validation_split(
    reference_run, config_path, tiny_data, xla_cache, tmp_path, monkeypatch):
  del reference_run  # built first: its programs in the compilation cache are this run's
  driver, spy_log, workdir = tmp_path / 'driver.py', tmp_path / 'spy.jsonl', tmp_path / 'run'
  driver.write_text(DRIVER)
  # Epoch 0 is the best; epoch 1 does not improve, so patience 0 stops the run there.
  monkeypatch.setenv('SCRIPTED_VAL_SUMR', '200,100')
  monkeypatch.setenv('SPY_LOG', str(spy_log))
  monkeypatch.setenv('PRVR_REPO', str(support.REPO))
  proc = support.run_cli(str(driver), f'--config={config_path}', f'--config.data.dir={tiny_data}',
                         f'--workdir={workdir}', '--config.train.patience=0',
                         cache_dir=xla_cache)
  events = support.read_jsonl(spy_log)
  assert [(e['event'], e.get('split', e.get('step'))) for e in events] == [
      ('evaluate', 'val'), ('save_best', STEPS_PER_EPOCH), ('save_latest', STEPS_PER_EPOCH),
      ('evaluate', 'val'), ('save_latest', 2 * STEPS_PER_EPOCH),
      ('evaluate', 'test')]  # once, after every decision and save
  assert 'Early stop: val SumR did not improve for 1 epochs.' in proc.stderr

  test = json.loads((workdir / 'test_metrics.json').read_text())
  assert (test['best_epoch'], test['step'], test['val_sumr']) == (0, STEPS_PER_EPOCH, 200.0)
  assert os.listdir(workdir / 'best') == [str(STEPS_PER_EPOCH)]
  # What is reported is the one (poisoned) test evaluation, of the checkpoint chosen on val.
  poisoned = events[-1]['metrics']
  assert {k: test[k] for k in poisoned} == poisoned
  records = support.read_jsonl(workdir / 'metrics.jsonl')
  assert [(r['epoch'], r['sumr'], r['best_sumr']) for r in records if r['split'] == 'val'] == [
      (0, 200.0, 200.0), (1, 100.0, 200.0)]
  assert [r['sumr'] for r in records if r['split'] == 'test'] == [poisoned['sumr']]
