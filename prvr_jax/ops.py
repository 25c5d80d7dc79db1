"""Small numerical helpers shared by models and losses."""

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
