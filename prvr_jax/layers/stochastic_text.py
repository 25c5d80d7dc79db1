"""Text as a mass (T-MASS): a similarity-aware radius, noise banks and max-over-samples scores.

A query embedding `t` becomes the stochastic embedding `t + eps * R`, with `R = exp(S W + b)`
a radius computed from the query's similarities `S` to what it is compared with, and `eps`
drawn from U[0, 1) (the official default) or N(0, std^2) (the paper; LSMDC's std 3e-3).

Evaluation scores a (query, video) pair by the best of `M` samples. The noise is a per-video
bank drawn from `fold_in(key, video_key)` (`video_noise_bank`), or fresh per (query, video,
sample) from `fold_in(fold_in(fold_in(key, video_key), query_key), m)` (`pair_noise`, the
official code's draw), so a pair's score depends on nothing but the pair, the key and the
parameters: not on the chunking, the device count, the gallery order or the other queries.
Per-video scores are computed from `[Q, B, M]` contractions (`max_over_samples`); per-pair
ones one sample at a time (`best_samples`); the `[Q, B, M, D]` samples are never formed.
"""

from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from prvr_jax import ops
from prvr_jax.layers.common import identity_kernel

PRIORS = ('uniform01', 'normal')
# Evaluation noise: one bank per video shared by every query ('per_video', indexable), or
# fresh noise per (query, video, sample) as the official `rand_like` draws it ('per_pair').
NOISE_MODES = ('per_video', 'per_pair')


def draw_noise(key: jax.Array, shape: tuple[int, ...], prior: str, std: float) -> jax.Array:
  """`eps` of `shape`: U[0, 1) for 'uniform01', N(0, std^2) for 'normal'."""
  if prior == 'uniform01':
    return jax.random.uniform(key, shape)
  if prior == 'normal':
    return std * jax.random.normal(key, shape)
  raise ValueError(f'unknown stochastic prior {prior!r}; expected one of {PRIORS}')


def video_noise_bank(key: jax.Array, video_keys: jax.Array, num_samples: int, dim: int,
                     prior: str, std: float) -> jax.Array:
  """`[B, M, D]` noise of each video, drawn from `fold_in(key, video_keys[b])`."""
  return jax.vmap(lambda k: draw_noise(jax.random.fold_in(key, k), (num_samples, dim), prior,
                                       std))(video_keys.astype(jnp.uint32))


def row_keys(rows: jax.Array) -> jax.Array:
  """`[Q]` uint32 hash of each row's bits (`[Q, ...]` ints or floats): a query's key for its
  per-pair noise, from its input (tokens or feature), which no computation rounds."""
  flat = rows.reshape(rows.shape[0], -1)
  if jnp.issubdtype(flat.dtype, jnp.floating):
    bits = jax.lax.bitcast_convert_type(flat.astype(jnp.float32), jnp.uint32)
  else:
    bits = flat.astype(jnp.uint32)
  weights = (jnp.arange(flat.shape[1], dtype=jnp.uint32) * jnp.uint32(2) + jnp.uint32(1)
             ) * jnp.uint32(0x9E3779B1)
  return jnp.sum(bits * weights, axis=-1, dtype=jnp.uint32)


def keys_as_columns(keys: jax.Array) -> jax.Array:
  """`[Q]` uint32 -> `[Q, 4]` float32: its four bytes, exact in any float dtype (bfloat16
  included), so a key rides along with the query's features."""
  return jnp.stack([(keys >> shift) & 0xFF for shift in (24, 16, 8, 0)],
                   axis=-1).astype(jnp.float32)


def keys_from_columns(columns: jax.Array) -> jax.Array:
  """`keys_as_columns`' inverse."""
  parts = columns.astype(jnp.uint32)
  return (parts[:, 0] << 24) | (parts[:, 1] << 16) | (parts[:, 2] << 8) | parts[:, 3]


def pair_noise(key: jax.Array, query_keys: jax.Array, video_keys: jax.Array, sample: jax.Array,
               dim: int, prior: str, std: float) -> jax.Array:
  """`[Q, B, D]` noise of sample `sample` for every (query, video) pair, drawn from
  `fold_in(fold_in(fold_in(key, video), query), sample)`: independent across pairs and samples,
  as the official code's fresh `rand_like` per (text, video, trial)."""
  def one(query_key, video_key):
    pair_key = jax.random.fold_in(jax.random.fold_in(key, video_key), query_key)
    return draw_noise(jax.random.fold_in(pair_key, sample), (dim,), prior, std)
  return jax.vmap(lambda q: jax.vmap(lambda v: one(q, v))(video_keys.astype(jnp.uint32)))(
      query_keys.astype(jnp.uint32))


def best_samples(text: jax.Array, radius: jax.Array, targets: jax.Array,
                 noise_of: Callable[[jax.Array], jax.Array], num_samples: int
                 ) -> tuple[jax.Array, jax.Array]:
  """(max_m cos(s_m, targets) `[Q, B]`, the first best sample `[Q, B, D]`), with
  `s_m = text[q] + noise_of(m)[q, b] * radius[q, b]` built one sample at a time (the official
  evaluation's trials: normalise, dot, argmax over trials).

  Args:
    text: `[Q, D]` deterministic query embeddings.
    radius: `[Q, B, D]` radius of each pair.
    targets: `[Q, B, D]` what each pair's samples are compared with.
    noise_of: sample index (traced int32) -> its noise, broadcastable to `[Q, B, D]`.
    num_samples: M.
  """
  unit = ops.l2_normalize(targets)

  def step(carry, m):
    best, chosen = carry
    sample = text[:, None] + noise_of(m) * radius
    cosine = jnp.sum(ops.l2_normalize(sample) * unit, axis=-1)
    better = cosine > best
    return (jnp.where(better, cosine, best), jnp.where(better[..., None], sample, chosen)), None

  init = (jnp.full(unit.shape[:2], -jnp.inf, unit.dtype), jnp.zeros_like(radius))
  (best, chosen), _ = jax.lax.scan(step, init, jnp.arange(num_samples))
  return best, chosen


class SimilarityRadius(nn.Module):
  """log R = S W + b (paper Eq. 7 with a bias, as coded): W starts at the identity, b at 0.

  similarities `[..., S]` -> log radius `[..., features]` (the radius is its exp).
  """
  features: int

  @nn.compact
  def __call__(self, similarities: jax.Array) -> jax.Array:
    return nn.Dense(self.features, kernel_init=identity_kernel, name='linear')(similarities)


def support_text(text: jax.Array, target: jax.Array, radius: jax.Array) -> jax.Array:
  """Paper Eq. 8: `t + (v - t) / ||v - t|| * R`, the point of the mass towards `v`.

  Shapes broadcast: text `[..., D]`, target `[..., D]`, radius `[..., D]`.
  """
  pointer = target - text
  return text + pointer / jnp.linalg.norm(pointer, axis=-1, keepdims=True) * radius


def max_over_samples(text: jax.Array, radius: jax.Array, targets: jax.Array,
                     noise: jax.Array) -> jax.Array:
  """`max_m cos(text[q] + noise[b, m] * radius[q, b], targets[q, b])` (paper Eq. 10).

  Args:
    text: `[Q, D]` deterministic query embeddings.
    radius: `[Q, B, D]` radius of each pair.
    targets: `[Q, B, D]` what each pair's samples are compared with (X-Pool: the video pooled
      by the query).
    noise: `[B, M, D]` each video's noise bank.

  Returns:
    `[Q, B]` scores, from `[Q, B, M]` contractions over D:
    <t + e R, u> = <t, u> + <e, R u>, ||t + e R||^2 = ||t||^2 + 2 <e, t R> + <e^2, R^2>.
  """
  unit = ops.l2_normalize(targets)
  base = jnp.einsum('qd,qbd->qb', text, unit)
  shift = jnp.einsum('qbd,bmd->qbm', radius * unit, noise)
  cross = jnp.einsum('qbd,bmd->qbm', text[:, None] * radius, noise)
  spread = jnp.einsum('qbd,bmd->qbm', radius * radius, noise * noise)
  squared_norm = jnp.sum(text * text, axis=-1)[:, None, None] + 2 * cross + spread
  cosines = (base[..., None] + shift) * jax.lax.rsqrt(
      jnp.maximum(squared_norm, ops.NORMALIZE_EPS ** 2))
  return jnp.max(cosines, axis=-1)


# ----------------------------------------------------------------------------- plug-in for PRVR
# A PRVR model scores a query against sets of stored vectors (clips, frames, prototypes) by the
# max over each set. As a plug-in, the radius input is the query's similarity to the set, made
# invariant to the set's order, and a sample is scored by the max over the set.


def sorted_top_k(similarities: jax.Array, k: int) -> jax.Array:
  """`[..., L]` -> the `min(k, L)` largest values, sorted descending: a radius input that does
  not depend on the order of a set's elements."""
  return jax.lax.top_k(similarities, min(k, similarities.shape[-1]))[0]


def max_over_samples_and_sets(texts: Sequence[jax.Array], radii: Sequence[jax.Array],
                              sets: Sequence[jax.Array], weights: Sequence[float],
                              noise: jax.Array) -> jax.Array:
  """`max_m sum_c w_c max_l cos(texts_c[q] + noise[b, m] * radii_c[q, b], sets_c[b, l])`.

  Branch c's samples share each video's noise (one draw per sample, each branch scaled by its
  own radius); the branches are fused per sample, then the best sample is kept.

  Args:
    texts: per branch `[Q, D]` deterministic query embeddings.
    radii: per branch `[Q, B, D]` radius of each pair.
    sets: per branch `[B, L_c, D]` each video's stored elements (zero vectors for padding:
      cosine 0, as `ops.max_similarity` scores them).
    weights: per branch fusion weight.
    noise: `[B, M, D]` each video's noise bank.

  Returns:
    `[Q, B]`. One sample at a time (`lax.map` over M): the largest intermediates are one
    sample's `[Q, B, D]` points and `[Q, B, L_c]` cosines, never `[Q, B, M, D]`.
  """
  units = [ops.l2_normalize(s) for s in sets]

  def one_sample(eps):  # [B, D]
    fused = 0.0
    for text, radius, unit, weight in zip(texts, radii, units, weights):
      point = ops.l2_normalize(text[:, None] + eps[None] * radius)
      fused = fused + weight * jnp.max(jnp.einsum('qbd,bld->qbl', point, unit), axis=-1)
    return fused

  return jnp.max(jax.lax.map(one_sample, jnp.swapaxes(noise, 0, 1)), axis=0)
