"""Decoders that reconstruct the inputs from prototypes (ProtoPRVR's dual reconstruction).

* `BroadcastDecoder` (uni-modal): every prototype is broadcast to every position of the
  sequence, decoded by an MLP into a feature and a weight; the softmax of the weights over
  the prototypes mixes them into one feature per position (Slot Attention's spatial
  broadcast decoder, in time).
* `MaskedTokenDecoder` (cross-modal): masked text tokens, projected, cross-attend to one
  prototype and then to each other (Eq. 3: SA(CA(fc_q(T); fc_k(p); fc_v(p)))), and are
  projected back to the token width.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from prvr_jax.layers.attention import AttentionBlockV1, dense, dense_init


class BroadcastDecoder(nn.Module):
  """`prototypes [B, P, D]`, `length` L <= max_len, `features` F -> `[B, L, F]`.

  h[p, t] = ReLU(W_1 prototype_p + position_t); weight[p, t] = w . h[p, t];
  out[t] = W_2 (sum_p softmax_p(weight)[p, t] h[p, t]) + b_2, which equals mixing the decoded
  features W_2 h + b_2 (the last layer is linear), without materialising `[B, P, L, features]`.

  Attributes:
    hidden_dim: width of h.
    max_len: learned positions.
  """
  hidden_dim: int
  max_len: int

  @nn.compact
  def __call__(self, prototypes: jax.Array, length: int, features: int) -> jax.Array:
    if length > self.max_len:
      raise ValueError(f'sequence length {length} exceeds the {self.max_len} learned positions')
    positions = self.param('positions', dense_init, (self.max_len, self.hidden_dim))[:length]
    hidden = nn.relu(dense(self.hidden_dim, 'hidden')(prototypes)[:, :, None, :]
                     + positions)  # [B, P, L, H]
    mixing = jax.nn.softmax(dense(1, 'weight')(hidden)[..., 0], axis=1)  # [B, P, L]
    return dense(features, 'output')(jnp.einsum('bpl,bplh->blh', mixing, hidden))


class MaskedTokenDecoder(nn.Module):
  """`tokens [Q, Lq, Dq]`, `token_mask [Q, Lq]` (1 = real token), `masked [Q, Lq]` (bool:
  replaced by the learned `mask_token [Dq]`), `prototype [Q, D]` -> reconstructed tokens
  `[Q, Lq, Dq]`.

  fc_q (with learned positions) aligns the tokens to the prototype width; the cross-attention
  block's key and value projections act as fc_k, fc_v. With a single prototype the softmax
  over keys is 1, so the key projection receives no gradient (as in Eq. 3).

  Attributes:
    hidden_dim: the prototype width D.
    num_heads: attention heads.
    max_len: learned token positions.
    dropout: dropout inside the attention blocks.
  """
  hidden_dim: int
  num_heads: int
  max_len: int
  dropout: float = 0.0

  @nn.compact
  def __call__(self, tokens: jax.Array, token_mask: jax.Array, masked: jax.Array,
               prototype: jax.Array, deterministic: bool = True) -> jax.Array:
    length = tokens.shape[1]
    mask_token = self.param('mask_token', dense_init, (tokens.shape[-1],))
    tokens = jnp.where(masked[..., None], mask_token, tokens)
    if length > self.max_len:
      raise ValueError(f'query length {length} exceeds the {self.max_len} learned positions')
    positions = self.param('positions', dense_init, (self.max_len, self.hidden_dim))[:length]
    x = dense(self.hidden_dim, 'token_proj')(tokens) + positions
    context = dense(self.hidden_dim, 'prototype_proj')(prototype)[:, None, :]
    x = AttentionBlockV1(self.num_heads, self.dropout, name='cross_attention')(
        x, context, deterministic=deterministic)
    x = AttentionBlockV1(self.num_heads, self.dropout, name='self_attention')(
        x, key_mask=token_mask, deterministic=deterministic)
    return dense(tokens.shape[-1], 'output')(x)
