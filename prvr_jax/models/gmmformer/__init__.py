"""GMMFormer (Wang et al., AAAI 2024): model, objective, official names, registry entry.

Parameters (the official model at its configs, `jax.eval_shape`): TVR 12,848,256;
ActivityNet and Charades-STA 11,366,016; on CLIP ViT-B/32 features (512-d inputs,
`tvr_clip`, `activitynet_clip`, `charades_clip`) 10,773,120. Stored per video: 32 clip vectors
and one video vector of width 384 (50,688 bytes in float32).
"""

from prvr_jax.models import two_branch
from prvr_jax.models.gmmformer import official
from prvr_jax.models.gmmformer.model import GMMFormer
from prvr_jax.models.gmmformer.objective import objective

SPEC = two_branch.spec(
    'gmmformer', GMMFormer, objective, official,
    param_counts={'tvr': 12_848_256, 'activitynet': 11_366_016, 'charades': 11_366_016,
                  'tvr_clip': 10_773_120, 'activitynet_clip': 10_773_120,
                  'charades_clip': 10_773_120},
    # Softmax is shift invariant: the key bias of the (unwindowed) query attention gets none.
    gradient_free=(r'^query/encoder/attention/key/bias$',),
    encoding_depends_on_batch=lambda config_model: (
        config_model.get('frame_window_length', 'batch_max') == 'batch_max'),
    relevance='relevance')

__all__ = ['GMMFormer', 'SPEC', 'objective']
