"""Holmes's official parameter names (lijun2005/ICML26-Holmes, `src/`) and config inference.

The state dict is GMMFormer v2's shape for shape; its GMM blocks (`DyGMMBlock`) name their
branches `e_attns.{k}` instead of `attn{k}` (then `ca`, `layer1`, `layer2`, as v2's).
"""

from collections.abc import Mapping
from typing import Any

import numpy as np

from prvr_jax.models import torch_names as tn
from prvr_jax.models.holmes.model import Holmes

BRANCH = 'e_attns.'


def names(params: Any) -> list[tn.Leaf]:
  """Every leaf of our Holmes params with its official torch name(s)."""
  gmm = lambda path, name: tn.gmm_block(path, name, 'v2', tn.num_branches(params),
                                        branch=BRANCH + '{k}')
  return (tn.query_encoder('v2') + tn.branch_inputs('clip') + tn.branch_inputs('frame')
          + gmm(('clip', 'encoder_0'), 'clip_encoder')
          + gmm(('frame', 'encoder_0'), 'frame_encoder_1')
          + [tn.Leaf(('weight_token',), ('weight_token',), 'reshape')])


def infer_config(state_dict: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """The lineage's dims, the official 4 heads (shapes cannot tell) and the clip count (the
  mixing's output width); the branch count must be Holmes's 8."""
  count = tn.count_gmm_branches(state_dict, 'clip_encoder', BRANCH)
  if count != len(Holmes.widths):
    raise ValueError(f"the state_dict has {count} 'clip_encoder.{BRANCH}<k>' branches, holmes "
                     f'has {len(Holmes.widths)}; pass config_model with widths')
  return {**tn.infer_dims(state_dict, 'holmes', tn.LINEAGE_DIMS), 'num_heads': 4,
          **tn.infer_dims(state_dict, 'holmes', {'num_clips': ('clip_encoder.layer2.weight', 0)})}


__all__ = ['Holmes', 'infer_config', 'names']
