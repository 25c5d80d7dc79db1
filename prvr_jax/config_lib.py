"""Config pieces shared by every model config in configs/ (same key names across models).

A model config file builds `get_base_config()` and fills `config.model`/`config.loss`
with its own fields and per-dataset values from `DATASETS`.
"""

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


def parse_variant(arg: str | None) -> str:
  """Returns the variant named by the `:arg` of `--config=file.py:arg` (default synthetic)."""
  variant = (arg or 'synthetic').strip().lower()
  if variant not in VARIANTS:
    raise ValueError(
        f'Unknown config variant {arg!r}; expected one of {", ".join(VARIANTS)} '
        '(as in --config=configs/gmmformer_v2.py:tvr).')
  return variant


def get_base_config(variant: str) -> ml_collections.ConfigDict:
  """Fields every model shares; per-dataset model/loss values are filled by the caller."""
  config = ml_collections.ConfigDict()
  config.variant = variant

  config.model = ml_collections.ConfigDict()
  config.model.name = ''
  config.model.hidden_dim = 384
  config.model.num_heads = 4
  config.model.max_query_len = 30
  config.model.max_frames = 128
  config.model.num_clips = 32
  config.model.window = 'gaussian'
  config.model.clip_score_weight = 0.7
  config.model.frame_score_weight = 0.3
  if variant in DATASETS:
    config.model.visual_dim = DATASETS[variant]['visual_dim']
    config.model.query_dim = DATASETS[variant]['query_dim']
  else:
    config.model.visual_dim = SYNTHETIC_DIMS['visual_dim']
    config.model.query_dim = SYNTHETIC_DIMS['query_dim']

  config.loss = ml_collections.ConfigDict()
  config.loss.hard_pool_size = 20

  config.optim = ml_collections.ConfigDict()
  config.optim.name = 'bert_adam'
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
  # Precision of matmuls/einsums in the train step: 'float32' (exact parity with the official
  # code; also stops TF32 on GPUs) or 'bfloat16' (bf16 passes, f32 accumulation: faster on CPUs
  # with AVX512-BF16, GPUs and TPUs).
  config.train.matmul_precision = 'float32'
  config.train.checkpoint_every_steps = 0  # 0: at the end of every epoch only
  # Test hooks: stop after this many steps (0: never) / make the loss NaN at this step (-1: never).
  config.train.stop_after_steps = 0
  config.train.inject_nan_at_step = -1

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


def apply_small_variant(config: ml_collections.ConfigDict) -> None:
  """Sizes for the embedded synthetic benchmark (`synthetic`) and the CI smoke run (`tiny`)."""
  if config.variant == 'synthetic':
    # Sized so that the main job (README command 1) ends in minutes on 2 CPU cores.
    config.model.hidden_dim = 64
    config.train.batch_size = 64
    config.train.num_epochs = 5
    config.train.patience = 100
    config.train.log_every_steps = 10
    config.loss.hard_negative_start_epoch = 3
  elif config.variant == 'tiny':
    config.model.hidden_dim = 32
    config.model.num_heads = 4
    config.train.batch_size = 8
    config.train.num_epochs = 2
    config.train.patience = 100
    config.train.log_every_steps = 1
    config.loss.hard_negative_start_epoch = 1
    config.eval.query_batch_size = 16
    config.eval.video_batch_size = 8
