"""Configs: every field's type and range checked in one pass naming the flag; unknown override
keys named with the nearest valid one; the model configs' variants all valid."""

import pytest

from prvr_jax import config_lib, models
import support


# Text-video retrieval models (one caption per whole video, a joint CLIP space) offer the
# text-video benchmarks instead of the PRVR feature releases.
TEXT_VIDEO_MODELS = {'tmass'}
# Models of CLIP's joint space only (zero-shot CLIP) offer the CLIP feature family instead of
# the I3D / RoBERTa release.
CLIP_ONLY_MODELS = {'clip_zero_shot'}


@pytest.mark.parametrize('name', models.names())
def test_every_shipped_config_is_valid(name):
  offered = [v for v in config_lib.VARIANTS if _offers(name, v)]
  datasets = ({'msrvtt', 'msrvtt_features'} if name in TEXT_VIDEO_MODELS
              else {'tvr_clip', 'activitynet_clip'} if name in CLIP_ONLY_MODELS
              else {'tvr', 'activitynet'})
  assert {'synthetic', 'tiny'} | datasets <= set(offered), name
  for variant in offered:
    config_lib.validate(support.load_config(name, variant))


def _offers(name, variant):
  try:
    support.load_config(name, variant)
  except ValueError as e:
    assert f'has no config variant {variant!r}; it offers' in str(e)
    return False
  return True


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
