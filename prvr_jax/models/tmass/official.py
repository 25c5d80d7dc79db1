"""T-MASS's official parameter names (Jiamian-Wang/T-MASS-text-video-retrieval `CLIPStochastic`)
and config inference.

The released checkpoints (`model_best.pth`, `checkpoint-epoch<N>.pth`) are the trainer's
`{'epoch', 'state_dict', 'optimizer'}`; the state dict holds

  clip.*          the Hugging Face `CLIPModel` (transformers 4.30: with its two `position_ids`
                  buffers), fine-tuned end to end; `clip.logit_scale` is T-MASS's logit scale
  pool_frames.*   X-Pool (`modules/transformer.py`: `cross_attn.{q,k,v,out}_proj`,
                  `linear_proj`, `layer_norm{1,2,3}`)
  stochastic.*    the radius (`std_branch.linear_proj`) and `std_branch.learnable_scalar`, a
                  parameter the official code never initialises nor uses (read and dropped)

The CLIP towers map through `prvr_jax.clip.weights.huggingface_names` (heads split, kernels
transposed); our model holds them with `config.model.backbone` set ('ViT-B/32', 'ViT-B/16').
"""

from collections.abc import Mapping
from typing import Any

import numpy as np

from prvr_jax import clip
from prvr_jax.clip import weights as clip_weights
from prvr_jax.models import torch_names as tn

POOL = 'pool_frames.'
RADIUS = 'stochastic.std_branch.linear_proj'
CLIP = 'clip.'
# Read and dropped: the unused scalar, and the buffers transformers < 4.31 saved with CLIP.
IGNORED = ('stochastic.std_branch.learnable_scalar',
           *(CLIP + name for name in clip_weights.HF_BUFFERS))
# The backbones a checkpoint's CLIP may be (the official `--clip_arch`, and our test CLIP).
BACKBONES = ('ViT-B/32', 'ViT-B/16', 'tiny')


def _shape(params: Any, *path: str) -> tuple[int, ...]:
  node = params
  for key in path:
    node = node[key]
  return tuple(node.shape)


def clip_config_of(params: Any) -> clip.CLIPConfig:
  """The `CLIPConfig` of our params' `visual` and `text` trees (arrays or shapes)."""
  def layers(tower):
    return len([k for k in params[tower]['transformer'] if k.startswith('resblocks_')])
  patch, _, _, vision_width = _shape(params, 'visual', 'patch_embed', 'kernel')
  positions = _shape(params, 'visual', 'positional_embedding')[0]
  block = ('transformer', 'resblocks_0', 'attn', 'query', 'kernel')
  vocab_size, text_width = _shape(params, 'text', 'token_embedding', 'embedding')
  return clip.CLIPConfig(
      embed_dim=_shape(params, 'visual', 'proj', 'kernel')[1],
      image_size=int(round((positions - 1) ** 0.5)) * patch, patch_size=patch,
      vision_width=vision_width, vision_layers=layers('visual'),
      vision_heads=_shape(params, 'visual', *block)[1],
      context_length=_shape(params, 'text', 'positional_embedding')[0], vocab_size=vocab_size,
      text_width=text_width, text_layers=layers('text'),
      text_heads=_shape(params, 'text', *block)[1])


def _clip_leaves(config: clip.CLIPConfig) -> list[tn.Leaf]:
  return [tn.Leaf(tuple(path.split('/')), (CLIP + name,), 'convert', convert=convert,
                  torch_shape=tuple(shape))
          for name, shape, targets in clip_weights.huggingface_names(config)
          for path, convert in targets.items() if path != 'logit_scale']


def names(params: Any) -> list[tn.Leaf]:
  """Every leaf of our T-MASS params with its official torch name."""
  pool = [leaf for p in 'qkv' for leaf in tn.dense(('pool', f'{p}_proj'),
                                                   f'{POOL}cross_attn.{p}_proj')]
  pool += (tn.dense(('pool', 'out_proj'), f'{POOL}cross_attn.out_proj')
           + tn.dense(('pool', 'linear_proj'), f'{POOL}linear_proj'))
  for i in (1, 2, 3):
    pool += tn.norm(('pool', f'layer_norm{i}'), f'{POOL}layer_norm{i}')
  leaves = (pool + tn.dense(('radius', 'linear'), RADIUS)
            + [tn.Leaf(('logit_scale',), (CLIP + 'logit_scale',))])
  if 'visual' in params:
    leaves += _clip_leaves(clip_config_of(params))
  return leaves


def _backbone(state_dict: Mapping[str, np.ndarray]) -> str:
  """The backbone whose Hugging Face CLIP the state dict's `clip.*` tensors are ('' if none)."""
  tensors = {k[len(CLIP):]: v for k, v in state_dict.items()
             if k.startswith(CLIP) and k != CLIP + 'logit_scale'}
  if not tensors:
    return ''
  shapes = {k: tuple(np.shape(v)) for k, v in tensors.items()
            if k not in clip_weights.HF_BUFFERS}
  for name in BACKBONES:
    config = clip.backbone_config(name)
    if shapes == {n: tuple(s) for n, s, _ in clip_weights.huggingface_names(config)
                  if n != 'logit_scale'}:
      return name
  width = shapes.get('vision_model.embeddings.patch_embedding.weight')
  raise ValueError(f'the T-MASS state_dict\'s CLIP ({CLIP}vision_model.embeddings.'
                   f'patch_embedding.weight {width}, {len(shapes)} tensors) is none of the '
                   f'backbones {BACKBONES}')


def infer_config(state_dict: Mapping[str, np.ndarray]) -> dict[str, Any]:
  """The `config.model` fields of an official T-MASS state_dict: width, frames, backbone. The
  attention heads (in no shape) keep the official `num_mha_heads` 1."""
  dims = tn.infer_dims(state_dict, 'tmass', {
      'hidden_dim': (f'{POOL}cross_attn.q_proj.weight', 0),
      'num_frames': (f'{RADIUS}.weight', 1)})
  frames, width = dims['num_frames'], dims['hidden_dim']
  return {**dims, 'num_heads': 1, 'backbone': _backbone(state_dict), 'visual_dim': width,
          'query_dim': width, 'num_clips': frames, 'max_frames': frames, 'max_query_len': 1}
