"""Masked reductions shared by the loss terms (the batch contract's padding masks).

Every loss takes `query_valid [Q]`, `video_valid [B]` and `query_video [Q]` (the video of
each query, an index into the B videos). Padding items contribute nothing and every average
runs over valid items only, so a padded batch gives the value of the unpadded batch.
"""

import jax
import jax.numpy as jnp

Array = jax.Array


def upcast(x: Array) -> Array:
  """`x` in at least float32 (losses never accumulate in half precision)."""
  x = jnp.asarray(x)
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def masked_logsumexp(x: Array, mask: Array, axis: int) -> Array:
  """logsumexp over the entries where `mask`; 0 where nothing is selected.

  Masked entries are filled with a finite very negative value (not -inf) so that fully
  masked slices stay finite in value and gradient.
  """
  filled = jnp.where(mask, x, jnp.finfo(x.dtype).min)
  return jnp.where(mask.any(axis), jax.nn.logsumexp(filled, axis=axis), 0.)


def masked_mean(x: Array, mask: Array) -> Array:
  """Mean of x over mask (0 when the mask is empty)."""
  count = mask.sum()
  return jnp.where(mask, x, 0.).sum() / jnp.maximum(count, 1)


def hinge(x: Array) -> Array:
  """max(x, 0) whose gradient at exactly 0 is 1, as torch.clamp(min=0) passes it."""
  return jnp.where(x >= 0, x, 0.)


def positives(query_video: Array, query_valid: Array, video_valid: Array) -> Array:
  """[Q, B] bool: valid query q belongs to valid video v."""
  num_videos = video_valid.shape[0]
  return ((query_video[:, None] == jnp.arange(num_videos)[None, :])
          & query_valid[:, None] & video_valid[None, :])


def same_video_pairs(query_video: Array, query_valid: Array) -> Array:
  """[Q, Q] bool: distinct valid queries of the same video."""
  num_queries = query_video.shape[0]
  return ((query_video[:, None] == query_video[None, :])
          & query_valid[:, None] & query_valid[None, :]
          & ~jnp.eye(num_queries, dtype=bool))
