"""Configs: every field's type and range checked in one pass naming the flag; unknown override
keys named with the nearest valid one; the model configs' variants all valid."""

import jax
import numpy as np
import pytest

from prvr_jax import config_lib, models, parallel, train
from prvr_jax.data import catalogue
import support


# Text-video retrieval models (one caption per whole video, a joint CLIP space) offer the
# text-video benchmarks instead of the PRVR feature releases.
TEXT_VIDEO_MODELS = {'tmass'}
# Models of CLIP's joint space only (zero-shot CLIP) offer the CLIP feature family instead of
# the I3D / RoBERTa release.
CLIP_ONLY_MODELS = {'clip_zero_shot'}
# The PRVR models, each offering the CLIP ViT-B/32 family beside its own release.
CLIP_MODELS = sorted(set(models.names()) - TEXT_VIDEO_MODELS - CLIP_ONLY_MODELS)
# How each model reads the CLIP release (docs/data_release.md): (along the MS-SL release's
# frame timeline, L2-normalised); the GMMFormer / MS-SL lineage otherwise.
CLIP_READING = {'amdnet': (False, False), 'dreamprvr': (False, True), 'holmes': (False, True),
                'msc_prvr': (False, False)}
# What a `*_clip` variant may change of its dataset's variant besides the data and the input
# dims: ProtoPRVR takes Table 8's CLIP setting (K = 1, lambda_ortho = 0.01); MSC-PRVR
# normalises the raw rows after merging them, as its official loader does.
CLIP_RECIPE_CHANGES = {'protoprvr': {'model.prototype_iterations', 'loss.ortho'},
                       'msc_prvr': {'model.normalize_inputs'}}


def _variants(name):
  """Every config variant `configs/<name>.py` offers (ProtoPRVR's CLIP-L/14 ones too)."""
  extra = list(getattr(support.load_config_module(name), 'CLIP_L14', {}))
  return [v for v in config_lib.VARIANTS if _offers(name, v)] + extra


@pytest.mark.parametrize('name', models.names())
def test_every_shipped_config_is_valid(name):
  """Every variant validates and its parameters initialise at its input dims (`jax.eval_shape`
  of the init, which runs the model on a batch of those dims). A variant whose `config.model`
  is that of `tiny` or of a variant with a documented parameter count is initialised (and
  counted) by tests/models/test_contract.py instead."""
  offered = _variants(name)
  datasets = ({'msrvtt', 'msrvtt_features'} if name in TEXT_VIDEO_MODELS
              else {'tvr_clip', 'activitynet_clip'} if name in CLIP_ONLY_MODELS
              else {'tvr', 'activitynet'})
  assert {'synthetic', 'tiny'} | datasets <= set(offered), name
  spec = models.get_spec(name)
  model_of = lambda variant: support.load_config(name, variant).model.to_json(sort_keys=True)
  covered = {model_of(v) for v in ('tiny', *spec.param_counts)}
  for variant in offered:
    config = support.load_config(name, variant)
    config_lib.validate(config)
    assert config.model.name == name, variant
    if config.model.to_json(sort_keys=True) not in covered:
      covered.add(config.model.to_json(sort_keys=True))
      assert models.count_params(spec.param_shapes(config.model)) > 0, variant


def _offers(name, variant):
  try:
    support.load_config(name, variant)
  except ValueError as e:
    assert f'has no config variant {variant!r}; it offers' in str(e)
    return False
  return True


@pytest.mark.parametrize('name', CLIP_MODELS)
def test_every_prvr_model_offers_the_clip_feature_family(name):
  """`<dataset>_clip` reads AMDNet's CLIP ViT-B/32 release (512-d frames and sentence vectors)
  as the model's CLIP code does, with its dataset's recipe unchanged (prvr-ea changes only the
  reader and the input dims), and the model documents its parameter count."""
  spec = models.get_spec(name)
  timeline, normalize = CLIP_READING.get(name, (True, True))
  for variant in config_lib.CLIP_VARIANTS:
    dataset = variant[:-len('_clip')]
    config = support.load_config(name, variant)
    assert (config.model.visual_dim, config.model.query_dim) == (512, 512)
    assert (config.data.collection, config.data.text_feature) == (dataset, 'clip')
    assert catalogue.lookup(config).name == f'amdnet-clip/{dataset}'
    assert config.data.frame_map == (config_lib.FRAME_TIMELINES[dataset] if timeline else '')
    assert config.data.normalize == normalize
    assert variant in spec.param_counts, variant  # counted by tests/models/test_contract.py
    if not _offers(name, dataset):
      continue  # ProtoPRVR on Charades-STA: no recipe of its own (ActivityNet's)
    base = config_lib.flat_items(support.load_config(name, dataset))
    clip = config_lib.flat_items(config)
    changed = {k for k in base.keys() | clip.keys() if base.get(k) != clip.get(k)}
    allowed = {'variant', 'model.visual_dim', 'model.query_dim',
               *CLIP_RECIPE_CHANGES.get(name, ())}
    assert {k for k in changed if not k.startswith('data.')} <= allowed, (variant, changed)


# Full-size configs added after the first ones, besides the `*_clip` family: each gets one
# training step below (the older ones train in their parity and end-to-end tests).
NEWER_CONFIGS = [('msc_prvr', v) for v in ('tvr', 'activitynet', 'charades', 'qvhighlights')
                ] + [('holmes', 'tvr,multi')]


def _step_case(name, variant):
  """CI runs the `tvr_clip` step of every model (`end_to_end`); the other two CLIP datasets
  differ from it in hyperparameters only (the same code path and input dims), so their steps
  are `exhaustive` (`-m exhaustive`, run when configs change)."""
  ci = variant == 'tvr_clip' or (name, variant) in NEWER_CONFIGS
  return pytest.param(name, variant,
                      marks=pytest.mark.end_to_end if ci else pytest.mark.exhaustive)


@pytest.mark.parametrize('name, variant', [
    *(_step_case(n, v) for n in CLIP_MODELS for v in config_lib.CLIP_VARIANTS),
    *(_step_case(n, v) for n, v in NEWER_CONFIGS)])
def test_one_training_step_of_each_new_config(name, variant):
  """The train step of the full-size model of each `*_clip` config (and `NEWER_CONFIGS`) on
  synthetic inputs of its dims (for CLIP: 512-d frames, one-token queries as the release gives
  them, L2-normalised where the config reads them so); only the batch is small (4 videos, 2
  queries each). Run twice: the warm-up schedule's first learning rate is 0, so the second
  update moves the parameters."""
  config = support.load_config(name, variant)
  spec = models.get_spec(name)
  mesh = support.data_mesh(1)
  tx, schedule = train.make_model_optimizer(config, spec, total_steps=10)
  state = train.create_train_state(config, spec, tx, mesh)
  before = jax.device_get(state.params)
  step = train.make_train_step(config, spec, tx, schedule, mesh)
  batch = models.random_batch(config.model, np.random.default_rng(0),
                              (config.model.max_frames, 70, 5, 33), (1,) * 8,
                              queries_per_video=2)
  if config.data.get('normalize', False):
    for key in ('clip_feats', 'frame_feats', 'query_feats'):
      norms = np.linalg.norm(batch[key], axis=-1, keepdims=True)
      batch[key] = batch[key] / np.maximum(norms, 1e-5)
  batch = parallel.shard_global_view(batch, mesh)
  for _ in range(2):  # one compile
    state, metrics = step(state, batch, np.int32(0))
    assert np.isfinite(float(metrics['loss'])) and float(metrics['grad_norm']) > 0, metrics
  after = jax.device_get(state.params)
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(after))
  moved = [not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before),
                                                     jax.tree.leaves(after))]
  assert np.mean(moved) > 0.5, f'{sum(moved)} of {len(moved)} parameter arrays changed'


@pytest.mark.parametrize('field, value, message', [
    ('optim.lr', -1.0, r'--config.optim.lr=-1.0 must be a finite number > 0'),
    ('optim.lr', 0.0, r'--config.optim.lr=0.0 must be a finite number > 0'),
    ('train.num_epochs', -1, r'--config.train.num_epochs=-1 must be an integer >= 1'),
    ('train.num_epochs', 0, r'--config.train.num_epochs=0 must be an integer >= 1'),
    ('data.shuffle_buffer', 0, r'--config.data.shuffle_buffer=0 must be an integer >= 1'),
    ('train.patience', -2, r'--config.train.patience=-2 must be an integer >= -1'),
    ('loss.clip_nce', float('nan'), r'--config.loss.clip_nce=nan must be a finite number'),
    ('model.dropout', 1.0, r'--config.model.dropout=1.0 must be .* < 1'),
    ('eval.mv_groups', ((0.5, 0.25),), r'mv_groups=.* 0 <= low < high <= 1'),
    ('train.matmul_precision', 'fp8', r"matmul_precision='fp8' must be one of"),
    ('model.hidden_dim', 30, r'hidden_dim=30 must be a multiple of --config.model.num_heads=4'),
])
def test_bad_fields_are_refused_naming_the_flag(field, value, message):
  config = support.load_config('gmmformer', 'tiny')
  section, key = field.split('.')
  config[section][key] = value
  with pytest.raises(ValueError, match=message):
    config_lib.validate(config)


def test_all_problems_are_reported_at_once():
  config = support.load_config('gmmformer_v2', 'tiny')
  config.optim.lr, config.train.num_epochs, config.data.shuffle_buffer = -1.0, 0, 0
  with pytest.raises(ValueError) as e:
    config_lib.validate(config)
  assert str(e.value).count('--config.') == 3


def test_unknown_override_keys_name_the_nearest_valid_key():
  argv = ['train.py', '--config=configs/gmmformer.py:tiny']
  config_lib.check_override_flags(argv + ['--config.train.batch_size=3'])
  with pytest.raises(SystemExit, match=r'Unknown config key --config.train.bach_size .* did '
                     r'you mean --config.train.batch_size\?'):
    config_lib.check_override_flags(argv + ['--config.train.bach_size=3'])
  with pytest.raises(SystemExit, match=r'--config.zz.top .*the config has: data, eval, loss'):
    config_lib.check_override_flags(argv + ['--config.zz.top', '3'])


def test_cli_refuses_an_unknown_key_before_doing_anything(tmp_path):
  proc = support.run_cli('train.py', '--config=configs/gmmformer.py:tiny',
                         f'--workdir={tmp_path / "w"}', '--config.optim.learning_rate=1e-3',
                         cache_dir=None, check=False, timeout=120)
  assert proc.returncode != 0
  assert 'Unknown config key --config.optim.learning_rate' in proc.stderr
  assert 'Traceback' not in proc.stderr and not (tmp_path / 'w').exists()


def test_a_model_name_resolves_to_the_shipped_config():
  shipped = config_lib.shipped_configs()
  assert {'gmmformer', 'gmmformer_v2', 'ms_sl', 'amdnet', 'protoprvr', 'tmass'} <= set(shipped)
  assert shipped['gmmformer'] == str(support.REPO / 'configs' / 'gmmformer.py')
  argv = ['train.py', '--config=gmmformer:tiny', '--config.train.batch_size=3', '--x=1']
  assert config_lib.resolve_config_flag(argv) == [
      'train.py', f'--config={shipped["gmmformer"]}:tiny', '--config.train.batch_size=3',
      '--x=1']
  assert config_lib.resolve_config_flag(['p', '--config', 'ms_sl']) == [
      'p', '--config', shipped['ms_sl']]
  as_path = ['train.py', '--config=configs/gmmformer.py:tiny']
  assert config_lib.resolve_config_flag(as_path) == as_path  # a file path is kept
  with pytest.raises(SystemExit, match=r'--config=gmmformr:tiny: no config file gmmformr, and '
                     r'no shipped model config of that name \(shipped: amdnet, clip_zero_shot, '
                     r'dreamprvr, gmmformer, '):
    config_lib.resolve_config_flag(['train.py', '--config=gmmformr:tiny'])
  with pytest.raises(SystemExit, match=r'Unknown config key --config.train.bach_size'):
    config_lib.resolve_config_flag(['p', '--config=gmmformer', '--config.train.bach_size=3'])


def test_an_installed_wheel_ships_its_configs_inside_the_package(tmp_path, monkeypatch):
  """In a wheel the configs are `prvr_jax/configs/` (setup.py), which wins over a checkout's."""
  package = tmp_path / 'prvr_jax'
  (package / 'configs').mkdir(parents=True)
  (package / 'configs' / '__init__.py').write_text('')
  (package / 'configs' / 'gmmformer_v2.py').write_text('')
  (tmp_path / 'configs').mkdir()
  (tmp_path / 'configs' / 'other.py').write_text('')
  monkeypatch.setattr(config_lib, '__file__', str(package / 'config_lib.py'))
  assert config_lib.shipped_configs() == {
      'gmmformer_v2': str(package / 'configs' / 'gmmformer_v2.py')}


@pytest.mark.parametrize('spelling', [
    ['--config', 'configs/gmmformer.py:tiny', '--config.train.bach_size=3'],
    ['--config=configs/gmmformer.py:tiny', '--config.train.bach_size', '3'],
    ['-config=configs/gmmformer.py:tiny', '-config.train.bach_size=3'],
    ['--config=configs/gmmformer.py:tiny', '--noconfig.train.bach_size'],
    ['-config', 'gmmformer:tiny', '--config.train.bach_size'],
])
def test_an_unknown_key_is_named_in_every_spelling(spelling):
  with pytest.raises(SystemExit, match=r'Unknown config key --config.train.bach_size .*did you '
                     r'mean --config.train.batch_size\?'):
    config_lib.resolve_config_flag(['train.py', *spelling])
  # After `--` absl parses no flags: neither does the check.
  config_lib.check_override_flags(['p', '--config=configs/gmmformer.py', '--', '--config.zz=1'])


@pytest.mark.parametrize('spelling', [['--config', 'nowhere/c.py:tiny'],
                                      ['-config=nowhere/c.py'], ['--config=nowhere/c.py']])
def test_a_missing_config_file_is_named(spelling):
  with pytest.raises(SystemExit, match=r'no config file nowhere/c.py$'):
    config_lib.resolve_config_flag(['train.py', *spelling])


def test_a_config_file_that_does_not_load_is_named(tmp_path):
  broken = tmp_path / 'broken.py'
  broken.write_text('def get_config(arg=None):\n  return {}["model"]\n')
  with pytest.raises(SystemExit, match=rf'the config file {broken} does not load \(KeyError'):
    config_lib.check_override_flags(['p', f'--config={broken}'])


@pytest.mark.parametrize('spelling, last_line', [
    (['--config', 'configs/gmmformer.py:tiny', '-config.optim.learning_rate=1e-3'],
     'Unknown config key --config.optim.learning_rate'),
    (['--config', 'nowhere/c.py:tiny'], 'no config file nowhere/c.py'),
])
def test_cli_last_line_names_the_key_or_file(tmp_path, spelling, last_line):
  proc = support.run_cli('train.py', *spelling, f'--workdir={tmp_path / "w"}', cache_dir=None,
                         check=False, timeout=120)
  assert proc.returncode != 0
  assert last_line in proc.stderr.strip().splitlines()[-1]
  assert 'Traceback' not in proc.stderr and not (tmp_path / 'w').exists()
