"""MSC-PRVR's official parameter names (admins97/MSC_PRVR) and config inference.

GMMFormer v2's names (`attn{k}` branches, `ca`, `layer1`, `layer2`, the used `weight_token`)
plus `vproj_clip`; the query positions are 77 (CLIP's context).
"""

from collections.abc import Mapping
from typing import Any

import numpy as np

from prvr_jax.models import torch_names as tn
from prvr_jax.models.gmmformer.official import family_config
from prvr_jax.models.gmmformer_v2 import official as v2_official
from prvr_jax.models.msc_prvr.model import MSCPRVR


def names(params: Any) -> list[tn.Leaf]:
  """Every leaf of our MSC-PRVR params with its official torch name(s)."""
  return v2_official.names(params) + tn.dense(('vproj_clip',), 'vproj_clip')


def infer_config(state_dict: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """`family_config` plus the clip count (the temporal consolidation's output width); the
  merge cascade keeps its official 80, 52 and ends at that count."""
  if 'vproj_clip.weight' not in state_dict:
    raise ValueError("cannot infer the msc_prvr config: the state_dict has no 'vproj_clip.weight'"
                     ' (a GMMFormer v2 checkpoint?)')
  return {**family_config(state_dict, 'msc_prvr', MSCPRVR.widths),
          **tn.infer_dims(state_dict, 'msc_prvr',
                          {'num_clips': ('clip_encoder.layer2.weight', 0)})}
