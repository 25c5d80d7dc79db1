"""Text as a mass (T-MASS): a similarity-aware radius, noise banks and max-over-samples scores.

A query embedding `t` becomes the stochastic embedding `t + eps * R`, with `R = exp(S W + b)`
a radius computed from the query's similarities `S` to what it is compared with, and `eps`
drawn from U[0, 1) (the official default) or N(0, std^2) (the paper; LSMDC's std 3e-3).

Evaluation scores a (query, video) pair by the best of `M` samples. The noise is a per-video
bank drawn from `fold_in(key, video_key)`, so a pair's score depends on nothing but the pair,
the key and the parameters: not on the chunking, the device count, the gallery order or the
other queries. Scores are computed from `[Q, B, M]` contractions; the `[Q, B, M, D]` samples
are never formed.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from prvr_jax import ops
from prvr_jax.layers.common import identity_kernel

PRIORS = ('uniform01', 'normal')


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
