"""Holmes's official parameter names (lijun2005/ICML26-Holmes, `src/` and `multisrc/`) and
config inference.

The `src/` state dict is GMMFormer v2's shape for shape; its GMM blocks (`DyGMMBlock`) name
their branches `e_attns.{k}` instead of `attn{k}` (then `ca`, `layer1`, `layer2`, as v2's).
`multisrc/` adds RAL's frame branch under RAL's names (`frame_branch_query_proj`,
`frame_branch_query_encoder`, `text_weight_fc`; `model.frame_branch_query`).
"""

from collections.abc import Mapping
from typing import Any

import numpy as np

from prvr_jax.models import torch_names as tn
from prvr_jax.models.holmes.model import Holmes
from prvr_jax.models.ral.official import frame_branch_names

BRANCH = 'e_attns.'
# A `multisrc/` state dict holds it (`model.frame_branch_query`).
FRAME_BRANCH_KEY = 'text_weight_fc.0.weight'


def names(params: Any) -> list[tn.Leaf]:
  """Every leaf of our Holmes params with its official torch name(s)."""
  gmm = lambda path, name: tn.gmm_block(path, name, 'v2', tn.num_branches(params),
                                        branch=BRANCH + '{k}')
  return (tn.query_encoder('v2') + tn.branch_inputs('clip') + tn.branch_inputs('frame')
          + gmm(('clip', 'encoder_0'), 'clip_encoder')
          + gmm(('frame', 'encoder_0'), 'frame_encoder_1')
          + [tn.Leaf(('weight_token',), ('weight_token',), 'reshape')]
          + (frame_branch_names() if 'text_weight_fc' in params else []))


def infer_config(state_dict: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """The lineage's dims, the official 4 heads (shapes cannot tell) and the clip count (the
  mixing's output width), and `frame_branch_query` True for a `multisrc/` state dict; the
  branch count must be Holmes's 8."""
  count = tn.count_gmm_branches(state_dict, 'clip_encoder', BRANCH)
  if count != len(Holmes.widths):
    raise ValueError(f"the state_dict has {count} 'clip_encoder.{BRANCH}<k>' branches, holmes "
                     f'has {len(Holmes.widths)}; pass config_model with widths')
  fields = {**tn.infer_dims(state_dict, 'holmes', tn.LINEAGE_DIMS), 'num_heads': 4,
            **tn.infer_dims(state_dict, 'holmes',
                            {'num_clips': ('clip_encoder.layer2.weight', 0)})}
  if FRAME_BRANCH_KEY in state_dict:
    fields['frame_branch_query'] = True
  return fields


__all__ = ['Holmes', 'infer_config', 'names']
