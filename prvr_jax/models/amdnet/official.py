"""AMDNet's official parameter names (songpipi/AMDNet `GMMFormer_Net`) and config inference."""

from collections.abc import Mapping
from typing import Any

import numpy as np

from prvr_jax.models import torch_names as tn


def names(params: Any) -> list[tn.Leaf]:
  """Every leaf of our AMDNet params with its official torch name(s)."""
  del params  # no stacked parameters
  block = 'clip_encoder'
  return (tn.input_projection(('query_proj',), 'query_input_proj')
          + tn.input_projection(('clip_proj',), 'clip_input_proj')
          + tn.positional_encoding(('pos_embed',), 'clip_pos_embed')
          + tn.attention_block(('attention',), f'{block}.attn0', 'v1')
          + tn.attention_block(('moment_attention',), f'{block}.attn1', 'v1')
          + tn.norm(('spans', 'summary_norm'), f'{block}.clip2video.layernorm')
          + tn.dense(('spans', 'summary'), f'{block}.clip2video.fc_out1')
          + tn.dense(('spans', 'span'), f'{block}.fc_gauss'))


def infer_config(state_dict: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """The `config.model` dims of an official AMDNet state_dict; num_heads (not in any shape)
  keeps the official 4 and the clip count the official 32."""
  dims = tn.infer_dims(state_dict, 'amdnet', {
      'visual_dim': ('clip_input_proj.LayerNorm.weight', 0),
      'query_dim': ('query_input_proj.LayerNorm.weight', 0),
      'hidden_dim': ('query_input_proj.net.1.weight', 0),
      'max_frames': ('clip_pos_embed.position_embeddings.weight', 0),
      'num_spans': ('clip_encoder.fc_gauss.weight', 0)})
  return {**dims, 'num_spans': dims['num_spans'] // 2, 'num_heads': 4, 'num_clips': 32,
          'max_query_len': 1}
