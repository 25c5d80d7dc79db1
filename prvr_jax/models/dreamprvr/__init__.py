"""DreamPRVR (Li et al., CVPR 2026): model, objective, official names, registry entry.

GMMFormer v2's / HLFormer's query branch and two video branches whose register-augmented
Gaussian attention blocks take K registers per video, made by a conditional diffusion from
a video-centric start (docs/dreamprvr.md). Parameters (the official model at its configs,
`jax.eval_shape`, equal to the official `parameters()` counts, the frozen 10 x 384 time
table included): TVR 37,622,976; ActivityNet 36,139,200; Charades-STA 36,139,968; on CLIP
ViT-B/32 features (512-d inputs) `tvr_clip` 35,547,840, `activitynet_clip` 35,546,304,
`charades_clip` 35,547,072 (K registers 8 / 4 / 6, as the datasets' recipes). Stored
per video: 32 clip and 128 frame vectors of width 384 (245,760 bytes in float32).
"""

import dataclasses

from prvr_jax.models import two_branch
from prvr_jax.models.dreamprvr import official
from prvr_jax.models.dreamprvr.model import PERTURBATION, DreamPRVR, RegisterQueryFormer
from prvr_jax.models.dreamprvr.model import RegisterVideoBranch, mean_video_queries
from prvr_jax.models.dreamprvr.objective import noise_mse, objective, video_kl

# Beyond the shared groups: the official names containing 'bias' include the GRU's
# `bias_ih_l0` / `bias_hh_l0`; the frozen time table gets no update at all officially.
_NO_DECAY = (r'/gpo/(forward|backward)/(input|hidden)_bias$',
             r'/time_embedding/table$')

_spec = two_branch.spec(
    'dreamprvr', DreamPRVR, objective, official, extra_rng_streams=(PERTURBATION,),
    param_counts={'tvr': 37_622_976, 'activitynet': 36_139_200, 'charades': 36_139_968,
                  'tvr_clip': 35_547_840, 'activitynet_clip': 35_546_304,
                  'charades_clip': 35_547_072},
    # Softmax is shift invariant: the key bias of unwindowed attention (query branch, the
    # condition encoder, the mixing and query-former cross-attentions) and the mixing output
    # bias get none; the time table is frozen (its gradient stopped, as officially).
    gradient_free=(r'^query/encoder/attention/key/bias$', r'/cross/attention/key/bias$',
                   r'^condition_encoder/attention/key/bias$', r'/mix_out/bias$',
                   r'/time_embedding/table$'),
    relevance='relevance')
SPEC = dataclasses.replace(_spec, no_decay=_spec.no_decay + _NO_DECAY)

__all__ = ['DreamPRVR', 'PERTURBATION', 'RegisterQueryFormer', 'RegisterVideoBranch', 'SPEC',
           'mean_video_queries', 'noise_mse', 'objective', 'video_kl']
