"""Prototype generators: a fixed set of learned vectors aggregates a variable-length sequence.

Every generator maps `feats [B, L, D]`, `mask [B, L]` (1 = real position, or None) to
`(prototypes [B, P, D], attention [B, P, L])`, where `attention[b, p]` is how prototype p's
last update drew on each position (head-averaged; each row sums to 1 over the real
positions, 0 on padding). The prototypes start from P learned vectors shared by all inputs.

* `PrototypeCrossAttention` (ProtoPRVR, Eq. 1): P^(k) = CA(P^(k-1); V; V), K times, one
  post-LN cross-attention block (weights shared across iterations), no interaction between
  prototypes. `update='detr'` (default): as DETR's decoder treats its object queries, the
  learned prototypes are added to the prototype content in the attention queries at every
  iteration; the content starts at 0, so a prototype is what it drew from the video (a
  residual on the learned vectors would make every video's prototypes nearly the same at the
  start of training). `update='paper'`: Eq. 1 as written, the state starts at the learned
  prototypes (P^(0) = P) and is the block's only query input.
* `PerceiverPrototypes` (Perceiver): the same cross-attention, then a latent transformer
  layer (self-attention between prototypes and an FFN) per iteration.
* `SlotAttentionPrototypes` (Slot Attention): softmax over the prototypes (they compete for
  positions), weighted mean over positions, GRU update and a residual MLP per iteration.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from prvr_jax.layers.attention import AttentionBlockV2, MultiHeadAttention, dense
from prvr_jax.layers.attention import layer_norm

# Where the learned prototypes enter Eq. 1 (`PrototypeCrossAttention.update`).
UPDATES = ('detr', 'paper')

# Like DETR's object queries (torch `nn.Embedding`), the prototypes start at N(0, 1): a small
# init would give every prototype the same uniform attention at the start.
prototype_init = nn.initializers.normal(stddev=1.0)


def _initial_prototypes(module: nn.Module, batch: int, width: int) -> jax.Array:
  init = module.param('prototypes', prototype_init, (module.num_prototypes, width))
  return jnp.broadcast_to(init, (batch,) + init.shape)


class _PrototypeQueriedAttention(nn.Module):
  """content <- LayerNorm(content + Dropout(W_o MHA(content + prototypes, V))); also returns
  the head-averaged attention `[B, P, L]`. `prototypes` is what the queries add to the
  content: the learned P (Eq. 1 DETR-style) or 0 (Eq. 1 as written)."""
  num_heads: int
  dropout: float

  @nn.compact
  def __call__(self, content: jax.Array, prototypes: jax.Array, feats: jax.Array,
               mask: jax.Array | None, deterministic: bool) -> tuple[jax.Array, jax.Array]:
    y, probs = MultiHeadAttention(self.num_heads, self.dropout, name='attention')(
        content + prototypes, feats, mask, deterministic=deterministic, return_probs=True)
    y = dense(content.shape[-1], 'output')(y)
    y = nn.Dropout(self.dropout)(y, deterministic=deterministic)
    return layer_norm('norm')(content + y), probs.mean(axis=1)


class PrototypeCrossAttention(nn.Module):
  """ProtoPRVR's prototype generator: `feats [B, L, D], mask [B, L] -> ([B, P, D], [B, P, L])`.

  Usable on its own:

    layer = PrototypeCrossAttention(num_prototypes=30, num_heads=4)
    variables = layer.init(key, feats, mask)
    prototypes, attention = layer.apply(variables, feats, mask)

  Attributes:
    num_prototypes: P.
    num_heads: attention heads (D must be a multiple).
    iterations: K, the cross-attention block applied K times with shared weights.
    dropout: dropout on the attention probabilities and the block output.
    latent_transformer: after each cross-attention, a latent transformer layer
      (self-attention between the prototypes + 4x FFN): `PerceiverPrototypes`.
    update: where the learned prototypes P enter Eq. 1 (`UPDATES`): 'detr', content from 0
      with P added to the attention queries at every iteration, P^(k) = LN(P^(k-1) +
      CA(P^(k-1) + P; V)), P^(0) = 0; or 'paper', P^(k) = LN(P^(k-1) + CA(P^(k-1); V)),
      P^(0) = P. The same parameters either way.
  """
  num_prototypes: int = 30
  num_heads: int = 4
  iterations: int = 1
  dropout: float = 0.0
  latent_transformer: bool = False
  update: str = 'detr'

  @nn.compact
  def __call__(self, feats: jax.Array, mask: jax.Array | None = None,
               deterministic: bool = True) -> tuple[jax.Array, jax.Array]:
    if self.update not in UPDATES:
      raise ValueError(f'{type(self).__name__}.update={self.update!r}: expected one of '
                       f'{list(UPDATES)}')
    prototypes = _initial_prototypes(self, feats.shape[0], feats.shape[-1])
    cross = _PrototypeQueriedAttention(self.num_heads, self.dropout, name='cross_attention')
    latent = (AttentionBlockV2(self.num_heads, self.dropout, name='latent_transformer')
              if self.latent_transformer else None)
    if self.update == 'paper':  # the state is the prototypes; nothing is added to the queries
      content, queries = prototypes, jnp.zeros_like(prototypes)
    else:
      content, queries = jnp.zeros_like(prototypes), prototypes
    for _ in range(self.iterations):
      content, attention = cross(content, queries, feats, mask, deterministic)
      if latent is not None:
        content = latent(content, deterministic=deterministic)
    return content, attention


class PerceiverPrototypes(PrototypeCrossAttention):
  """Perceiver-style generator (ProtoPRVR Table 6 (a)): each iteration cross-attends to the
  features, then runs a latent transformer layer (self-attention + 4x FFN) over the
  prototypes. Same signature and attributes as `PrototypeCrossAttention`."""
  latent_transformer: bool = True


class SlotAttentionPrototypes(nn.Module):
  """Slot Attention generator (ProtoPRVR Table 6 (b); Locatello et al. 2020, with a learned
  deterministic start instead of sampled slots). Same signature and attributes as
  `PrototypeCrossAttention` (one head: `num_heads` is unused; `dropout` too, as in the
  original)."""
  num_prototypes: int = 30
  num_heads: int = 1
  iterations: int = 1
  dropout: float = 0.0
  epsilon: float = 1e-8

  @nn.compact
  def __call__(self, feats: jax.Array, mask: jax.Array | None = None,
               deterministic: bool = True) -> tuple[jax.Array, jax.Array]:
    del deterministic
    width = feats.shape[-1]
    slots = _initial_prototypes(self, feats.shape[0], width)
    inputs = layer_norm('input_norm')(feats)
    keys = dense(width, 'key', use_bias=False)(inputs)
    values = dense(width, 'value', use_bias=False)(inputs)
    query_proj = dense(width, 'query', use_bias=False)
    slot_norm, mlp_norm = layer_norm('slot_norm'), layer_norm('mlp_norm')
    gru = nn.GRUCell(width, name='gru')
    mlp_in, mlp_out = dense(width, 'mlp_in'), dense(width, 'mlp_out')
    real = jnp.ones(feats.shape[:2], feats.dtype) if mask is None else mask
    for _ in range(self.iterations):
      logits = jnp.einsum('bpd,bld->bpl', query_proj(slot_norm(slots)), keys) / math.sqrt(width)
      share = jax.nn.softmax(logits, axis=1) + self.epsilon  # competition over slots
      share = share * real[:, None, :]
      # Weighted mean over positions; a video without real positions (padding) gets none.
      attention = share / jnp.maximum(share.sum(axis=-1, keepdims=True), self.epsilon)
      updates = jnp.einsum('bpl,bld->bpd', attention, values)
      slots, _ = gru(slots, updates)
      slots = slots + mlp_out(nn.relu(mlp_in(mlp_norm(slots))))
    return slots, attention


GENERATORS = {'cross_attention': PrototypeCrossAttention, 'perceiver': PerceiverPrototypes,
              'slot_attention': SlotAttentionPrototypes}
