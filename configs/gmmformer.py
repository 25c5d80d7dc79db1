r"""GMMFormer (Wang et al., AAAI 2024) with the official per-dataset hyperparameters.

Launch (the embedded synthetic benchmark is the default variant):

  python train.py --config=configs/gmmformer.py --workdir=/tmp/gmmformer
  python train.py --config=configs/gmmformer.py:activitynet \
      --config.data.dir=/data/prvr/activitynet --workdir=/tmp/gmmformer_anet

Variants: `synthetic` (default), `tiny` (a few-second smoke run), `tvr`, `activitynet`,
`charades`. Paper numbers (text-to-video R@1 / R@5 / R@10 / R@100 / SumR):
  TVR          13.9 / 33.3 / 44.5 / 84.9 / 176.6
  ActivityNet   8.3 / 24.9 / 36.7 / 76.1 / 146.0
  Charades-STA  2.1 /  7.8 / 12.5 / 50.6 /  72.9

CLIP ViT-B/32 features (AMDNet's release, docs/data_release.md): `tvr_clip`,
`activitynet_clip`, `charades_clip`. GMMFormer's authors ran no CLIP features; these follow
prvr-ea (CELL-POSTECH/prvr-ea, `*_clip`), which changes only the reader and the input dims:
each dataset's official recipe, 512-d frames and sentence vectors (a query of one token), the
CLIP rows read along the MS-SL release's frame timeline (`data.frame_map`: its
`FeatureData/{i3d_resnet,i3d,i3d_rgb_lgi}/video2frames.txt` must be there), pooled to 32 clips
and at most 128 frames, L2-normalised. Reported numbers on them: none (the authors did not run
them; prvr-ea's repository publishes no result table).

  python train.py --config=configs/gmmformer.py:tvr_clip \
      --config.data.dir=/data/prvr/tvr --workdir=/tmp/gmmformer_tvr_clip
"""

import ml_collections

from prvr_jax import config_lib
from prvr_jax.models.fields import config_fields
from prvr_jax.models.two_branch import TwoBranchModel

MODEL = dict(
    name='gmmformer', **config_fields(TwoBranchModel), window='gaussian',
    widths=(None, 0.5, 1.0, 5.0), aggregation='average', temperature=1.0,
    # Official v1 sizes the frame-branch windows by the padded batch length ('batch_max');
    # 'static' uses max_frames for every batch.
    frame_window_length='batch_max')
# proxy_matching / distribution_alignment: the probabilistic plug-in's weights (RAL's; used
# with --config.model.probabilistic=True, docs/ral.md).
LOSS = dict(hard_pool_size=20, stochastic_support=0.0, proxy_matching=4e-3,
            distribution_alignment=2.5e-4)

# Official per-dataset values (src/Configs/{tvr,act,cha}.py of the official code).
_TVR = {'optim.lr': 3e-4, 'model.dropout': 0.2, 'model.input_dropout': 0.2,
        'loss.margin': 0.1, 'loss.hard_negative_start_epoch': 30, 'loss.clip_nce': 0.05,
        'loss.frame_nce': 0.04, 'loss.qdl': 0.001, 'loss.qdl_delta': 0.15,
        'loss.qdl_alpha': 32.0}
PER_DATASET = {
    'tvr': _TVR,
    'activitynet': {**_TVR, 'optim.lr': 2.5e-4, 'loss.margin': 0.2,
                    'loss.hard_negative_start_epoch': 20, 'loss.clip_nce': 0.02,
                    'loss.qdl': 0.015, 'loss.qdl_delta': 0.2},
    'charades': {**_TVR, 'optim.lr': 2.5e-4, 'model.dropout': 0.15,
                 'model.input_dropout': 0.15, 'loss.margin': 0.2,
                 'loss.hard_negative_start_epoch': 100, 'loss.clip_nce': 0.02,
                 'loss.frame_nce': 0.02, 'loss.qdl': 0.005},
    # The synthetic benchmark and the smoke run: the TVR recipe at a smaller size.
    'synthetic': {**_TVR, 'model.hidden_dim': 64, 'loss.hard_negative_start_epoch': 3},
    'tiny': {**_TVR, 'model.hidden_dim': 32, 'loss.hard_negative_start_epoch': 1},
}
# CLIP ViT-B/32 (prvr-ea's GMMFormer: each dataset's recipe, 512-d inputs, the CLIP rows read
# along the MS-SL release's frame timeline, L2-normalised).
PER_DATASET.update(config_lib.clip_variants(PER_DATASET, frame_timeline=True))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  return config_lib.build_config(arg, model=MODEL, loss=LOSS, per_dataset=PER_DATASET)
