"""GMMFormer v2's official parameter names (huangmozhi9527/GMMFormer_v2) and config inference."""

from collections.abc import Mapping
from typing import Any

import numpy as np

from prvr_jax.models import torch_names as tn
from prvr_jax.models.gmmformer.official import family_config
from prvr_jax.models.gmmformer_v2.model import GMMFormerV2


def names(params: Any) -> list[tn.Leaf]:
  """Every leaf of our GMMFormer v2 params with its official torch name(s)."""
  gmm = lambda path, name: tn.gmm_block(path, name, 'v2', tn.num_branches(params))
  return (tn.query_encoder('v2') + tn.branch_inputs('clip') + tn.branch_inputs('frame')
          + gmm(('clip', 'encoder_0'), 'clip_encoder')
          + gmm(('frame', 'encoder_0'), 'frame_encoder_1')
          + [tn.Leaf(('weight_token',), ('weight_token',), 'reshape')])


def infer_config(state_dict: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """`family_config` plus the clip count (the temporal consolidation's output width)."""
  return {**family_config(state_dict, 'gmmformer_v2', GMMFormerV2.widths),
          **tn.infer_dims(state_dict, 'gmmformer_v2',
                          {'num_clips': ('clip_encoder.layer2.weight', 0)})}
