"""Contrastive retrieval terms: InfoNCE over a query-video or a paired score matrix."""

import jax
import jax.numpy as jnp

from prvr_jax.losses.masking import masked_logsumexp, masked_mean, positives, upcast


def clip_nce(scores: jax.Array, query_video: jax.Array, query_valid: jax.Array,
             video_valid: jax.Array) -> jax.Array:
  """Multi-positive InfoNCE of the official `clip_nce` (no temperature).

  t2v: mean over queries of LSE_v S[q, v] - S[q, y_q];
  v2t: mean over videos of LSE_q S[q, v] - LSE_{q of v} S[q, v]. A valid video without any
  valid query (impossible in the official batching, where each video brings all its
  captions) is left out of the v2t term.

  Args:
    scores: [Q, B] raw (unnormalised) query-video scores.
    query_video: [Q] int, video of each query.
    query_valid: [Q] bool.
    video_valid: [B] bool.

  Returns:
    Scalar loss t2v + v2t.
  """
  scores = upcast(scores)
  pos = positives(query_video, query_valid, video_valid)
  has_pos = pos.any(axis=0)

  t2v_den = masked_logsumexp(scores, video_valid[None, :], axis=1)
  t2v_num = jnp.take_along_axis(scores, query_video[:, None], axis=1)[:, 0]
  t2v = masked_mean(t2v_den - t2v_num, query_valid)

  v2t_den = masked_logsumexp(scores, query_valid[:, None], axis=0)
  v2t_num = masked_logsumexp(scores, pos, axis=0)
  v2t = masked_mean(v2t_den - v2t_num, has_pos)
  return t2v + v2t


def paired_nce(scores: jax.Array, valid: jax.Array) -> jax.Array:
  """InfoNCE of the official `frame_nce` (MS-SL's frame branch), positives on the diagonal:
  mean over valid i of LSE(row i and column i) - S[i, i], the row and the column taken over
  valid entries (S[i, i] enters the LSE twice, as coded).

  Args:
    scores: [N, N] raw scores, `scores[i, j]` = query i with the item built for query j.
    valid: [N] bool.
  Returns:
    Scalar loss.
  """
  scores = upcast(scores)
  both = jnp.concatenate([scores, scores.T], axis=1)
  denominator = masked_logsumexp(both, jnp.tile(valid, 2)[None, :], axis=1)
  return masked_mean(denominator - jnp.diagonal(scores), valid)
