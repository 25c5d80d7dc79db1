"""RAL's official parameter names (zhanglong-ustc/RAL-PRVR, `RAL4GMMV2_Net`) and config
inference: GMMFormer v2's, plus the frame-branch query encoder, the word-confidence predictor
and the two Gaussian heads (docs/ral.md)."""

from collections.abc import Mapping
from typing import Any

import numpy as np

from prvr_jax.models import torch_names as tn
from prvr_jax.models.gmmformer_v2 import official as gmmformer_v2_official
from prvr_jax.models.gmmformer.official import family_config
from prvr_jax.models.ral.model import RAL


def gaussian_head(path: tn.Path, modality: str) -> list[tn.Leaf]:
  """One `ProbabilisticEmbedding` at `path`: the official `pie_net_<modality>` and
  `uncertain_net_<modality>`."""
  leaves = []
  for ours, theirs in (('pie_net', f'pie_net_{modality}'),
                       ('uncertain_net', f'uncertain_net_{modality}')):
    for w in ('w_1', 'w_2'):
      leaves += tn.dense(path + (ours, 'attention', w), f'{theirs}.attention.{w}', bias=False)
    leaves += tn.dense(path + (ours, 'fc'), f'{theirs}.fc')
  return (leaves + tn.norm(path + ('pie_net', 'layer_norm'), f'pie_net_{modality}.layer_norm')
          + tn.dense(path + ('uncertain_net', 'fc2'), f'uncertain_net_{modality}.fc2'))


def frame_branch_names() -> list[tn.Leaf]:
  """The frame branch's query encoder (`RALQueryEncoder`'s `frame_input_proj`,
  `frame_encoder`) and word confidences (`ConfidenceWeightedScores` as `text_weight_fc`):
  the official `frame_branch_query_proj`, `frame_branch_query_encoder`, `text_weight_fc`
  (RAL's, and Holmes's `multisrc/`)."""
  return (tn.input_projection(('query', 'frame_input_proj'), 'frame_branch_query_proj')
          + tn.attention_block(('query', 'frame_encoder'), 'frame_branch_query_encoder', 'v2')
          + tn.dense(('text_weight_fc', 'fc_0'), 'text_weight_fc.0')
          + tn.dense(('text_weight_fc', 'fc_2'), 'text_weight_fc.2'))


def names(params: Any) -> list[tn.Leaf]:
  """Every leaf of our RAL params with its official torch name(s)."""
  return (gmmformer_v2_official.names(params) + frame_branch_names()
          + gaussian_head(('prob_video',), 'video') + gaussian_head(('prob_text',), 'text'))


def infer_config(state_dict: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """`family_config` plus the clip count (the temporal consolidation's output width)."""
  return {**family_config(state_dict, 'ral', RAL.widths),
          **tn.infer_dims(state_dict, 'ral', {'num_clips': ('clip_encoder.layer2.weight', 0)})}
