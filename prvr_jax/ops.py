"""Small numerical helpers shared by models and losses: normalisation and similarities."""

import jax
import jax.numpy as jnp

# F.normalize's eps in the official code.
NORMALIZE_EPS = 1e-12


def l2_normalize(x: jax.Array, eps: float = NORMALIZE_EPS) -> jax.Array:
  """`torch.nn.functional.normalize(x, dim=-1)`: x / max(||x||, eps) along the last axis.

  Written with rsqrt(max(||x||^2, eps^2)) so that zero vectors (padded frames) have a zero,
  not NaN, gradient -- as torch's clamp gives.
  """
  squared_norm = jnp.sum(x * x, axis=-1, keepdims=True)
  return x * jax.lax.rsqrt(jnp.maximum(squared_norm, eps * eps))


def max_similarity(queries: jax.Array, items: jax.Array, cosine: bool) -> jax.Array:
  """`max_t sim(q, items[b, t])`: queries `[Q, D]`, item sets `[B, L, D]` -> `[Q, B]`.

  Padded items are included as the official code does (they are zero vectors, similarity 0).
  """
  if cosine:
    queries, items = l2_normalize(queries), l2_normalize(items)
  return jnp.max(jnp.einsum('qd,bld->qbl', queries, items), axis=-1)


def similarity(queries: jax.Array, vectors: jax.Array, cosine: bool) -> jax.Array:
  """queries `[Q, D]`, one vector per video `[B, D]` -> `[Q, B]`."""
  if cosine:
    queries, vectors = l2_normalize(queries), l2_normalize(vectors)
  return queries @ vectors.T
