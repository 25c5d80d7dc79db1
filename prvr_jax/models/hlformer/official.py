"""HLFormer's official parameter names (lijun2005/ICCV25-HLFormer) and config inference.

The official state dict also holds the shared frozen `manifold.k` (1.0) under every Lorentz
block (`ignored`): ours is the constant `k`.
"""

from collections.abc import Mapping
import re
from typing import Any

import numpy as np

from prvr_jax.layers.lorentz import OFFICIAL_BLOCK_PARAMS
from prvr_jax.models import torch_names as tn
from prvr_jax.models.hlformer.model import HLFormer


def _lorentz_block(path: tuple[str, ...], name: str) -> list[tn.Leaf]:
  return [tn.Leaf(path + tuple(ours.split('/')), (f'{name}.{theirs}',),
                  'transpose' if transpose else 'copy')
          for theirs, ours, transpose in OFFICIAL_BLOCK_PARAMS]


def hlformer_block(path: tuple[str, ...], name: str, half: int) -> list[tn.Leaf]:
  """An official `HLFormerBlock` `name` (e_attns, h_attns, ca, layer1, layer2) at `path`."""
  leaves = [tn.Leaf(leaf.path, tuple(leaf.names[0].replace('{k}', str(k)) for k in range(half)),
                    leaf.kind, stacked=True)
            for leaf in tn.attention_block(path + ('branches',), name + '.e_attns.{k}', 'v2')]
  for i in range(half):
    leaves += _lorentz_block(path + (f'lorentz_{i}',), f'{name}.h_attns.{i}')
  return (leaves + tn.attention_block(path + ('cross',), name + '.ca', 'v2')
          + tn.dense(path + ('mix_hidden',), name + '.layer1')
          + tn.dense(path + ('mix_out',), name + '.layer2'))


def names(params: Any) -> list[tn.Leaf]:
  """Every leaf of our HLFormer params with its official torch name(s)."""
  half = tn.num_branches(params)
  scalars = [tn.Leaf((n,), (n,)) for n in ('curv', 'textual_alpha', 'video_alpha')]
  return (tn.query_encoder('v2')
          + tn.branch_inputs('clip') + hlformer_block(('clip', 'encoder'), 'clip_encoder', half)
          + tn.branch_inputs('frame')
          + hlformer_block(('frame', 'encoder'), 'frame_encoder_1', half)
          + tn.dense(('frame_pooling', 'score'), 'modular_vector_mapping_2', bias=False)
          + tn.dense(('clip_pooling', 'score'), 'modular_vector_mapping_3', bias=False)
          + scalars)


def infer_config(state_dict: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """`config.model` fields the shapes determine: input and hidden widths, the Lorentz width,
  the number of branches and the clip count (the mixing layer's output width)."""
  dims = tn.infer_dims(state_dict, 'hlformer', {
      **tn.LINEAGE_DIMS,
      'num_clips': ('clip_encoder.layer2.weight', 0),
      'lorentz_dim': ('clip_encoder.h_attns.0.self.input_proj.net.1.weight', 0)})
  pattern = re.compile(r'^clip_encoder\.h_attns\.(\d+)\.')
  half = 1 + max((int(m.group(1)) for k in state_dict if (m := pattern.match(k))), default=-1)
  if half == 0:
    raise ValueError('cannot infer the hlformer config: the state_dict has no '
                     "'clip_encoder.h_attns.0.*'")
  return {**dims, 'attention_num': 2 * half}


__all__ = ['HLFormer', 'hlformer_block', 'infer_config', 'names']
