"""Encoder stacks of the MS-SL lineage (MS-SL, GMMFormer, GMMFormer v2), built from the layers.

* `SequenceEncoder`: features -> input projection -> positional encoding -> one attention
  block (MS-SL's clip and frame branches).
* `QueryEncoder`: a `SequenceEncoder` over the tokens, then attention pooling to one vector
  per query.
* `VideoBranch`: visual features -> input projection -> positional encoding -> GMMBlocks.
"""

import flax.linen as nn
import jax

from prvr_jax.layers.attention import BLOCKS
from prvr_jax.layers.common import AttentionPooling, InputProjection, PositionalEncoding
from prvr_jax.layers.gmm_block import GMMBlock


def _encode_sequence(encoder: 'SequenceEncoder | QueryEncoder', feats: jax.Array,
                     mask: jax.Array | None, deterministic: bool) -> jax.Array:
  """The layers both encoders share, created inside the caller's compact method (so their
  parameters are `input_proj`, `pos_embed`, `encoder` of the caller)."""
  x = InputProjection(encoder.hidden_dim, encoder.input_dropout, name='input_proj')(
      feats, deterministic)
  x = PositionalEncoding(encoder.max_len, encoder.input_dropout, name='pos_embed')(
      x, deterministic)
  return BLOCKS[encoder.block](encoder.num_heads, encoder.dropout, name='encoder')(
      x, key_mask=mask, deterministic=deterministic)


class SequenceEncoder(nn.Module):
  """`[B, L, D_in], mask [B, L] or None -> [B, L, D]` (L <= max_len).

  Attributes:
    hidden_dim: D.
    num_heads: attention heads.
    max_len: learned positions.
    block: 'v1' or 'v2' (`prvr_jax.layers.attention.BLOCKS`).
    dropout: dropout inside the block.
    input_dropout: dropout of the input projection and positional encoding.
  """
  hidden_dim: int
  num_heads: int
  max_len: int
  block: str = 'v1'
  dropout: float = 0.0
  input_dropout: float = 0.0

  @nn.compact
  def __call__(self, feats: jax.Array, mask: jax.Array | None = None,
               deterministic: bool = True) -> jax.Array:
    return _encode_sequence(self, feats, mask, deterministic)


class QueryEncoder(nn.Module):
  """`[Q, Lq, Dq], [Q, Lq] -> [Q, D]`: `SequenceEncoder`'s layers, then attention pooling.

  Attributes are `SequenceEncoder`'s, with `max_query_len` the learned positions.
  """
  hidden_dim: int
  num_heads: int
  max_query_len: int
  block: str
  dropout: float = 0.0
  input_dropout: float = 0.0

  @property
  def max_len(self) -> int:
    return self.max_query_len

  @nn.compact
  def __call__(self, query_feats: jax.Array, query_mask: jax.Array,
               deterministic: bool = True, tokens: bool = False
               ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """The pooled `[Q, D]`; with `tokens`, also the token encodings `[Q, Lq, D]` it pools
    (the probabilistic plug-in's query support sets read them)."""
    x = _encode_sequence(self, query_feats, query_mask, deterministic)
    pooled = AttentionPooling(name='pooling')(x, query_mask)
    return (pooled, x) if tokens else pooled


class VideoBranch(nn.Module):
  """`[B, L, Dv] -> [B, L, D]`: `num_blocks` GMMBlocks named `encoder_0..`.

  Attributes mirror `GMMBlock`'s, plus `hidden_dim`, `max_len` (learned positions),
  `num_blocks` and `input_dropout`.
  """
  hidden_dim: int
  num_heads: int
  max_len: int
  widths: tuple[float | None, ...]
  block: str
  num_blocks: int = 1
  window: str = 'gaussian'
  aggregation: str = 'average'
  temperature: float = 1.0
  dropout: float = 0.0
  input_dropout: float = 0.0

  @nn.compact
  def __call__(self, feats: jax.Array, mask: jax.Array | None = None,
               window_length: jax.Array | None = None, query_token: jax.Array | None = None,
               deterministic: bool = True, key_bias: jax.Array | None = None) -> jax.Array:
    """`key_bias [B, L]`: added to the branches' attention logits (`GMMBlock`)."""
    x = InputProjection(self.hidden_dim, self.input_dropout, name='input_proj')(
        feats, deterministic)
    x = PositionalEncoding(self.max_len, self.input_dropout, name='pos_embed')(x, deterministic)
    for i in range(self.num_blocks):
      x = GMMBlock(self.widths, self.num_heads, self.dropout, self.block, self.window,
                   self.aggregation, self.temperature, name=f'encoder_{i}')(
                       x, mask, window_length, query_token, deterministic, key_bias)
    return x
