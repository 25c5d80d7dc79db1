"""Query diversity terms: GMMFormer's query diverse loss (v1) and its focal version (v2)."""

import jax
import jax.numpy as jnp

from prvr_jax.losses.masking import masked_logsumexp, masked_mean, same_video_pairs, upcast
from prvr_jax.ops import l2_normalize

Array = jax.Array


def query_diverse_loss_v1(queries: Array, query_video: Array, query_valid: Array, *,
                          delta: float, alpha: float) -> Array:
  """GMMFormer v1 query diverse loss (as coded).

  mean over valid queries j of log(1 + sum_{i != j, same video} exp(alpha (cos_ij + delta))),
  computed as softplus(logsumexp(.)).

  Args:
    queries: [Q, D] query embeddings (normalised here).
    query_video: [Q] int; query_valid: [Q] bool.
    delta, alpha: the official `neg_factor[0]`, `neg_factor[1]`.

  Returns:
    Scalar loss.
  """
  x = l2_normalize(upcast(queries))
  cos = x @ x.T
  pairs = same_video_pairs(query_video, query_valid)
  lse = masked_logsumexp(alpha * (cos + delta), pairs, axis=0)
  per_query = jnp.where(pairs.any(axis=0), jax.nn.softplus(lse), 0.)
  return masked_mean(per_query, query_valid)


def query_diverse_loss_v2(queries: Array, query_video: Array, query_valid: Array, *,
                          delta: float, alpha: float, gamma: float) -> Array:
  """GMMFormer v2 focal query diverse loss (as coded).

  sum over ordered same-video pairs i != j of (1 + cos_ij)^gamma * log(1 + exp(alpha (cos_ij +
  delta))), divided by the number of valid queries.

  Args:
    queries: [Q, D] query embeddings (normalised here).
    query_video: [Q] int; query_valid: [Q] bool.
    delta, alpha, gamma: the official `neg_factor`.

  Returns:
    Scalar loss.
  """
  x = l2_normalize(upcast(queries))
  cos = x @ x.T
  pairs = same_video_pairs(query_video, query_valid)
  # Rounding can push cos below -1; clamp so a fractional gamma stays real.
  focal = jnp.maximum(1. + cos, 0.) ** gamma
  terms = focal * jax.nn.softplus(alpha * (cos + delta))
  return jnp.where(pairs, terms, 0.).sum() / jnp.maximum(query_valid.sum(), 1)
