"""Holmes's partial optimal transport: query-clip transport plans with a dustbin row.

Within each training video, the queries of that video are matched to its clips by entropic
optimal transport with one extra "dustbin" (prompt bucket) row that takes the mass of the clips
no query explains. The row-normalised plan is a soft per-query distribution over clips: the
pseudo label of Holmes's intra-video evidential loss. As in the official `BatchPOT`, the plan is
computed without gradient (`stop_gradient`); only the min-max normalised query-clip
similarities it starts from are differentiated (by the loss that consumes both).

Batched over videos, static shapes: queries are padded to `Q` per video (`query_mask`), the
Sinkhorn iterations run in a `lax.fori_loop` (or a `lax.while_loop` with a tolerance), in log
space as the official code does. Formulas, clamps and parity: docs/holmes.md.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np

from prvr_jax.losses.masking import upcast

# Official defaults: `pot_scale` (every dataset), `pot_prompt_ratio` (every dataset) and the
# fixed iteration count of `BatchPOT`.
DEFAULT_EPSILON = 0.1
DEFAULT_BUCKET_QUANTILE = 0.3
DEFAULT_ITERATIONS = 50
# The official constants: log mass of a padded query row, the min-max normaliser's and the
# row normaliser's epsilons, and F.normalize's norm floor.
MASKED_LOG_MASS = -1e9
MINMAX_EPS = 1e-8
ROW_EPS = 1e-8
NORM_EPS = 1e-12


def _l2_normalize(x: jax.Array) -> jax.Array:
  """`x / max(|x|, 1e-12)` (F.normalize: a zero vector stays zero). The floor is applied to the
  squared norm so that a zero vector's gradient stays finite (sqrt has none at 0)."""
  squared = jnp.sum(x * x, axis=-1, keepdims=True)
  return x / jnp.sqrt(jnp.maximum(squared, NORM_EPS * NORM_EPS))


def intra_video_similarity(clips: jax.Array, queries: jax.Array, query_mask: jax.Array
                           ) -> jax.Array:
  """Cosine similarities of each video's queries and clips, min-max normalised per video:
  `(s - min) / (max - min + 1e-8)` over the video's entries.

  The official code pads each video's queries with zero vectors to the batch's largest count
  and takes the min and max over the padded matrix, so a video with fewer queries than that
  also counts cosine 0 (once per clip) in its min and max; a video with the largest count does
  not. Ours gives the same for any padding `Q >=` the largest count: padded entries are 0 and
  take part only in the videos with fewer real queries than the batch's largest count.

  Args:
    clips: `[B, C, D]` clip embeddings of the B videos.
    queries: `[B, Q, D]` the queries of each video, padded to Q.
    query_mask: `[B, Q]` True (or 1) on real queries.

  Returns:
    `[B, Q, C]` in [0, 1] (differentiable).
  """
  clips, queries = upcast(clips), upcast(queries)
  cos = jnp.einsum('bqd,bcd->bqc', _l2_normalize(queries), _l2_normalize(clips),
                   precision=jax.lax.Precision.HIGHEST)
  valid = query_mask.astype(bool)
  cos = jnp.where(valid[:, :, None], cos, 0.0)
  count = jnp.sum(valid, axis=1)
  counted = (valid | (count < jnp.max(count))[:, None])[:, :, None]
  lo = jnp.min(jnp.where(counted, cos, jnp.inf), axis=(1, 2), keepdims=True)
  hi = jnp.max(jnp.where(counted, cos, -jnp.inf), axis=(1, 2), keepdims=True)
  # Nothing counted (no video has a query): every entry is 0, and so is the result.
  lo, hi = jnp.where(jnp.isfinite(lo), lo, 0.0), jnp.where(jnp.isfinite(hi), hi, 0.0)
  return (cos - lo) / (hi - lo + MINMAX_EPS)


def _kth_index_table(num_queries: int, num_clips: int, quantile: float) -> np.ndarray:
  """0-based rank of the bucket value for each possible count of real queries (0..Q): the
  official `k = int(quantile * n)` clamped to [1, n], n = queries * clips, in float64."""
  table = np.zeros(num_queries + 1, np.int32)
  for q in range(1, num_queries + 1):
    n = q * num_clips
    table[q] = max(1, min(int(quantile * n), n)) - 1
  return table


def bucket_value(similarity: jax.Array, query_mask: jax.Array,
                 quantile: float = DEFAULT_BUCKET_QUANTILE) -> jax.Array:
  """The dustbin's score per video: the k-th smallest similarity of its real queries
  (`torch.kthvalue`, k = int(quantile * entries), at least 1); 0 for a video without queries.

  Args:
    similarity: `[B, Q, C]` (`intra_video_similarity`).
    query_mask: `[B, Q]`.
    quantile: the official `pot_prompt_ratio`, in (0, 1].

  Returns:
    `[B]`.
  """
  if not 0.0 < quantile <= 1.0:
    raise ValueError(f'bucket quantile must be in (0, 1], got {quantile} '
                     '(config.model.pot_bucket_quantile)')
  batch, num_queries, num_clips = similarity.shape
  valid = query_mask.astype(bool)
  ordered = jnp.sort(jnp.where(valid[:, :, None], similarity, jnp.inf).reshape(batch, -1),
                     axis=-1)
  table = jnp.asarray(_kth_index_table(num_queries, num_clips, quantile))
  count = jnp.sum(valid, axis=1)
  value = jnp.take_along_axis(ordered, table[count][:, None], axis=1)[:, 0]
  return jnp.where(count > 0, value, 0.0)


def _marginals(query_mask: jax.Array, num_clips: int, dtype, query_mass: float | None = None
               ) -> tuple[jax.Array, jax.Array]:
  """Log marginals. Rows: the official `1/(C + M)` per real query (padded: `MASKED_LOG_MASS`)
  and `C/(C + M)` for the dustbin, i.e. the queries take the fraction `M/(C + M)` of the mass;
  with `query_mass = s` they take `s` instead (`s/M` each, dustbin `1 - s`). Columns: `1/C` per
  clip. M real queries, C clips; both marginals sum to 1."""
  valid = query_mask.astype(bool)
  num_real = jnp.sum(valid, axis=1).astype(dtype)
  log_c = math.log(num_clips)
  if query_mass is None:
    row_norm = -jnp.log(num_clips + num_real)                                # [B]
    log_dustbin = log_c + row_norm
  else:
    if not 0.0 < query_mass < 1.0:
      raise ValueError(f'query mass must be in (0, 1), got {query_mass} '
                       '(config.model.pot_query_mass)')
    row_norm = math.log(query_mass) - jnp.log(jnp.maximum(num_real, 1.0))
    log_dustbin = jnp.full_like(num_real, math.log1p(-query_mass))
  real_rows = jnp.where(valid, row_norm[:, None], MASKED_LOG_MASS).astype(dtype)
  log_mu = jnp.concatenate([real_rows, log_dustbin[:, None].astype(dtype)], axis=1)
  log_nu = jnp.full((valid.shape[0], num_clips), -log_c, dtype)
  return log_mu, log_nu


def sinkhorn_log(couplings: jax.Array, log_mu: jax.Array, log_nu: jax.Array,
                 num_iters: int = DEFAULT_ITERATIONS, tolerance: float = 0.0
                 ) -> tuple[jax.Array, jax.Array]:
  """Log-domain Sinkhorn: `log P = K + u 1' + 1 v'` with rows summing to `mu`, columns to `nu`.

  Each iteration sets `u = log_mu - lse_j(K + v)`, then `v = log_nu - lse_i(K + u)` (the
  official order), starting from `u = v = 0`. With `tolerance` 0 it runs exactly `num_iters`
  iterations (the official solver); otherwise it stops early once every row marginal is within
  `tolerance` of `mu` (the columns are exact after each iteration).

  Args:
    couplings: `[B, R, C]` log kernel (scores / epsilon).
    log_mu: `[B, R]`; log_nu: `[B, C]`.
    num_iters: the most iterations.
    tolerance: stop when `max |P 1 - mu| <= tolerance` (0: never stop early).

  Returns:
    (`[B, R, C]` log plan, iterations run).
  """
  def step(u, v):
    u = log_mu - jax.nn.logsumexp(couplings + v[:, None, :], axis=2)
    v = log_nu - jax.nn.logsumexp(couplings + u[:, :, None], axis=1)
    return u, v

  u, v = jnp.zeros_like(log_mu), jnp.zeros_like(log_nu)
  if tolerance <= 0.0:
    u, v = jax.lax.fori_loop(0, num_iters, lambda _, uv: step(*uv), (u, v))
    iterations = jnp.asarray(num_iters, jnp.int32)
  else:
    def row_error(u, v):
      rows = jnp.exp(jax.nn.logsumexp(couplings + v[:, None, :], axis=2) + u)
      return jnp.max(jnp.abs(rows - jnp.exp(log_mu)))

    def cond(state):
      i, _, _, err = state
      return (i < num_iters) & (err > tolerance)

    def body(state):
      i, u, v, _ = state
      u, v = step(u, v)
      return i + 1, u, v, row_error(u, v)

    iterations, u, v, _ = jax.lax.while_loop(
        cond, body, (jnp.asarray(0, jnp.int32), u, v, jnp.asarray(jnp.inf, couplings.dtype)))
  return couplings + u[:, :, None] + v[:, None, :], iterations


def partial_transport(similarity: jax.Array, bucket: jax.Array, query_mask: jax.Array,
                      epsilon: float = DEFAULT_EPSILON, num_iters: int = DEFAULT_ITERATIONS,
                      tolerance: float = 0.0, query_mass: float | None = None) -> jax.Array:
  """The query rows of the dustbin-augmented transport plan, scaled by C (no gradient).

  Kernel `[similarity; bucket] / epsilon` (`[B, Q + 1, C]`), marginals of `_marginals`, then
  `sinkhorn_log`; the plan is multiplied by C (so each clip column, dustbin included, sums to
  1) and the dustbin row dropped.

  Args:
    similarity: `[B, Q, C]` (`intra_video_similarity`).
    bucket: `[B]` dustbin score (`bucket_value`).
    query_mask: `[B, Q]`.
    epsilon: entropic regularisation (official `pot_scale`; may be traced).
    num_iters, tolerance: `sinkhorn_log`'s.
    query_mass: the fraction of the mass the queries take (None: the official `M/(C + M)`).

  Returns:
    `[B, Q, C]` log plan (padded query rows ~ -1e9).
  """
  similarity = jax.lax.stop_gradient(upcast(similarity))
  bucket = jax.lax.stop_gradient(upcast(bucket))
  batch, num_queries, num_clips = similarity.shape
  couplings = jnp.concatenate(
      [similarity / epsilon, jnp.broadcast_to((bucket / epsilon)[:, None, None],
                                              (batch, 1, num_clips))], axis=1)
  log_mu, log_nu = _marginals(query_mask, num_clips, couplings.dtype, query_mass)
  log_plan, _ = sinkhorn_log(couplings, log_mu, log_nu, num_iters, tolerance)
  return jax.lax.stop_gradient(log_plan[:, :num_queries] + math.log(num_clips))


def transport_labels(log_plan: jax.Array, query_mask: jax.Array
                     ) -> tuple[jax.Array, jax.Array]:
  """Per-query pseudo labels: the plan's rows, padded rows zeroed, each divided by its sum
  plus 1e-8; and the transported mass `[B]` (their sum: ~ the number of real queries)."""
  plan = jnp.exp(log_plan) * query_mask.astype(log_plan.dtype)[:, :, None]
  labels = plan / (jnp.sum(plan, axis=2, keepdims=True) + ROW_EPS)
  return labels, jnp.sum(labels, axis=(1, 2))


def holmes_partial_ot(clips: jax.Array, queries: jax.Array, query_mask: jax.Array,
                      epsilon: float = DEFAULT_EPSILON,
                      bucket_quantile: float = DEFAULT_BUCKET_QUANTILE,
                      num_iters: int = DEFAULT_ITERATIONS, tolerance: float = 0.0,
                      query_mass: float | None = None) -> dict[str, jax.Array]:
  """The official `BatchPOT.forward`: similarity, dustbin, plan, pseudo labels.

  Args:
    clips: `[B, C, D]`; queries: `[B, Q, D]`; query_mask: `[B, Q]` (see
      `intra_video_similarity`).
    epsilon, bucket_quantile, num_iters, tolerance, query_mass: the solver's (official 0.1,
      0.3, 50, none, `M/(C + M)`).

  Returns:
    {'similarity': `[B, Q, C]` (differentiable), 'bucket': `[B]`, 'log_plan': `[B, Q, C]`,
    'labels': `[B, Q, C]`, 'mass': `[B]`} (all but the similarity without gradient).
  """
  similarity = intra_video_similarity(clips, queries, query_mask)
  detached = jax.lax.stop_gradient(similarity)
  bucket = bucket_value(detached, query_mask, bucket_quantile)
  log_plan = partial_transport(detached, bucket, query_mask, epsilon, num_iters, tolerance,
                               query_mass)
  labels, mass = transport_labels(log_plan, query_mask)
  return {'similarity': similarity, 'bucket': bucket, 'log_plan': log_plan, 'labels': labels,
          'mass': mass}
