"""ProtoPRVR (Moon et al., ICCV 2025, "Prototypes are Balanced Units for Efficient and Effective
PRVR"): model, objective, registry entry. The authors released no code; every choice the paper
leaves open is listed in docs/protoprvr.md.

Parameters (`jax.eval_shape`, configs/protoprvr.py; K shares its weights, so it adds none):
TVR 10,424,450; ActivityNet 7,562,370; QVHighlights (SlowFast + CLIP) 9,733,762; TVR and
ActivityNet with CLIP-L/14 features (`tvr_clip_l14`, `activitynet_clip_l14`) 6,871,682; on
CLIP ViT-B/32 features (512-d inputs, `tvr_clip`, `activitynet_clip`, `charades_clip`)
6,180,994. Of
these, the decoders used only in training (text decoder, two feature decoders) hold 4,658,690
/ 3,278,850 / 4,264,450 / 2,884,610. Stored per video: 2 branches x 30 prototypes x 384
float32 = 92,160 bytes (a tenth of MS-SL's 1,008,128).
"""

from prvr_jax.models import two_branch
from prvr_jax.models.protoprvr.model import ProtoPRVR
from prvr_jax.models.protoprvr.objective import objective

SPEC = two_branch.spec(
    'protoprvr', ProtoPRVR, objective, extra_rng_streams=('masking',),
    # Softmax is shift invariant: no key bias of an attention gets a gradient, nor the bias of
    # the feature decoders' mixing weights (softmax over the prototypes); the text
    # decoder's cross-attention has a single key (the retrieved prototype), so its softmax
    # is 1 and its query and key projections get none either.
    gradient_free=(r'/attention/key/bias$', r'_decoder/weight/bias$',
                   r'^text_decoder/cross_attention/attention/(query|key)/'),
    param_counts={'tvr': 10_424_450, 'activitynet': 7_562_370, 'qvhighlights': 9_733_762,
                  'tvr_clip_l14': 6_871_682, 'activitynet_clip_l14': 6_871_682,
                  'tvr_clip': 6_180_994, 'activitynet_clip': 6_180_994,
                  'charades_clip': 6_180_994},
    candidate_set='clip_prototypes', candidate_query='clip', relevance='relevance')

__all__ = ['ProtoPRVR', 'SPEC', 'objective']
