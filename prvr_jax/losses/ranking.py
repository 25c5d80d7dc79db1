"""Ranking terms: the bidirectional triplet (hinge) loss with random or hard negatives."""

from typing import Union

import jax
import jax.numpy as jnp

from prvr_jax.losses.masking import hinge, positives, upcast

Array = jax.Array


def _ranked_negative(scores: Array, positive: Array, valid: Array, u: Array, *,
                     use_hard_negative: Union[bool, Array], hard_pool_size: int) -> Array:
  """Per row, a column drawn uniformly from the ranks [1, hi) of the row sorted in descending
  order with its positive first and invalid columns last, as the official code samples (with
  the batch size replaced by the number of valid columns n): hi = min(1 + pool, n) in hard
  mode, else n.

  Args:
    scores: [N, M] (no gradient is taken through the choice).
    positive: [N, M] bool, one positive per row.
    valid: [M] bool, real columns.
    u: [N] uniform draws in [0, 1).
  Returns:
    [N] int column indices.
  """
  ranked = jnp.where(positive, jnp.inf, jnp.where(valid[None, :], scores, -jnp.inf))
  order = jnp.argsort(ranked, axis=1, descending=True)
  num_valid = valid.sum()
  hi = jnp.where(use_hard_negative, jnp.minimum(1 + hard_pool_size, num_valid), num_valid)
  num_ranks = jnp.maximum(hi - 1, 1)
  rank = 1 + jnp.minimum((u * num_ranks).astype(jnp.int32), num_ranks - 1)
  return jnp.take_along_axis(order, rank[:, None], axis=1)[:, 0]


def triplet_negatives(
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
  pos = positives(query_video, query_valid, video_valid)
  # One uniform draw per query (t2v rank) and per query-video pair (v2t).
  u = jax.random.uniform(key, (num_queries, 1 + num_videos))

  # t2v: a negative video drawn from the ranks after the positive (see `_ranked_negative`).
  is_pos_video = query_video[:, None] == jnp.arange(num_videos)[None, :]
  t2v_neg = _ranked_negative(scores, is_pos_video, video_valid, u[:, 0],
                             use_hard_negative=use_hard_negative, hard_pool_size=hard_pool_size)
  t2v_ok = query_valid & (video_valid.sum() >= 2)

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

  v2t: positive = mean score of the video's queries, negative = the hardest query of another
  video (hard mode) or a uniformly drawn one. t2v: negative video drawn uniformly from the
  ranks [1, min(1 + pool, Bv)) (hard mode) or [1, Bv) of the query's row sorted with its
  positive first, Bv = number of valid videos. With hard mode and `hard_pool_size=1` the loss
  is deterministic. Each direction is the sum of hinges over its valid items divided by their
  count.

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
  scores = upcast(scores)
  t2v_neg, t2v_ok, v2t_neg, v2t_ok = triplet_negatives(
      scores, query_video, query_valid, video_valid, key=key,
      use_hard_negative=use_hard_negative, hard_pool_size=hard_pool_size)
  pos = positives(query_video, query_valid, video_valid)
  has_pos = pos.any(axis=0)

  t2v_pos = jnp.take_along_axis(scores, query_video[:, None], axis=1)[:, 0]
  t2v_negs = jnp.take_along_axis(scores, t2v_neg[:, None], axis=1)[:, 0]
  t2v = jnp.where(t2v_ok, hinge(margin + t2v_negs - t2v_pos), 0.).sum()
  t2v = t2v / jnp.maximum(query_valid.sum(), 1)

  v2t_pos = jnp.where(pos, scores, 0.).sum(axis=0) / jnp.maximum(pos.sum(axis=0), 1)
  v2t_negs = jnp.take_along_axis(scores, v2t_neg[None, :], axis=0)[0]
  v2t = jnp.where(v2t_ok, hinge(margin + v2t_negs - v2t_pos), 0.).sum()
  v2t = v2t / jnp.maximum(has_pos.sum(), 1)
  return t2v + v2t


def paired_triplet_loss(scores: Array, valid: Array, *, margin: float, key: Array,
                        use_hard_negative: Union[bool, Array], hard_pool_size: int) -> Array:
  """Bidirectional hinge loss of the official `get_frame_trip_loss` (MS-SL's frame branch):
  `scores[i, j]` compares query i with the item built for query j, positives on the diagonal.

  Row direction: a negative item drawn from ranks [1, min(1 + pool, n)) (hard mode) or
  [1, n) of row i sorted with its positive first; column direction the same on the columns
  (n = number of valid items). Every off-diagonal item is a negative, also one built for
  another query of the same video, as coded. Each direction is the sum of hinges over valid
  items divided by their count.

  Args:
    scores: [N, N] (cosines in MS-SL).
    valid: [N] bool.
    margin, key, use_hard_negative, hard_pool_size: as in `triplet_loss`.
  Returns:
    Scalar loss.
  """
  scores = upcast(scores)
  size = scores.shape[0]
  diagonal = jnp.eye(size, dtype=bool)
  u = jax.random.uniform(key, (2, size))
  positives_ = jnp.diagonal(scores)
  count = jnp.maximum(valid.sum(), 1)
  ok = valid & (valid.sum() >= 2)
  total = 0.
  for direction, s in enumerate((scores, scores.T)):
    negative = _ranked_negative(jax.lax.stop_gradient(s), diagonal, valid, u[direction],
                                use_hard_negative=use_hard_negative,
                                hard_pool_size=hard_pool_size)
    negatives = jnp.take_along_axis(s, negative[:, None], axis=1)[:, 0]
    total += jnp.where(ok, hinge(margin + negatives - positives_), 0.).sum() / count
  return total
