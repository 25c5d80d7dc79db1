"""One device vs 4 devices in one process vs 2 processes x 2 devices (jax.distributed, gloo).

The same tiny run (global batch 8) must end with the same parameters (within 1e-5 of each
tensor's magnitude) and the same validation and test metrics on every topology. Each run is
train.py in processes of its own (`support.run_cli`, `support.run_processes`).
"""

import json

import jax
import numpy as np
import pytest

import support
from support import load_latest_params, read_jsonl, run_cli


def _train_two_processes(config: str, data: str, workdir, *args: str, devices: int = 2) -> None:
  """train.py as 2 processes x `devices` CPU devices with a localhost coordinator."""
  address = f'localhost:{support.free_port()}'
  procs = support.run_processes(
      [[str(support.REPO / 'train.py'), f'--config={config}',
        f'--config.data.dir={data}', f'--workdir={workdir}', f'--coordinator_address={address}',
        '--num_processes=2', f'--process_id={i}', *args] for i in range(2)], devices=devices)
  for i, p in enumerate(procs):
    assert p.returncode == 0, f'process {i} failed ({p.returncode}):\n{p.stderr[-6000:]}'


def _records(workdir, split):
  return [{k: v for k, v in r.items() if k != 'steps_per_sec'}
          for r in read_jsonl(workdir / 'metrics.jsonl') if r['split'] == split]


@pytest.mark.end_to_end
def test_one_device_four_devices_two_hosts_agree(tmp_path, reference_run, config_path, tiny_data,
                                                 xla_cache):
  # The one-device run is the session's reference run (conftest.py).
  runs = {'one_device': reference_run, **{name: tmp_path / name
                                           for name in ('four_devices', 'two_hosts')}}
  run_cli('train.py', f'--config={config_path}', f'--config.data.dir={tiny_data}',
          f'--workdir={runs["four_devices"]}', cache_dir=xla_cache, devices=4)
  _train_two_processes(config_path, tiny_data, runs['two_hosts'])

  reference, step = load_latest_params(runs['one_device'], config_path)
  reference_test = json.loads((runs['one_device'] / 'test_metrics.json').read_text())
  largest = max(np.abs(a).max() for a in jax.tree.leaves(reference))
  for name in ('four_devices', 'two_hosts'):
    params, other_step = load_latest_params(runs[name], config_path)
    assert other_step == step
    for path, a in jax.tree_util.tree_leaves_with_path(reference):
      b = params
      for key in path:
        b = b[key.key]
      # Gradients all-reduced in another order: float32 rounding, compounded over 6 steps of
      # Adam: 1e-5 (~80 eps) of each tensor's magnitude (up to 1.0; biases that start at 0
      # hold what 6 steps added, ~4e-3). Tensors with (nearly) vanishing gradients
      # (attention key biases: softmax is shift invariant, exactly so without a window) hold
      # little more than rounding noise (1e-10 to 1e-4), which differs wholly between
      # topologies; as in the parity gradient check, their magnitude is taken as at least 1e-3
      # of the largest parameter.
      scale = max(np.abs(a).max(), 1e-3 * largest)
      support.assert_close(b, a, rtol=1e-5, scale=scale, err_msg=f'{name} {path}')
    # Metrics stay exact: the topologies' scores differ by ~1e-7 (1-2 ulps), while at every
    # recall boundary the gap between a ground truth's score and the neighbour that could cross
    # it is >= 500x twice that (measured on the tiny run: test v2t 1.2e-4, t2v 1.2e-3, val
    # >= 2.3e-3), so no rank flips, on any CPU kind.
    test = json.loads((runs[name] / 'test_metrics.json').read_text())
    for key in ('r1', 'r5', 'r10', 'r100', 'sumr', 'v2t_sumr', 'step'):
      assert test[key] == reference_test[key], (name, key)
    for a, b in zip(_records(runs[name], 'val'), _records(runs['one_device'], 'val'),
                    strict=True):
      for key in ('r1', 'r5', 'r10', 'r100', 'sumr'):
        assert a[key] == b[key], (name, key)
    for a, b in zip(_records(runs[name], 'train'), _records(runs['one_device'], 'train'),
                    strict=True):
      # A sum of positive O(1) terms: relative (measured <= 6.3e-8 between topologies).
      assert a['loss'] == pytest.approx(b['loss'], rel=1e-5), name


@pytest.mark.end_to_end
# HLFormer, Holmes (the partial transport over each video's queries) and DreamPRVR (the
# 'perturbation' stream) passed the same check when they were added; their compiles would
# make it CI's longest test.
@pytest.mark.parametrize('model', ['ral'])
def test_sampling_models_train_alike_on_two_hosts_and_on_two_devices(model, tmp_path, tiny_data,
                                                                     xla_cache):
  """A model whose training samples or transports per video over the global batch (RAL: the
  'sample' rng stream, the Gaussians over each video's support set): one epoch as 2 processes
  x 1 device ends as 1 process x 2 devices."""
  args = ('--config.train.num_epochs=1', '--config.eval.video_batch_size=16')
  config = f'configs/{model}.py:tiny'
  run_cli('train.py', f'--config={config}', f'--config.data.dir={tiny_data}',
          f'--workdir={tmp_path / "two_devices"}', *args, cache_dir=xla_cache, devices=2)
  _train_two_processes(config, tiny_data, tmp_path / 'two_hosts', *args, devices=1)
  reference, step = load_latest_params(tmp_path / 'two_devices', model, 'tiny')
  params, other_step = load_latest_params(tmp_path / 'two_hosts', model, 'tiny')
  assert other_step == step > 0
  largest = max(np.abs(a).max() for a in jax.tree.leaves(reference))
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(reference),
                          jax.tree.leaves(params), strict=True):
    # The same devices and sharding; the all-reduce runs over gloo instead of in-process:
    # float32 rounding at most, over the epoch's steps (the bound of the test above).
    support.assert_close(b, a, rtol=1e-5, scale=max(np.abs(a).max(), 1e-3 * largest),
                         err_msg=f'{model} {jax.tree_util.keystr(path)}')
  reference_test = json.loads((tmp_path / 'two_devices' / 'test_metrics.json').read_text())
  test = json.loads((tmp_path / 'two_hosts' / 'test_metrics.json').read_text())
  for key in ('r1', 'r5', 'r10', 'r100', 'sumr', 'step'):
    assert test[key] == pytest.approx(reference_test[key], abs=1e-6), key


_PARALLEL_SCRIPT = r'''
import sys
import numpy as np
from prvr_jax import parallel
parallel.maybe_initialize_distributed(sys.argv[1], 2, int(sys.argv[2]))
import jax
p = jax.process_index()
mesh = parallel.make_mesh()
assert [d.process_index for d in mesh.devices] == [0, 0, 1, 1]
# Host-sharded mode: 2 local videos, 3 local query slots (padded to 4 for 2 local devices).
local = {'clip_feats': np.full((2, 3), p, np.float32), 'video_valid': np.ones(2, bool),
         'query_feats': np.arange(3, dtype=np.float32)[:, None] + 10 * p,
         'query_valid': np.array([True, True, False]), 'query_video': np.array([0, 1, 0], np.int32)}
batch = parallel.to_host(parallel.global_batch(local, mesh))
np.testing.assert_array_equal(batch['clip_feats'][:, 0], [0, 0, 1, 1])
np.testing.assert_array_equal(batch['query_video'], [0, 1, 0, 0, 2, 3, 2, 0])
np.testing.assert_array_equal(batch['query_valid'], [1, 1, 0, 0, 1, 1, 0, 0])
# Global view: every process holds the same 5 rows; padded to 8, each feeds its block.
view = parallel.to_host(parallel.shard_global_view({'x': np.arange(5.0)}, mesh))
np.testing.assert_array_equal(view['x'], [0, 1, 2, 3, 4, 0, 0, 0])
rep = parallel.replicate({'w': np.arange(6.0).reshape(2, 3)}, mesh)
assert rep['w'].sharding.is_fully_replicated
np.testing.assert_array_equal(parallel.to_host(rep)['w'], np.arange(6.0).reshape(2, 3))
print('ok', p)
'''


def test_parallel_helpers_across_two_processes():
  address = f'localhost:{support.free_port()}'
  procs = support.run_processes(
      [['-c', _PARALLEL_SCRIPT, address, str(i)] for i in range(2)], devices=2,
      timeout=300)
  for i, p in enumerate(procs):
    assert p.returncode == 0 and f'ok {i}' in p.stdout, p.stderr[-4000:]
