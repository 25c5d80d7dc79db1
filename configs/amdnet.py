r"""AMDNet (Song et al., active moment discovering) with the official per-dataset
hyperparameters (songpipi/AMDNet `Configs/{tvr,act,cha}.py`) on CLIP ViT-B/32 features.

Launch (the embedded synthetic benchmark, with sentence-vector queries, is the default):

  python train.py --config=configs/amdnet.py --workdir=/tmp/amdnet
  python train.py --config=configs/amdnet.py:tvr \
      --config.data.dir=/data/prvr/tvr --workdir=/tmp/amdnet_tvr

The real variants read AMDNet's CLIP release layout (`FeatureData/new_clip_vit_32_<coll>_
vid_features.hdf5`, `TextData/clip_ViT_B_32_<coll>_query_feat.hdf5`, 512-d, not normalised).
Variants: `synthetic` (default), `tiny`, `tvr`, `activitynet`, `charades`, and the same three
under the CLIP names every model offers, `tvr_clip`, `activitynet_clip`, `charades_clip`
(AMDNet's own construction, as prvr-ea runs it: the CLIP rows as stored, pooled in float32 to
32 clips, not L2-normalised; `data.frame_map=''`, `data.normalize=False`). Paper numbers
(text-to-video R@1 / R@5 / R@10 / R@100 / SumR; the paper reports no Charades-STA result):
  TVR          19.7 / 42.4 / 54.1 / 88.9 / 205.1
  ActivityNet  12.3 / 32.5 / 45.9 / 82.1 / 172.8
The paper's loss values instead of the code's: `--config.loss.moment_relevance=1
--config.loss.moment_relevance_margin=0.05` (TVR; 0.1 ActivityNet) `--config.loss.clip_nce=0.02`
(docs/paper_vs_code.md). GMMFormer v2's L_div / L_om plug in with `--config.loss.qdl`,
`--config.loss.om` (0: off). The default variant ends with test SumR about 251 (R@1 29.2) on
the synthetic benchmark (docs/synthetic.md, which gives its run time).
"""

import ml_collections

from prvr_jax import config_lib
from prvr_jax.models.amdnet import AMDNet
from prvr_jax.models.fields import config_fields

MODEL = dict(name='amdnet', **config_fields(AMDNet))
# Hard-coded in the official code: diversity alpha 0.15, relevance margin 0.02 and weight 25.
LOSS = dict(clip_nce=0.04, moment_diversity=1.0, moment_diversity_alpha=0.15,
            moment_relevance=25.0, moment_relevance_margin=0.02,
            qdl=0.0, qdl_delta=0.15, qdl_alpha=32.0, qdl_gamma=1.0, om=0.0)
# Every variant reads CLIP sentence vectors and 512-d CLIP frame features.
_CLIP = {'model.visual_dim': 512, 'model.query_dim': 512, 'data.text_feature': 'clip'}
_TVR = {**_CLIP, 'optim.lr': 3e-4, 'model.dropout': 0.2, 'model.input_dropout': 0.2,
        'loss.clip_nce': 0.04, 'train.num_epochs': 200, 'train.patience': 15,
        'train.seed': 9527}
_ACT = {**_TVR, 'model.hidden_dim': 256, 'optim.lr': 2.5e-4, 'loss.clip_nce': 0.02,
        'train.num_epochs': 100, 'train.seed': 3407}
PER_DATASET = {
    'tvr': _TVR,
    'activitynet': _ACT,
    'charades': {**_ACT, 'model.dropout': 0.15, 'model.input_dropout': 0.15,
                 'train.patience': 10},
    # The synthetic benchmark (its own dims, sentence vectors) and the smoke run.
    'synthetic': {'data.text_feature': 'clip', 'optim.lr': 3e-4, 'model.hidden_dim': 64,
                  'model.dropout': 0.2, 'model.input_dropout': 0.2, 'loss.clip_nce': 0.04},
    'tiny': {'data.text_feature': 'clip', 'optim.lr': 3e-4, 'model.hidden_dim': 32,
             'model.dropout': 0.2, 'model.input_dropout': 0.2, 'loss.clip_nce': 0.04},
}
# The feature-family names every model offers: AMDNet's own variants (the CLIP rows as stored,
# not normalised), under the names `<dataset>_clip`.
PER_DATASET.update(config_lib.clip_variants(PER_DATASET, frame_timeline=False, normalize=False))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  return config_lib.build_config(arg, model=MODEL, loss=LOSS, per_dataset=PER_DATASET)
