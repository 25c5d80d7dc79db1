"""Query diversity terms: GMMFormer's query diverse loss (v1), its focal version (v2), and
DreamPRVR's query similarity preservation (a supervised contrastive loss over the queries)."""

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


def query_similarity_preservation_loss(queries: Array, query_video: Array, query_valid: Array,
                                       *, temperature: float) -> Array:
  """DreamPRVR's query similarity preservation (as coded: supervised contrastive over queries).

  With `l_ij = cos_ij / temperature` and `log p_ij = l_ij - logsumexp_{k != i} l_ik` (valid k),
  each valid query i with at least one other query of its video gets
  `-mean_{j != i, same video} log p_ij`; the loss is the mean over those queries (0 if none).

  Args:
    queries: [Q, D] query embeddings (normalised here).
    query_video: [Q] int; query_valid: [Q] bool.
    temperature: the official `deterministic_tau`.

  Returns:
    Scalar loss.
  """
  x = l2_normalize(upcast(queries))
  logits = (x @ x.T) / temperature
  num_queries = queries.shape[0]
  others = (query_valid[:, None] & query_valid[None, :] & ~jnp.eye(num_queries, dtype=bool))
  log_prob = logits - masked_logsumexp(logits, others, axis=1)[:, None]
  pairs = same_video_pairs(query_video, query_valid)
  count = pairs.sum(axis=1)
  per_query = jnp.where(pairs, log_prob, 0.).sum(axis=1) / jnp.maximum(count, 1)
  return -masked_mean(per_query, count > 0)
