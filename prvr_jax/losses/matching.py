"""Matching terms: GMMFormer v2's optimal matching loss and its Hungarian step.

The optimal matching (OM) loss assigns every query of a video to a
distinct clip of that video by solving a linear assignment problem per video.
The assignment is piecewise constant in the scores (no gradient), so it is
computed on the host with `scipy.optimize.linear_sum_assignment` through
`jax.pure_callback` (`hungarian_assignment`, the default), or on the device by the same
shortest-augmenting-path algorithm (`device_assignment`: no host round trip, and a step JAX's
persistent compilation cache can keep); the loss itself is then computed in JAX from the
indices.

Under `jit` with automatically sharded inputs, JAX gathers the (small) cost
matrix and runs the callback once, on the first device of the computation.
Under `vmap` the callback is called once with the whole batch.
Ties between equal-cost assignments are broken by scipy.
"""

import jax
import jax.numpy as jnp
import numpy as np

from prvr_jax.losses.masking import masked_mean, upcast
from prvr_jax.ops import l2_normalize


def _assign_one(cost: np.ndarray, query_video: np.ndarray,
                query_valid: np.ndarray) -> np.ndarray:
  """Host assignment for one unbatched problem, see `hungarian_assignment`."""
  # Imported on first use: scipy.optimize is a heavy import that most users of the losses skip.
  from scipy import optimize  # pylint: disable=g-import-not-at-top
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


def device_assignment(cost: jax.Array, query_video: jax.Array, query_valid: jax.Array,
                      num_videos: int) -> jax.Array:
  """`hungarian_assignment` on the device, for videos with at most `Lc` valid queries.

  Crouse's shortest augmenting path algorithm, as scipy's `linear_sum_assignment` runs it
  (costs made non-negative per video, the same order of the columns searched and the same
  choice between equal path lengths), for every video at once: row r of every video is added in
  step r, so the loops run (most queries of a video)^2 times at most, over `[B, Lc]` arrays.
  Arithmetic is float32 (scipy: float64), so assignments whose costs differ by less than the
  float32 rounding may be chosen differently; equal costs are resolved as scipy resolves them.

  Args:
    cost: [Q, Lc] float assignment costs (no gradient flows through them).
    query_video: [Q] int in [0, num_videos), video of each query.
    query_valid: [Q] bool.
    num_videos: B, the number of videos (static).

  Returns:
    [Q] int32 as `hungarian_assignment`, for videos with at most `Lc` valid queries. Beyond
    that the assignment is not optimal (its queries after the first `Lc` are left unmatched):
    `train.data.check_matching_bound` refuses such training data.
  """
  cost = jax.lax.stop_gradient(cost).astype(jnp.float32)
  num_queries, num_clips = cost.shape
  member = (query_video[:, None] == jnp.arange(num_videos)[None]) & query_valid[:, None]
  count = member.sum(0)  # [B] valid queries per video
  solved = count >= 2
  rank = jnp.where(query_valid, jnp.take_along_axis(jnp.cumsum(member, 0) - 1,
                                                    query_video[:, None], axis=1)[:, 0], -1)
  in_problem = query_valid & solved[query_video]
  video_min = jnp.min(jnp.where(member[:, :, None], cost[:, None, :], jnp.inf), axis=(0, 2))
  cost = cost - jnp.where(in_problem, video_min[query_video], 0.)[:, None]
  removed = num_clips  # scan position of a column already on the path
  nowhere = num_queries  # a scatter index that writes nothing
  clip_ids = jnp.arange(num_clips)[None]

  def row_of(array, rows):
    return array.at[jnp.minimum(rows, num_queries - 1)].get()

  def add_row(r, state):
    u, v, col4row, row4col = state
    is_row = (rank[:, None] == r) & member & solved[None]  # [Q, B]
    active = is_row.any(0)
    current = jnp.where(active, jnp.argmax(is_row, axis=0), nowhere)  # [B] row added now

    def search(s):
      """One step of the shortest-path search of every video still without a free column."""
      remaining = s['pos'] < removed
      # A video whose every column is on the path has more rows than columns: it stops (-3).
      going = (s['sink'] == -1) & remaining.any(1)
      sr = s['sr'].at[jnp.where(going, s['i'], nowhere)].set(True, mode='drop')
      reduced = (s['min_val'][:, None] + row_of(cost, s['i']) - row_of(u, s['i'])[:, None]
                 - v)
      better = going[:, None] & remaining & (reduced < s['shortest'])
      path = jnp.where(better, s['i'][:, None], s['path'])
      shortest = jnp.where(better, reduced, s['shortest'])
      lengths = jnp.where(remaining, shortest, jnp.inf)
      lowest = lengths.min(1)
      is_min = remaining & (lengths == lowest[:, None])
      # scipy scans the remaining columns in order `pos` and keeps the first shortest one,
      # unless a later one of the same length is free.
      first = jnp.min(jnp.where(is_min, s['pos'], removed), axis=1)
      later_free = is_min & (row4col == -1) & (s['pos'] > first[:, None])
      pick = jnp.where(later_free.any(1),
                       jnp.argmax(jnp.where(later_free, s['pos'], -1), axis=1),
                       jnp.argmin(jnp.where(is_min, s['pos'], removed), axis=1))
      owner = jnp.take_along_axis(row4col, pick[:, None], axis=1)[:, 0]
      picked = going[:, None] & (clip_ids == pick[:, None])
      # Remove `pick` from the scan order: the last remaining column takes its place.
      last = (remaining.sum(1) - 1)[:, None]
      pos = jnp.where(going[:, None] & (s['pos'] == last),
                      jnp.take_along_axis(s['pos'], pick[:, None], axis=1), s['pos'])
      return dict(i=jnp.where(going & (owner != -1), owner, s['i']), sr=sr,
                  sc=s['sc'] | picked, pos=jnp.where(picked, removed, pos), path=path,
                  shortest=shortest, min_val=jnp.where(going, lowest, s['min_val']),
                  sink=jnp.where(going, jnp.where(owner == -1, pick, -1),
                                 jnp.where(s['sink'] == -1, -3, s['sink'])))

    s = jax.lax.while_loop(lambda s: jnp.any(s['sink'] == -1), search, dict(
        i=current, sr=jnp.zeros(num_queries, bool),
        sc=jnp.zeros((num_videos, num_clips), bool),
        pos=jnp.broadcast_to(num_clips - 1 - jnp.arange(num_clips), (num_videos, num_clips)),
        path=jnp.full((num_videos, num_clips), -1, jnp.int32),
        shortest=jnp.full((num_videos, num_clips), jnp.inf),
        min_val=jnp.zeros(num_videos), sink=jnp.where(active, -1, -2)))
    min_val = s['min_val'][query_video]
    own_shortest = jnp.take_along_axis(s['shortest'][query_video],
                                       jnp.maximum(col4row, 0)[:, None], axis=1)[:, 0]
    is_current = jnp.zeros(num_queries, bool).at[current].set(True, mode='drop')
    u = u + jnp.where(is_current, min_val, jnp.where(s['sr'], min_val - own_shortest, 0.))
    v = v - jnp.where(s['sc'], s['min_val'][:, None] - s['shortest'], 0.)

    def augment(a):
      """One edge back along every video's path: its row takes the column."""
      going, j = a['going'], a['j']
      i = jnp.take_along_axis(s['path'], jnp.maximum(j, 0)[:, None], axis=1)[:, 0]
      row4col = jnp.where(going[:, None] & (clip_ids == j[:, None]), i[:, None],
                          a['row4col'])
      target = jnp.where(going, i, nowhere)
      return dict(going=going & (i != current), j=jnp.where(going, row_of(a['col4row'], target), j),
                  row4col=row4col, col4row=a['col4row'].at[target].set(j, mode='drop'))

    a = jax.lax.while_loop(lambda a: jnp.any(a['going']), augment, dict(
        going=s['sink'] >= 0, j=s['sink'], row4col=row4col, col4row=col4row))
    return u, v, a['col4row'], a['row4col']

  _, _, col4row, _ = jax.lax.fori_loop(
      0, jnp.max(jnp.where(solved, count, 0)), add_row,
      (jnp.zeros(num_queries), jnp.zeros((num_videos, num_clips)),
       jnp.full(num_queries, -1, jnp.int32), jnp.full((num_videos, num_clips), -1, jnp.int32)))
  return jnp.where(in_problem, col4row, -1)


def optimal_matching_loss(queries: jax.Array, clips: jax.Array, query_video: jax.Array,
                          query_valid: jax.Array, video_valid: jax.Array,
                          solver: str = 'host') -> jax.Array:
  """GMMFormer v2 optimal matching loss.

  For each video with at least two valid queries, its queries are matched to distinct clips by
  the Hungarian algorithm on -cos(query, clip) (host side, `hungarian_assignment`); OM = 1 +
  mean of the matched -cos over all matched pairs of the batch, or 0 when no video qualifies.
  The gradient flows through the matched cosines.

  Args:
    queries: [Q, D] query embeddings.
    clips: [B, Lc, D] clip embeddings.
    query_video: [Q] int; query_valid: [Q] bool; video_valid: [B] bool.
    solver: 'host' (`hungarian_assignment`) or 'device' (`device_assignment`; at most `Lc`
      queries per video).

  Returns:
    Scalar loss.
  """
  q = l2_normalize(upcast(queries))
  c = l2_normalize(upcast(clips))
  cos = jnp.einsum('qd,qcd->qc', q, c[query_video])  # [Q, Lc]
  valid = query_valid & video_valid[query_video]
  if solver == 'host':
    assignment = hungarian_assignment(-cos, query_video, valid)
  elif solver == 'device':
    assignment = device_assignment(-cos, query_video, valid, clips.shape[0])
  else:
    raise ValueError(f"optimal_matching_loss: solver must be 'host' or 'device', not {solver!r}.")
  matched = assignment >= 0
  matched_cos = jnp.take_along_axis(cos, jnp.maximum(assignment, 0)[:, None], axis=1)[:, 0]
  return jnp.where(matched.any(), 1. - masked_mean(matched_cos, matched), 0.)
