"""Loss terms vs loop-based numpy references written from the official formulas."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import optimize

import support
from prvr_jax import losses

GARBAGE = 50.  # value written into padded score slots; must never leak
# Padded batches have these fixed sizes so that jitted functions compile once.
Q_SLOTS, B_SLOTS = 48, 10
# float32 losses vs float64 references: the float32 side sets the error. Reductions (logsumexp,
# means) over <= 48 query slots, ~2 chained. A loss is a mean of terms whose rounding is
# relative to the scores / cosines they are made of, not to the loss (which a hinge or a
# cancellation may make small): the comparisons pass that magnitude as `scale`.
RTOL = support.f32_rtol(Q_SLOTS, ops=2)  # 1.65e-5
# Cosines of 16-dim query features: reductions over 16 features, ~2 chained ops.
COS_RTOL = support.f32_rtol(16, ops=2)  # 9.5e-6

clip_nce = jax.jit(losses.clip_nce)
triplet_loss = jax.jit(losses.triplet_loss,
                       static_argnames=('use_hard_negative', 'hard_pool_size'))
qdl_v1 = jax.jit(jax.value_and_grad(losses.query_diverse_loss_v1))
qdl_v2 = jax.jit(jax.value_and_grad(losses.query_diverse_loss_v2))
om_loss = jax.jit(jax.value_and_grad(losses.optimal_matching_loss, (0, 1)))
qsp_loss = jax.jit(jax.value_and_grad(losses.query_similarity_preservation_loss),
                   static_argnames='temperature')


# ----------------------------------------------------------------------------
# Batches
# ----------------------------------------------------------------------------


def ragged_labels(rng, num_videos, max_queries=6):
  """Query labels of an unpadded official batch: 1..max queries per video."""
  counts = rng.integers(1, max_queries + 1, size=num_videos)
  return np.repeat(np.arange(num_videos), counts)


def pad_batch(labels, num_videos):
  """query_video and masks of a batch padded to Q_SLOTS / B_SLOTS."""
  nq = len(labels)
  query_video = np.zeros(Q_SLOTS, np.int32)
  query_video[:nq] = labels
  return query_video, np.arange(Q_SLOTS) < nq, np.arange(B_SLOTS) < num_videos


def pad_scores(scores):
  nq, nv = scores.shape
  return np.pad(scores, ((0, Q_SLOTS - nq), (0, B_SLOTS - nv)),
                constant_values=GARBAGE)


def pad_rows(x, size, value=GARBAGE):
  pad = np.full((size - len(x),) + x.shape[1:], value, x.dtype)
  return np.concatenate([x, pad])


def lse(x):
  x = np.asarray(x, np.float64)
  m = x.max()
  return m + np.log(np.exp(x - m).sum())


def normalize(x):
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


# ----------------------------------------------------------------------------
# References (float64, unpadded)
# ----------------------------------------------------------------------------


def ref_clip_nce(scores, labels):
  s = scores.astype(np.float64)
  nq, nv = s.shape
  t2v = np.mean([lse(s[q]) - s[q, labels[q]] for q in range(nq)])
  v2t = np.mean([lse(s[:, v]) - lse(s[labels == v, v]) for v in range(nv)])
  return t2v + v2t


def ref_hard_negatives(scores, labels):
  """Official hard-mode, pool-1 negatives: hardest other video / query."""
  nq, nv = scores.shape
  t2v = []
  for q in range(nq):
    masked = scores[q].astype(np.float64).copy()
    masked[labels[q]] = -np.inf
    t2v.append(int(np.argmax(masked)))
  v2t = []
  for v in range(nv):
    masked = scores[:, v].astype(np.float64).copy()
    masked[labels == v] = -np.inf
    v2t.append(int(np.argmax(masked)))
  return np.array(t2v), np.array(v2t)


def ref_triplet(scores, labels, margin, t2v_neg, v2t_neg):
  s = scores.astype(np.float64)
  nq, nv = s.shape
  v2t = 0.
  for v in range(nv):
    pos = s[labels == v, v].mean()
    v2t += max(margin + s[v2t_neg[v], v] - pos, 0.)
  t2v = 0.
  for q in range(nq):
    t2v += max(margin + s[q, t2v_neg[q]] - s[q, labels[q]], 0.)
  return t2v / nq + v2t / nv


def ref_qdl_v1(queries, labels, delta, alpha):
  x = normalize(queries.astype(np.float64))
  cos = x @ x.T
  total = 0.
  for j in range(len(labels)):
    acc = 0.
    for i in range(len(labels)):
      if i != j and labels[i] == labels[j]:
        acc += np.exp(alpha * (cos[i, j] + delta))
    total += np.log1p(acc)
  return total / len(labels)


def ref_qdl_v2(queries, labels, delta, alpha, gamma):
  x = normalize(queries.astype(np.float64))
  cos = x @ x.T
  total = 0.
  for i, j in itertools.permutations(range(len(labels)), 2):
    if labels[i] == labels[j]:
      total += ((1 + cos[i, j]) ** gamma
                * np.log1p(np.exp(alpha * (cos[i, j] + delta))))
  return total / len(labels)


def ref_qsp(queries, labels, tau):
  """DreamPRVR's query similarity preservation, as its official loop: log-softmax over the other
  queries, averaged over each row's positives, rows without a positive skipped."""
  x = normalize(queries.astype(np.float64))
  logits = x @ x.T / tau
  rows = []
  for i in range(len(labels)):
    others = [j for j in range(len(labels)) if j != i]
    positives = [j for j in others if labels[j] == labels[i]]
    if positives:
      log_norm = np.log(np.sum(np.exp(logits[i, others])))
      rows.append(np.mean([logits[i, j] - log_norm for j in positives]))
  return -np.mean(rows) if rows else 0.


def ref_om(queries, clips, labels):
  q = normalize(queries.astype(np.float64))
  c = normalize(clips.astype(np.float64))
  matched = []
  for v in range(clips.shape[0]):
    rows = np.flatnonzero(labels == v)
    if len(rows) < 2:
      continue
    neg_cos = -(q[rows] @ c[v].T)
    r, k = optimize.linear_sum_assignment(neg_cos)
    matched.extend(neg_cos[r, k])
  return 1. + np.mean(matched) if matched else 0.


# ----------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------


def unpadded(labels, nv):
  return labels.astype(np.int32), np.ones(len(labels), bool), np.ones(nv, bool)


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_clip_nce_matches_reference_and_ignores_padding(seed):
  rng = np.random.default_rng(seed)
  nv = int(rng.integers(2, 8))
  labels = ragged_labels(rng, nv)
  scores = (rng.normal(size=(len(labels), nv)) * 3).astype(np.float32)
  expected = ref_clip_nce(scores, labels)
  padded = clip_nce(pad_scores(scores), *pad_batch(labels, nv))
  scale = np.abs(scores).max()  # terms lse(s) - s: rounding relative to the scores (~10)
  support.assert_close(padded, expected, rtol=RTOL, scale=scale)
  if seed == 0:
    support.assert_close(clip_nce(scores, *unpadded(labels, nv)), expected, rtol=RTOL,
                         scale=scale)


def test_clip_nce_gradient_is_zero_on_padding_and_finite():
  rng = np.random.default_rng(3)
  labels = ragged_labels(rng, 4)
  scores = pad_scores(rng.normal(size=(len(labels), 4)).astype(np.float32))
  grad = jax.jit(jax.grad(losses.clip_nce))(scores, *pad_batch(labels, 4))
  assert np.all(np.isfinite(grad)) and np.abs(grad).sum() > 0
  assert np.all(grad[len(labels):] == 0) and np.all(grad[:, 4:] == 0)


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_triplet_hard_pool1_matches_reference_and_ignores_padding(seed):
  rng = np.random.default_rng(seed)
  nv = int(rng.integers(2, 8))
  labels = ragged_labels(rng, nv)
  scores = rng.uniform(-1, 1, size=(len(labels), nv)).astype(np.float32)
  t2v_neg, v2t_neg = ref_hard_negatives(scores, labels)
  expected = ref_triplet(scores, labels, 0.1, t2v_neg, v2t_neg)

  for k in range(3):
    value = triplet_loss(pad_scores(scores), *pad_batch(labels, nv), margin=0.1,
                         key=jax.random.PRNGKey(k), use_hard_negative=True,
                         hard_pool_size=1)
    # Hinge terms margin + s_neg - s_pos of scores in [-1, 1]: magnitude 1.
    support.assert_close(value, expected, rtol=RTOL, scale=1.0)
  if seed == 0:  # unpadded, and hard mode given as a traced bool
    value = jax.jit(losses.triplet_loss, static_argnames='hard_pool_size')(
        scores, *unpadded(labels, nv), margin=0.1, key=jax.random.PRNGKey(7),
        use_hard_negative=jnp.bool_(True), hard_pool_size=1)
    support.assert_close(value, expected, rtol=RTOL, scale=1.0)


def _triplet_draw(scores, query_video, query_valid, video_valid, key, hard):
  """Negatives, loss and gradient for one key (hard pool 3 when `hard`)."""
  args = (scores, query_video, query_valid, video_valid)
  negatives = losses.triplet_negatives(*args, key=key, use_hard_negative=hard,
                                        hard_pool_size=3)
  value, grad = jax.value_and_grad(losses.triplet_loss)(
      *args, margin=0.2, key=key, use_hard_negative=hard, hard_pool_size=3)
  return negatives, value, grad


@jax.jit
def triplet_draws(scores, query_video, query_valid, video_valid, keys, hard):
  """`_triplet_draw` for each key; `hard` is traced: one compilation."""
  return jax.lax.map(
      lambda key: _triplet_draw(scores, query_video, query_valid, video_valid,
                                key, hard), keys)


@pytest.mark.parametrize('use_hard', [False, True])
def test_triplet_random_draws_valid_uniform_and_match_reference(use_hard):
  pool = 3 if use_hard else None
  rng = np.random.default_rng(5)
  nv = 7
  labels = ragged_labels(rng, nv, max_queries=4)
  nq = len(labels)
  scores = rng.uniform(-1, 1, size=(nq, nv)).astype(np.float32)
  qv, qval, vval = pad_batch(labels, nv)
  num_keys = 500
  keys = jax.random.split(jax.random.PRNGKey(0), num_keys)
  negatives, values, grads = triplet_draws(pad_scores(scores), qv, qval, vval,
                                           keys, use_hard)
  t2v_neg, t2v_ok, v2t_neg, v2t_ok = [np.asarray(x) for x in negatives]

  np.testing.assert_array_equal(t2v_ok[0], qval)
  np.testing.assert_array_equal(v2t_ok[0], vval)
  for q in range(nq):
    order = [v for v in np.argsort(-scores[q]) if v != labels[q]]
    allowed = order[:pool]
    assert set(t2v_neg[:, q].tolist()) == set(allowed), q
    # Uniform over the candidates: every count near num_keys / len(allowed).
    counts = np.bincount(t2v_neg[:, q], minlength=B_SLOTS)[allowed]
    assert counts.min() > num_keys / len(allowed) / 3, (q, counts)
  for v in range(nv):
    if use_hard:
      allowed = {int(np.argmax(np.where(labels != v, scores[:, v], -np.inf)))}
    else:
      allowed = set(np.flatnonzero(labels != v).tolist())
    assert set(v2t_neg[:, v].tolist()) == allowed, v

  for k in range(5):
    expected = ref_triplet(scores, labels, 0.2, t2v_neg[k, :nq], v2t_neg[k, :nv])
    support.assert_close(values[k], expected, rtol=RTOL, scale=1.0)  # scores in [-1, 1]
  grads = np.asarray(grads)
  assert np.all(np.isfinite(grads)) and np.abs(grads).sum() > 0
  assert np.all(grads[:, nq:] == 0) and np.all(grads[:, :, nv:] == 0)


@pytest.mark.parametrize('seed', [0, 1])
def test_query_diverse_losses_match_reference_and_ignore_padding(seed):
  rng = np.random.default_rng(seed)
  nv = 5
  labels = ragged_labels(rng, nv)
  queries = rng.normal(size=(len(labels), 16)).astype(np.float32)
  qv, qval, _ = pad_batch(labels, nv)
  padded = pad_rows(queries, Q_SLOTS)
  value, grad = qdl_v1(padded, qv, qval, delta=0.15, alpha=32.)
  # exp(alpha (cos + delta)) turns the cosines' absolute rounding into a relative error of
  # the loss alpha times larger (a sum of positive terms: no cancellation).
  rtol = 32. * COS_RTOL
  support.assert_close(value, ref_qdl_v1(queries, labels, 0.15, 32.), rtol=rtol)
  assert np.all(np.asarray(grad)[len(labels):] == 0)
  for gamma in (1., 2.):
    value, grad = qdl_v2(padded, qv, qval, delta=0.15, alpha=32., gamma=gamma)
    support.assert_close(value, ref_qdl_v2(queries, labels, 0.15, 32., gamma), rtol=rtol)
    assert np.all(np.asarray(grad)[len(labels):] == 0)


@pytest.mark.parametrize('seed', [0, 1])
def test_query_similarity_preservation_matches_reference_and_ignores_padding(seed):
  rng = np.random.default_rng(seed)
  nv = 5
  labels = ragged_labels(rng, nv, max_queries=3)  # single-query videos: rows skipped
  queries = rng.normal(size=(len(labels), 16)).astype(np.float32)
  qv, qval, _ = pad_batch(labels, nv)
  for tau in (0.09, 0.01):
    value, grad = qsp_loss(pad_rows(queries, Q_SLOTS), qv, qval, temperature=tau)
    # Logits are cosines / tau: their absolute rounding is COS_RTOL / tau, the loss O(1 / tau).
    support.assert_close(value, ref_qsp(queries, labels, tau), rtol=COS_RTOL,
                         scale=1.0 / tau)
    assert np.all(np.asarray(grad)[len(labels):] == 0) and np.abs(grad).sum() > 0
  # No video with two queries: no positive anywhere, the loss is 0.
  value, _ = qsp_loss(pad_rows(queries[:3], Q_SLOTS), *pad_batch(np.arange(3), 3)[:2],
                      temperature=0.09)
  assert value == 0.


@pytest.mark.parametrize('alpha', [32., 200.])
def test_query_diverse_losses_do_not_overflow(alpha):
  """Near-identical queries: alpha (cos + delta) up to 230, exp(230) = inf in f32."""
  rng = np.random.default_rng(4)
  labels = np.array([0, 0, 0, 1, 1, 2])
  queries = (rng.normal(size=(1, 16))
             + 1e-3 * rng.normal(size=(6, 16))).astype(np.float32)
  qv, qval, _ = pad_batch(labels, 3)
  padded = pad_rows(queries, Q_SLOTS, value=0.)  # zero rows: still no NaN
  for fn, ref, kwargs in ((qdl_v1, ref_qdl_v1, {}),
                          (qdl_v2, ref_qdl_v2, {'gamma': 1.})):
    value, grad = fn(padded, qv, qval, delta=0.15, alpha=alpha, **kwargs)
    assert np.isfinite(value) and np.all(np.isfinite(grad))
    # Here the loss ~ alpha (cos + delta) with cos ~ 1: its relative error is the cosines'.
    support.assert_close(value, ref(queries, labels, 0.15, alpha, *kwargs.values()),
                         rtol=COS_RTOL)


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_optimal_matching_matches_reference_and_ignores_padding(seed):
  rng = np.random.default_rng(seed)
  nv, lc, d = 5, 4, 8
  labels = ragged_labels(rng, nv)  # up to 6 queries > 4 clips: rectangular
  queries = rng.normal(size=(len(labels), d)).astype(np.float32)
  clips = rng.normal(size=(nv, lc, d)).astype(np.float32)
  value, (gq, gc) = om_loss(pad_rows(queries, Q_SLOTS),
                            pad_rows(clips, B_SLOTS), *pad_batch(labels, nv))
  # 1 + mean matched -cosine (8-dim features): near 0 by cancellation of O(1) cosines.
  support.assert_close(value, ref_om(queries, clips, labels), rtol=support.f32_rtol(8, ops=2),
                       scale=1.0)
  gq, gc = np.asarray(gq), np.asarray(gc)
  assert np.all(gq[len(labels):] == 0) and np.all(gc[nv:] == 0)
  single = [q for q in range(len(labels)) if (labels == labels[q]).sum() < 2]
  assert np.all(gq[single] == 0) and np.abs(gq).sum() > 0


def test_optimal_matching_gradient_matches_finite_differences():
  rng = np.random.default_rng(9)
  labels = np.array([0, 0, 0, 1, 1, 2])
  queries = rng.normal(size=(6, 5))
  clips = rng.normal(size=(3, 2, 5))
  _, (grad, _) = om_loss(queries.astype(np.float32), clips.astype(np.float32),
                         *unpadded(labels, 3))
  direction = rng.normal(size=queries.shape)
  eps = 1e-3
  numeric = (ref_om(queries + eps * direction, clips, labels)
             - ref_om(queries - eps * direction, clips, labels)) / (2 * eps)
  # Central differences of the float64 reference (step 1e-3): truncation error ~1e-6
  # relative; the float32 gradient adds ~1e-6. A purely relative 1e-3 leaves room for both.
  support.assert_close((np.asarray(grad) * direction).sum(), numeric, rtol=1e-3)


def test_optimal_matching_is_zero_without_multi_query_videos():
  rng = np.random.default_rng(0)
  labels = np.array([0, 1, 2, 0])  # video 0's second query is padding
  qv, qval, vval = pad_batch(labels, 3)
  qval[3] = False
  value, (gq, _) = om_loss(
      pad_rows(rng.normal(size=(4, 8)).astype(np.float32), Q_SLOTS),
      pad_rows(rng.normal(size=(3, 4, 8)).astype(np.float32), B_SLOTS),
      qv, qval, vval)
  assert value == 0. and np.all(np.asarray(gq) == 0)
