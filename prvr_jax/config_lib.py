"""Config building shared by the model configs in configs/ (the same key names for every model).

The base config (`get_base_config`) holds the keys every model uses: the model's name and
input dims, the optimiser, training, evaluation and data settings. A model config file adds
its own `config.model` / `config.loss` fields and picks its per-dataset values from a dict
of named variants (dotted keys), through `build_config`:

  def get_config(arg=None):
    return config_lib.build_config(arg, model=MODEL, loss=LOSS, per_dataset=PER_DATASET)
"""

from collections.abc import Mapping
from typing import Any

import ml_collections

VARIANTS = ('synthetic', 'tiny', 'tvr', 'activitynet', 'charades')

# The MS-SL feature release: feature folder and input dims per collection.
DATASETS: dict[str, dict[str, Any]] = {
    'tvr': dict(visual_feature='i3d_resnet', visual_dim=3072, query_dim=768),
    'activitynet': dict(visual_feature='i3d', visual_dim=1024, query_dim=1024),
    'charades': dict(visual_feature='i3d_rgb_lgi', visual_dim=1024, query_dim=1024),
}

# Dims of the embedded synthetic benchmark (prvr_jax.data.synthetic).
SYNTHETIC_DIMS = dict(visual_dim=256, query_dim=128)

# Model fields of the MS-SL lineage (MS-SL, GMMFormer, GMMFormer v2): the release's input
# lengths (30 tokens, 128 frames, 32 clips), width 384, 4 heads, 0.7 / 0.3 score fusion.
MS_SL_LINEAGE: dict[str, Any] = dict(
    hidden_dim=384, num_heads=4, max_query_len=30, max_frames=128, num_clips=32,
    clip_score_weight=0.7, frame_score_weight=0.3)

# Run sizes of the small variants (keys of the base config): `synthetic` is sized so that the
# main job (README command 1) ends in minutes on 2 CPU cores, `tiny` is the CI smoke run.
SMALL_VARIANTS: dict[str, dict[str, Any]] = {
    'synthetic': {'train.batch_size': 64, 'train.num_epochs': 5, 'train.patience': 100,
                  'train.log_every_steps': 10},
    'tiny': {'train.batch_size': 8, 'train.num_epochs': 2, 'train.patience': 100,
             'train.log_every_steps': 1, 'eval.query_batch_size': 16,
             'eval.video_batch_size': 8},
}


def parse_variant(arg: str | None) -> str:
  """Returns the variant named by the `:arg` of `--config=file.py:arg` (default synthetic)."""
  variant = (arg or 'synthetic').strip().lower()
  if variant not in VARIANTS:
    raise ValueError(
        f'Unknown config variant {arg!r}; expected one of {", ".join(VARIANTS)} '
        '(as in --config=configs/gmmformer_v2.py:tvr).')
  return variant


def get_base_config(variant: str) -> ml_collections.ConfigDict:
  """The keys every model uses, for `variant`'s data."""
  dims = DATASETS.get(variant, SYNTHETIC_DIMS)
  config = ml_collections.ConfigDict()
  config.variant = variant

  config.model = ml_collections.ConfigDict()
  config.model.name = ''
  config.model.visual_dim = dims['visual_dim']
  config.model.query_dim = dims['query_dim']

  config.loss = ml_collections.ConfigDict()  # the model's loss weights and settings

  config.optim = ml_collections.ConfigDict()
  config.optim.name = 'bert_adam'  # the model config sets optim.lr
  config.optim.warmup_proportion = 0.01
  config.optim.weight_decay = 0.01
  config.optim.max_grad_norm = 1.0

  config.train = ml_collections.ConfigDict()
  config.train.batch_size = 128
  config.train.num_epochs = 100
  config.train.patience = 10
  config.train.seed = 9527
  config.train.log_every_steps = 50
  config.train.checkpoint_keep = 1
  config.train.checkpoint_every_steps = 0  # 0: at the end of every epoch only
  # Save and stop after this global step (0: never), e.g. to fit a job's time limit; running
  # again with the same workdir continues exactly.
  config.train.stop_after_steps = 0
  # Precision of matmuls/einsums in the train step: 'float32' (exact parity with the official
  # code; also stops TF32 on GPUs) or 'bfloat16' (bf16 passes, f32 accumulation: faster on CPUs
  # with AVX512-BF16, GPUs and TPUs).
  config.train.matmul_precision = 'float32'

  config.eval = ml_collections.ConfigDict()
  config.eval.query_batch_size = 50
  config.eval.video_batch_size = 100
  config.eval.matmul_precision = 'float32'
  # Moment-to-video groups for SumR by M/V (the GMMFormer papers' bins).
  config.eval.mv_groups = ((0.0, 0.25), (0.25, 0.5), (0.5, 1.0))

  config.data = ml_collections.ConfigDict()
  config.data.name = variant if variant in DATASETS else 'synthetic'
  config.data.dir = ''
  config.data.synthetic_size = 'tiny' if variant == 'tiny' else 'default'
  config.data.collection = variant if variant in DATASETS else 'synthetic'
  config.data.visual_feature = DATASETS.get(variant, {}).get('visual_feature', 'synthetic')
  config.data.text_feature = 'roberta'
  config.data.train_split = 'train'
  config.data.val_split = 'val'
  config.data.test_split = 'test'
  config.data.max_queries_per_batch = 0  # 0: local batch x max captions per video
  config.data.skip_bad_items = False
  config.data.shuffle_buffer = 1024
  # False: every host reads the whole batch stream and keeps its rows (results independent of
  # the host count); True: each host reads only its own shard files (less I/O on large pods).
  config.data.host_sharded_reading = False
  return config


def apply_overrides(config: ml_collections.ConfigDict, values: Mapping[str, Any]) -> None:
  """Sets `section.key` entries of `values` (the section must exist)."""
  for dotted, value in values.items():
    section, _, key = dotted.rpartition('.')
    if section not in config:
      raise KeyError(f'config has no section {section!r} (setting {dotted!r})')
    config[section][key] = value


def build_config(arg: str | None, model: Mapping[str, Any], loss: Mapping[str, Any],
                 per_dataset: Mapping[str, Mapping[str, Any]]) -> ml_collections.ConfigDict:
  """The config of one model for the variant `arg`.

  Args:
    arg: the `:arg` of `--config=file.py:arg` (see `parse_variant`).
    model: the model's `config.model` fields (its `name` among them).
    loss: the model's `config.loss` fields common to every variant.
    per_dataset: variant -> dotted-key values (`{'optim.lr': 3e-4, 'loss.margin': 0.1}`),
      one entry per variant in `VARIANTS`.
  """
  variant = parse_variant(arg)
  config = get_base_config(variant)
  config.model.update(model)
  config.loss.update(loss)
  apply_overrides(config, per_dataset[variant])
  apply_overrides(config, SMALL_VARIANTS.get(variant, {}))
  return config
