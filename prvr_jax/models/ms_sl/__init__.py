"""MS-SL (Dong et al., ACM MM 2022): model, objective, official names, registry entry.

Parameters (the minimally repaired official model at its configs, `jax.eval_shape`): TVR
4,852,992; ActivityNet and Charades-STA 3,370,752; on CLIP ViT-B/32 features (512-d inputs,
`tvr_clip`, `activitynet_clip`, `charades_clip`) 2,777,856. Stored per video: 528 multi-scale
clip and 128 frame vectors of width 384 plus the frame mask (1,008,128 bytes in float32).
"""

from prvr_jax.models import two_branch
from prvr_jax.models.ms_sl import official
from prvr_jax.models.ms_sl.model import MSSL
from prvr_jax.models.ms_sl.objective import objective

SPEC = two_branch.spec(
    'ms_sl', MSSL, objective, official,
    param_counts={'tvr': 4_852_992, 'activitynet': 3_370_752, 'charades': 3_370_752,
                  'tvr_clip': 2_777_856, 'activitynet_clip': 2_777_856,
                  'charades_clip': 2_777_856},
    # Softmax is shift invariant: the key biases of the three (unwindowed) attention blocks
    # get none.
    gradient_free=(r'^(query|clip|frame)/encoder/attention/key/bias$',),
    relevance='relevance')

__all__ = ['MSSL', 'SPEC', 'objective']
