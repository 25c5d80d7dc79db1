"""T-MASS (Wang et al., CVPR 2024, "Text Is MASS: Modeling as Stochastic Embedding for
Text-Video Retrieval"): model, objective, official names (released `model_best.pth`
checkpoints), registry entry, with the evaluation of the paper's Eq. 10; the released
evaluation, which leaks the ground truth, is reproduced as an option (`released.py`,
docs/tmass.md).

Parameters (`jax.eval_shape`, configs/tmass.py): the head on 512-d CLIP features with 12
frames holds 1,323,009: X-Pool pooling 1,316,352, the similarity-aware radius 6,656 and the
logit scale 1. End to end with CLIP ViT-B/32 (`msrvtt`, `didemo`, `lsmdc`): 152,600,321 (CLIP
151,277,313 with its logit scale, plus the head). Stored per video: its 12 frame features and
its seed, 24,580 bytes.
"""

import math

from prvr_jax.models.spec import ModelSpec, OfficialCheckpoint
from prvr_jax.models.tmass import official
from prvr_jax.models.tmass.model import MAX_LOGIT_SCALE, TMASS, example_batch, input_keys
from prvr_jax.models.tmass.objective import objective

SPEC = ModelSpec(
    name='tmass', module=TMASS, objective=objective, rng_streams=('dropout', 'sampling'),
    score_rng_streams=('sampling',),
    # The official optimiser decays every parameter (weight decay 0.2).
    no_decay=(),
    # X-Pool's key bias is added to every frame's logit alike: softmax ignores it.
    gradient_free=(r'^pool/k_proj/bias$',),
    video_inputs=('clip_feats', 'video_seed'), query_inputs=('query_feats',),
    input_keys=input_keys, example_batch=example_batch,
    # CLIP (its towers and logit scale) is the backbone group (lr 1e-6); the logit scale is
    # clamped to ln 100.
    backbone=(r'^logit_scale$', r'^(visual|text)/'),
    bounds=lambda _: ((r'^logit_scale$', -math.inf, MAX_LOGIT_SCALE),),
    # Released checkpoints (`model_best.pth`: CLIP, X-Pool, radius).
    official=OfficialCheckpoint(names=official.names, infer_config=official.infer_config,
                                ignored=official.IGNORED),
    # Evaluation's samples per pair and noise, and where CLIP's initial weights came from.
    fingerprint_exempt=('num_samples', 'noise', 'clip_weights'),
    param_counts={'msrvtt_features': 1_323_009, 'msrvtt': 152_600_321},
    # Two-stage search proposes videos by their best frame (X-Pool re-scores them).
    candidate_set='frames')

__all__ = ['SPEC', 'TMASS', 'objective']
