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


def inverse_norm(x: jax.Array, eps: float = NORMALIZE_EPS) -> jax.Array:
  """1 / max(||x||, eps) along the last axis (`l2_normalize`'s factor), without that axis."""
  return jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1), eps * eps))


def set_similarities(queries: jax.Array, items: jax.Array, cosine: bool) -> jax.Array:
  """`sim(q, items[b, t])` for every query and item: queries `[Q, D]`, items `[B, L, D]` ->
  `[Q, B, L]`.

  One `[Q, D] x [D, B L]` matmul on the raw items; for cosines the queries are normalised and
  the products scaled by the items' inverse norms afterwards, which equals normalising the
  items first but never writes a normalised copy of them (on CPU that copy and the 3-D
  contraction cost several times the matmul itself).
  """
  if cosine:
    queries = l2_normalize(queries)
  flat = items.reshape(-1, items.shape[-1])
  products = (queries @ flat.T).reshape(queries.shape[:-1] + items.shape[:-1])
  return products * inverse_norm(items) if cosine else products


def set_cosines_and_dots(queries: jax.Array, items: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(cosines, raw dot products), each `[Q, B, L]`, of queries `[Q, D]` with items `[B, L, D]`,
  from one product: the cosines are the products scaled by both inverse norms.

  Training scores each query against the same sets twice, by cosine (triplet terms) and by raw
  dot (InfoNCE): one product instead of two, forward and backward.
  """
  products = set_similarities(queries, items, cosine=False)
  return products * inverse_norm(queries)[:, None, None] * inverse_norm(items), products


def max_similarities(queries: jax.Array, items: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(`max_similarity(..., cosine=True)`, `max_similarity(..., cosine=False)`), each `[Q, B]`,
  from one product (`set_cosines_and_dots`)."""
  cosines, products = set_cosines_and_dots(queries, items)
  return jnp.max(cosines, axis=-1), jnp.max(products, axis=-1)


def max_similarity(queries: jax.Array, items: jax.Array, cosine: bool) -> jax.Array:
  """`max_t sim(q, items[b, t])`: queries `[Q, D]`, item sets `[B, L, D]` -> `[Q, B]`.

  Padded items are included as the official code does (they are zero vectors, similarity 0).
  """
  return jnp.max(set_similarities(queries, items, cosine), axis=-1)


def similarity(queries: jax.Array, vectors: jax.Array, cosine: bool) -> jax.Array:
  """queries `[Q, D]`, one vector per video `[B, D]` -> `[Q, B]`."""
  if cosine:
    queries, vectors = l2_normalize(queries), l2_normalize(vectors)
  return queries @ vectors.T
