"""Moment terms of AMDNet: diversity of the span masks and relevance of the moments."""

import jax
import jax.numpy as jnp

from prvr_jax.losses.masking import hinge, masked_mean, upcast
from prvr_jax.ops import l2_normalize

Array = jax.Array


def moment_diversity_loss(masks: Array, video_valid: Array, *, alpha: float) -> Array:
  """Mean over valid videos of ||alpha I - M M^T||_F^2, the rows of M scaled to sum 1.

  Args:
    masks: [B, K, L] non-negative span masks.
    video_valid: [B] bool.
    alpha: the target self-overlap (official 0.15).
  """
  masks = upcast(masks)
  masks = masks / jnp.sum(masks, axis=-1, keepdims=True)
  overlap = jnp.einsum('bkl,bjl->bkj', masks, masks)
  target = alpha * jnp.eye(masks.shape[1], dtype=masks.dtype)
  return masked_mean(jnp.sum(jnp.square(target - overlap), axis=(1, 2)), video_valid)


def moment_relevance_loss(queries: Array, summaries: Array, moments: Array,
                          query_video: Array, query_valid: Array, *, margin: float) -> Array:
  """Mean over valid queries of [margin + cos(q, v_bar) - max_k cos(q, m_k)]_+ for the query's
  own video: its best moment must beat the whole-video summary by `margin`.

  Args:
    queries: [Q, D]; summaries: [B, D] (v_bar); moments: [B, K, D] (mask-pooled features).
    query_video: [Q] int; query_valid: [Q] bool.
    margin: the official 0.02 (paper: 0.05 TVR, 0.1 ActivityNet).
  """
  queries = l2_normalize(upcast(queries))
  own_summary = l2_normalize(upcast(summaries))[query_video]
  own_moments = l2_normalize(upcast(moments))[query_video]
  negative = jnp.sum(queries * own_summary, axis=-1)
  positive = jnp.max(jnp.einsum('qd,qkd->qk', queries, own_moments), axis=-1)
  return masked_mean(hinge(margin + negative - positive), query_valid)
