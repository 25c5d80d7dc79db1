"""Masked multi-head attention with an optional constraint window, and the block flavours.

* `AttentionBlockV1` (GMMFormer, MS-SL, AMDNet): attention -> output projection -> dropout ->
  LayerNorm(x + .) (post-LN, no FFN).
* `AttentionBlockV2` (GMMFormer v2): attention without output projection -> dropout ->
  LayerNorm(x + .) -> FFN(`ffn_multiplier` x D, ReLU) -> dropout -> LayerNorm(x + .).
  `ffn_multiplier=1` with a separate query input is v2's temporal-consolidation cross-attention.

The layers are plain Flax. Two operations read the shared input of `GMMBlock`'s parallel
branches and so take its batching rules (`prvr_jax.kernels.branches`, docs/kernels.md): a
block's residual `branches.residual(x, y)` and the projections' `branches.matmul`; anywhere
else they are `x + y` and `precision.matmul`.
"""

from collections.abc import Callable
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from prvr_jax.kernels import branches
from prvr_jax.layers import precision
from prvr_jax.layers.precision import dense_dot_general

# PyTorch defaults the official code relies on.
LAYER_NORM_EPS = 1e-5
MASKED_LOGIT = -10000.0
dense_init = nn.initializers.normal(stddev=0.02)


def layer_norm(name: str) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=LAYER_NORM_EPS, name=name)


def dense(features: int, name: str, use_bias: bool = True) -> nn.Dense:
  return nn.Dense(features, use_bias=use_bias, kernel_init=dense_init,
                  dot_general=dense_dot_general, name=name)


class Projection(nn.Module):
  """A Linear layer with `nn.Dense`'s parameters (`kernel [D_in, F]`, `bias [F]`) that can also
  hand out its weights, for attention that folds a projection into the other operand."""
  in_features: int
  features: int
  kernel_init: Callable[..., jax.Array] = dense_init

  def setup(self):
    self.kernel = self.param('kernel', self.kernel_init, (self.in_features, self.features))
    self.bias = self.param('bias', nn.initializers.zeros, (self.features,))

  def __call__(self, x: jax.Array) -> jax.Array:
    return branches.matmul(x, self.kernel) + self.bias


def folding_is_cheaper(num_folded: int, num_other: int, width: int, num_heads: int) -> bool:
  """Whether a `[D, D]` projection between per-head dots takes fewer multiply-adds applied per
  head at full width to the `num_folded` rows, which then meet the `num_other` rows at width D,
  `Nf D^2 + H Nf No D`, than applied to the `num_other` rows before the per-head dots,
  `No D^2 + Nf No D`.

  Attention's key and value projections: the queries fold (`q W_k^T` per head, then against
  the raw keys). X-Pool's output projection: the frames' values fold (`v W_o` per head, then
  pooled), instead of projecting every pooled (text, video) pair.
  """
  return (num_folded * (width + num_heads * num_other)
          < num_other * (width + num_folded))


class MultiHeadAttention(nn.Module):
  """Scaled dot-product attention; the window multiplies the logits, masked keys get -10000.

  With few queries against many keys (a learnable query token attending over a sequence) the
  key and value projections are folded into the query side instead of being applied to every
  key: the same function with O(Lq D^2 + H Lq Lk D) instead of O(Lk D^2 + Lq Lk D) work, taken
  only where that is less (never for self-attention, Lq = Lk).

  Attributes:
    num_heads: number of heads; the model width must be divisible by it.
    dropout_rate: dropout on the attention probabilities.
  """
  num_heads: int
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, queries: jax.Array, keys: jax.Array, key_mask: jax.Array | None = None,
               window: jax.Array | None = None, deterministic: bool = True,
               return_probs: bool = False, key_bias: jax.Array | None = None
               ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """queries `[B, Lq, D]`, keys (= values) `[B, Lk, D]`, key_mask `[B, Lk]` (1 = real key),
    window broadcastable to `[B, 1, Lq, Lk]` -> `[B, Lq, D]`, and with `return_probs` the
    attention probabilities `[B, H, Lq, Lk]` (before dropout). `key_bias [B, Lk]` is added to
    every query's logits after the mask (MSC-PRVR's log token sizes: proportional attention
    over merged tokens)."""
    width = queries.shape[-1]
    if width % self.num_heads:
      raise ValueError(f'hidden size {width} is not a multiple of num_heads {self.num_heads}')
    head_dim = width // self.num_heads
    split = lambda x: x.reshape(x.shape[:-1] + (self.num_heads, head_dim))
    query_proj, key_proj, value_proj = (Projection(width, width, name=n)
                                        for n in ('query', 'key', 'value'))
    q = split(query_proj(queries))
    fold = folding_is_cheaper(queries.shape[-2], keys.shape[-2], width, self.num_heads)
    if fold:  # logits = (q W_k^T) . x + q . b_k
      q_keys = jnp.einsum('bqhd,ehd->bqhe', q, split(key_proj.kernel))  # [B, Lq, H, D]
      logits = (jnp.einsum('bqhe,bke->bhqk', q_keys, keys)
                + jnp.einsum('bqhd,hd->bhq', q, split(key_proj.bias))[..., None])
    else:
      logits = precision.einsum('bqhd,bkhd->bhqk', q, split(key_proj(keys)))
    logits = logits / math.sqrt(head_dim)
    if window is not None:
      logits = logits * window
    if key_mask is not None:
      logits = logits + (1.0 - key_mask[:, None, None, :]) * MASKED_LOGIT
    if key_bias is not None:
      logits = logits + key_bias[:, None, None, :]
    attention = jax.nn.softmax(logits, axis=-1)
    probs = nn.Dropout(self.dropout_rate)(attention, deterministic=deterministic)
    if fold:  # sum_k p_k (x_k W_v + b_v) = (sum_k p_k x_k) W_v + (sum_k p_k) b_v
      attended = jnp.einsum('bhqk,bke->bqhe', probs, keys)  # [B, Lq, H, D]
      out = (jnp.einsum('bqhe,ehd->bqhd', attended, split(value_proj.kernel))
             + jnp.einsum('bhqk,hd->bqhd', probs, split(value_proj.bias)))
    else:
      out = precision.einsum('bhqk,bkhd->bqhd', probs, split(value_proj(keys)))
    out = out.reshape(out.shape[:-2] + (width,))
    return (out, attention) if return_probs else out


class AttentionBlockV1(nn.Module):
  """GMMFormer v1 / MS-SL `BertAttention`: post-LN with an output projection, no FFN."""
  num_heads: int
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x: jax.Array, context: jax.Array | None = None,
               key_mask: jax.Array | None = None, window: jax.Array | None = None,
               deterministic: bool = True, return_probs: bool = False
               ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """x `[B, L, D]` (context `[B, Lk, D]`, default x) -> `[B, L, D]`, and with
    `return_probs` the attention probabilities `[B, H, L, Lk]`."""
    context = x if context is None else context
    y, probs = MultiHeadAttention(self.num_heads, self.dropout_rate, name='attention')(
        x, context, key_mask, window, deterministic, return_probs=True)
    y = dense(x.shape[-1], 'output')(y)
    y = nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)
    out = layer_norm('norm')(branches.residual(x, y))
    return (out, probs) if return_probs else out


class AttentionBlockV2(nn.Module):
  """GMMFormer v2 `BertAttention` (ffn_multiplier 4) / `BertCrossAttention` (ffn_multiplier 1)."""
  num_heads: int
  dropout_rate: float = 0.0
  ffn_multiplier: int = 4

  @nn.compact
  def __call__(self, x: jax.Array, context: jax.Array | None = None,
               key_mask: jax.Array | None = None, window: jax.Array | None = None,
               deterministic: bool = True, key_bias: jax.Array | None = None) -> jax.Array:
    """x `[B, L, D]` (context `[B, Lk, D]`, default x) -> `[B, L, D]`; `key_bias [B, Lk]` as
    `MultiHeadAttention`'s."""
    width = x.shape[-1]
    context = x if context is None else context
    drop = lambda y: nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)
    y = MultiHeadAttention(self.num_heads, self.dropout_rate, name='attention')(
        x, context, key_mask, window, deterministic, key_bias=key_bias)
    x = layer_norm('norm1')(branches.residual(x, drop(y)))
    y = dense(self.ffn_multiplier * width, 'ffn_in')(x)
    y = dense(width, 'ffn_out')(drop(nn.relu(y)))
    return layer_norm('norm2')(x + drop(y))


BLOCKS = {'v1': AttentionBlockV1, 'v2': AttentionBlockV2}
