"""RAL (Zhang et al., EMNLP 2025 Findings): model, objective, official names, registry entry.

GMMFormer v2 with a frame-branch query encoder, confidence-weighted word-frame scores and, in
training, Gaussian embeddings of each video and of its query support set (docs/ral.md).
Parameters (the official model at its configs, `jax.eval_shape`): TVR 35,529,377;
ActivityNet 34,145,953; Charades-STA (GMMFormer v2's values) 34,145,953; on CLIP ViT-B/32
features (512-d inputs, `tvr_clip`, `activitynet_clip`, `charades_clip`) 33,355,425. Stored per
video: 32 clip and 128 frame vectors of width 384 and the 128 frame mask values
(246,272 bytes in float32).
"""

from prvr_jax.models import two_branch
from prvr_jax.models.ral import official
from prvr_jax.models.ral.model import RAL
from prvr_jax.models.ral.objective import objective

SPEC = two_branch.spec(
    'ral', RAL, objective, official, extra_rng_streams=('sample',),
    param_counts={'tvr': 35_529_377, 'activitynet': 34_145_953, 'charades': 34_145_953,
                  'tvr_clip': 33_355_425, 'activitynet_clip': 33_355_425,
                  'charades_clip': 33_355_425},
    # Softmax is shift invariant: GMMFormer v2's (the key bias of unwindowed attention, the
    # temporal-consolidation output bias), the frame-branch query encoder's key bias and the
    # word-confidence logit's bias (one value for all words of a query) get none.
    gradient_free=(r'^query/(frame_)?encoder/attention/key/bias$', r'/cross/attention/key/bias$',
                   r'/mix_out/bias$', r'^text_weight_fc/fc_2/bias$'),
    candidate_query='query')

__all__ = ['RAL', 'SPEC', 'objective']
