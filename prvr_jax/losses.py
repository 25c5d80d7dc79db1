"""Loss terms of GMMFormer v1/v2 as pure functions on the batch contract.

Every function takes query/video masks (`query_valid [Q]`, `video_valid [B]`)
and `query_video [Q]` (the video of each query, an index into the B videos).
Padding items contribute nothing and every average runs over valid items only,
so a padded batch gives the value of the official code on the unpadded batch.
A valid video without any valid query (impossible in the official batching,
where each video brings all its captions) is left out of the video-to-text
terms. Computations run in at least float32.
"""

from typing import Union

import jax
import jax.numpy as jnp

from prvr_jax import matching
from prvr_jax.ops import l2_normalize

Array = jax.Array


def _upcast(x: Array) -> Array:
  x = jnp.asarray(x)
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _masked_logsumexp(x: Array, mask: Array, axis: int) -> Array:
  """logsumexp over the entries where `mask`; 0 where nothing is selected.

  Masked entries are filled with a finite very negative value (not -inf) so
  that fully masked slices stay finite in value and gradient.
  """
  filled = jnp.where(mask, x, jnp.finfo(x.dtype).min)
  return jnp.where(mask.any(axis), jax.nn.logsumexp(filled, axis=axis), 0.)


def _masked_mean(x: Array, mask: Array) -> Array:
  """Mean of x over mask (0 when the mask is empty)."""
  count = mask.sum()
  return jnp.where(mask, x, 0.).sum() / jnp.maximum(count, 1)


def _hinge(x: Array) -> Array:
  # torch.clamp(min=0) passes the gradient at exactly 0.
  return jnp.where(x >= 0, x, 0.)


def _positives(query_video: Array, query_valid: Array,
               video_valid: Array) -> Array:
  """[Q, B] bool: valid query q belongs to valid video v."""
  num_videos = video_valid.shape[0]
  return ((query_video[:, None] == jnp.arange(num_videos)[None, :])
          & query_valid[:, None] & video_valid[None, :])


def clip_nce(scores: Array, query_video: Array, query_valid: Array,
             video_valid: Array) -> Array:
  """Multi-positive InfoNCE of the official `clip_nce` (no temperature).

  t2v: mean over queries of LSE_v S[q, v] - S[q, y_q];
  v2t: mean over videos of LSE_q S[q, v] - LSE_{q of v} S[q, v].

  Args:
    scores: [Q, B] raw (unnormalised) query-video scores.
    query_video: [Q] int, video of each query.
    query_valid: [Q] bool.
    video_valid: [B] bool.

  Returns:
    Scalar loss t2v + v2t.
  """
  scores = _upcast(scores)
  pos = _positives(query_video, query_valid, video_valid)
  has_pos = pos.any(axis=0)

  t2v_den = _masked_logsumexp(scores, video_valid[None, :], axis=1)
  t2v_num = jnp.take_along_axis(scores, query_video[:, None], axis=1)[:, 0]
  t2v = _masked_mean(t2v_den - t2v_num, query_valid)

  v2t_den = _masked_logsumexp(scores, query_valid[:, None], axis=0)
  v2t_num = _masked_logsumexp(scores, pos, axis=0)
  v2t = _masked_mean(v2t_den - v2t_num, has_pos)
  return t2v + v2t


def _triplet_negatives(
    scores: Array, query_video: Array, query_valid: Array, video_valid: Array,
    *, key: Array, use_hard_negative: Union[bool, Array],
    hard_pool_size: int) -> tuple[Array, Array, Array, Array]:
  """Negatives of `triplet_loss`.

  Returns:
    t2v_neg [Q] int (a negative video per query), t2v_ok [Q] bool (it exists),
    v2t_neg [B] int (a negative query per video), v2t_ok [B] bool.
  """
  scores = jax.lax.stop_gradient(scores)
  num_queries, num_videos = scores.shape
  pos = _positives(query_video, query_valid, video_valid)
  # One uniform draw per query (t2v rank) and per query-video pair (v2t).
  u = jax.random.uniform(key, (num_queries, 1 + num_videos))

  # t2v: the positive is ranked first, padding videos last; the negative is
  # drawn uniformly from ranks [1, hi) as in the official code, with the
  # batch size replaced by the number of valid videos.
  is_pos_video = query_video[:, None] == jnp.arange(num_videos)[None, :]
  ranked = jnp.where(is_pos_video, jnp.inf,
                     jnp.where(video_valid[None, :], scores, -jnp.inf))
  order = jnp.argsort(ranked, axis=1, descending=True)
  num_valid = video_valid.sum()
  hi = jnp.where(use_hard_negative,
                 jnp.minimum(1 + hard_pool_size, num_valid), num_valid)
  num_ranks = jnp.maximum(hi - 1, 1)
  rank = 1 + jnp.minimum((u[:, 0] * num_ranks).astype(jnp.int32),
                         num_ranks - 1)
  t2v_neg = jnp.take_along_axis(order, rank[:, None], axis=1)[:, 0]
  t2v_ok = query_valid & (num_valid >= 2)

  # v2t: the hardest or a uniformly drawn valid query of another video.
  is_neg = query_valid[:, None] & ~is_pos_video
  hardest = jnp.argmax(jnp.where(is_neg, scores, -jnp.inf), axis=0)
  drawn = jnp.argmax(jnp.where(is_neg, u[:, 1:], -1.), axis=0)
  v2t_neg = jnp.where(use_hard_negative, hardest, drawn)
  v2t_ok = pos.any(axis=0) & is_neg.any(axis=0)
  return t2v_neg, t2v_ok, v2t_neg, v2t_ok


def triplet_loss(scores: Array, query_video: Array, query_valid: Array,
                 video_valid: Array, *, margin: float, key: Array,
                 use_hard_negative: Union[bool, Array],
                 hard_pool_size: int) -> Array:
  """Bidirectional hinge loss of the official `get_clip_triplet_loss`.

  v2t: positive = mean score of the video's queries, negative = the hardest
  query of another video (hard mode) or a uniformly drawn one.
  t2v: negative video drawn uniformly from the ranks [1, min(1 + pool, Bv))
  (hard mode) or [1, Bv) of the query's row sorted with its positive first,
  Bv = number of valid videos. With hard mode and `hard_pool_size=1` the loss
  is deterministic. Each direction is the sum of hinges over its valid items
  divided by their count.

  Args:
    scores: [Q, B] query-video scores (cosine in the official models).
    query_video: [Q] int; query_valid: [Q] bool; video_valid: [B] bool.
    margin: hinge margin.
    key: PRNG key for the random draws (one `jax.random.uniform` call).
    use_hard_negative: python bool or traced bool scalar.
    hard_pool_size: pool size of hard t2v negatives (int, may be traced).

  Returns:
    Scalar loss t2v + v2t.
  """
  scores = _upcast(scores)
  t2v_neg, t2v_ok, v2t_neg, v2t_ok = _triplet_negatives(
      scores, query_video, query_valid, video_valid, key=key,
      use_hard_negative=use_hard_negative, hard_pool_size=hard_pool_size)
  pos = _positives(query_video, query_valid, video_valid)
  has_pos = pos.any(axis=0)

  t2v_pos = jnp.take_along_axis(scores, query_video[:, None], axis=1)[:, 0]
  t2v_negs = jnp.take_along_axis(scores, t2v_neg[:, None], axis=1)[:, 0]
  t2v = jnp.where(t2v_ok, _hinge(margin + t2v_negs - t2v_pos), 0.).sum()
  t2v = t2v / jnp.maximum(query_valid.sum(), 1)

  v2t_pos = (jnp.where(pos, scores, 0.).sum(axis=0)
             / jnp.maximum(pos.sum(axis=0), 1))
  v2t_negs = jnp.take_along_axis(scores, v2t_neg[None, :], axis=0)[0]
  v2t = jnp.where(v2t_ok, _hinge(margin + v2t_negs - v2t_pos), 0.).sum()
  v2t = v2t / jnp.maximum(has_pos.sum(), 1)
  return t2v + v2t


def _same_video_pairs(query_video: Array, query_valid: Array) -> Array:
  """[Q, Q] bool: distinct valid queries of the same video."""
  num_queries = query_video.shape[0]
  return ((query_video[:, None] == query_video[None, :])
          & query_valid[:, None] & query_valid[None, :]
          & ~jnp.eye(num_queries, dtype=bool))


def query_diverse_loss_v1(queries: Array, query_video: Array,
                          query_valid: Array, *, delta: float,
                          alpha: float) -> Array:
  """GMMFormer v1 query diverse loss (as coded).

  mean over valid queries j of log(1 + sum_{i != j, same video}
  exp(alpha (cos_ij + delta))), computed as softplus(logsumexp(.)).

  Args:
    queries: [Q, D] query embeddings (normalised here).
    query_video: [Q] int; query_valid: [Q] bool.
    delta, alpha: the official `neg_factor[0]`, `neg_factor[1]`.

  Returns:
    Scalar loss.
  """
  x = l2_normalize(_upcast(queries))
  cos = x @ x.T
  pairs = _same_video_pairs(query_video, query_valid)
  lse = _masked_logsumexp(alpha * (cos + delta), pairs, axis=0)
  per_query = jnp.where(pairs.any(axis=0), jax.nn.softplus(lse), 0.)
  return _masked_mean(per_query, query_valid)


def query_diverse_loss_v2(queries: Array, query_video: Array,
                          query_valid: Array, *, delta: float, alpha: float,
                          gamma: float) -> Array:
  """GMMFormer v2 focal query diverse loss (as coded).

  sum over ordered same-video pairs i != j of
  (1 + cos_ij)^gamma * log(1 + exp(alpha (cos_ij + delta))),
  divided by the number of valid queries.

  Args:
    queries: [Q, D] query embeddings (normalised here).
    query_video: [Q] int; query_valid: [Q] bool.
    delta, alpha, gamma: the official `neg_factor`.

  Returns:
    Scalar loss.
  """
  x = l2_normalize(_upcast(queries))
  cos = x @ x.T
  pairs = _same_video_pairs(query_video, query_valid)
  # Rounding can push cos below -1; clamp so a fractional gamma stays real.
  focal = jnp.maximum(1. + cos, 0.) ** gamma
  terms = focal * jax.nn.softplus(alpha * (cos + delta))
  return jnp.where(pairs, terms, 0.).sum() / jnp.maximum(query_valid.sum(), 1)


def optimal_matching_loss(queries: Array, clips: Array, query_video: Array,
                          query_valid: Array, video_valid: Array) -> Array:
  """GMMFormer v2 optimal matching loss.

  For each video with at least two valid queries, its queries are matched to
  distinct clips by the Hungarian algorithm on -cos(query, clip) (host side,
  `matching.hungarian_assignment`); OM = 1 + mean of the matched -cos over all
  matched pairs of the batch, or 0 when no video qualifies. The gradient flows
  through the matched cosines.

  Args:
    queries: [Q, D] query embeddings.
    clips: [B, Lc, D] clip embeddings.
    query_video: [Q] int; query_valid: [Q] bool; video_valid: [B] bool.

  Returns:
    Scalar loss.
  """
  q = l2_normalize(_upcast(queries))
  c = l2_normalize(_upcast(clips))
  cos = jnp.einsum('qd,qcd->qc', q, c[query_video])  # [Q, Lc]
  valid = query_valid & video_valid[query_video]
  assignment = matching.hungarian_assignment(-cos, query_video, valid)
  matched = assignment >= 0
  matched_cos = jnp.take_along_axis(
      cos, jnp.maximum(assignment, 0)[:, None], axis=1)[:, 0]
  return jnp.where(matched.any(), 1. - _masked_mean(matched_cos, matched), 0.)
