"""GMMBlock: K parallel windowed attention blocks with separate weights, then an aggregation.

The K branches are one `nn.vmap`-ed block whose parameters are stacked on a leading axis, so
they run as a single batched computation. Aggregations (GMMFormer v2, Sec. 4.4.2 / App. A.1):
  * `average` -- mean of the K outputs (GMMFormer v1).
  * `weighted` -- one learned logit per branch, softmax(w / temperature).
  * `dynamic` -- per-video weights from a cross-attention of the learnable query token over the
    block input, then Linear -> ReLU -> Dropout -> Linear(K), softmax(. / temperature).
  * `temporal_consolidation` -- v2's TC module: the token cross-attends over each branch output
    (one shared 1x-FFN cross-attention block), Linear -> ReLU -> Dropout -> Linear(L) gives one
    weight per branch and time step, softmax over branches of (. / temperature).
"""

from collections.abc import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from prvr_jax.kernels import branches
from prvr_jax.layers.attention import BLOCKS, AttentionBlockV2, dense
from prvr_jax.layers.windows import stacked_windows

AGGREGATIONS = ('average', 'weighted', 'dynamic', 'temporal_consolidation',
                'mean_consolidation')
# Name of the stacked branch parameters (leading axis K); per-tensor code such as BertAdam's
# gradient clipping treats each of the K slices as one tensor.
BRANCHES = 'branches'


class GMMBlock(nn.Module):
  """`[B, L, D] -> [B, L, D]`.

  Attributes:
    widths: one window width per branch; None is a plain-attention branch.
    num_heads: attention heads.
    dropout_rate: dropout inside the blocks and the aggregation MLP.
    block: 'v1' (`AttentionBlockV1`) or 'v2' (`AttentionBlockV2`).
    window: constraint window kind (`prvr_jax.layers.windows.WINDOW_KINDS`).
    aggregation: one of `AGGREGATIONS`.
    temperature: softmax temperature of the learned aggregations (v2 `sft_factor`).
  """
  widths: Sequence[float | None]
  num_heads: int
  dropout_rate: float = 0.0
  block: str = 'v1'
  window: str = 'gaussian'
  aggregation: str = 'average'
  temperature: float = 1.0

  @nn.compact
  def __call__(self, x: jax.Array, key_mask: jax.Array | None = None,
               window_length: jax.Array | None = None,
               query_token: jax.Array | None = None,
               deterministic: bool = True, key_bias: jax.Array | None = None) -> jax.Array:
    """Args:
      x: `[B, L, D]`.
      key_mask: `[B, L]`, 1 for real positions (None: all real).
      window_length: optional `[B]` lengths that size each video's windows (v1 frame branch).
      query_token: `[D]` learnable query of the `dynamic` / `temporal_consolidation`
        aggregations (`mean_consolidation` ignores it).
      deterministic: disables dropout.
      key_bias: optional `[B, L]` added to the K branches' attention logits (v2 blocks only;
        not to the aggregation's cross-attention): MSC-PRVR's log sizes of merged tokens.
    """
    if self.aggregation not in AGGREGATIONS:
      raise ValueError(f'Unknown aggregation {self.aggregation!r}; expected one of '
                       f'{AGGREGATIONS} (config.model.aggregation).')
    num_branches, (batch, length, width) = len(self.widths), x.shape
    windows = stacked_windows(self.window, self.widths, length, window_length)
    if window_length is not None:
      windows = windows[:, :, None]  # [K, B, 1, L, L]: broadcast over heads.
    if key_bias is not None and self.block != 'v2':
      raise ValueError(f'key_bias needs v2 blocks; this GMM block has {self.block!r} '
                       '(config.model.block)')
    biased = () if key_bias is None else (key_bias,)
    blocks = stacked_blocks(BLOCKS[self.block], num_branches, self.num_heads,
                            self.dropout_rate, len(biased))
    with branches.shared_input():
      outputs = blocks(x, None, key_mask, windows, deterministic, *biased)  # [K, B, L, D]

    if self.aggregation in ('average', 'weighted'):
      if self.aggregation == 'average':
        weights = jnp.full((num_branches,), 1.0 / num_branches)
      else:
        logits = self.param('branch_logits', nn.initializers.zeros, (num_branches,))
        weights = jax.nn.softmax(logits / self.temperature)
      return branches.sum_over_branches(outputs, weights)

    if self.aggregation == 'mean_consolidation':
      return consolidate(outputs, jnp.mean(outputs, axis=(0, 2)), key_mask, self.num_heads,
                         self.dropout_rate, self.temperature, deterministic)
    if query_token is None:
      raise ValueError(f'aggregation {self.aggregation!r} needs the learnable query token')
    if self.aggregation == 'temporal_consolidation':
      return consolidate(outputs, jnp.broadcast_to(query_token, (batch, width)), key_mask,
                         self.num_heads, self.dropout_rate, self.temperature, deterministic)
    # Dynamic: the token cross-attends over the block input once per video.
    cross = AttentionBlockV2(self.num_heads, self.dropout_rate, ffn_multiplier=1, name='cross')
    tokens = cross(jnp.broadcast_to(query_token, (batch, 1, width)), x, key_mask,
                   deterministic=deterministic)[:, 0]
    logits = mix_logits(tokens, num_branches, self.dropout_rate, deterministic)  # [B, K]
    weights = jax.nn.softmax(logits / self.temperature, axis=-1)
    # The learned mixtures are float32 sums of the branch outputs too (HIGHEST), as the
    # activations between layers are in every precision mode.
    return jnp.einsum('kbld,bk->bld', outputs, weights, precision=jax.lax.Precision.HIGHEST)


def stacked_blocks(block: type[nn.Module], num_branches: int, num_heads: int,
                   dropout_rate: float, extra_args: int = 0) -> nn.Module:
  """`num_branches` copies of the attention `block` as one module (`BRANCHES`, parameters
  stacked on a leading axis), called as `(x, context, key_mask, windows, deterministic,
  *extra)`: the windows `[K, ...]` map over the branches, the other arguments are shared.
  Create it inside a parent's compact method."""
  return nn.vmap(
      block, in_axes=(None, None, None, 0, None) + (None,) * extra_args, out_axes=0,
      variable_axes={'params': 0}, split_rngs={'params': True, 'dropout': True},
      axis_size=num_branches)(num_heads=num_heads, dropout_rate=dropout_rate, name=BRANCHES)


def mix_logits(tokens: jax.Array, features: int, dropout_rate: float, deterministic: bool
               ) -> jax.Array:
  """Linear (`mix_hidden`) -> ReLU -> Dropout -> Linear(features) (`mix_out`): the learned
  aggregations' mixing MLP. Call inside a compact method: the layers belong to its module."""
  hidden = nn.relu(dense(tokens.shape[-1], 'mix_hidden')(tokens))
  hidden = nn.Dropout(dropout_rate)(hidden, deterministic=deterministic)
  return dense(features, 'mix_out')(hidden)


def consolidate(outputs: jax.Array, token: jax.Array, key_mask: jax.Array | None,
                num_heads: int, dropout_rate: float, temperature: float, deterministic: bool
                ) -> jax.Array:
  """Temporal consolidation of K branch outputs `[K, B, L, D]` by a per-video token `[B, D]`:
  one cross-attention block (`cross`, 1x FFN, keys masked by `key_mask [B, L]`) of the token
  over each branch output, `mix_logits` -> one logit per branch and position, softmax over
  branches of (. / temperature), the weighted sum `[B, L, D]` (float32, HIGHEST).

  GMMFormer v2's TC module (a learnable token), HLFormer's and Holmes's mixing (the mean of
  the outputs). Call inside a compact method: the layers belong to its module.
  """
  num_branches, batch, length, width = outputs.shape
  cross = AttentionBlockV2(num_heads, dropout_rate, ffn_multiplier=1, name='cross')
  flat_outputs = outputs.reshape(num_branches * batch, length, width)
  flat_mask = None if key_mask is None else jnp.tile(key_mask, (num_branches, 1))
  tokens = cross(jnp.tile(token[:, None], (num_branches, 1, 1)), flat_outputs, flat_mask,
                 deterministic=deterministic)
  tokens = tokens.reshape(num_branches, batch, width).transpose(1, 0, 2)  # [B, K, D]
  logits = mix_logits(tokens, length, dropout_rate, deterministic)  # [B, K, L]
  weights = jax.nn.softmax(logits / temperature, axis=1)
  return jnp.einsum('kbld,bkl->bld', outputs, weights, precision=jax.lax.Precision.HIGHEST)
