"""train.py end to end on the tiny synthetic benchmark: outputs, resume, NaN stop, model guard.

Runs are subprocesses of the real CLI (GMMFormer `tiny`, 2 epochs of 3 steps). They share a
persistent XLA compilation cache, so the programs compile once per test session.
"""

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

# The `tiny` GMMFormer config on the tiny synthetic benchmark.
TINY_CONFIG = """
from configs import gmmformer

def get_config(arg=None):
  config = gmmformer.get_config('tiny')
  config.eval.video_batch_size = 16  # val and test in one chunk: fewer programs to compile
  return config
"""
STEPS_PER_EPOCH, EPOCHS = 3, 2  # 24 train videos / batch 8; config 'tiny'


def write_config(directory: pathlib.Path) -> str:
  path = directory / 'tiny_config.py'
  path.write_text(TINY_CONFIG)
  return str(path)


def cli_env(cache_dir: pathlib.Path | None, devices: int = 1) -> dict[str, str]:
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join([str(REPO), env.get('PYTHONPATH', '')])
  # LLVM -O0 compiles about a third faster; every run compared in a test uses it.
  env['XLA_FLAGS'] = (f'--xla_force_host_platform_device_count={devices} '
                      '--xla_backend_optimization_level=0')
  env['JAX_PLATFORMS'] = 'cpu'
  env['TF_CPP_MIN_LOG_LEVEL'] = '2'
  env.pop('JAX_COMPILATION_CACHE_DIR', None)
  if cache_dir is not None:
    env['JAX_COMPILATION_CACHE_DIR'] = str(cache_dir)
    env['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'
  return env


def run_cli(script: str, *args: str, cache_dir: pathlib.Path | None, devices: int = 1,
            check: bool = True, timeout: int = 600) -> subprocess.CompletedProcess:
  proc = subprocess.run([sys.executable, str(REPO / script), *args], cwd=REPO,
                        env=cli_env(cache_dir, devices), capture_output=True, text=True,
                        timeout=timeout)
  if check and proc.returncode:
    raise AssertionError(f'{script} {" ".join(args)} failed ({proc.returncode}):\n'
                         f'{proc.stderr[-6000:]}')
  return proc


def load_config(config_path: str):
  spec = importlib.util.spec_from_file_location('tiny_config', config_path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def load_latest_params(workdir: pathlib.Path, config_path: str):
  """The params of the latest checkpoint of `workdir`, as numpy (in this process)."""
  import jax  # pylint: disable=g-import-not-at-top
  from prvr_jax import parallel, train_lib  # pylint: disable=g-import-not-at-top
  config = load_config(config_path)
  params, info = train_lib.load_params(str(workdir / 'checkpoints'), config,
                                       parallel.make_mesh())
  return jax.tree.map(np.asarray, params), info['step']


def read_jsonl(path: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in path.read_text().splitlines()]


def comparable(records: list[dict]) -> list[dict]:
  return [{k: v for k, v in r.items() if k != 'steps_per_sec'} for r in records]


@pytest.fixture(scope='session')
def xla_cache(tmp_path_factory) -> pathlib.Path:
  """One persistent compilation cache for the session's single-process runs."""
  return tmp_path_factory.getbasetemp() / 'xla_cache'


@pytest.fixture(scope='session')
def tiny_data(tmp_path_factory) -> str:
  """The tiny synthetic benchmark, generated once (what a run would generate itself)."""
  from prvr_jax.data import synthetic  # pylint: disable=g-import-not-at-top
  return synthetic.ensure('tiny', str(tmp_path_factory.getbasetemp() / 'tiny_data'), seed=0)


@pytest.fixture(scope='session')
def config_path(tmp_path_factory) -> str:
  directory = tmp_path_factory.getbasetemp() / 'tiny_config'
  directory.mkdir(exist_ok=True)
  return write_config(directory)


@pytest.fixture(scope='module')
def reference_run(tmp_path_factory, config_path, tiny_data, xla_cache) -> pathlib.Path:
  """An uninterrupted tiny run."""
  workdir = tmp_path_factory.mktemp('reference')
  run_cli('train.py', f'--config={config_path}', f'--config.data.dir={tiny_data}',
          f'--workdir={workdir}', cache_dir=xla_cache)
  return workdir


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


def test_evaluate_cli_on_workdir(reference_run, config_path, tiny_data, xla_cache):
  out = reference_run / 'eval_out'
  run_cli('evaluate.py', f'--config={config_path}', f'--config.data.dir={tiny_data}',
          f'--checkpoint={reference_run}',
          f'--output_dir={out}', cache_dir=xla_cache)
  metrics = json.loads((out / 'metrics.json').read_text())
  test = json.loads((reference_run / 'test_metrics.json').read_text())
  # Exact: the same eval programs on the same checkpoint, on the same machine.
  for key in ('r1', 'r5', 'r10', 'r100', 'sumr', 'v2t_sumr'):
    assert metrics[key] == test[key]
  assert metrics['checkpoint'].endswith(f'best/{test["step"]}')
  scores = np.load(out / 'scores.npy')
  index = tiny_test_index(tiny_data)
  assert scores.shape == (len(index.caption_ids), len(index.video_ids))
  assert scores.dtype == np.float32


def test_resume_after_stop_and_torn_checkpoint(reference_run, config_path, tiny_data,
                                               xla_cache, tmp_path):
  """Stopped mid-epoch, then a later checkpoint write 'killed' half way: the resumed run
  uses the last complete checkpoint and ends bit-identical to the uninterrupted run."""
  workdir = tmp_path / 'resumed'
  args = (f'--config={config_path}', f'--config.data.dir={tiny_data}', f'--workdir={workdir}')
  run_cli('train.py', *args, '--config.train.stop_after_steps=2', cache_dir=xla_cache)
  assert os.listdir(workdir / 'checkpoints') == ['2']
  assert not (workdir / 'test_metrics.json').exists()
  # What a kill during an Orbax write leaves behind: an unfinished tmp folder.
  torn = workdir / 'checkpoints' / '4.orbax-checkpoint-tmp-1234567'
  (torn / 'state').mkdir(parents=True)
  (torn / 'state' / 'partial').write_bytes(b'\0' * 100)

  run_cli('train.py', *args, cache_dir=xla_cache)
  # Exact: the same programs on the same machine replay the same steps (bit-identical resume).
  assert (json.loads((workdir / 'test_metrics.json').read_text())
          == json.loads((reference_run / 'test_metrics.json').read_text()))
  assert (comparable(read_jsonl(workdir / 'metrics.jsonl'))
          == comparable(read_jsonl(reference_run / 'metrics.jsonl')))
  resumed, step = load_latest_params(workdir, config_path)
  reference, ref_step = load_latest_params(reference_run, config_path)
  assert step == ref_step == STEPS_PER_EPOCH * EPOCHS
  for a, b in zip(jax_leaves(resumed), jax_leaves(reference)):
    np.testing.assert_array_equal(a, b)


def jax_leaves(tree):
  import jax  # pylint: disable=g-import-not-at-top
  return jax.tree.leaves(tree)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(reference_run, config_path, tiny_data,
                                                       xla_cache, tmp_path):
  workdir = tmp_path / 'nan'
  args = (f'--config={config_path}', f'--config.data.dir={tiny_data}', f'--workdir={workdir}')
  # The update that makes step 5 (second step of epoch 1) sees a NaN loss.
  proc = run_cli('train.py', *args, '--config.train.inject_nan_at_step=4', cache_dir=xla_cache,
                 check=False)
  assert proc.returncode != 0
  assert 'Non-finite loss at step 5 (epoch 1)' in proc.stderr
  assert 'loss=nan' in proc.stderr and 'clip_nce=nan' in proc.stderr
  assert 'last good checkpoint (step 3)' in proc.stderr
  assert os.listdir(workdir / 'checkpoints') == ['3']
  params, _ = load_latest_params(workdir, config_path)
  assert all(np.isfinite(x).all() for x in jax_leaves(params))
  # Resuming without the fault from the epoch-end checkpoint gives the reference run.
  shutil.rmtree(workdir / 'tensorboard')
  run_cli('train.py', *args, cache_dir=xla_cache)
  assert (json.loads((workdir / 'test_metrics.json').read_text())
          == json.loads((reference_run / 'test_metrics.json').read_text()))


def test_workdir_of_another_model_errors(reference_run, tmp_path):
  from configs import gmmformer_v2  # pylint: disable=g-import-not-at-top
  from prvr_jax import parallel, train_lib  # pylint: disable=g-import-not-at-top
  config = gmmformer_v2.get_config('tiny')
  with pytest.raises(ValueError, match="holds a checkpoint of model 'gmmformer'.*gmmformer_v2"):
    train_lib.train_and_evaluate(config, str(reference_run))
  with pytest.raises(ValueError, match="holds a checkpoint of model 'gmmformer'"):
    train_lib.load_params(str(reference_run), config, parallel.make_mesh())
  # A changed model field of the same model is another model too.
  from configs import gmmformer  # pylint: disable=g-import-not-at-top
  config = gmmformer.get_config('tiny')
  config.model.hidden_dim = 64
  with pytest.raises(ValueError, match='model config hash'):
    train_lib.train_and_evaluate(config, str(reference_run))
