"""Config building shared by the model configs in configs/ (the same key names for every model).

The base config (`get_base_config`) holds the keys every model uses: the model's name and
input dims, the optimiser, training, evaluation and data settings. A model config file adds
its own `config.model` / `config.loss` fields and picks its per-dataset values from a dict
of named variants (dotted keys), through `build_config`:

  def get_config(arg=None):
    return config_lib.build_config(arg, model=MODEL, loss=LOSS, per_dataset=PER_DATASET)
"""

from collections.abc import Callable, Mapping, Sequence
import difflib
import hashlib
import importlib.util
import json
import math
import os
from typing import Any

import ml_collections

VARIANTS = ('synthetic', 'tiny', 'tvr', 'activitynet', 'charades', 'qvhighlights', 'msrvtt',
            'msrvtt_features', 'didemo', 'lsmdc', 'tvr_clip', 'activitynet_clip', 'charades_clip')

# The MS-SL feature release: feature folder and input dims per collection; QVHighlights as
# converted by `prvr_jax.data.qvhighlights` (SlowFast + CLIP clips, CLIP text tokens).
DATASETS: dict[str, dict[str, Any]] = {
    'tvr': dict(visual_feature='i3d_resnet', visual_dim=3072, query_dim=768),
    'activitynet': dict(visual_feature='i3d', visual_dim=1024, query_dim=1024),
    'charades': dict(visual_feature='i3d_rgb_lgi', visual_dim=1024, query_dim=1024),
    'qvhighlights': dict(visual_feature='slowfast_clip', visual_dim=2816, query_dim=512,
                         text_feature='clip_text'),
    # Text-video retrieval (T-MASS) on CLIP ViT-B/32 features: 12 frame features per video and
    # one sentence feature per caption (`prvr_jax.data.text_video`).
    **{name: dict(visual_feature='clip_frames', visual_dim=512, query_dim=512,
                  text_feature='clip', collection=collection)
       for name, collection in (('msrvtt', 'msrvtt'), ('msrvtt_features', 'msrvtt'),
                                ('didemo', 'didemo'), ('lsmdc', 'lsmdc'))},
    # The PRVR collections on CLIP ViT-B/32 features (AMDNet's release: 512-d frame rows and
    # one 512-d sentence vector per caption). How a model reads them is its config's
    # `data.frame_map` / `data.normalize` (docs/data_release.md); these are the release's
    # defaults (the rows as stored, not normalised).
    **{f'{name}_clip': dict(visual_feature='', visual_dim=512, query_dim=512,
                            text_feature='clip', collection=name, frame_map='',
                            normalize=False)
       for name in ('tvr', 'activitynet', 'charades')},
}

# BigFile folder of the MS-SL release per collection: the frame timeline prvr-ea reads the
# CLIP release along for the models whose loaders walk a BigFile's frame list
# (`data.frame_map`, `release.Release(frame_map=...)`).
FRAME_TIMELINES = {name: DATASETS[name]['visual_feature']
                   for name in ('tvr', 'activitynet', 'charades')}

# Dims of the embedded synthetic benchmark (prvr_jax.data.synthetic).
SYNTHETIC_DIMS = dict(visual_dim=256, query_dim=128)

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
  config.optim.schedule = 'warmup_linear'
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
  # Draw the pictures of docs/plots.md into the workdir at the end (needs the `plots` extra).
  config.train.plots = False
  # Precision of matmuls/einsums in the train step: 'float32' (exact parity with the official
  # code; also stops TF32 on GPUs) or 'bfloat16' (bf16 passes, f32 accumulation: faster on CPUs
  # with AVX512-BF16, GPUs and TPUs).
  config.train.matmul_precision = 'float32'
  # The train step's dropout and LayerNorm: 'auto' (by backend, `prvr_jax.kernels.policy`),
  # 'fast' (the CPU-tuned kernels) or 'plain' (flax's layers); docs/kernels.md.
  config.train.kernels = 'auto'

  config.eval = ml_collections.ConfigDict()
  config.eval.query_batch_size = 50
  config.eval.video_batch_size = 100
  config.eval.matmul_precision = 'float32'
  # Moment-to-video groups for SumR by M/V (the GMMFormer papers' bins).
  config.eval.mv_groups = ((0.0, 0.25), (0.25, 0.5), (0.5, 1.0))
  # Models that sample at evaluation (T-MASS) draw their noise from this seed.
  config.eval.score_seed = 0
  # Also report the metrics after DSL re-ranking (`dsl_*`; transductive, off by default).
  config.eval.dual_softmax = False
  # 'single' (one ground-truth video per query: the papers' protocol) or 'dense': evaluate.py
  # also reports the dense multi-ground-truth metrics `dense_*` from the same scores, with
  # the files `data.dense_gt` / `data.dense_captions` (docs/dense_eval.md).
  config.eval.protocol = 'single'

  config.data = ml_collections.ConfigDict()
  config.data.name = variant if variant in DATASETS else 'synthetic'
  config.data.dir = ''
  config.data.synthetic_size = 'tiny' if variant == 'tiny' else 'default'
  config.data.collection = DATASETS.get(variant, {}).get('collection', variant
                                                        if variant in DATASETS else 'synthetic')
  config.data.visual_feature = DATASETS.get(variant, {}).get('visual_feature', 'synthetic')
  config.data.text_feature = DATASETS.get(variant, {}).get('text_feature', 'roberta')
  if 'frame_map' in DATASETS.get(variant, {}):
    # The CLIP layout's construction (CLIP variants only): the FeatureData/<name> folder whose
    # video2frames.txt gives the frame timeline the CLIP rows are read along ('': the rows as
    # stored), and whether frames, clips and queries are L2-normalised.
    config.data.frame_map = DATASETS[variant]['frame_map']
    config.data.normalize = DATASETS[variant]['normalize']
  config.data.train_split = 'train'
  config.data.val_split = 'val'
  config.data.test_split = 'test'
  # The dense ground truth of the evaluated split (`--config.eval.protocol=dense`): its JSONL
  # and caption file; empty: prvr-ea's layout in data.dir (docs/dense_eval.md).
  config.data.dense_gt = ''
  config.data.dense_captions = ''
  config.data.max_queries_per_batch = 0  # 0: local batch x max captions per video
  config.data.skip_bad_items = False
  # Before training or preparing, compare the release with its published dims and split sizes
  # (prvr_jax.data.catalogue); False for a subset or a release of one's own.
  config.data.check_published = True
  # True accepts a training split that shares videos with the val/test splits (test leakage;
  # recorded in the shard manifest and warned about).
  config.data.allow_split_overlap = False
  config.data.shuffle_buffer = 1024
  # False: every host reads the whole batch stream and keeps its rows (results independent of
  # the host count); True: each host reads only its own shard files (less I/O on large pods).
  config.data.host_sharded_reading = False
  # Where the training split lives: 'stream' (read from the shards through tf.data every
  # epoch) or 'device' (read once into every device's memory, batches gathered there:
  # prvr_jax.data.resident; another batch order than the stream's).
  config.data.placement = 'stream'
  return config


CLIP_VARIANTS = ('tvr_clip', 'activitynet_clip', 'charades_clip')


def clip_variants(per_dataset: Mapping[str, Mapping[str, Any]], *, frame_timeline: bool,
                  normalize: bool = True, recipe_of: Mapping[str, str] | None = None,
                  extra: Mapping[str, Any] | None = None) -> dict[str, dict[str, Any]]:
  """The `<dataset>_clip` variants of a model: each dataset's recipe (`per_dataset[dataset]`,
  or `per_dataset[recipe_of[variant]]`) on the CLIP ViT-B/32 release, read as the model's CLIP
  code reads it: along the MS-SL release's frame timeline (`frame_timeline`, prvr-ea's
  GMMFormer / MS-SL lineage loaders) or the rows as stored, L2-normalised or not; `extra`
  overrides on top (a model's own CLIP settings)."""
  out = {}
  for variant in CLIP_VARIANTS:
    dataset = variant[:-len('_clip')]
    recipe = per_dataset[(recipe_of or {}).get(variant, dataset)]
    out[variant] = {**recipe, 'data.frame_map': FRAME_TIMELINES[dataset] if frame_timeline
                    else '', 'data.normalize': normalize, **(extra or {})}
  return out


def apply_overrides(config: ml_collections.ConfigDict, values: Mapping[str, Any]) -> None:
  """Sets `section.key` entries of `values` (the section must exist)."""
  for dotted, value in values.items():
    section, _, key = dotted.rpartition('.')
    if section not in config:
      raise KeyError(f'config has no section {section!r} (setting {dotted!r})')
    config[section][key] = value


def build_config(arg: str | None, model: Mapping[str, Any], loss: Mapping[str, Any],
                 per_dataset: Mapping[str, Mapping[str, Any]],
                 options: Mapping[str, Mapping[str, Any]] | None = None,
                 options_name: str = 'option') -> ml_collections.ConfigDict:
  """The config of one model for the variant `arg`.

  Args:
    arg: the `:arg` of `--config=file.py:arg` (see `parse_variant`); with `options`,
      'VARIANT' or 'VARIANT,OPTION'.
    model: the model's `config.model` fields (its `name` among them).
    loss: the model's `config.loss` fields common to every variant.
    per_dataset: variant -> dotted-key values (`{'optim.lr': 3e-4, 'loss.margin': 0.1}`),
      one entry per variant of `VARIANTS` the model offers.
    options: named dotted-key overrides applied over any variant (ablations, recipes);
      `options_name` is what an error calls them.
  """
  option = ''
  if options is not None:
    full_arg = arg
    arg, _, option = (arg or '').partition(',')
    if option and option not in options:
      raise ValueError(f'unknown {model["name"]} {options_name} {option!r} (in '
                       f'--config=...:{full_arg}); expected one of {", ".join(options)}')
  variant = parse_variant(arg or None)
  if variant not in per_dataset:
    raise ValueError(f'model {model["name"]!r} has no config variant {variant!r}; it offers '
                     f'{", ".join(per_dataset)}')
  config = get_base_config(variant)
  config.model.update(model)
  config.loss.update(loss)
  apply_overrides(config, per_dataset[variant])
  apply_overrides(config, SMALL_VARIANTS.get(variant, {}))
  if option:
    apply_overrides(config, options[option])
  return config


# ----------------------------------------------------------------------------- validation

MATMUL_PRECISIONS = ('float32', 'tensorfloat32', 'bfloat16')
EVAL_PROTOCOLS = ('single', 'dense')  # `eval.protocol` (docs/dense_eval.md)
KERNEL_CHOICES = ('auto', 'fast', 'plain')  # `train.kernels`: the keys of `kernels.policy.CHOICES`


def _is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))


def _integer(low: int) -> Callable[[Any], str | None]:
  return lambda v: None if _is_int(v) and v >= low else f'must be an integer >= {low}'


def _number(low: float | None = None, high: float | None = None, low_open: bool = False,
            high_open: bool = False) -> Callable[[Any], str | None]:
  bounds = []
  if low is not None:
    bounds.append(f'{">" if low_open else ">="} {low}')
  if high is not None:
    bounds.append(f'{"<" if high_open else "<="} {high}')
  text = ' '.join(['must be a finite number', ' and '.join(bounds)]).strip()

  def check(v):
    ok = _is_number(v) and (low is None or (v > low if low_open else v >= low)) and (
        high is None or (v < high if high_open else v <= high))
    return None if ok else text
  return check


def _choice(*values: Any) -> Callable[[Any], str | None]:
  return lambda v: None if v in values else f'must be one of {list(values)}'


def _flag(v: Any) -> str | None:
  return None if isinstance(v, bool) else 'must be True or False'


def _warmup(v: Any) -> str | None:
  return None if _is_number(v) and (0 <= v < 1 or v == -1) else 'must be in [0, 1), or -1'


def _widths(v: Any) -> str | None:
  ok = isinstance(v, (list, tuple)) and v and all(w is None or (_is_number(w) and w > 0)
                                                    for w in v)
  return None if ok else 'must be a non-empty list of positive numbers or None'


def _mv_groups(v: Any) -> str | None:
  ok = isinstance(v, (list, tuple)) and all(
      isinstance(g, (list, tuple)) and len(g) == 2 and all(_is_number(x) for x in g)
      and 0 <= g[0] < g[1] <= 1 for g in v)
  return None if ok else 'must be a list of (low, high) pairs with 0 <= low < high <= 1'


# Range and type of every field with a meaning (the same names across models); any other
# number of `model`, `loss` and `optim` must be finite.
FIELD_RULES: dict[str, Callable[[Any], str | None]] = {
    **{f'model.{k}': _integer(1) for k in ('visual_dim', 'query_dim', 'hidden_dim', 'num_heads',
                                            'max_query_len', 'max_frames', 'num_clips')},
    'model.dropout': _number(0, 1, high_open=True),
    'model.input_dropout': _number(0, 1, high_open=True),
    'model.temperature': _number(0, low_open=True),
    'model.widths': _widths,
    'model.stochastic_text': _flag,
    'model.stochastic_samples': _integer(1),
    'model.stochastic_top_k': _integer(1),
    'model.stochastic_prior': _choice('uniform01', 'normal'),
    'model.stochastic_std': _number(0, low_open=True),
    'loss.stochastic_support': _number(0),
    'model.probabilistic': _flag,
    'model.support_slots': _integer(1),
    'loss.proxy_matching': _number(0),
    'loss.distribution_alignment': _number(0),
    'model.frame_branch_query': _flag,
    'loss.dc': _number(0),
    **{f'loss.{k}': _number(0) for k in ('clip_nce', 'frame_nce', 'qdl', 'om', 'margin',
                                          'qdl_gamma')},
    'loss.qdl_alpha': _number(0, low_open=True),
    'loss.om_solver': _choice('host', 'device'),
    'loss.hard_pool_size': _integer(1),
    'loss.hard_negative_start_epoch': _integer(0),
    'optim.name': _choice('bert_adam', 'adamw', 'hf_adamw'),
    'optim.schedule': _choice('warmup_linear', 'warmup_cosine'),
    'optim.lr': _number(0, low_open=True),
    'optim.backbone_lr': _number(0),
    'optim.warmup_proportion': _warmup,
    'optim.weight_decay': _number(0),
    'train.batch_size': _integer(1),
    'train.num_epochs': _integer(1),
    'train.patience': _integer(-1),
    'train.seed': _integer(0),
    'train.log_every_steps': _integer(1),
    'train.checkpoint_keep': _integer(1),
    'train.checkpoint_every_steps': _integer(0),
    'train.stop_after_steps': _integer(0),
    'train.plots': _flag,
    'train.matmul_precision': _choice(*MATMUL_PRECISIONS),
    'train.kernels': _choice(*KERNEL_CHOICES),
    'eval.query_batch_size': _integer(1),
    'eval.video_batch_size': _integer(1),
    'eval.matmul_precision': _choice(*MATMUL_PRECISIONS),
    'eval.mv_groups': _mv_groups,
    'eval.score_seed': _integer(0),
    'eval.dual_softmax': _flag,
    'eval.protocol': _choice(*EVAL_PROTOCOLS),
    'data.shuffle_buffer': _integer(1),
    'data.max_queries_per_batch': _integer(0),
    'data.skip_bad_items': _flag,
    'data.check_published': _flag,
    'data.allow_split_overlap': _flag,
    'data.host_sharded_reading': _flag,
    'data.source': _choice('shards', 'frames'),
    'data.query_tokens': _flag,
    'data.placement': _choice('stream', 'device'),
    'data.frame_map': lambda v: None if isinstance(v, str) else 'must be a folder name or ""',
    'data.normalize': _flag,
}


def flat_items(config: Any, prefix: str = '') -> dict[str, Any]:
  """{'section.key': value} of a (nested) ConfigDict or mapping."""
  out = {}
  for key, value in config.items():
    if isinstance(value, (Mapping, ml_collections.ConfigDict)):
      out.update(flat_items(value, f'{prefix}{key}.'))
    else:
      out[f'{prefix}{key}'] = value
  return out


# Fields that change nothing a run computes (where data lies, logging, checkpoint cadence):
# a resumed run may change them freely, and `config_fingerprint` leaves them out.
# Fields added to the config after workdirs and checkpoints were written, with the value that
# does what a config without them did: absent from a saved config, a field of the current
# config counts as this value (resuming), and a `model.` field at this value is left out of
# the older form of a checkpoint's model fingerprint (`checkpoint.check_fingerprint`).
ADDED_FIELDS = {'data.placement': 'stream', 'train.kernels': 'auto',
                'model.prototype_update': 'detr', 'model.noise': 'per_video',
                'eval.tmass_official_leak': False, 'model.probabilistic': False,
                'model.num_samples': 6, 'model.support_slots': 26,
                'loss.proxy_matching': 4e-3, 'loss.distribution_alignment': 2.5e-4,
                'eval.protocol': 'single', 'data.dense_gt': '', 'data.dense_captions': '',
                'model.frame_branch_query': False, 'loss.dc': 0.0}
OPERATIONAL_FIELDS = ('data.dir', 'data.dense_gt', 'data.dense_captions',
                      'train.log_every_steps', 'train.checkpoint_keep',
                      'train.checkpoint_every_steps', 'train.stop_after_steps', 'train.plots')


def config_fingerprint(config: Any) -> str:
  """16 hex digits of the sha256 of a config (ConfigDict or mapping) but its
  `OPERATIONAL_FIELDS`: what a result file records of the settings that produced it, the same
  wherever the data lay."""
  flat = {k: v for k, v in flat_items(config).items() if not k.startswith(OPERATIONAL_FIELDS)}
  text = json.dumps(flat, sort_keys=True, default=list)
  return hashlib.sha256(text.encode()).hexdigest()[:16]


def validate(config: ml_collections.ConfigDict) -> None:
  """Checks the type and range of every field in one pass; raises one ValueError naming each
  bad field (as its --config flag) and what it must be."""
  problems = []
  for key, value in flat_items(config).items():
    rule = FIELD_RULES.get(key)
    if rule is None and key.split('.')[0] in ('model', 'loss', 'optim') and (
        isinstance(value, float) and not math.isfinite(value)):
      rule = _number()
    problem = rule(value) if rule is not None else None
    if problem:
      problems.append(f'--config.{key}={value!r} {problem}')
  model = config.get('model', {})
  if (_is_int(model.get('hidden_dim')) and _is_int(model.get('num_heads'))
      and model['num_heads'] > 0 and model['hidden_dim'] % model['num_heads']):
    problems.append(f'--config.model.hidden_dim={model["hidden_dim"]} must be a multiple of '
                    f'--config.model.num_heads={model["num_heads"]}')
  if problems:
    raise ValueError('Invalid config:\n  ' + '\n  '.join(problems))


def _flag_tokens(argv: Sequence[str], flag: str) -> tuple[list[tuple[int, str, str]],
                                                         list[str]]:
  """(`--flag` values as (index of the value, prefix before it, value), in order; the dotted
  keys of `--flag.key` overrides) of a command line, in every spelling absl accepts: one or
  two dashes, `=value` or the value as the next token, `--noflag.key` for a False boolean.
  Parsing stops at `--`, as absl's does."""
  values, keys = [], []
  for i, item in enumerate(argv):
    if item == '--':
      break
    name = item.lstrip('-')
    if not item.startswith('-') or len(item) - len(name) > 2:
      continue
    dashes = item[:len(item) - len(name)]
    if name.startswith(f'{flag}='):
      values.append((i, f'{dashes}{flag}=', name.split('=', 1)[1]))
    elif name == flag and i + 1 < len(argv):
      values.append((i + 1, '', argv[i + 1]))
    elif name.startswith((f'{flag}.', f'no{flag}.')):
      keys.append(name.split('=', 1)[0].split('.', 1)[1])
  return values, keys


def check_override_flags(argv: Sequence[str], flag: str = 'config') -> None:
  """Refuses `--config.x.y=v` overrides naming no field of the `--config` file, naming the
  flag and the nearest valid key (ml_collections would raise a bare AttributeError), in every
  spelling absl accepts (`_flag_tokens`); refuses a `--config` file that does not exist or
  does not load, naming it.

  Call before `absl.app.run` parses the flags; does nothing without a `--config` flag.
  """
  values, keys = _flag_tokens(argv, flag)
  if not values:
    return
  given = values[-1][2]
  path, _, arg = given.partition(':')
  if not os.path.isfile(path):
    raise SystemExit(f'--{flag}={given}: no config file {path}')
  spec = importlib.util.spec_from_file_location('_checked_config', path)
  module = importlib.util.module_from_spec(spec)
  try:
    spec.loader.exec_module(module)
    known = flat_items(module.get_config(arg or None))
  except ValueError as e:  # e.g. an unknown variant
    raise SystemExit(f'--{flag}={given}: {e}') from None
  except Exception as e:  # pylint: disable=broad-except  (a broken config file)
    raise SystemExit(f'--{flag}={given}: the config file {path} does not load '
                     f'({type(e).__name__}: {e})') from None
  for key in keys:
    if key not in known:
      close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
      hint = f'; did you mean --{flag}.{close[0]}?' if close else (
          f'; the config has: {", ".join(sorted({k.split(".")[0] for k in known}))}')
      raise SystemExit(f'Unknown config key --{flag}.{key} (no field {key!r} in '
                       f'{path}){hint}')


def shipped_config_dir() -> str | None:
  """The folder of the model configs that come with the package: `prvr_jax/configs` in an
  installed wheel, `configs/` beside `prvr_jax/` in a checkout; None when neither exists."""
  package = os.path.dirname(os.path.abspath(__file__))
  for folder in (os.path.join(package, 'configs'),
                 os.path.join(os.path.dirname(package), 'configs')):
    if os.path.isdir(folder):
      return folder
  return None


def shipped_configs() -> dict[str, str]:
  """{model name: path} of the shipped model configs (`shipped_config_dir`)."""
  folder = shipped_config_dir()
  if folder is None:
    return {}
  return {name[:-3]: os.path.join(folder, name) for name in sorted(os.listdir(folder))
          if name.endswith('.py') and not name.startswith('_')}


def resolve_config_flag(argv: Sequence[str], flag: str = 'config') -> list[str]:
  """`argv` with `--config=NAME[:variant]` (or `--config NAME[:variant]`) that names no file
  but a shipped model config (`shipped_configs`, e.g. `gmmformer_v2:tvr`) given as that file's
  path, so that a user without a clone runs the configs of the wheel; then
  `check_override_flags` (any spelling: `-config`, `--config NAME`). A file path is kept as it
  is; a bare name that is neither a file nor a shipped config is refused, naming the flag and
  the shipped names. Call before
  `absl.app.run` parses the flags: `sys.argv[:] = config_lib.resolve_config_flag(sys.argv)`."""
  resolved = list(argv)
  for at, prefix, value in _flag_tokens(argv, flag)[0]:
    name, colon, variant = value.partition(':')
    if os.path.isfile(name) or os.sep in name or name.endswith('.py'):
      continue
    shipped = shipped_configs()
    if name not in shipped:
      raise SystemExit(f'--{flag}={value}: no config file {name}, and no shipped model config '
                       f'of that name (shipped: {", ".join(shipped) or "none"}).')
    resolved[at] = prefix + shipped[name] + colon + variant
  check_override_flags(resolved, flag)
  return resolved
