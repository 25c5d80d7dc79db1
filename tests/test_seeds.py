"""The seeds tool: the aggregation (exact values), the train.py commands it builds, parallel
runs, failures and resuming (with a stand-in for train.py), and a real run of two seeds of the
tiny config, one of them finished before (the session's reference run: not run again)."""

import json
import math
import shutil
import statistics
import sys

import pytest

from prvr_jax.experiments import seeds
import support

# Relative: the means and sample standard deviations of a few float64 numbers.
RTOL = 1e-12
# ml_collections loads config files with the deprecated `load_module`.
LOAD_MODULE = pytest.mark.filterwarnings('ignore:the load_module:DeprecationWarning')


def test_aggregate_gives_mean_and_sample_std_per_split():
  results = {2: {'val': {'sumr': 4.0, 'r1': 2.0}, 'test': {'sumr': 10.0, 'num_queries': 7}},
             0: {'val': {'sumr': 1.0, 'r1': 1.0}, 'test': {'sumr': 20.0, 'num_queries': 7}},
             1: {'val': {'sumr': 2.0, 'r1': 1.5}, 'test': {'sumr': 60.0, 'num_queries': 7}}}
  summary = seeds.aggregate(results)
  assert summary['seeds'] == [0, 1, 2]
  assert 'ddof=1' in summary['std']
  val, test = summary['splits']['val'], summary['splits']['test']
  assert list(summary['splits']) == ['val', 'test'] and list(val) == ['r1', 'sumr']
  assert val['sumr']['values'] == [1.0, 2.0, 4.0]
  assert val['sumr']['mean'] == pytest.approx(7 / 3, rel=RTOL)
  # sqrt(((1 - 7/3)^2 + (2 - 7/3)^2 + (4 - 7/3)^2) / (3 - 1)) = sqrt(7/3)
  assert val['sumr']['std'] == pytest.approx(math.sqrt(7 / 3), rel=RTOL)
  assert val['r1']['mean'] == pytest.approx(1.5, rel=RTOL)
  assert val['r1']['std'] == pytest.approx(0.5, rel=RTOL)
  assert test['sumr']['mean'] == pytest.approx(30.0, rel=RTOL)
  assert test['sumr']['std'] == pytest.approx(math.sqrt(700.0), rel=RTOL)  # (100+900+400)/2
  assert test['num_queries'] == {'mean': 7.0, 'std': 0.0, 'values': [7, 7, 7]}

  table = seeds.format_markdown(summary, 'title').splitlines()
  assert table[0] == '# title'
  assert '| metric | mean ± std | seed 0 | seed 1 | seed 2 |' in table
  assert '| sumr | 2.33 ± 1.53 | 1.00 | 2.00 | 4.00 |' in table
  assert '| num_queries | 7.00 ± 0.00 | 7 | 7 | 7 |' in table

  one = seeds.aggregate({5: {'test': {'sumr': 3.0}}})
  assert one['splits']['test']['sumr'] == {'mean': 3.0, 'std': None, 'values': [3.0]}
  assert '| sumr | 3.00 (one seed) | 3.00 |' in seeds.format_markdown(one, 't').splitlines()
  with pytest.raises(ValueError, match=r"Seed 1 has other test metrics than seed 0: \['r1'\]"):
    seeds.aggregate({0: {'test': {'sumr': 1.0}}, 1: {'test': {'sumr': 1.0, 'r1': 1.0}}})


@LOAD_MODULE
def test_train_commands_and_config(config_path):
  support.require_tensorflow()
  argv = ['seeds', '--seeds=2', '--config=c.py:tiny', '--config.data.dir=/d', '--config.optim.lr',
          '0.1', '--workdir=w', '--noconfig.data.skip_bad_items', '--config.train.seed=5']
  overrides = seeds.override_tokens(argv)
  assert overrides == ['--config.data.dir=/d', '--config.optim.lr', '0.1',
                       '--noconfig.data.skip_bad_items', '--config.train.seed=5']
  assert seeds.child_argv('train.py', 'c.py:tiny', overrides, 7, 'w/seed_7') == [
      sys.executable, 'train.py', '--config=c.py:tiny', '--config.data.dir=/d',
      '--config.optim.lr', '0.1', '--noconfig.data.skip_bad_items', '--config.train.seed=7',
      '--workdir=w/seed_7']
  config = seeds.load_config(config_path, ['--config.train.seed=11', '--config.optim.lr=0.5'])
  assert (config.train.seed, config.optim.lr) == (11, 0.5)
  with pytest.raises(SystemExit, match='Unknown config key --config.train.sed'):
    seeds.load_config(config_path, ['--config.train.sed=11'])
  # The files it reads are the ones train.py writes.
  from prvr_jax.train import logs, loop  # pylint: disable=g-import-not-at-top
  assert (seeds.TEST_METRICS_FILE, seeds.METRICS_FILE) == (loop.TEST_METRICS_FILE,
                                                           logs.METRICS_FILE)


# A stand-in for train.py: writes what a finished run leaves (config.json from $CONFIG_JSON with
# its seed, a val record, test_metrics.json), or fails for seed $FAIL_SEED.
FAKE_TRAIN = """
import json, os, sys
args = dict(a.split('=', 1) for a in sys.argv[1:])
seed, workdir = int(args['--config.train.seed']), args['--workdir']
print('XLA_PYTHON_CLIENT_PREALLOCATE=' + os.environ.get('XLA_PYTHON_CLIENT_PREALLOCATE', ''))
if seed == int(os.environ['FAIL_SEED']):
  sys.exit('diverged')
os.makedirs(workdir)
config = json.loads(os.environ['CONFIG_JSON'])
config['train']['seed'] = seed
def write(name, text):
  with open(os.path.join(workdir, name), 'w') as f:
    f.write(text)
write('config.json', json.dumps(config))
write('metrics.jsonl', json.dumps({'step': 3, 'split': 'val', 'epoch': 0, 'sumr': seed / 2}))
test = {'step': 3, 'best_epoch': 0, 'val_sumr': seed / 2, 'sumr': float(seed)}
if os.environ.get('DATA_JSON'):  # the data identity train.py records
  test['data'] = json.loads(os.environ['DATA_JSON'])
write('test_metrics.json', json.dumps(test))
"""


@LOAD_MODULE
def test_parallel_runs_failures_and_resuming(config_path, tmp_path, monkeypatch):
  fake = tmp_path / 'fake_train.py'
  fake.write_text(FAKE_TRAIN)
  workdir = tmp_path / 'seeds'
  first = support.load_config(config_path).train.seed
  monkeypatch.setenv('CONFIG_JSON', json.dumps(seeds.load_config(config_path, []).to_dict()))
  monkeypatch.setenv('FAIL_SEED', str(first))
  monkeypatch.delenv('XLA_PYTHON_CLIENT_PREALLOCATE', raising=False)
  with pytest.raises(seeds.SeedRunError, match=rf'seed {first}: train.py exited with 1; the end '
                     rf'of {workdir}/seed_{first}.log:\n.*\ndiverged') as e:
    seeds.run_seeds(config_path, [], 2, str(workdir), parallel=2, train_script=str(fake))
  assert str(e.value).splitlines()[-1] == (
      f'Run the same command again to resume (failed: {workdir}/seed_{first}.log).')
  assert (workdir / f'seed_{first + 1}' / 'test_metrics.json').exists()  # the other one ran
  assert not (workdir / seeds.JSON_FILE).exists()

  monkeypatch.setenv('FAIL_SEED', '-1')
  summary = seeds.run_seeds(config_path, [], 2, str(workdir), parallel=2,
                            train_script=str(fake))
  logs = [(workdir / f'seed_{s}.log').read_text().splitlines() for s in (first, first + 1)]
  # The failed seed ran again, the finished one did not; parallel runs do not preallocate.
  assert [log.count('XLA_PYTHON_CLIENT_PREALLOCATE=false') for log in logs] == [2, 1]
  assert summary['splits']['test']['sumr']['values'] == [float(first), float(first + 1)]
  assert summary['splits']['val'] == {'sumr': {
      'mean': pytest.approx(first / 2 + 0.25, rel=RTOL),
      'std': pytest.approx(0.5 / math.sqrt(2), rel=RTOL), 'values': [first / 2, first / 2 + 0.5]}}


def _run_metrics(run_dir) -> dict[str, dict]:
  test = json.loads((run_dir / 'test_metrics.json').read_text())
  val = [r for r in support.read_jsonl(run_dir / 'metrics.jsonl')
         if r['split'] == 'val' and r['step'] == test['step']]
  return {'val': val[0], 'test': test}


@LOAD_MODULE
@pytest.mark.end_to_end
def test_two_seeds_end_to_end(reference_run, config_path, tiny_data, xla_cache, tmp_path):
  first = support.load_config(config_path).train.seed  # the reference run's seed
  shutil.copytree(reference_run, tmp_path / f'seed_{first}')
  finished = tmp_path / f'seed_{first}' / 'test_metrics.json'
  finished_at = finished.stat().st_mtime_ns
  plots = json.loads((reference_run / 'config.json').read_text())['train']['plots']
  overrides = [f'--config.data.dir={tiny_data}', f'--config.train.plots={plots}']
  summary = seeds.run_seeds(config_path, overrides, 2, str(tmp_path),
                            env=support.cli_env(xla_cache))

  assert summary['seeds'] == [first, first + 1]
  assert finished.stat().st_mtime_ns == finished_at  # finished before: not run again
  assert not (tmp_path / f'seed_{first}.log').exists()
  assert (tmp_path / f'seed_{first + 1}.log').exists()
  second = tmp_path / f'seed_{first + 1}'
  assert json.loads((second / 'config.json').read_text())['train']['seed'] == first + 1
  runs = [_run_metrics(tmp_path / f'seed_{s}') for s in summary['seeds']]
  for split in ('val', 'test'):
    table = summary['splits'][split]
    assert {'r1', 'r5', 'r10', 'r100', 'sumr'} <= set(table)
    for name, stat in table.items():
      a, b = (run[split][name] for run in runs)
      assert stat['values'] == [a, b], (split, name)
      assert stat['mean'] == pytest.approx((a + b) / 2, rel=RTOL), (split, name)
      # The sample standard deviation of two values.
      assert stat['std'] == pytest.approx(abs(a - b) / math.sqrt(2), rel=RTOL)
  assert 'epoch' not in summary['splits']['val']
  assert summary['splits']['test']['best_epoch']['values'] == [
      run['test']['best_epoch'] for run in runs]
  assert json.loads((tmp_path / 'seeds.json').read_text()) == json.loads(json.dumps(summary))
  markdown = (tmp_path / 'seeds.md').read_text()
  assert markdown.count('| sumr | ') == 2 and 'ddof=1' in markdown
  assert statistics.fmean(v['test']['sumr'] for v in runs) == pytest.approx(
      summary['splits']['test']['sumr']['mean'], rel=RTOL)

  # A finished seed trained with other settings is refused, not aggregated.
  with pytest.raises(ValueError, match=rf'seed_{first} finished with another configuration '
                     r'\(optim.lr: 0.0003 -> 0.5\)'):
    seeds.run_seeds(config_path, [*overrides, '--config.optim.lr=0.5'], 2, str(tmp_path),
                    env=support.cli_env(xla_cache))


@LOAD_MODULE
def test_seeds_trained_on_different_data_are_refused_naming_both_and_the_flag(
    config_path, tmp_path, monkeypatch):
  """Seeds that record different data identities are not averaged unless --allow_mixed_data;
  seeds.json names what produced each seed's results."""
  fake = tmp_path / 'fake_train.py'
  fake.write_text(FAKE_TRAIN)
  workdir = tmp_path / 'seeds'
  first = support.load_config(config_path).train.seed
  monkeypatch.setenv('CONFIG_JSON', json.dumps(seeds.load_config(config_path, []).to_dict()))
  monkeypatch.setenv('FAIL_SEED', '-1')
  old = {'collection': 'synthetic', 'splits': {'train': 'aaaa'}}
  monkeypatch.setenv('DATA_JSON', json.dumps(old))
  seeds.run_seeds(config_path, [], 1, str(workdir), train_script=str(fake))
  # The second seed trains on another release (the fake train.py cannot be checked before).
  monkeypatch.setenv('DATA_JSON', json.dumps({**old, 'splits': {'train': 'bbbb'}}))
  with pytest.raises(ValueError) as e:
    seeds.run_seeds(config_path, [], 2, str(workdir), train_script=str(fake))
  message = str(e.value)
  assert (f'seed_{first + 1} and {workdir}/seed_{first} are of different data (splits: '
          "{'train': 'aaaa'} -> {'train': 'bbbb'})") in message
  assert message.splitlines()[-1].endswith('pass --allow_mixed_data to aggregate them '
                                           'knowingly.')
  # seeds.json still holds the one-seed summary of the first command, nothing mixed.
  assert json.loads((workdir / seeds.JSON_FILE).read_text())['seeds'] == [first]
  summary = seeds.run_seeds(config_path, [], 2, str(workdir), train_script=str(fake),
                            allow_mixed_data=True)
  assert summary['mixed_data'] is True
  assert [summary['runs'][str(s)]['data']['splits'] for s in (first, first + 1)] == [
      {'train': 'aaaa'}, {'train': 'bbbb'}]
  assert summary['runs'][str(first)]['step'] == 3
  assert '**The seeds trained on different data** (--allow_mixed_data' in (
      workdir / seeds.MARKDOWN_FILE).read_text()


@LOAD_MODULE
def test_a_new_release_is_refused_before_any_seed_trains(reference_run, config_path,
                                                         tmp_path_factory, tmp_path):
  """A finished seed (the session's reference run) and config.data.dir pointing at another
  release: refused before training, naming both and the flag (through the CLI: the last line);
  the finished seed's data identity comes from its test_metrics.json or its checkpoints."""
  from prvr_jax.data import synthetic  # pylint: disable=g-import-not-at-top
  first = support.load_config(config_path).train.seed
  run_dir = tmp_path / f'seed_{first}'
  shutil.copytree(reference_run, run_dir)
  recorded = json.loads((run_dir / 'test_metrics.json').read_text())['data']
  other = synthetic.ensure('tiny', str(tmp_path_factory.mktemp('other')), seed=1)
  plots = json.loads((reference_run / 'config.json').read_text())['train']['plots']
  overrides = [f'--config.data.dir={other}', f'--config.train.plots={plots}']
  with pytest.raises(ValueError, match=rf'config.data.dir={other} and {run_dir} are of '
                     r"different data \(splits: .*--allow_mixed_data to aggregate them"):
    seeds.run_seeds(config_path, overrides, 2, str(tmp_path))
  assert not (tmp_path / f'seed_{first + 1}').exists()  # nothing trained
  # An older test_metrics.json without the identity: the checkpoints' is compared.
  test = json.loads((run_dir / 'test_metrics.json').read_text())
  del test['data']
  (run_dir / 'test_metrics.json').write_text(json.dumps(test))
  assert seeds.recorded_data(str(run_dir)) == recorded
  proc = support.run_cli('prvr_jax/tools/seeds.py', f'--config={config_path}', '--seeds=2',
                         f'--workdir={tmp_path}', *overrides, cache_dir=None, check=False,
                         timeout=300)
  assert proc.returncode != 0
  last = proc.stderr.strip().splitlines()[-1]
  assert f'config.data.dir={other} and {run_dir} are of different data' in last
  assert last.endswith('--allow_mixed_data to aggregate them knowingly.')
  assert not (tmp_path / f'seed_{first + 1}').exists()
