"""GMMFormer's official parameter names (huangmozhi9527/GMMFormer) and config inference."""

from collections.abc import Mapping
from typing import Any

import numpy as np

from prvr_jax.models import torch_names as tn
from prvr_jax.models.gmmformer.model import GMMFormer


def names(params: Any) -> list[tn.Leaf]:
  """Every leaf of our GMMFormer params with its official torch name(s)."""
  gmm = lambda path, name: tn.gmm_block(path, name, 'v1', tn.num_branches(params))
  return (tn.query_encoder('v1') + tn.branch_inputs('clip') + tn.branch_inputs('frame')
          + gmm(('clip', 'encoder_0'), 'clip_encoder')
          + gmm(('clip', 'encoder_1'), 'clip_encoder_2')
          + gmm(('frame', 'encoder_0'), 'frame_encoder_1')
          + gmm(('frame', 'encoder_1'), 'frame_encoder_2')
          + tn.dense(('video_pooling', 'score'), 'modular_vector_mapping_2', bias=False))


def family_config(state_dict: Mapping[str, np.ndarray], model_name: str,
                  default_widths: tuple[float | None, ...]) -> dict[str, Any]:
  """The `config.model` dims of an official GMMFormer / GMMFormer v2 state_dict.

  num_heads cannot be read from shapes and keeps the official 4; the widths are the model's
  defaults, whose count must match the checkpoint's branches.
  """
  branches = tn.count_gmm_branches(state_dict, 'clip_encoder')
  if branches != len(default_widths):
    raise ValueError(f'the state_dict has {branches} attention branches per GMM block, '
                     f'{model_name} has {len(default_widths)}; pass config_model with widths')
  return {**tn.infer_dims(state_dict, model_name, tn.LINEAGE_DIMS), 'num_heads': 4}


def infer_config(state_dict: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """`family_config` plus the official 32 clips (no GMMFormer tensor is sized by them)."""
  return {**family_config(state_dict, 'gmmformer', GMMFormer.widths), 'num_clips': 32}
