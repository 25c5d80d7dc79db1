"""LayerNorm's CPU kernel: `flax.linen.LayerNorm`'s forward with a hand-written backward pass.

Reference: `flax.linen.LayerNorm` over the last axis, which the layers use. The forward here is
Flax's, operation for operation (mean and mean square in one pass,
`var = max(0, E[x^2] - mean^2)`, `(x - mean) * (rsqrt(var + eps) * scale) + bias`), and the
parameters are the same (`scale` and `bias`, `[D]`), so checkpoints and converted official
weights load unchanged. Differentiating Flax's form, JAX keeps `x - mean` and the `[..., D]`
product `rsqrt(var + eps) * scale` for the backward pass, and XLA:CPU writes that product and
broadcasts of the scale and the inverse deviation out to full size for its reduction kernels.
Here the backward pass keeps only `x` and the per-row statistics and computes the usual closed
form, with `g = dy * scale` and `xhat = (x - mean) * rstd`:

    dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  dscale = sum(dy * xhat),  dbias = sum(dy)

which is the gradient of Flax's form (its `max(0, .)` only clamps rounding of a constant row,
where `xhat` is 0 and both give `rstd * (g - mean(g))`). Less peak memory at the same speed;
`prvr_jax.kernels.policy` says where it stands in for `nn.LayerNorm`.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp


def _statistics(x: jax.Array, epsilon: float) -> tuple[jax.Array, jax.Array]:
  """`x [..., D]` -> (mean, rsqrt(var + epsilon)), each `[..., 1]`."""
  mean = jnp.mean(x, axis=-1, keepdims=True)
  mean_square = jnp.mean(x * x, axis=-1, keepdims=True)
  variance = jnp.maximum(0.0, mean_square - mean * mean)
  return mean, jax.lax.rsqrt(variance + epsilon)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def layer_norm(x: jax.Array, scale: jax.Array, bias: jax.Array, epsilon: float) -> jax.Array:
  """`x [..., D]` normalised over its last axis, times `scale [D]` plus `bias [D]`."""
  return _layer_norm_fwd(x, scale, bias, epsilon)[0]


def _layer_norm_fwd(x, scale, bias, epsilon):
  mean, rstd = _statistics(x, epsilon)
  return (x - mean) * (rstd * scale) + bias, (x, mean, rstd, scale)


def _layer_norm_bwd(epsilon, residuals, dy):
  del epsilon
  x, mean, rstd, scale = residuals
  xhat = (x - mean) * rstd
  g = dy * scale
  dx = rstd * (g - jnp.mean(g, axis=-1, keepdims=True)
               - xhat * jnp.mean(g * xhat, axis=-1, keepdims=True))
  rows = tuple(range(dy.ndim - 1))
  return dx, jnp.sum(dy * xhat, axis=rows), jnp.sum(dy, axis=rows)


layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


def supports(module: nn.LayerNorm, x: jax.Array) -> bool:
  """Whether `apply` computes `module(x)`: a float32 LayerNorm over the last axis with a scale
  and a bias, Flax's one-pass variance and no cross-device statistics."""
  return (x.dtype == jnp.float32 and module.dtype is None and module.param_dtype == jnp.float32
          and module.reduction_axes in (-1, (-1,)) and module.feature_axes in (-1, (-1,))
          and module.use_bias and module.use_scale and module.use_fast_variance
          and module.axis_name is None)


def apply(module: nn.LayerNorm, x: jax.Array) -> jax.Array:
  """`module(x)` with `layer_norm`'s backward pass; the same parameters, made by the same
  initialisers."""
  width = x.shape[-1]
  scale = module.param('scale', module.scale_init, (width,), module.param_dtype)
  bias = module.param('bias', module.bias_init, (width,), module.param_dtype)
  return layer_norm(x, scale, bias, module.epsilon)
