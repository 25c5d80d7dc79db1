"""GMMFormer v2 (Wang et al., NeurIPS 2024): model, objective, official names, registry entry.

Parameters (the official model at its configs, `jax.eval_shape`): TVR 32,273,440;
ActivityNet and Charades-STA 30,791,200; on CLIP ViT-B/32 features (512-d inputs,
`tvr_clip`, `activitynet_clip`, `charades_clip`) 30,198,304. Stored per video: 32 clip and 128
frame vectors of width 384 (245,760 bytes in float32).
"""

from prvr_jax.models import two_branch
from prvr_jax.models.gmmformer_v2 import official
from prvr_jax.models.gmmformer_v2.model import GMMFormerV2
from prvr_jax.models.gmmformer_v2.objective import objective

SPEC = two_branch.spec(
    'gmmformer_v2', GMMFormerV2, objective, official,
    param_counts={'tvr': 32_273_440, 'activitynet': 30_791_200, 'charades': 30_791_200,
                  'tvr_clip': 30_198_304, 'activitynet_clip': 30_198_304,
                  'charades_clip': 30_198_304},
    # Softmax is shift invariant: the key bias of unwindowed attention (query branch, the
    # temporal-consolidation cross-attention) and the TC output bias (one value per time
    # step, shared by the K branches the softmax runs over) get none.
    gradient_free=(r'^query/encoder/attention/key/bias$', r'/cross/attention/key/bias$',
                   r'/mix_out/bias$'),
    relevance='relevance')

__all__ = ['GMMFormerV2', 'SPEC', 'objective']
