"""MSC-PRVR (Moon et al., NeurIPS 2025): model, objective, official names, registry entry.

GMMFormer v2's model on merged clip tokens with proportional attention and a projection for
the cross-branch alignment (`model.py`), trained with GMMFormer v2's retrieval terms, text
correlation preservation (relational distillation from the CLIP text features) and adaptive
cross-branch video alignment (`objective.py`, docs/msc_prvr.md). Parameters (the official
model at each input width, counted with `named_parameters()` on the official code and by
`jax.eval_shape` here): the official features, CLIP ViT-L/14 (768 / 768, TVR, ActivityNet,
Charades-STA: the `<dataset>_l14` variants) 30,660,640 and QVHighlights (SlowFast + CLIP 2816,
CLIP text 512: `qvhighlights` and `qvhighlights_msc`) 32,142,880;
the CLIP ViT-B/32 release (512 / 512, the `<dataset>_clip` variants) 30,364,192; the MS-SL
release: TVR (3072 / 768) 32,439,328, ActivityNet and Charades-STA (1024 / 1024) 30,957,088.
Stored per video: 32 clip and 128 frame vectors of width 384 (245,760 bytes in float32).
"""

from prvr_jax.models import two_branch
from prvr_jax.models.msc_prvr import official
from prvr_jax.models.msc_prvr.model import MSCPRVR
from prvr_jax.models.msc_prvr.objective import msc_terms, objective

SPEC = two_branch.spec(
    'msc_prvr', MSCPRVR, objective, official,
    param_counts={'tvr': 32_439_328, 'activitynet': 30_957_088, 'charades': 30_957_088,
                  'qvhighlights': 32_142_880, 'tvr_clip': 30_364_192,
                  'activitynet_clip': 30_364_192, 'charades_clip': 30_364_192,
                  'tvr_l14': 30_660_640, 'activitynet_l14': 30_660_640,
                  'charades_l14': 30_660_640, 'qvhighlights_msc': 32_142_880},
    # Softmax is shift invariant: the key bias of unwindowed attention (query branch, the
    # temporal-consolidation cross-attention) and the TC output bias (one value per time
    # step, shared by the K branches the softmax runs over) get none.
    gradient_free=(r'^query/encoder/attention/key/bias$', r'/cross/attention/key/bias$',
                   r'/mix_out/bias$'))

__all__ = ['MSCPRVR', 'SPEC', 'msc_terms', 'objective']
