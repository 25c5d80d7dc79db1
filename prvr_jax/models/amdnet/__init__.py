"""AMDNet (Song et al., active moment discovering): model, objective, official names, registry
entry.

Parameters (the minimally repaired official model at the repo's configs, 512-d CLIP inputs,
`jax.eval_shape`): hidden 384 (TVR, also `tvr_clip`) 1,781,896; hidden 256 (ActivityNet and
Charades-STA, also `activitynet_clip`, `charades_clip`) 893,704 (paper: 0.89M). Stored per
video: 32 moment-enhanced clip vectors (49,152 bytes in float32 at width 384, 32,768 at 256).
"""

from prvr_jax.models.amdnet import official
from prvr_jax.models.amdnet.model import AMDNet
from prvr_jax.models.amdnet.objective import objective
from prvr_jax.models.spec import ModelSpec, OfficialCheckpoint
from prvr_jax.models.two_branch import OFFICIAL_NO_DECAY

SPEC = ModelSpec(
    name='amdnet', module=AMDNet, objective=objective, rng_streams=('dropout',),
    # The official groups: the summary's lowercase `layernorm.weight` is decayed, as coded.
    no_decay=OFFICIAL_NO_DECAY,
    # Softmax is shift invariant: the key bias of the first (unmasked) attention gets none.
    gradient_free=(r'^attention/attention/key/bias$',),
    official=OfficialCheckpoint(names=official.names, infer_config=official.infer_config),
    param_counts={'tvr': 1_781_896, 'activitynet': 893_704, 'charades': 893_704,
                  'tvr_clip': 1_781_896, 'activitynet_clip': 893_704,
                  'charades_clip': 893_704},
    video_inputs=('clip_feats',), relevance='relevance',
    learned_spans='learned_spans')

__all__ = ['AMDNet', 'SPEC', 'objective']
