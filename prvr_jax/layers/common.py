"""Input projection, trainable positional encoding, attention pooling, an identity init."""

import flax.linen as nn
import jax
import jax.numpy as jnp

from prvr_jax.layers.attention import dense, dense_init, layer_norm

# `mask_logits` of the official code: masked positions get this logit before the softmax.
POOLING_MASKED_LOGIT = -1e10


def identity_kernel(key: jax.Array, shape: tuple[int, ...], dtype=jnp.float32) -> jax.Array:
  """`torch.nn.init.eye_` of a Linear weight as a Dense kernel `[in, out]` (its transpose is
  `eye(in, out)` as well)."""
  del key
  return jnp.eye(*shape, dtype=dtype)


class InputProjection(nn.Module):
  """LayerNorm -> Dropout -> Linear -> ReLU: `[..., D_in] -> [..., features]`."""
  features: int
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
    x = layer_norm('norm')(x)
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    return nn.relu(dense(self.features, 'dense')(x))


class PositionalEncoding(nn.Module):
  """x + learned position embedding -> LayerNorm -> Dropout: `[B, L, D] -> [B, L, D]`,
  L <= max_len."""
  max_len: int
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
    length = x.shape[-2]
    if length > self.max_len:
      raise ValueError(f'sequence length {length} exceeds the {self.max_len} learned positions')
    embedding = self.param('embedding', dense_init, (self.max_len, x.shape[-1]))
    x = layer_norm('norm')(x + embedding[:length])
    return nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)


class AttentionPooling(nn.Module):
  """`softmax_L(w . x_t)` weighted sum over real positions: `[B, L, D], [B, L] -> [B, D]`."""

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
    logits = dense(1, 'score', use_bias=False)(x)[..., 0]
    logits = logits * mask + (1.0 - mask) * POOLING_MASKED_LOGIT
    weights = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum('bl,bld->bd', weights, x)
