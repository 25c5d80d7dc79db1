"""DreamPRVR's official parameter names (lijun2005/CVPR26-DreamPRVR, `DreamPRVR_Net`) and
config inference.

The layers' name tables (`prvr_jax.layers.register_block`, `latent_sampler`, `diffusion`)
relative to `clip_encoder.` / `frame_encoder.`, `video_probabilistic_variational_sampler.` and
`diffusion_mlp.`, plus the shared query branch and video inputs. The frozen time table
`diffusion_mlp.time_embedding.timembedding.0.weight` (the official `reset_parameters`' N(0,
0.02) draw) is read and written as it is.
"""

from collections.abc import Mapping
import re
from typing import Any

import jax
import numpy as np

from prvr_jax.layers.diffusion import official_denoiser_params
from prvr_jax.layers.latent_sampler import OFFICIAL_SAMPLER_PARAMS
from prvr_jax.layers.register_block import OFFICIAL_REGISTER_BLOCK_PARAMS
from prvr_jax.models import torch_names as tn
from prvr_jax.models.spec import path_of


def _table(path: tn.Path, prefix: str, rows: tuple[tuple[str, str, bool], ...],
           num_branches: int = 0) -> list[tn.Leaf]:
  """A layer's (official name, our path, transpose) rows as `Leaf`s under `path` / `prefix`;
  names with `{k}` are stacked over `num_branches`."""
  leaves = []
  for name, ours, transpose in rows:
    stacked = '{k}' in name
    names = (tuple(prefix + name.replace('{k}', str(k)) for k in range(num_branches))
             if stacked else (prefix + name,))
    leaves.append(tn.Leaf(path + tuple(ours.split('/')), names,
                          'transpose' if transpose else 'copy', stacked=stacked))
  return leaves


def _num_denoiser_layers(params: Any) -> int:
  paths = {path_of(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)}
  return len({m.group(1) for p in paths
              if (m := re.match(r'^diffusion/denoiser/layers_(\d+)/', p))})


def names(params: Any) -> list[tn.Leaf]:
  """Every leaf of our DreamPRVR params with its official torch name(s)."""
  branches = tn.num_branches(params)
  leaves = tn.query_encoder('v2')
  for branch in ('clip', 'frame'):
    leaves += tn.branch_inputs(branch) + _table(
        (branch, 'encoder'), f'{branch}_encoder.', OFFICIAL_REGISTER_BLOCK_PARAMS, branches)
  return (leaves
          + tn.attention_block(('condition_encoder',), 'mean_clip_encoder', 'v2')
          + [tn.Leaf(('query_former', 'tokens'), ('video_qformer.query_tokens',))]
          + tn.attention_block(('query_former', 'cross'), 'video_qformer.cross_attention', 'v2')
          + _table(('video_sampler',), 'video_probabilistic_variational_sampler.',
                   OFFICIAL_SAMPLER_PARAMS)
          + _table(('diffusion', 'denoiser'), 'diffusion_mlp.',
                   official_denoiser_params(_num_denoiser_layers(params))))


def _count(state_dict: Mapping[str, np.ndarray], pattern: str) -> int:
  compiled = re.compile(pattern)
  return len({m.group(1) for k in state_dict if (m := compiled.match(k))})


def infer_config(state_dict: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """`config.model` fields the shapes determine: input and hidden widths, positions, the clip
  count (the mixing layer's output width), K, the branches, T and the denoiser's depth."""
  dims = tn.infer_dims(state_dict, 'dreamprvr', {
      **tn.LINEAGE_DIMS,
      'num_clips': ('clip_encoder.layer2.weight', 0),
      'num_registers': ('video_qformer.query_tokens', 1),
      'timesteps': ('diffusion_mlp.time_embedding.timembedding.0.weight', 0)})
  counts = {'attention_num': _count(state_dict, r'^clip_encoder\.e_attns\.(\d+)\.'),
            'num_diffusion_layers': _count(state_dict, r'^diffusion_mlp\.layers\.(\d+)\.')}
  for field, count in counts.items():
    if not count:
      raise ValueError(f'cannot infer the dreamprvr config field {field}: the state_dict has '
                       "no 'clip_encoder.e_attns.0.*' or no 'diffusion_mlp.layers.0.*'")
  return {**dims, **counts}


__all__ = ['infer_config', 'names']
