r"""ProtoPRVR (Moon et al., ICCV 2025) with the paper's Table 8 loss weights per dataset.

Launch (the embedded synthetic benchmark is the default variant):

  python train.py --config=configs/protoprvr.py --workdir=/tmp/protoprvr
  python train.py --config=configs/protoprvr.py:tvr \
      --config.data.dir=/data/prvr/tvr --workdir=/tmp/protoprvr_tvr
  python train.py --config=configs/protoprvr.py:qvhighlights \
      --config.data.dir=/data/prvr/qvhighlights --workdir=/tmp/protoprvr_qvh

Variants: `synthetic` (default), `tiny`, `tvr`, `activitynet` (the MS-SL feature release:
I3D/ResNet + RoBERTa, so K = 6 and, on ActivityNet, lambda_ortho = 0.3), `qvhighlights`
(docs/qvhighlights.md). Paper numbers (text-to-video R@1 / R@5 / R@10 / R@100 / SumR):
  TVR (RoBERTa)          15.4 / 35.9 / 47.5 / 86.4 / 185.1
  ActivityNet (RoBERTa)   7.9 / 24.9 / 37.2 / 77.3 / 147.4
  QVHighlights           22.6 / 48.8 / 61.3 / 93.9 / 226.6
An ablation of the paper's Tables 4-6 is a second `:arg` part, e.g.
`--config=configs/protoprvr.py:tvr,table4_retrieval` (names in `ABLATIONS`). The default
variant ends with test SumR about 204 (R@1 23.3; mean-pooled baseline 129.0) on the synthetic
benchmark (docs/protoprvr.md, which also lists every choice
the paper leaves open, and docs/synthetic.md).
"""

import ml_collections

from prvr_jax import config_lib
from prvr_jax.models.fields import config_fields
from prvr_jax.models.two_branch import TwoBranchModel

MODEL = dict(name='protoprvr', **config_fields(TwoBranchModel), num_prototypes=30,
             prototype_iterations=1, prototype_generator='cross_attention',
             share_prototypes=False, mask_ratio=0.15)
# Table 8: lambda_nce (both branches' InfoNCE) 0.03 TVR / 0.06 ANet, QVH; the triplet terms
# and hard negatives as MS-SL. Each prototype term has a weight and a switch.
LOSS = dict(margin=0.2, hard_pool_size=20, hard_negative_start_epoch=20, use_nce=True,
            clip_nce=0.06, frame_nce=0.06, use_crecon=True, crecon=0.1, crecon_temperature=1.0,
            use_urecon=True, urecon=1.0, use_guide=True, guide=0.005, guide_margin=0.2,
            use_ortho=True, ortho=0.01, stochastic_support=0.0)

# MS-SL's recipe (the paper adopts MS-SL's settings; batch 128).
_RECIPE = {'optim.lr': 2.5e-4, 'model.dropout': 0.1, 'model.input_dropout': 0.1,
           'train.seed': 2018, 'eval.video_batch_size': 200}
_ROBERTA = {**_RECIPE, 'model.prototype_iterations': 6}
PER_DATASET = {
    'tvr': {**_ROBERTA, 'loss.margin': 0.1, 'loss.clip_nce': 0.03, 'loss.frame_nce': 0.03},
    'activitynet': {**_ROBERTA, 'loss.ortho': 0.3},
    'qvhighlights': _RECIPE,
    # The synthetic benchmark and the smoke run: the recipe at a smaller width; 5 epochs need
    # lr 1e-3 for the prototypes' attention to sharpen (2.5e-4: test SumR 131.5).
    'synthetic': {**_RECIPE, 'optim.lr': 1e-3, 'model.hidden_dim': 64,
                  'loss.hard_negative_start_epoch': 3},
    'tiny': {**_RECIPE, 'model.hidden_dim': 32, 'model.num_prototypes': 6,
             'loss.hard_negative_start_epoch': 1},
}

_NO_PROTOTYPE_TERMS = {f'loss.use_{t}': False for t in ('crecon', 'urecon', 'guide', 'ortho')}
# The paper's ablations (Tables 4, 5, 6) as overrides of any variant.
ABLATIONS = {
    # Table 4: the prototype generator with the retrieval loss, then each component added.
    'table4_retrieval': _NO_PROTOTYPE_TERMS,
    'table4_crecon': {**_NO_PROTOTYPE_TERMS, 'loss.use_crecon': True},
    'table4_urecon': {**_NO_PROTOTYPE_TERMS, 'loss.use_crecon': True, 'loss.use_urecon': True},
    'table4_guide': {'loss.use_ortho': False},
    'table4_full': {},
    # Table 5: prototypes per branch.
    **{f'table5_prototypes{n}': {'model.num_prototypes': n} for n in (10, 20, 30, 60)},
    # Table 6: prototype construction (Slot Attention with its usual 3 iterations).
    'table6_perceiver': {'model.prototype_generator': 'perceiver'},
    'table6_slot_attention': {'model.prototype_generator': 'slot_attention',
                              'model.prototype_iterations': 3},
    'table6_cross_attention': {},
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """`arg`: 'VARIANT' or 'VARIANT,ABLATION'."""
  return config_lib.build_config(arg, model=MODEL, loss=LOSS, per_dataset=PER_DATASET,
                                 options=ABLATIONS, options_name='ablation')
