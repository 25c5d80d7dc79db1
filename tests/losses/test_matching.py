"""Host Hungarian assignment vs brute force; jit, vmap and sharded inputs. The device solver
assigns exactly as scipy does, ties included, and gives the same loss and gradient."""

import itertools
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import support
from prvr_jax import losses
from prvr_jax.losses import matching


def brute_force(cost):
  """Optimal assignment [rows] -> column or -1, by enumeration."""
  rows, cols = cost.shape
  out = np.full(rows, -1)
  if rows <= cols:
    best = min(itertools.permutations(range(cols), rows),
               key=lambda p: sum(cost[r, p[r]] for r in range(rows)))
    out[:] = best
  else:  # every clip gets a distinct query
    best = min(itertools.permutations(range(rows), cols),
               key=lambda p: sum(cost[p[c], c] for c in range(cols)))
    out[list(best)] = range(cols)
  return out


def random_problem(rng, num_videos=5, num_clips=3, max_queries=5, q_pad=3):
  counts = rng.integers(1, max_queries + 1, size=num_videos)
  counts[0] = max_queries  # more queries than clips: rectangular problem
  labels = np.repeat(np.arange(num_videos), counts)
  nq = len(labels)
  query_video = np.concatenate([labels, np.zeros(q_pad, int)]).astype(np.int32)
  query_valid = np.arange(nq + q_pad) < nq
  cost = rng.normal(size=(nq + q_pad, num_clips)).astype(np.float32)
  expected = np.full(nq + q_pad, -1, np.int32)
  for v in range(num_videos):
    rows = np.flatnonzero(labels == v)
    if len(rows) >= 2:
      expected[rows] = brute_force(cost[rows].astype(np.float64))
  return cost, query_video, query_valid, expected


@pytest.mark.parametrize('seed', range(4))
def test_matches_brute_force_under_jit(seed):
  rng = np.random.default_rng(seed)
  cost, qv, qval, expected = random_problem(rng, num_clips=3 + seed % 2)
  got = jax.jit(matching.hungarian_assignment)(cost, qv, qval)
  assert got.dtype == np.int32 and got.shape == qv.shape
  np.testing.assert_array_equal(got, expected)
  np.testing.assert_array_equal(
      matching.hungarian_assignment(cost, qv, qval), expected)


def test_vmap_matches_per_item():
  rng = np.random.default_rng(7)
  problems = [random_problem(rng, max_queries=3) for _ in range(3)]
  size = max(len(p[1]) for p in problems)

  def pad(x, value):
    return np.concatenate([x, np.full((size - len(x),) + x.shape[1:], value,
                                      x.dtype)])

  cost = np.stack([pad(p[0], 0.) for p in problems])
  qv = np.stack([pad(p[1], 0) for p in problems])
  qval = np.stack([pad(p[2], False) for p in problems])
  expected = np.stack([pad(p[3], -1) for p in problems])
  got = jax.jit(jax.vmap(matching.hungarian_assignment))(cost, qv, qval)
  np.testing.assert_array_equal(got, expected)
  # Unbatched arguments are broadcast.
  got = jax.vmap(matching.hungarian_assignment, in_axes=(0, None, None))(
      np.stack([cost[0], cost[0] + 1.]), qv[0], qval[0])
  np.testing.assert_array_equal(got, np.stack([expected[0]] * 2))


def test_device_solver_assigns_as_scipy_ties_included():
  """Random problems of one shape (one compile): normal costs (unique optima) and costs in
  {0, 1, 2} (many equal-cost assignments: resolved as scipy resolves them)."""
  num_videos, num_clips, num_queries = 5, 6, 16
  solve = jax.jit(matching.device_assignment, static_argnums=3)
  for seed in range(40):
    rng = np.random.default_rng(seed)
    qv = rng.integers(0, num_videos, num_queries).astype(np.int32)
    valid = rng.random(num_queries) < 0.85
    for video in range(num_videos):  # at most num_clips queries per video (its bound)
      valid[np.flatnonzero(valid & (qv == video))[num_clips:]] = False
    if seed % 2:
      cost = rng.integers(0, 3, (num_queries, num_clips)).astype(np.float32)
    else:
      cost = rng.normal(size=(num_queries, num_clips)).astype(np.float32)
    got = solve(cost, qv, valid, num_videos)
    np.testing.assert_array_equal(got, matching._assign_host(cost, qv, valid),
                                  err_msg=f'seed {seed}')
  # A constant matrix: scipy's identity-like answer.
  np.testing.assert_array_equal(
      solve(np.ones((4, 4), np.float32), np.zeros(4, np.int32), np.ones(4, bool), 1),
      [0, 1, 2, 3])


def test_device_solver_stops_on_more_queries_than_clips():
  cost = np.array([[0., 5.], [1., 0.], [0., 0.], [3., 3.]], np.float32)
  got = matching.device_assignment(cost, np.zeros(4, np.int32), np.ones(4, bool), 1)
  np.testing.assert_array_equal(got, [0, 1, -1, -1])  # the first 2 matched, no hang


def test_device_solver_loss_and_gradient_equal_the_host_ones():
  rng = np.random.default_rng(3)
  queries = rng.normal(size=(12, 8)).astype(np.float32)
  clips = rng.normal(size=(4, 5, 8)).astype(np.float32)
  labels = np.sort(rng.integers(0, 4, 12)).astype(np.int32)
  valid, video_valid = np.arange(12) < 11, np.array([True, True, False, True])
  host, device = (jax.jit(jax.value_and_grad(
      lambda q, c, solver=solver: losses.optimal_matching_loss(
          q, c, labels, valid, video_valid, solver=solver), (0, 1)))(queries, clips)
                  for solver in ('host', 'device'))
  # The same assignment, so the same arithmetic: equal up to compilation differences.
  support.assert_close(device[0], host[0], rtol=support.f32_rtol(8), scale=1.0)
  for device_grad, host_grad in zip(device[1], host[1]):
    support.assert_close(device_grad, host_grad, rtol=support.f32_rtol(8))
  with pytest.raises(ValueError, match="'host' or 'device'"):
    losses.optimal_matching_loss(queries, clips, labels, valid, video_valid, solver='gpu')


def test_device_solver_refuses_data_beyond_its_bound():
  support.require_tensorflow()
  from prvr_jax.train import data as train_data  # pylint: disable=g-import-not-at-top
  config = support.load_config('gmmformer_v2', 'tiny')
  batching = type('Batching', (), {'split': lambda self, name: name})()
  shards = type('Data', (), {'dir': '/data/x', 'batching': batching,
                             'max_captions_per_video': 40})()
  train_data.check_matching_bound(config, shards)  # host solver: no bound
  config.loss.om_solver = 'device'
  with pytest.raises(ValueError, match='num_clips=32 captions per video.*has 40'):
    train_data.check_matching_bound(config, shards)


def test_nan_cost_raises_naming_the_video():
  cost = np.zeros((3, 2), np.float32)
  cost[1, 0] = np.nan
  with pytest.raises(Exception, match='video 0'):
    jax.block_until_ready(matching.hungarian_assignment(
        cost, np.zeros(3, np.int32), np.ones(3, bool)))


def test_shape_mismatch_raises():
  with pytest.raises(ValueError, match='cost'):
    matching.hungarian_assignment(np.zeros((3, 2)), np.zeros(4, np.int32),
                                  np.ones(4, bool))


_SHARDED_SCRIPT = textwrap.dedent('''
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from prvr_jax import losses
    from prvr_jax.losses import matching
    import support
    assert jax.device_count() == 4, jax.devices()
    rng = np.random.default_rng(0)
    num_videos, num_clips, num_queries = 8, 4, 32
    labels = np.sort(rng.integers(0, num_videos, size=num_queries)).astype(np.int32)
    valid = np.arange(num_queries) < 29
    cost = rng.normal(size=(num_queries, num_clips)).astype(np.float32)
    queries = rng.normal(size=(num_queries, 16)).astype(np.float32)
    clips = rng.normal(size=(num_videos, num_clips, 16)).astype(np.float32)
    video_valid = np.ones(num_videos, bool)

    mesh = Mesh(np.array(jax.devices()), ('data',))
    shard = lambda x: jax.device_put(x, NamedSharding(mesh, P('data')))
    assign = jax.jit(matching.hungarian_assignment)
    local = assign(cost, labels, valid)
    sharded = assign(shard(cost), shard(labels), shard(valid))
    assert len(sharded.sharding.device_set) >= 1
    np.testing.assert_array_equal(np.asarray(sharded), np.asarray(local))
    np.testing.assert_array_equal(
        np.asarray(local), matching._assign_host(cost, labels, valid))
    assert (np.asarray(local) >= 0).sum() > 8

    om = jax.jit(jax.value_and_grad(losses.optimal_matching_loss))
    value, grad = om(queries, clips, labels, valid, video_valid)
    value_s, grad_s = om(shard(queries), shard(clips), shard(labels),
                         shard(valid), shard(video_valid))
    # Sharded: the means are summed across devices in another order. The loss is 1 - a mean
    # matched cosine (16-dim features), O(1); the gradients are relative to their largest.
    rtol = support.f32_rtol(32, ops=2)
    support.assert_close(value_s, value, rtol=rtol, scale=1.0)
    support.assert_close(grad_s, grad, rtol=rtol)
    print('SHARDED_OK')
''')


def test_sharded_inputs_over_four_devices():
  env = support.subprocess_env(JAX_PLATFORMS='cpu',
                               XLA_FLAGS='--xla_force_host_platform_device_count=4')
  result = subprocess.run([sys.executable, '-c', _SHARDED_SCRIPT], env=env,
                          capture_output=True, text=True, timeout=120,
                          check=False)
  assert 'SHARDED_OK' in result.stdout, result.stderr[-3000:]
