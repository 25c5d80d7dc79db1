r"""HLFormer (Li et al., ICCV 2025) with the official per-dataset hyperparameters.

Launch (the embedded synthetic benchmark is the default variant):

  python train.py --config=configs/hlformer.py --workdir=/tmp/hlformer
  python train.py --config=configs/hlformer.py:tvr \
      --config.data.dir=/data/prvr/tvr --workdir=/tmp/hlformer_tvr

Variants: `synthetic` (default), `tiny` (a few-second smoke run), `tvr`, `activitynet`,
`charades`. Numbers of the official README (text-to-video R@1 / R@5 / R@10 / R@100 / SumR):
  TVR          15.7 / 37.1 / 48.5 / 86.4 / 187.7
  ActivityNet   8.7 / 27.1 / 40.1 / 79.0 / 154.9
  Charades-STA  2.6 /  8.5 / 13.7 / 54.0 /  78.7
Official `loss_factor` [a, b, c, d] is `loss.clip_nce`, `loss.frame_nce`, `loss.qdl`,
`loss.partial_order`; `neg_factor` [m, s, l] is `loss.qdl_delta`, `loss.qdl_alpha`,
`loss.qdl_gamma`; `sft_factor` is `model.temperature`; `drop` / `input_drop` are
`model.dropout` / `model.input_dropout`. The synthetic and tiny variants shrink the Lorentz
blocks with the width (`model.lorentz_dim` + 1 must be a multiple of `model.num_heads`).

CLIP ViT-B/32 features (AMDNet's release, docs/data_release.md): `tvr_clip`,
`activitynet_clip`, `charades_clip`. HLFormer's authors ran no CLIP features (their README: no
ViT-derived features); these follow prvr-ea (CELL-POSTECH/prvr-ea, `*_clip`), which changes
only the reader and the input dims: each dataset's official recipe, 512-d frames and sentence
vectors (a query of one token), the CLIP rows read along the MS-SL release's frame timeline
(`data.frame_map`: its `FeatureData/{i3d_resnet,i3d,i3d_rgb_lgi}/video2frames.txt` must be
there), pooled to 32 clips and at most 128 frames, L2-normalised. Reported numbers on them:
none (the authors did not run them; prvr-ea's repository publishes no result table).

  python train.py --config=configs/hlformer.py:tvr_clip \
      --config.data.dir=/data/prvr/tvr --workdir=/tmp/hlformer_tvr_clip
"""

import ml_collections

from prvr_jax import config_lib
from prvr_jax.models.fields import config_fields
from prvr_jax.models.two_branch import TwoBranchModel

MODEL = dict(name='hlformer', **config_fields(TwoBranchModel), lorentz_dim=127,
             attention_num=8, curv_init=1.0, learn_curv=True)
# proxy_matching / distribution_alignment: the probabilistic plug-in's weights (RAL's; used
# with --config.model.probabilistic=True, docs/ral.md).
LOSS = dict(hard_pool_size=20, hard_negative_start_epoch=20, stochastic_support=0.0, om=0.0,
            proxy_matching=4e-3, distribution_alignment=2.5e-4)

# Official per-dataset values (src/Configs/{tvr,act,cha}.py of the official code).
_TVR = {'optim.lr': 3e-4, 'model.temperature': 0.09, 'model.dropout': 0.2,
        'model.input_dropout': 0.2, 'loss.margin': 0.1, 'loss.clip_nce': 0.05,
        'loss.frame_nce': 0.04, 'loss.qdl': 8e-5, 'loss.partial_order': 1e-3,
        'loss.qdl_delta': 0.15, 'loss.qdl_alpha': 32.0, 'loss.qdl_gamma': 1.0}
_ACT = {**_TVR, 'optim.lr': 2.5e-4, 'model.temperature': 0.6, 'model.dropout': 0.31,
        'model.input_dropout': 0.31, 'loss.margin': 0.2, 'loss.clip_nce': 0.02,
        'loss.qdl': 0.003, 'loss.qdl_delta': 0.2}
PER_DATASET = {
    'tvr': _TVR,
    'activitynet': _ACT,
    'charades': {**_ACT, 'optim.lr': 2e-4, 'model.dropout': 0.25, 'model.input_dropout': 0.25},
    # The synthetic benchmark and the smoke run: the TVR recipe at a smaller size.
    'synthetic': {**_TVR, 'model.hidden_dim': 64, 'model.lorentz_dim': 63,
                  'loss.hard_negative_start_epoch': 3},
    'tiny': {**_TVR, 'model.hidden_dim': 32, 'model.lorentz_dim': 31,
             'loss.hard_negative_start_epoch': 1},
}
# CLIP ViT-B/32 (prvr-ea's HLFormer: each dataset's recipe, 512-d inputs, the CLIP rows read
# along the MS-SL release's frame timeline, L2-normalised).
PER_DATASET.update(config_lib.clip_variants(PER_DATASET, frame_timeline=True))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  return config_lib.build_config(arg, model=MODEL, loss=LOSS, per_dataset=PER_DATASET)
