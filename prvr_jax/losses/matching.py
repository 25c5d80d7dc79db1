"""Matching terms: GMMFormer v2's optimal matching loss and its host-side Hungarian step.

The optimal matching (OM) loss assigns every query of a video to a
distinct clip of that video by solving a linear assignment problem per video.
The assignment is piecewise constant in the scores (no gradient), so it is
computed on the host with `scipy.optimize.linear_sum_assignment` through
`jax.pure_callback`; the loss itself is then computed in JAX from the indices.

Under `jit` with automatically sharded inputs, JAX gathers the (small) cost
matrix and runs the callback once, on the first device of the computation.
Under `vmap` the callback is called once with the whole batch.
Ties between equal-cost assignments are broken by scipy.
"""

import jax
import jax.numpy as jnp
import numpy as np
from scipy import optimize

from prvr_jax.losses.masking import masked_mean, upcast
from prvr_jax.ops import l2_normalize


def _assign_one(cost: np.ndarray, query_video: np.ndarray,
                query_valid: np.ndarray) -> np.ndarray:
  """Host assignment for one unbatched problem, see `hungarian_assignment`."""
  assignment = np.full(query_video.shape, -1, np.int32)
  for video in np.unique(query_video[query_valid]):
    rows = np.flatnonzero(query_valid & (query_video == video))
    if rows.size < 2:
      continue
    group_cost = cost[rows]
    if not np.all(np.isfinite(group_cost)):
      raise ValueError(
          f'prvr_jax.losses.hungarian_assignment: the cost matrix of video '
          f'{int(video)} (query rows {rows.tolist()}) has NaN or inf entries.')
    matched_rows, cols = optimize.linear_sum_assignment(group_cost)
    assignment[rows[matched_rows]] = cols
  return assignment


def _assign_host(cost, query_video, query_valid) -> np.ndarray:
  """Host callback; leading dimensions (from `vmap`) are looped over."""
  cost = np.asarray(cost)
  query_video = np.asarray(query_video)
  query_valid = np.asarray(query_valid, bool)
  batch_shape = cost.shape[:-2]
  out = np.empty(query_video.shape, np.int32)
  for index in np.ndindex(*batch_shape):
    out[index] = _assign_one(cost[index], query_video[index],
                             query_valid[index])
  return out


def hungarian_assignment(cost: jax.Array, query_video: jax.Array,
                         query_valid: jax.Array) -> jax.Array:
  """Minimum-cost query-to-clip assignment, solved per video on the host.

  For every video with at least two valid queries, its valid queries (rows of
  `cost`) are assigned to distinct clips minimising the summed cost
  (rectangular problems allowed: with more queries than clips only `Lc` of them
  are matched). Ties are broken by scipy's `linear_sum_assignment`.

  Args:
    cost: [Q, Lc] float assignment costs (no gradient flows through them).
    query_video: [Q] int, video of each query.
    query_valid: [Q] bool, False for padding query slots.

  Returns:
    [Q] int32, the clip assigned to each query; -1 for unmatched queries,
    padding slots and queries whose video has fewer than two valid queries.
  """
  cost = jax.lax.stop_gradient(cost)
  if cost.ndim != 2 or query_video.shape != cost.shape[:1] or (
      query_valid.shape != cost.shape[:1]):
    raise ValueError(
        'prvr_jax.losses.hungarian_assignment: expected cost [Q, Lc], '
        f'query_video [Q], query_valid [Q]; got {cost.shape}, '
        f'{query_video.shape}, {query_valid.shape}.')
  return jax.pure_callback(
      _assign_host,
      jax.ShapeDtypeStruct(query_video.shape, jnp.int32),
      cost, jnp.asarray(query_video, jnp.int32),
      jnp.asarray(query_valid, jnp.bool_),
      vmap_method='broadcast_all')


def optimal_matching_loss(queries: jax.Array, clips: jax.Array, query_video: jax.Array,
                          query_valid: jax.Array, video_valid: jax.Array) -> jax.Array:
  """GMMFormer v2 optimal matching loss.

  For each video with at least two valid queries, its queries are matched to distinct clips by
  the Hungarian algorithm on -cos(query, clip) (host side, `hungarian_assignment`); OM = 1 +
  mean of the matched -cos over all matched pairs of the batch, or 0 when no video qualifies.
  The gradient flows through the matched cosines.

  Args:
    queries: [Q, D] query embeddings.
    clips: [B, Lc, D] clip embeddings.
    query_video: [Q] int; query_valid: [Q] bool; video_valid: [B] bool.

  Returns:
    Scalar loss.
  """
  q = l2_normalize(upcast(queries))
  c = l2_normalize(upcast(clips))
  cos = jnp.einsum('qd,qcd->qc', q, c[query_video])  # [Q, Lc]
  valid = query_valid & video_valid[query_video]
  assignment = hungarian_assignment(-cos, query_video, valid)
  matched = assignment >= 0
  matched_cos = jnp.take_along_axis(cos, jnp.maximum(assignment, 0)[:, None], axis=1)[:, 0]
  return jnp.where(matched.any(), 1. - masked_mean(matched_cos, matched), 0.)
