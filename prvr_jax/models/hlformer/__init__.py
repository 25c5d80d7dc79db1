"""HLFormer (Li et al., ICCV 2025): model, objective, official names, registry entry.

Parameters (the official model at its configs, `jax.eval_shape`): TVR 29,911,483;
ActivityNet and Charades-STA 28,429,243; on CLIP ViT-B/32 features (512-d inputs, `tvr_clip`,
`activitynet_clip`, `charades_clip`) 27,836,347 (the official `named_parameters()` count one
more: the frozen manifold curvature `manifold.k` = 1, a constant here). Stored per video: 32 clip
and 128 frame vectors of width 384 (245,760 bytes in float32).
"""

import dataclasses
import math
from typing import Any

from prvr_jax.models import two_branch
from prvr_jax.models.hlformer import official
from prvr_jax.models.hlformer.model import HLFormer, HLFormerBlock
from prvr_jax.models.hlformer.objective import objective, partial_order_loss
from prvr_jax.models.spec import OfficialCheckpoint

# The frozen `Lorentz().k` the official model shares, under every name it is reachable by
# (blocks of up to attention_num = 16).
_MANIFOLD_K = ('manifold.k',) + tuple(
    f'{encoder}.h_attns.{i}.self.{part}manifold.k'
    for encoder in ('clip_encoder', 'frame_encoder_1') for i in range(8)
    for part in ('', 'lorentz_multiattention.', 'lorentz_multiattention.linear_keys.',
                 'lorentz_multiattention.linear_values.', 'lorentz_multiattention.linear_query.'))



def bounds(config_model: Any) -> tuple[tuple[str, float, float], ...]:
  """The official in-place clamps (applied there to the stored values before each forward,
  here after each update): `curv` in `[log(curv_init / 10), log(10 curv_init)]`, the text,
  video and Lorentz-block scale factors `<= 0`."""
  c0 = config_model.curv_init
  return ((r'^curv$', math.log(c0 / 10), math.log(c0 * 10)),
          (r'(^textual_alpha|^video_alpha|/scale_alpha)$', -math.inf, 0.0))


SPEC = dataclasses.replace(
    two_branch.spec(
        'hlformer', HLFormer, objective,
        param_counts={'tvr': 29_911_483, 'activitynet': 28_429_243, 'charades': 28_429_243,
                      'tvr_clip': 27_836_347, 'activitynet_clip': 27_836_347,
                      'charades_clip': 27_836_347},
        # Softmax is shift invariant: the key bias of unwindowed attention (query branch, the
        # mixing cross-attention), the score bias of the unwindowed Lorentz block and the
        # mixing output bias (one value per position, shared by the branches the softmax runs
        # over) get none.
        gradient_free=(r'^query/encoder/attention/key/bias$', r'/cross/attention/key/bias$',
                       r'/lorentz_0/attention/lorentz_attention/bias$', r'/mix_out/bias$'),
        relevance='relevance'),
    official=OfficialCheckpoint(names=official.names, infer_config=official.infer_config,
                                ignored=_MANIFOLD_K),
    bounds=bounds)

__all__ = ['HLFormer', 'HLFormerBlock', 'SPEC', 'bounds', 'objective', 'partial_order_loss']
