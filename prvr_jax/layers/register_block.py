"""DreamPRVR's register-augmented Gaussian attention block (official `DreamPRVRBlock`,
`lijun2005/CVPR26-DreamPRVR`, `src/Models/DreamPRVR/model_components.py`).

The official block appends K projected registers to the L tokens and runs `attention_num`
Euclidean attention blocks over the `L + K` rows with a `[L + K, L + K]` mask (token rows see
every valid token and every register, register rows see the valid tokens only) and a Gaussian
window on the token-token part (ones elsewhere); it keeps the first L rows of each branch and
mixes the branches as HLFormer does. Every operation of those blocks after the attention is
per row, so the L token rows depend on the register rows only as keys and values: here the
branches run the L token queries over the `L + K` keys (key mask `[valid, 1 ... 1]`, window
`[gauss | ones]`), which gives the official token rows exactly and skips the discarded register
rows (and with them the register-row mask).
"""

from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from prvr_jax.kernels import branches
from prvr_jax.layers.attention import AttentionBlockV2, dense
from prvr_jax.layers.common import InputProjection
from prvr_jax.layers.gmm_block import BRANCHES, stacked_blocks
from prvr_jax.layers.windows import stacked_windows


def register_widths(attention_num: int) -> tuple[float | None, ...]:
  """The official branch windows: None, then `2^i` for `i = -2 .. attention_num - 4`
  (attention_num 8: None, 0.25, 0.5, 1, 2, 4, 8, 16)."""
  if attention_num < 1:
    raise ValueError(f'attention_num {attention_num} < 1 (config.model.attention_num)')
  return (None,) + tuple(2.0**i for i in range(-2, attention_num - 3))


def register_windows(widths: tuple[float | None, ...], length: int, num_registers: int
                     ) -> jax.Array:
  """`[n, L, L + K]`: each branch's Gaussian window over the tokens, ones for the registers."""
  windows = stacked_windows('gaussian', widths, length)
  return jnp.pad(windows, [(0, 0), (0, 0), (0, num_registers)], constant_values=1.0)


class RegisterGaussianBlock(nn.Module):
  """Official `DreamPRVRBlock`: tokens `[B, L, D]`, registers `[B, K, D]`, key_mask `[B, L]`
  -> `[B, L, D]`.

  Registers: LayerNorm-Dropout-Linear-ReLU (`register_proj`, official `noise_input_layer`).
  Branches: `AttentionBlockV2` (4x FFN) stacked under `branches`, windows `register_widths`.
  Mixing (as `HLFormerBlock`): the mean of the branch outputs over branches and positions, one
  cross-attention block (1x FFN, key mask `key_mask`) from it over each branch output, Linear ->
  ReLU -> Dropout -> Linear(L), softmax over branches of `logit / temperature` (`sft_factor`).
  """
  num_heads: int
  attention_num: int = 8
  temperature: float = 0.09
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x: jax.Array, registers: jax.Array, key_mask: jax.Array | None = None,
               deterministic: bool = True) -> jax.Array:
    batch, length, width = x.shape
    registers = InputProjection(width, self.dropout_rate, name='register_proj')(
        registers, deterministic)
    context = jnp.concatenate([x, registers], axis=1)
    context_mask = None
    if key_mask is not None:
      context_mask = jnp.concatenate(
          [key_mask, jnp.ones(registers.shape[:2], key_mask.dtype)], axis=1)
    widths = register_widths(self.attention_num)
    windows = register_windows(widths, length, registers.shape[1])
    euclidean = stacked_blocks(AttentionBlockV2, len(widths), self.num_heads, self.dropout_rate)
    with branches.shared_input():
      outputs = euclidean(x, context, context_mask, windows, deterministic)  # [n, B, L, D]
    num_branches = outputs.shape[0]
    token = jnp.mean(outputs, axis=(0, 2))  # [B, D]
    cross = AttentionBlockV2(self.num_heads, self.dropout_rate, ffn_multiplier=1, name='cross')
    flat_outputs = outputs.reshape(num_branches * batch, length, width)
    flat_mask = None if key_mask is None else jnp.tile(key_mask, (num_branches, 1))
    tokens = cross(jnp.tile(token[:, None], (num_branches, 1, 1)), flat_outputs, flat_mask,
                   deterministic=deterministic)
    tokens = tokens.reshape(num_branches, batch, width).transpose(1, 0, 2)  # [B, n, D]
    hidden = nn.relu(dense(width, 'mix_hidden')(tokens))
    hidden = nn.Dropout(self.dropout_rate)(hidden, deterministic=deterministic)
    logits = dense(length, 'mix_out')(hidden)  # [B, n, L]
    weights = jax.nn.softmax(logits / self.temperature, axis=1)
    return jnp.einsum('kbld,bkl->bld', outputs, weights, precision=jax.lax.Precision.HIGHEST)


def _attention_block_rows(official: str, ours: str, ffn: bool = True
                          ) -> list[tuple[str, str, bool]]:
  rows = []
  for proj in ('query', 'key', 'value'):
    rows += [(f'{official}.self.{proj}.weight', f'{ours}/attention/{proj}/kernel', True),
             (f'{official}.self.{proj}.bias', f'{ours}/attention/{proj}/bias', False)]
  for theirs, mine in (('norm1', 'norm1'), ('norm2', 'norm2')):
    rows += [(f'{official}.{theirs}.weight', f'{ours}/{mine}/scale', False),
             (f'{official}.{theirs}.bias', f'{ours}/{mine}/bias', False)]
  if ffn:
    for theirs, mine in (('output.layer1', 'ffn_in'), ('output.layer2', 'ffn_out')):
      rows += [(f'{official}.{theirs}.weight', f'{ours}/{mine}/kernel', True),
               (f'{official}.{theirs}.bias', f'{ours}/{mine}/bias', False)]
  return rows


# Official name (relative to a `DreamPRVRBlock`, e.g. under `clip_encoder.`) -> our path;
# `T`: a Linear weight, transposed to a Dense kernel. `{k}`: the branch index; those leaves are
# stacked over the branches under `branches/`.
OFFICIAL_REGISTER_BLOCK_PARAMS: tuple[tuple[str, str, bool], ...] = (
    ('noise_input_layer.LayerNorm.weight', 'register_proj/norm/scale', False),
    ('noise_input_layer.LayerNorm.bias', 'register_proj/norm/bias', False),
    ('noise_input_layer.net.1.weight', 'register_proj/dense/kernel', True),
    ('noise_input_layer.net.1.bias', 'register_proj/dense/bias', False),
    *_attention_block_rows('e_attns.{k}', BRANCHES),
    *_attention_block_rows('ca', 'cross'),
    ('layer1.weight', 'mix_hidden/kernel', True),
    ('layer1.bias', 'mix_hidden/bias', False),
    ('layer2.weight', 'mix_out/kernel', True),
    ('layer2.bias', 'mix_out/bias', False),
)


def register_block_params_from_official(state: Mapping[str, np.ndarray], attention_num: int,
                                        prefix: str = '') -> dict:
  """A `RegisterGaussianBlock`'s params from an official state dict (arrays keyed by
  `prefix + name`, e.g. prefix `clip_encoder.`). Raises ValueError naming a missing key."""
  params: dict = {}
  for name, path, transpose in OFFICIAL_REGISTER_BLOCK_PARAMS:
    keys = ([prefix + name.replace('{k}', str(k)) for k in range(attention_num)]
            if '{k}' in name else [prefix + name])
    values = []
    for key in keys:
      if key not in state:
        raise ValueError(f'official DreamPRVR block parameter missing: {key}')
      value = np.asarray(state[key], np.float32)
      values.append(value.T if transpose else value)
    node = params
    *parents, leaf = path.split('/')
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = jnp.asarray(np.stack(values) if '{k}' in name else values[0])
  return params
