"""Zero-shot CLIP (Radford et al., ICML 2021; meanP of CLIP4Clip, Luo et al., Neurocomputing
2022): nothing trained, CLIP's text feature against a video's pooled frame embeddings,
mean-pooled as CLIP4Clip's parameter-free meanP or max-pooled over frames (the PRVR analogue:
a video is as relevant as its best frame), on a CLIP feature release or on frames through
CLIP's image tower (docs/clip_zero_shot.md).

Parameters (`jax.eval_shape`, configs/clip_zero_shot.py): on CLIP features (`tvr_clip`,
`activitynet_clip`, `charades_clip`, `synthetic`, `tiny`) only CLIP's logit scale, 1 (it
never changes a ranking); captions through CLIP ViT-B/32's text tower (`tvr_clip,text_tower`)
63,428,097 (the text tower and the logit scale); frames and captions through CLIP
ViT-B/32 (`msrvtt`) 151,277,313, the whole CLIP. Stored per video: one 512-d vector with
'mean' (2,052 bytes with its mask), every frame's with 'max' and 'topk'.
"""

from typing import Any

import jax
import numpy as np

from prvr_jax.clip import weights as clip_weights
from prvr_jax.models.clip_zero_shot.model import ClipZeroShot, example_batch, input_keys
from prvr_jax.models.clip_zero_shot.model import pool_scores
from prvr_jax.models.spec import ModelSpec

Params = Any
# The parts of CLIP's parameter tree the model may hold.
CLIP_PARTS = ('visual', 'text', 'logit_scale')


class NothingToTrainError(ValueError):
  """A training run of a model without trained parameters."""


def objective(module, params, batch, rngs, ctx):
  """Refuses: zero-shot CLIP has nothing to train."""
  del module, params, batch, rngs, ctx
  raise NothingToTrainError('clip_zero_shot has no parameters to train (zero-shot CLIP): '
                            'evaluate it with evaluate.py, without --checkpoint')


def into_model(params: Params, clip_params: Params, source: str) -> Params:
  """`params` with the parts of CLIP it holds (`CLIP_PARTS`) taken from `clip_params` (a
  `prvr_jax.clip.weights.load` tree); every part must have the model's shapes."""
  merged = dict(params)
  for name in CLIP_PARTS:
    if name not in params:
      continue
    ours = jax.tree.map(np.shape, params[name])
    theirs = jax.tree.map(np.shape, clip_params[name])
    if ours != theirs:
      raise clip_weights.WeightsError(f'{source}: {name} does not fit the model ({theirs} vs '
                                      f'{ours}; config.model.backbone)')
    merged[name] = jax.tree.map(np.asarray, clip_params[name])
  return merged


def pretrained_params(config: Any) -> Params:
  """The parameters zero-shot CLIP is evaluated with: CLIP's weights from
  `config.model.clip_weights` (`prvr_jax.clip.weights.load`: OpenAI / open_clip or Hugging
  Face files) for the towers it holds; without a file, the initialisation of
  `config.train.seed` (CLIP's logit scale on features; random towers only for the 'tiny'
  backbone of tests and smoke runs, refused for a real one)."""
  model = config.model
  path = model.get('clip_weights', '')
  towers = [name for name, used in (('image', model.video_input == 'frames'),
                                    ('text', model.query_input == 'tokens')) if used]
  if towers and not path and model.backbone != 'tiny':
    raise ValueError(f'clip_zero_shot runs CLIP {model.backbone}\'s {" and ".join(towers)} '
                     'tower(s) but config.model.clip_weights is empty: set it to a CLIP '
                     'weights file (OpenAI / open_clip / Hugging Face, docs/clip.md)')
  if not path:
    init = jax.jit(lambda key: SPEC.init_params(model, key))
    return jax.device_get(init(jax.random.key(config.train.seed)))
  # Every parameter is a part of CLIP's: the shapes suffice, nothing is initialised.
  _, clip_params = clip_weights.load(path)
  return into_model(SPEC.param_shapes(model), clip_params, f'config.model.clip_weights={path}')


SPEC = ModelSpec(
    name='clip_zero_shot', module=ClipZeroShot, objective=objective,
    input_keys=input_keys, example_batch=example_batch,
    video_inputs=('frame_feats', 'frame_mask'), query_inputs=('query_feats',),
    pretrained=pretrained_params,
    # The weights' path: the parameters themselves are fingerprinted where they are used.
    fingerprint_exempt=('clip_weights',),
    param_counts={'tiny': 1, 'tvr_clip': 1, 'tvr_clip,text_tower': 63_428_097,
                  'msrvtt': 151_277_313},
    # Two-stage search proposes videos by their best frame: the 'max' score itself.
    candidate_set='frames', relevance='relevance')

__all__ = ['SPEC', 'ClipZeroShot', 'NothingToTrainError', 'pool_scores', 'pretrained_params']
