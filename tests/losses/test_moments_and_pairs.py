"""MS-SL's paired frame terms and AMDNet's moment terms vs loop-based numpy references written
from the official code, padded batches included."""

import jax
import numpy as np
import pytest

import support
from prvr_jax import losses

SLOTS = 12  # padded size of every item axis (compile once)
GARBAGE = 50.  # written into padded slots; must never leak
RTOL = support.f32_rtol(2 * SLOTS, ops=2)

paired_nce = jax.jit(losses.paired_nce)
paired_triplet = jax.jit(losses.paired_triplet_loss,
                         static_argnames=('use_hard_negative', 'hard_pool_size'))
diversity = jax.jit(jax.value_and_grad(losses.moment_diversity_loss))
relevance = jax.jit(jax.value_and_grad(losses.moment_relevance_loss, (0, 1, 2)))


def _pad_square(scores):
  n = len(scores)
  return np.pad(scores, ((0, SLOTS - n), (0, SLOTS - n)), constant_values=GARBAGE)


def _valid(n, size=SLOTS):
  return np.arange(size) < n


def _lse(x):
  x = np.asarray(x, np.float64)
  return x.max() + np.log(np.exp(x - x.max()).sum())


def ref_paired_nce(s):
  """Official frame_nce: cat(row i, column i) in the denominator, the diagonal on top."""
  s = s.astype(np.float64)
  return np.mean([_lse(np.concatenate([s[i], s[:, i]])) - s[i, i] for i in range(len(s))])


def ref_paired_triplet_hard1(s, margin):
  """Official get_frame_trip_loss, hard mode, pool 1: the best other item per row/column."""
  s = s.astype(np.float64)
  n = len(s)
  total = 0.
  for m in (s, s.T):
    for i in range(n):
      others = np.delete(m[i], i)
      total += max(margin + others.max() - m[i, i], 0.) / n
  return total


@pytest.mark.parametrize('n', [2, 5, 11])
def test_paired_nce_matches_official_formula_and_ignores_padding(n):
  rng = np.random.default_rng(n)
  scores = rng.normal(scale=3.0, size=(n, n)).astype(np.float32)
  got = paired_nce(_pad_square(scores), _valid(n))
  support.assert_close(got, ref_paired_nce(scores), RTOL, scale=np.abs(scores).max())


@pytest.mark.parametrize('n', [2, 6, 11])
def test_paired_triplet_hard_pool_one_is_the_official_loss(n):
  rng = np.random.default_rng(10 + n)
  scores = rng.uniform(-1, 1, size=(n, n)).astype(np.float32)
  got = paired_triplet(_pad_square(scores), _valid(n), margin=0.2, key=jax.random.key(0),
                       use_hard_negative=True, hard_pool_size=1)
  support.assert_close(got, ref_paired_triplet_hard1(scores, 0.2), RTOL, scale=1.0)


def test_paired_triplet_random_negatives_are_valid_off_diagonal_items():
  """With random negatives every drawn item is a real, off-diagonal one: the loss lies between
  the hinge with the easiest and with the hardest negative of each row / column."""
  n = 7
  rng = np.random.default_rng(3)
  scores = rng.uniform(-1, 1, size=(n, n)).astype(np.float32)
  s = scores.astype(np.float64)
  bounds = []
  for pick in (np.min, np.max):
    bounds.append(sum(max(0.2 + pick(np.delete(m[i], i)) - m[i, i], 0.) / n
                      for m in (s, s.T) for i in range(n)))
  for seed in range(5):
    got = float(paired_triplet(_pad_square(scores), _valid(n), margin=0.2,
                               key=jax.random.key(seed), use_hard_negative=False,
                               hard_pool_size=20))
    assert bounds[0] - 1e-5 <= got <= bounds[1] + 1e-5


def ref_diversity(masks, alpha):
  out = []
  for m in masks.astype(np.float64):
    m = m / m.sum(-1, keepdims=True)
    out.append(np.sum((alpha * np.eye(len(m)) - m @ m.T) ** 2))
  return np.mean(out)


def test_moment_diversity_matches_reference_and_ignores_padded_videos():
  rng = np.random.default_rng(0)
  masks = rng.uniform(0.01, 1, size=(5, 4, 32)).astype(np.float32)
  padded = np.concatenate([masks, np.full((SLOTS - 5, 4, 32), GARBAGE, np.float32)])
  value, grad = diversity(padded, _valid(5), alpha=0.15)
  support.assert_close(value, ref_diversity(masks, 0.15), support.f32_rtol(32, ops=3))
  assert np.all(np.asarray(grad)[5:] == 0) and np.abs(np.asarray(grad)[:5]).max() > 0


def ref_relevance(queries, summaries, moments, labels, margin):
  n = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  q, v, m = (n(x.astype(np.float64)) for x in (queries, summaries, moments))
  return np.mean([max(margin + q[i] @ v[labels[i]] - (m[labels[i]] @ q[i]).max(), 0.)
                  for i in range(len(q))])


def test_moment_relevance_matches_reference_and_ignores_padded_queries():
  rng = np.random.default_rng(1)
  labels = np.array([0, 0, 1, 2, 2, 2, 3])
  queries = rng.normal(size=(7, 16)).astype(np.float32)
  summaries = rng.normal(size=(4, 16)).astype(np.float32)
  moments = rng.normal(size=(4, 4, 16)).astype(np.float32)
  # Half the queries lean towards a moment of their video, half towards its summary (hinge on).
  queries[::2] += 2 * moments[labels[::2], 1]
  queries[1::2] += 3 * summaries[labels[1::2]]
  pad = lambda x, value=GARBAGE: np.concatenate(
      [x, np.full((SLOTS - len(x),) + x.shape[1:], value, x.dtype)])
  query_video = pad(labels.astype(np.int32), 0)
  value, grads = relevance(pad(queries), pad(summaries), pad(moments), query_video,
                           _valid(7), margin=0.02)
  expected = ref_relevance(queries, summaries, moments, labels, 0.02)
  assert expected > 0
  support.assert_close(value, expected, support.f32_rtol(16, ops=3), scale=1.0)
  assert np.all(np.asarray(grads[0])[7:] == 0) and np.all(np.asarray(grads[1])[4:] == 0)
