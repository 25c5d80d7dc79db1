"""Holmes (ICML 2026, `src/` and `multisrc/` variants): model, objective, official names,
registry entry.

GMMFormer v2's model with mean-token mixing in its GMM blocks (`model.py`), trained with
evidential (Dirichlet) losses and an intra-video term from a partial optimal transport
(`objective.py`, docs/holmes.md). Parameters (the official model at its configs, counted with
`named_parameters()` on the official code and by `jax.eval_shape` here): TVR 32,273,440;
ActivityNet and Charades-STA 30,791,200 (GMMFormer v2's, shape for shape; the unused
`weight_token` included); on CLIP ViT-B/32 features (512-d inputs: `tvr_clip`,
`activitynet_clip`, `charades_clip`) 30,198,304. Stored per video: 32 clip and 128 frame
vectors of width 384 (245,760 bytes in float32).

The official `multisrc/` ("multi", TVR only; `model.frame_branch_query`, the config option
`multi`) adds RAL's frame branch: a frame-branch query encoder and confidence-weighted
word-frame scores. Parameters: TVR multi 34,345,121 (the official count); stored per video
also the 128 frame mask values (246,272 bytes in float32).
"""

import dataclasses

from prvr_jax.models import two_branch
from prvr_jax.models.holmes import official
from prvr_jax.models.holmes.model import Holmes
from prvr_jax.models.holmes.objective import holmes_terms, objective

SPEC = two_branch.spec(
    'holmes', Holmes, objective, official,
    param_counts={'tvr': 32_273_440, 'activitynet': 30_791_200, 'charades': 30_791_200,
                  'tvr,multi': 34_345_121, 'tvr_clip': 30_198_304,
                  'activitynet_clip': 30_198_304, 'charades_clip': 30_198_304},
    # Softmax is shift invariant: the key bias of unwindowed attention (query branch, the
    # mixing cross-attention) and the mixing output bias (one value per position, shared by
    # the branches the softmax runs over) get none; `weight_token` is unused, as officially.
    # (The contract test runs the `src/` model; multi's frame-branch key bias and
    # word-confidence logit bias, RAL's, would be gradient-free too.)
    gradient_free=(r'^query/encoder/attention/key/bias$', r'/cross/attention/key/bias$',
                   r'/mix_out/bias$', r'^weight_token$'),
    relevance='relevance')
# The official BertAdam skips a tensor without gradient (the unused `weight_token`), weight
# decay included: exempt from decay, its zero gradient leaves it as it is, as officially.
SPEC = dataclasses.replace(SPEC, no_decay=SPEC.no_decay + (r'^weight_token$',))

__all__ = ['Holmes', 'SPEC', 'holmes_terms', 'objective']
