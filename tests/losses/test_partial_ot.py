"""Holmes's partial optimal transport: parity with the official `BatchPOT` (partial_ot.npz,
tests/fixtures/holmes/README.md), a float64 numpy reference of the solver, and its identities
(marginals, transported mass, pseudo labels, padding, gradients only where the official code
has them)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import support
from prvr_jax.losses import partial_ot as pot

FIXTURE = support.FIXTURES / 'holmes' / 'partial_ot.npz'


@pytest.fixture(scope='module')
def official():
  with np.load(FIXTURE) as f:
    return dict(f)


def _run(clips, queries, mask, cotangent, epsilon, quantile):
  """`holmes_partial_ot` and the gradients of `sum(similarity * cotangent)` and of a weighted
  sum of the labels and mass (the plan's: official 0)."""
  def weighted(c, q):
    out = pot.holmes_partial_ot(c, q, mask, epsilon, quantile)
    return jnp.sum(out['similarity'] * cotangent), out

  def detached(c, q):
    out = pot.holmes_partial_ot(c, q, mask, epsilon, quantile)
    return jnp.sum(out['labels'] * jnp.arange(out['labels'].shape[-1])) + jnp.sum(out['mass'])

  (_, out), grads = jax.value_and_grad(weighted, (0, 1), has_aux=True)(clips, queries)
  return out, grads, jax.grad(detached, (0, 1))(clips, queries)


# epsilon traced (one compile serves every value), the quantile static (it sizes a table).
forward = jax.jit(_run, static_argnums=5)


def ref_lse(x, axis):
  top = np.max(x, axis=axis, keepdims=True)
  return np.squeeze(top, axis) + np.log(np.sum(np.exp(x - top), axis=axis))


def ref_partial_ot(similarity, mask, epsilon, quantile, num_iters):
  """float64 reference written from the official algorithm: dustbin = k-th smallest real
  similarity, log-domain Sinkhorn on `[S; bucket] / eps` with rows 1/(C+M) (dustbin C/(C+M)),
  columns 1/C; the real rows times C, then normalised. Returns (bucket, plan, labels)."""
  similarity = np.asarray(similarity, np.float64)
  batch, q, c = similarity.shape
  mask = np.asarray(mask, bool)
  buckets, plans = np.zeros(batch), np.zeros((batch, q, c))
  for b in range(batch):
    m = int(mask[b].sum())
    vals = np.sort(similarity[b][mask[b]].ravel())
    k = max(1, min(int(quantile * vals.size), vals.size))
    buckets[b] = vals[k - 1]
    kernel = np.concatenate([similarity[b][mask[b]], np.full((1, c), buckets[b])]) / epsilon
    log_mu = np.log(np.concatenate([np.full(m, 1.0 / (c + m)), [c / (c + m)]]))
    log_nu = np.full(c, -np.log(c))
    u, v = np.zeros(m + 1), np.zeros(c)
    for _ in range(num_iters):
      u = log_mu - ref_lse(kernel + v[None], 1)
      v = log_nu - ref_lse(kernel + u[:, None], 0)
    plans[b][mask[b]] = np.exp(kernel + u[:, None] + v[None])[:m] * c
  labels = plans / (plans.sum(-1, keepdims=True) + pot.ROW_EPS)
  return buckets, plans, labels


def _inputs(seed, counts, num_clips, dim, pad_value=0.0, num_queries=None):
  rng = np.random.default_rng(seed)
  q = num_queries or max(counts)
  clips = rng.normal(size=(len(counts), num_clips, dim)).astype(np.float32)
  queries = rng.normal(size=(len(counts), q, dim)).astype(np.float32)
  mask = np.arange(q)[None] < np.asarray(counts)[:, None]
  queries[~mask] = pad_value
  return clips, queries, mask


# Every video padded (M < Q), as in an official batch where some video has more queries.
COUNTS, NUM_QUERIES, NUM_CLIPS, DIM = [4, 2, 1, 3], 5, 12, 8
PLAN_RTOL = support.f32_rtol(NUM_CLIPS, ops=4)


@pytest.fixture(scope='module')
def synthetic():
  clips, queries, mask = _inputs(1, COUNTS, NUM_CLIPS, DIM, num_queries=NUM_QUERIES)
  cot = np.random.default_rng(2).normal(size=mask.shape + (NUM_CLIPS,)).astype(np.float32)
  return clips, queries, mask, cot


@pytest.mark.parametrize('case', ['a', 'b', 'c'])
def test_matches_official_batch_pot(official, case):
  g = lambda key: official[f'{case}_{key}']  # noqa: E731
  clips, queries, mask, cot = g('clips'), g('queries'), g('mask'), g('cotangent')
  (_, num_clips, dim), real = clips.shape, mask.astype(bool)
  out, (grad_c, grad_q), _ = forward(clips, queries, mask, cot, float(g('epsilon')),
                                     float(g('quantile')))
  sim_rtol = support.f32_rtol(dim, ops=3)
  support.assert_close(out['similarity'], g('similarity'), sim_rtol)
  support.assert_close(out['bucket'], g('bucket'), sim_rtol)
  # 50 Sinkhorn iterations of logsumexps over C clips, on scores up to 1 / epsilon.
  plan_rtol = support.f32_rtol(num_clips, ops=4)
  support.assert_close(np.exp(out['log_plan']), np.exp(g('log_plan')), plan_rtol)
  np.testing.assert_array_equal(np.asarray(out['log_plan'])[~real] <= -1e8, True)
  support.assert_close(out['labels'], g('labels'), plan_rtol)
  support.assert_close(out['mass'], g('mass'), plan_rtol)
  grad_rtol = support.f32_rtol(num_clips * dim, ops=3)
  support.assert_close(grad_c, g('grad_clips'), grad_rtol)
  # Padded queries: the official zero vectors get ~1e12 gradients (F.normalize below its norm
  # floor) that reach no parameter; ours are masked out and get 0.
  support.assert_close(np.asarray(grad_q)[real], g('grad_queries')[real], grad_rtol)
  np.testing.assert_array_equal(np.asarray(grad_q)[~real], 0.0)


def test_float32_is_as_close_to_float64_official_as_official_float32(official):
  out, _, _ = forward(official['a_clips'], official['a_queries'], official['a_mask'],
                      official['a_cotangent'], 0.1, 0.3)
  ref = np.exp(official['a64_log_plan'])
  ours = float(np.abs(np.exp(out['log_plan']) - ref).max())
  theirs = float(np.abs(np.exp(official['a_log_plan']) - ref).max())
  assert ours <= max(4 * theirs, support.f32_rtol(32, ops=4) * float(ref.max()))
  support.assert_close(out['labels'], official['a64_labels'], support.f32_rtol(32, ops=4))


def test_matches_float64_reference_marginals_and_is_detached(synthetic):
  clips, queries, mask, cot = synthetic
  out, _, plan_grads = forward(clips, queries, mask, cot, 0.1, 0.3)
  bucket, plan, labels = ref_partial_ot(out['similarity'], mask, 0.1, 0.3, 50)
  support.assert_close(out['bucket'], bucket, PLAN_RTOL)
  support.assert_close(np.exp(out['log_plan']), plan, PLAN_RTOL)
  support.assert_close(out['labels'], labels, PLAN_RTOL)
  # Official marginals (x C): every clip column sends at most 1 to the queries (the rest to the
  # dustbin; exact after the last column update); each real query row C / (C + M).
  plan32 = np.exp(np.asarray(out['log_plan'], np.float64))
  assert np.all(plan32.sum(1) <= 1 + PLAN_RTOL)
  m = np.asarray(COUNTS, np.float64)
  np.testing.assert_allclose(plan32.sum(2)[mask], np.repeat(NUM_CLIPS / (NUM_CLIPS + m), COUNTS),
                             rtol=1e-3)
  # Pseudo labels: distributions over clips on real rows, 0 on padded ones; mass = M.
  labels32 = np.asarray(out['labels'])
  support.assert_close(labels32.sum(-1)[mask], np.ones(sum(COUNTS)), PLAN_RTOL)
  np.testing.assert_array_equal(labels32[~mask], 0.0)
  assert np.all(labels32 >= 0)
  support.assert_close(out['mass'], m, PLAN_RTOL)
  # The plan carries no gradient (official: computed under torch.no_grad).
  for g in plan_grads:
    np.testing.assert_array_equal(g, 0.0)
  # A much sharper plan (epsilon 1e-3: scores up to 1000 in the exponent) stays finite.
  sharp, _, _ = forward(clips, queries, mask, cot, 1e-3, 0.3)
  assert np.all(np.isfinite(np.asarray(sharp['labels'])))
  support.assert_close(np.asarray(sharp['labels']).sum(-1)[mask], np.ones(sum(COUNTS)),
                       PLAN_RTOL)


@functools.partial(jax.jit, static_argnums=3)
def _converged(clips, queries, mask, query_mass=None):
  """The dustbin-augmented problem solved to tolerance 1e-6 (at most 1000 iterations)."""
  sim = pot.intra_video_similarity(clips, queries, mask)
  bucket = pot.bucket_value(sim, mask)
  couplings = jnp.concatenate([sim, jnp.broadcast_to(bucket[:, None, None],
                                                     (len(COUNTS), 1, NUM_CLIPS))], 1) / 0.1
  log_mu, log_nu = pot._marginals(  # pylint: disable=protected-access
      mask, NUM_CLIPS, jnp.float32, query_mass)
  return (sim, log_mu) + pot.sinkhorn_log(couplings, log_mu, log_nu, 1000, 1e-6)


def test_converged_solver_moves_the_requested_fraction(synthetic):
  """With a tolerance the while-loop stops early, every marginal within it; the queries then
  take M / (C + M) of the clips' unit mass, the dustbin the rest."""
  clips, queries, mask, _ = synthetic
  sim, log_mu, log_plan, iterations = _converged(clips, queries, mask)
  assert 0 < int(iterations) < 1000
  plan = np.exp(np.asarray(log_plan, np.float64))
  np.testing.assert_allclose(plan.sum(2), np.exp(np.asarray(log_mu, np.float64)), rtol=0,
                             atol=2e-6)
  np.testing.assert_allclose(plan.sum(1), 1 / NUM_CLIPS, rtol=0, atol=1e-6)
  m = np.asarray(COUNTS, np.float64)
  np.testing.assert_allclose(plan[:, :-1].sum((1, 2)), m / (NUM_CLIPS + m), rtol=0, atol=1e-5)
  # The same plan as the float64 reference run to convergence.
  _, ref_plan, _ = ref_partial_ot(sim, mask, 0.1, 0.3, 2000)
  support.assert_close(plan[:, :-1] * NUM_CLIPS, ref_plan, 1e-4)
  # Another requested fraction: the queries take exactly it, evenly per query.
  _, _, log_plan, iterations = _converged(clips, queries, mask, 0.6)
  assert int(iterations) < 1000
  plan = np.exp(np.asarray(log_plan, np.float64))
  np.testing.assert_allclose(plan[:, :-1].sum((1, 2)), 0.6, rtol=0, atol=1e-5)
  np.testing.assert_allclose(plan.sum(2)[:, :-1][mask], np.repeat(0.6 / m, COUNTS), rtol=0,
                             atol=2e-6)
  with pytest.raises(ValueError, match='pot_query_mass'):
    pot.partial_transport(sim, np.zeros(len(COUNTS)), mask, query_mass=1.0)


def ref_similarity(clips, queries, counts):
  """The official min-max normalisation, float64: each video's queries padded with zero
  vectors to the largest count, min and max over that padded matrix."""
  width = max(counts)
  out = np.zeros((len(counts), width, clips.shape[1]))
  for b, n in enumerate(counts):
    q = np.zeros((width, clips.shape[-1]))
    q[:n] = queries[b, :n]
    q /= np.maximum(np.linalg.norm(q, axis=-1, keepdims=True), 1e-12)
    c = clips[b] / np.linalg.norm(clips[b], axis=-1, keepdims=True)
    cos = q @ c.T
    out[b] = (cos - cos.min()) / (cos.max() - cos.min() + pot.MINMAX_EPS)
  return out


def test_min_max_counts_zero_padding_only_below_the_largest_count():
  """All cosines positive (a shared direction), so the official zero padding moves the min of
  the videos with fewer queries than the largest count, and only theirs, whatever Q is."""
  counts, slots = [3, 1, 3, 2], 6
  rng = np.random.default_rng(7)
  shared = 3.0 * rng.normal(size=DIM)
  clips = (rng.normal(size=(len(counts), NUM_CLIPS, DIM)) + shared).astype(np.float32)
  queries = (rng.normal(size=(len(counts), slots, DIM)) + shared).astype(np.float32)
  mask = np.arange(slots)[None] < np.asarray(counts)[:, None]
  ref = ref_similarity(clips.astype(np.float64), queries.astype(np.float64), counts)
  got = np.asarray(jax.jit(pot.intra_video_similarity)(clips, queries, mask))
  support.assert_close(got[:, :3], ref, support.f32_rtol(DIM, ops=3))
  for b, n in enumerate(counts):
    assert (got[b, :n].min() > 0.05) == (n < max(counts)), b  # 0 is the real min or not


QUANTILES = (1e-3, 0.3, 0.55, 1.0)


@jax.jit
def _buckets(sim, mask):
  return ([pot.bucket_value(sim, mask, q) for q in QUANTILES],
          pot.bucket_value(sim, jnp.zeros_like(mask), 0.3))


def test_bucket_is_the_official_kth_value(synthetic):
  clips, queries, mask, cot = synthetic
  sim = np.asarray(forward(clips, queries, mask, cot, 0.1, 0.3)[0]['similarity'])
  got, empty = _buckets(sim, mask)
  for quantile, values in zip(QUANTILES, got):
    for b in range(len(COUNTS)):
      ordered = np.sort(sim[b][mask[b]].ravel())
      k = max(1, min(int(quantile * ordered.size), ordered.size))
      assert float(values[b]) == ordered[k - 1], (quantile, b)
  np.testing.assert_array_equal(empty, 0.0)
  with pytest.raises(ValueError, match='pot_bucket_quantile'):
    pot.bucket_value(sim, mask, 0.0)


def test_padding_content_and_extra_slots_change_nothing(official):
  """Official case a (video 0 has the batch's largest count, so no zero query in its min-max)
  with random content in the padded slots and two more of them: the official values."""
  extra = 2
  g = lambda key: official[f'a_{key}']  # noqa: E731
  mask, queries, cot = g('mask').astype(bool), g('queries'), g('cotangent')
  batch, num_queries, num_clips = cot.shape
  wider = np.concatenate([mask, np.zeros((batch, extra), bool)], 1)
  noisy = np.concatenate([queries, np.zeros((batch, extra, queries.shape[-1]), np.float32)], 1)
  noisy[~wider] = np.random.default_rng(6).normal(size=(int((~wider).sum()), noisy.shape[-1]))
  wide_cot = np.concatenate([cot, np.zeros((batch, extra, num_clips), np.float32)], 1)
  got, (grad_c, _), _ = forward(g('clips'), noisy, wider, wide_cot, 0.1, 0.3)
  rtol = support.f32_rtol(num_clips, ops=4)
  for key in ('bucket', 'mass'):
    support.assert_close(got[key], g(key), rtol)
  for key in ('similarity', 'labels'):
    support.assert_close(np.asarray(got[key])[:, :num_queries], g(key), rtol)
  np.testing.assert_array_equal(np.asarray(got['labels'])[~wider], 0.0)
  support.assert_close(grad_c, g('grad_clips'), rtol)
