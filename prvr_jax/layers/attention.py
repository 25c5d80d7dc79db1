"""Masked multi-head attention with an optional constraint window, and the block flavours.

* `AttentionBlockV1` (GMMFormer, MS-SL, AMDNet): attention -> output projection -> dropout ->
  LayerNorm(x + .) (post-LN, no FFN).
* `AttentionBlockV2` (GMMFormer v2): attention without output projection -> dropout ->
  LayerNorm(x + .) -> FFN(`ffn_multiplier` x D, ReLU) -> dropout -> LayerNorm(x + .).
  `ffn_multiplier=1` with a separate query input is v2's temporal-consolidation cross-attention.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

# PyTorch defaults the official code relies on.
LAYER_NORM_EPS = 1e-5
MASKED_LOGIT = -10000.0
dense_init = nn.initializers.normal(stddev=0.02)


def layer_norm(name: str) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=LAYER_NORM_EPS, name=name)


def dense(features: int, name: str, use_bias: bool = True) -> nn.Dense:
  return nn.Dense(features, use_bias=use_bias, kernel_init=dense_init, name=name)


class MultiHeadAttention(nn.Module):
  """Scaled dot-product attention; the window multiplies the logits, masked keys get -10000.

  Attributes:
    num_heads: number of heads; the model width must be divisible by it.
    dropout_rate: dropout on the attention probabilities.
  """
  num_heads: int
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, queries: jax.Array, keys: jax.Array, key_mask: jax.Array | None = None,
               window: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
    """queries `[B, Lq, D]`, keys (= values) `[B, Lk, D]`, key_mask `[B, Lk]` (1 = real key),
    window broadcastable to `[B, 1, Lq, Lk]` -> `[B, Lq, D]`."""
    width = queries.shape[-1]
    if width % self.num_heads:
      raise ValueError(f'hidden size {width} is not a multiple of num_heads {self.num_heads}')
    head_dim = width // self.num_heads

    def heads(x, name):
      x = dense(width, name)(x)
      return x.reshape(x.shape[:-1] + (self.num_heads, head_dim))

    q, k, v = heads(queries, 'query'), heads(keys, 'key'), heads(keys, 'value')
    logits = jnp.einsum('bqhd,bkhd->bhqk', q, k) / math.sqrt(head_dim)
    if window is not None:
      logits = logits * window
    if key_mask is not None:
      logits = logits + (1.0 - key_mask[:, None, None, :]) * MASKED_LOGIT
    probs = jax.nn.softmax(logits, axis=-1)
    probs = nn.Dropout(self.dropout_rate)(probs, deterministic=deterministic)
    out = jnp.einsum('bhqk,bkhd->bqhd', probs, v)
    return out.reshape(out.shape[:-2] + (width,))


class AttentionBlockV1(nn.Module):
  """GMMFormer v1 / MS-SL `BertAttention`: post-LN with an output projection, no FFN."""
  num_heads: int
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x: jax.Array, context: jax.Array | None = None,
               key_mask: jax.Array | None = None, window: jax.Array | None = None,
               deterministic: bool = True) -> jax.Array:
    """x `[B, L, D]` (context `[B, Lk, D]`, default x) -> `[B, L, D]`."""
    context = x if context is None else context
    y = MultiHeadAttention(self.num_heads, self.dropout_rate, name='attention')(
        x, context, key_mask, window, deterministic)
    y = dense(x.shape[-1], 'output')(y)
    y = nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)
    return layer_norm('norm')(x + y)


class AttentionBlockV2(nn.Module):
  """GMMFormer v2 `BertAttention` (ffn_multiplier 4) / `BertCrossAttention` (ffn_multiplier 1)."""
  num_heads: int
  dropout_rate: float = 0.0
  ffn_multiplier: int = 4

  @nn.compact
  def __call__(self, x: jax.Array, context: jax.Array | None = None,
               key_mask: jax.Array | None = None, window: jax.Array | None = None,
               deterministic: bool = True) -> jax.Array:
    """x `[B, L, D]` (context `[B, Lk, D]`, default x) -> `[B, L, D]`."""
    width = x.shape[-1]
    context = x if context is None else context
    drop = lambda y: nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)
    y = MultiHeadAttention(self.num_heads, self.dropout_rate, name='attention')(
        x, context, key_mask, window, deterministic)
    x = layer_norm('norm1')(x + drop(y))
    y = dense(self.ffn_multiplier * width, 'ffn_in')(x)
    y = dense(width, 'ffn_out')(drop(nn.relu(y)))
    return layer_norm('norm2')(x + drop(y))


BLOCKS = {'v1': AttentionBlockV1, 'v2': AttentionBlockV2}
