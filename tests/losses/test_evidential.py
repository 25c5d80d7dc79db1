"""Holmes's evidential losses (`prvr_jax.losses.evidential`): padding changes nothing, the
lower median is `torch.median`'s, the combined Dirichlet keeps its evidence on the real
videos, the degree of conflict is the official view sum. Parity with the official loss:
tests/models/test_holmes.py and tests/models/test_holmes_multi.py (DC)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

import support
from prvr_jax.losses import evidential

VIDEOS = np.array([0, 0, 0, 1, 1, 2, 3, 3])


def _scores(rng, queries, videos):
  return jnp.asarray(np.tanh(rng.normal(size=(queries, videos))), jnp.float32)


def test_padding_videos_and_queries_changes_nothing():
  rng = np.random.default_rng(0)
  scores = {b: _scores(rng, 8, 4) for b in ('frame', 'clip')}
  ones = lambda n: jnp.ones(n, bool)
  common = dict(tau=0.05, division_beta=0.3, smooth_beta=0.2)

  @jax.jit
  def both(frame, clip, padded_frame, padded_clip):
    out = {}
    for calibrate in (False, True):
      plain = evidential.inter_video_edl(frame, clip, jnp.asarray(VIDEOS), ones(8), ones(4),
                                         calibrate=calibrate, **common)
      padded = evidential.inter_video_edl(
          padded_frame, padded_clip, jnp.asarray(np.r_[VIDEOS, 4, 0]),
          jnp.arange(10) < 8, jnp.arange(5) < 4, calibrate=calibrate, **common)
      out[calibrate] = plain, padded
    return out

  # A padded video column and two padded query rows holding large scores.
  pad = lambda s: jnp.pad(s, ((0, 2), (0, 1)), constant_values=0.9)
  results = both(scores['frame'], scores['clip'], pad(scores['frame']), pad(scores['clip']))
  for calibrate, (plain, padded) in results.items():
    assert set(plain) == {'frame', 'clip', 'combined'}
    for name in plain:
      support.assert_close(padded[name], plain[name], support.f32_rtol(8, ops=4),
                           err_msg=f'{name} calibrate={calibrate}')
  assert not np.allclose(results[True][0]['frame'], results[False][0]['frame'])


def test_lower_median_and_combined_evidence():
  values = jnp.asarray([3.0, 1.0, 4.0, 1.5, 9.0, 2.0])
  for mask, expected in (([1, 1, 1, 1, 1, 1], 2.0), ([1, 1, 1, 1, 0, 0], 1.5),
                         ([0, 1, 0, 0, 0, 0], 1.0), ([1, 0, 1, 0, 1, 0], 4.0)):
    assert float(evidential.lower_median(values, jnp.asarray(mask, bool))) == expected
  rng = np.random.default_rng(1)
  alpha1 = jnp.asarray(1 + rng.uniform(size=(3, 5)) * 4, jnp.float32)
  alpha2 = jnp.asarray(1 + rng.uniform(size=(3, 5)) * 4, jnp.float32)
  mask = jnp.asarray([[1, 1, 1, 1, 0]], jnp.float32)
  combined = evidential.combine_dirichlets(alpha1, alpha2, mask)
  assert np.all(np.asarray(combined)[:, 4] == 0) and np.all(np.asarray(combined)[:, :4] > 0)
  # The official form: the conflict as the off-diagonal sum of the belief outer product.
  k = 4.0
  s1, s2 = alpha1[:, :4].sum(1, keepdims=True), alpha2[:, :4].sum(1, keepdims=True)
  b1, b2, u1, u2 = (alpha1[:, :4] - 1) / s1, (alpha2[:, :4] - 1) / s2, k / s1, k / s2
  outer = b1[:, :, None] * b2[:, None, :]
  conflict = outer.sum((1, 2)) - jnp.trace(outer, axis1=1, axis2=2)
  u = u1 * u2 / (1 - conflict[:, None])
  expected = (b1 * b2 + b1 * u2 + b2 * u1) / (1 - conflict[:, None]) * (k / u)
  support.assert_close(combined[:, :4], expected, support.f32_rtol(16, ops=4))


def test_intra_video_edl_ignores_padded_slots_and_videos_without_queries():
  rng = np.random.default_rng(2)
  sim = jnp.asarray(rng.uniform(size=(3, 4, 6)), jnp.float32)
  labels = jax.nn.softmax(jnp.asarray(rng.normal(size=(3, 4, 6)), jnp.float32), axis=-1)
  mask = jnp.asarray([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]], jnp.float32)
  plain = evidential.intra_video_edl(sim, labels, mask, tau=0.06)
  # Garbage in the padded slots, and a fourth video without queries.
  sim2 = jnp.concatenate([jnp.where(mask[..., None] > 0, sim, 0.7), sim[:1]])
  labels2 = jnp.concatenate([jnp.where(mask[..., None] > 0, labels, 0.3), labels[:1]])
  mask2 = jnp.concatenate([mask, jnp.zeros((1, 4))])
  support.assert_close(evidential.intra_video_edl(sim2, labels2, mask2, tau=0.06), plain,
                       support.f32_rtol(6, ops=2))
  alpha = np.exp(np.tanh(np.asarray(sim, np.float64)) / 0.06) + 1
  s = alpha.sum(-1, keepdims=True)
  risk = (((np.asarray(labels) - alpha / s) ** 2).sum(-1)
          + (alpha * (s - alpha) / (s * s * (s + 1))).sum(-1))
  m = np.asarray(mask)
  support.assert_close(plain, np.mean((risk * m).sum(1) / m.sum(1)), support.f32_rtol(6, ops=2))


def test_degree_of_conflict_is_the_official_view_sum_and_ignores_padding():
  """The official `get_dc_loss` sums, over ordered view pairs (i, v), half the L1 distance of
  the expected probabilities over V - 1 times both certainties (numpy, float64, V = 2);
  padded videos and queries change nothing; equal branches have no conflict."""
  rng = np.random.default_rng(1)
  frame, clip = _scores(rng, 8, 4), _scores(rng, 8, 4)
  tau = 0.2
  views = []
  for scores in (frame, clip):
    alpha = np.exp(np.tanh(np.asarray(scores, np.float64)) / tau) + 1
    strength = alpha.sum(axis=1, keepdims=True)
    views.append((alpha / strength, 4 / strength[:, 0]))
  expected = np.mean(sum((np.abs(views[v][0] - p).sum(axis=1) / 2) / (2 - 1)
                         * (1 - u) * (1 - views[v][1]) for p, u in views for v in range(2)))
  pad = lambda s: jnp.pad(s, ((0, 2), (0, 1)), constant_values=0.9)

  @jax.jit
  def run(frame, clip):
    dc = functools.partial(evidential.degree_of_conflict, tau=tau)
    return (dc(frame, clip, jnp.ones(8, bool), jnp.ones(4, bool)),
            dc(pad(frame), pad(clip), jnp.arange(10) < 8, jnp.arange(5) < 4),
            dc(frame, frame, jnp.ones(8, bool), jnp.ones(4, bool)))

  ours, padded, same = run(frame, clip)
  support.assert_close(ours, expected, support.f32_rtol(4, ops=4))
  support.assert_close(padded, ours, support.f32_rtol(4, ops=4))
  assert same == 0
