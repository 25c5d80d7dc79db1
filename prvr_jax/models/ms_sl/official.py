"""MS-SL's official parameter names (HuiGuanLab/ms-sl `MS_SL_Net`) and config inference."""

from collections.abc import Mapping
from typing import Any

import numpy as np

from prvr_jax.models import torch_names as tn


def names(params: Any) -> list[tn.Leaf]:
  """Every leaf of our MS-SL params with its official torch name(s)."""
  del params  # no stacked parameters
  return (tn.query_encoder('v1') + tn.branch_inputs('clip') + tn.branch_inputs('frame')
          + tn.attention_block(('clip', 'encoder'), 'clip_encoder', 'v1')
          + tn.attention_block(('frame', 'encoder'), 'frame_encoder', 'v1')
          + [tn.Leaf(('key_clip_attention', 'key'), ('mapping_linear.0.weight',), 'transpose'),
             tn.Leaf(('key_clip_attention', 'value'), ('mapping_linear.1.weight',),
                     'transpose')])


def infer_config(state_dict: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """The `config.model` dims of an official MS-SL state_dict; num_heads (not in any shape) and
  the clip count (the pools have no parameters) keep the official 4 and 32."""
  return {**tn.infer_dims(state_dict, 'ms_sl', tn.LINEAGE_DIMS), 'num_heads': 4,
          'num_clips': 32}
