"""prvr_jax.convert: the official name mapping, and its command line (prvr_jax.tools.convert)."""

import os
import pathlib
import re
import subprocess
import sys

import jax
import ml_collections
import msgpack
import numpy as np
import pytest
from flax import serialization

import support
from prvr_jax import convert, models, torch_file

FIXTURES = support.OFFICIAL
NAMES = ('gmmformer', 'gmmformer_v2', 'ms_sl', 'amdnet')


def _ckpt(name):
  return str(FIXTURES / f'{name}_best.ckpt')


def _config(name):
  return ml_collections.ConfigDict(dict(name=name, visual_dim=48, query_dim=40, hidden_dim=32,
                                        num_heads=4, max_query_len=1 if name == 'amdnet' else 30,
                                        max_frames=128, num_clips=32))


@pytest.mark.parametrize('name', NAMES)
def test_config_inferred_from_the_official_checkpoint(name):
  inferred = convert.infer_model_config(
      torch_file.load_torch_checkpoint(_ckpt(name), use_torch=False), name)
  assert {k: inferred[k] for k in _config(name)} == _config(name).to_dict()
  if name == 'amdnet':
    assert inferred.num_spans == 4


@pytest.mark.parametrize('name', NAMES)
def test_round_trip_and_official_names(name):
  config = _config(name)
  shapes = models.get_spec(name).param_shapes(config)
  leaves, treedef = jax.tree_util.tree_flatten(shapes)
  rng = np.random.default_rng(0)
  params = jax.tree_util.tree_unflatten(
      treedef, [rng.normal(size=s.shape).astype(np.float32) for s in leaves])
  state_dict = convert.params_to_torch(params, name)
  official = torch_file.load_torch_checkpoint(_ckpt(name), use_torch=False)
  assert {k: v.shape for k, v in state_dict.items()} == {k: v.shape for k, v in official.items()}
  back = convert.torch_to_params(state_dict, name, config)
  jax.tree.map(np.testing.assert_array_equal, back, params)
  # DataParallel checkpoints carry a 'module.' prefix.
  prefixed = convert.torch_to_params({'module.' + k: v for k, v in state_dict.items()}, name)
  jax.tree.map(np.testing.assert_array_equal, prefixed, params)

  names = convert.torch_names(params, name)
  assert jax.tree_util.tree_structure(names) == treedef
  flat_names = jax.tree_util.tree_leaves(names)
  assert {n.replace('attn*', 'attn0') for n in flat_names} <= set(official)
  assert len(flat_names) == len(set(flat_names))
  if name == 'ms_sl':
    assert names['key_clip_attention']['key'] == 'mapping_linear.0.weight'
    assert names['frame']['encoder']['norm']['scale'] == 'frame_encoder.output.LayerNorm.weight'
    return
  if name == 'amdnet':
    assert names['spans']['span']['kernel'] == 'clip_encoder.fc_gauss.weight'
    assert names['moment_attention']['attention']['key']['bias'] == (
        'clip_encoder.attn1.self.key.bias')
    return
  v2 = name == 'gmmformer_v2'
  assert names['clip']['encoder_0']['branches']['attention']['query']['kernel'] == (
      'clip_encoder.attn*.self.query.weight')
  assert names['query']['input_proj']['norm']['scale'] == 'query_input_proj.LayerNorm.weight'
  if v2:
    assert names['frame']['encoder_0']['mix_out']['bias'] == 'frame_encoder_1.layer2.bias'
    assert names['weight_token'] == 'weight_token'
  else:
    assert names['frame']['encoder_1']['branches']['norm']['scale'] == (
        'frame_encoder_2.attn*.output.LayerNorm.weight')


@pytest.mark.parametrize('name', ['gmmformer', 'gmmformer_v2'])
def test_stacked_branches_keep_the_official_order(name):
  official = torch_file.load_torch_checkpoint(_ckpt(name), use_torch=False)
  params = convert.torch_to_params(official, name)
  kernels = params['clip']['encoder_0']['branches']['attention']['value']['kernel']
  for k in range(kernels.shape[0]):
    np.testing.assert_array_equal(kernels[k], official[f'clip_encoder.attn{k}.self.value.weight'].T)
  if name == 'gmmformer_v2':
    np.testing.assert_array_equal(params['weight_token'], official['weight_token'].reshape(-1))


def test_mapping_error_lists_missing_unused_and_misshaped_keys():
  state_dict = torch_file.load_torch_checkpoint(_ckpt('gmmformer_v2'), use_torch=False)
  del state_dict['clip_encoder.attn3.norm2.bias']
  state_dict['frame_encoder_2.attn0.self.query.weight'] = np.zeros((32, 32), np.float32)
  state_dict['query_input_proj.net.1.weight'] = np.zeros((32, 41), np.float32)
  with pytest.raises(ValueError) as error:
    convert.torch_to_params(state_dict, 'gmmformer_v2', _config('gmmformer_v2'))
  message = str(error.value)
  assert 'missing torch keys (1)' in message
  assert 'clip_encoder.attn3.norm2.bias (-> clip/encoder_0/branches/norm2/bias' in message
  assert 'unused torch keys (1)' in message
  assert 'frame_encoder_2.attn0.self.query.weight (32, 32)' in message
  assert 'mis-shaped torch keys (1)' in message
  assert ('query_input_proj.net.1.weight (32, 41) -> query/input_proj/dense/kernel expects '
          '(40, 32)') in message


def test_v1_checkpoint_into_v2_is_refused():
  state_dict = torch_file.load_torch_checkpoint(_ckpt('gmmformer'), use_torch=False)
  with pytest.raises(ValueError, match='missing torch keys') as error:
    convert.torch_to_params(state_dict, 'gmmformer_v2', _config('gmmformer_v2'))
  # v1 tensors v2 has no name for (its second GMM blocks, its video pooling) are unused; ten
  # of them are listed.
  v2_names = set(convert.params_to_torch(
      convert.torch_to_params(torch_file.load_torch_checkpoint(_ckpt('gmmformer_v2'),
                                                            use_torch=False), 'gmmformer_v2'),
      'gmmformer_v2'))
  unused = int(re.search(r'unused torch keys \((\d+)\)', str(error.value)).group(1))
  assert unused == len(set(state_dict) - v2_names) > 10
  assert f'... and {unused - 10} more' in str(error.value)


def test_cli_import_and_export(tmp_path):
  env = support.subprocess_env(JAX_PLATFORMS='cpu')
  run = lambda *args: subprocess.run([sys.executable, '-m', 'prvr_jax.tools.convert', *args],
                                     env=env, check=True, capture_output=True, text=True)
  run('--model=gmmformer', f'--checkpoint={_ckpt("gmmformer")}', f'--out={tmp_path}/p.msgpack')
  official = torch_file.load_torch_checkpoint(_ckpt('gmmformer'), use_torch=False)
  restored = serialization.msgpack_restore((tmp_path / 'p.msgpack').read_bytes())
  jax.tree.map(np.testing.assert_array_equal, restored,
               convert.torch_to_params(official, 'gmmformer'))
  run('--model=gmmformer', f'--params={tmp_path}/p.msgpack', f'--out={tmp_path}/sd.npz')
  exported = np.load(tmp_path / 'sd.npz')
  assert set(exported) == set(official)
  for key, value in official.items():
    np.testing.assert_array_equal(exported[key], value, err_msg=key)
  # Exporting to a torch file without torch says so (instead of an ImportError).
  if not support.has_torch():
    proc = subprocess.run([sys.executable, '-m', 'prvr_jax.tools.convert', '--model=gmmformer',
                           f'--params={tmp_path}/p.msgpack', f'--out={tmp_path}/sd.pt'], env=env,
                          capture_output=True, text=True)
    assert proc.returncode != 0 and 'needs torch installed; write an .npz' in proc.stderr


def test_mapping_errors_stay_short_for_hostile_state_dicts():
  """100,000 junk keys of 10,000 characters each: the error lists a few, cut, and counts."""
  state_dict = torch_file.load_torch_checkpoint(_ckpt('gmmformer'), use_torch=False)
  state_dict.update({f'{i}' + 'x' * 10_000: np.zeros(1, np.float32) for i in range(100_000)})
  with pytest.raises(ValueError, match=r'unused torch keys \(100000\):') as e:
    convert.torch_to_params(state_dict, 'gmmformer', _config('gmmformer'))
  assert '... and 99990 more' in str(e.value) and len(str(e.value)) < 2000


def test_cli_never_replaces_its_input_or_an_existing_file(tmp_path):
  """`--out` equal to the input (same path, a relative path, a symbolic or hard link) is refused
  whatever the flags; an existing `--out` is replaced only with `--overwrite`. Each refusal's
  last line names the flag, and the files are left as they were."""
  ckpt = tmp_path / 'best.ckpt'
  ckpt.write_bytes(pathlib.Path(_ckpt('gmmformer')).read_bytes())
  original = ckpt.read_bytes()
  (tmp_path / 'link.ckpt').symlink_to(ckpt)
  os.link(ckpt, tmp_path / 'hard.ckpt')
  sub = tmp_path / 'sub'
  sub.mkdir()
  for out in (str(ckpt), str(tmp_path / 'link.ckpt'), str(tmp_path / 'hard.ckpt'),
              str(sub / '..' / 'best.ckpt')):
    for overwrite in (False, True):
      with pytest.raises(ValueError, match=r'is the input file --checkpoint=') as error:
        convert.checkpoint_to_params_file(str(ckpt), 'gmmformer', out, overwrite)
      assert str(error.value).startswith(f'--out={out} ')
  assert ckpt.read_bytes() == original and (tmp_path / 'link.ckpt').is_symlink()
  env = support.subprocess_env(JAX_PLATFORMS='cpu')
  run = lambda *args: subprocess.run([sys.executable, '-m', *args], env=env, cwd=tmp_path,
                                     capture_output=True, text=True)
  # The library module run as a program converts nothing and names the command (it used to
  # exit 0 having done nothing).
  proc = run('prvr_jax.convert', '--model=gmmformer', f'--checkpoint={ckpt}', '--out=best.ckpt')
  assert proc.returncode != 0 and ckpt.read_bytes() == original
  assert proc.stderr.strip().splitlines()[-1].endswith(
      'Run `python -m prvr_jax.tools.convert --model=gmmformer '
      f'--checkpoint={ckpt} --out=best.ckpt` (or prvr-convert ...)'), proc.stderr[-2000:]
  # The command: a relative --out is resolved, and --overwrite does not make it replaceable.
  proc = run('prvr_jax.tools.convert', '--model=gmmformer', f'--checkpoint={ckpt}',
             '--out=best.ckpt', '--overwrite')
  assert proc.returncode != 0 and ckpt.read_bytes() == original
  assert proc.stderr.strip().splitlines()[-1].endswith(
      f'--out=best.ckpt is the input file --checkpoint={ckpt}; refusing to replace what is '
      'being converted: choose another --out'), proc.stderr[-2000:]
  # An existing file that the converter did not write: refused without --overwrite.
  other = tmp_path / 'params.msgpack'
  other.write_bytes(b'not ours')
  proc = run('prvr_jax.tools.convert', '--model=gmmformer', f'--checkpoint={ckpt}',
             f'--out={other}')
  assert proc.returncode != 0 and other.read_bytes() == b'not ours'
  assert proc.stderr.strip().splitlines()[-1].endswith(
      f'--out={other} already exists; refusing to replace it (pass --overwrite to replace it, '
      'or choose another --out)'), proc.stderr[-2000:]
  convert.checkpoint_to_params_file(str(ckpt), 'gmmformer', str(other), overwrite=True)
  restored = serialization.msgpack_restore(other.read_bytes())
  jax.tree.map(np.testing.assert_array_equal, restored,
               convert.torch_to_params(torch_file.load_torch_checkpoint(str(ckpt)), 'gmmformer'))
  # Export: --out equal to --params, or an existing file, is refused the same way.
  with pytest.raises(ValueError, match=rf'--out={other} is the input file --params={other}'):
    convert.params_file_to_torch(str(other), 'gmmformer', str(other), overwrite=True)
  (tmp_path / 'sd.npz').write_bytes(b'keep')
  with pytest.raises(ValueError, match=r'sd.npz already exists; .*--overwrite'):
    convert.params_file_to_torch(str(other), 'gmmformer', str(tmp_path / 'sd.npz'))
  assert (tmp_path / 'sd.npz').read_bytes() == b'keep'
  with pytest.raises(ValueError, match=rf'--out={sub} is a folder'):
    convert.params_file_to_torch(str(other), 'gmmformer', str(sub), overwrite=True)
  for out in ('', f'{tmp_path}/new/'):
    with pytest.raises(ValueError, match=rf"--out='{out}' names no file"):
      convert.params_file_to_torch(str(other), 'gmmformer', out, overwrite=True)


def test_export_refuses_non_finite_or_foreign_params_files(tmp_path):
  params = convert.torch_to_params(torch_file.load_torch_checkpoint(_ckpt('gmmformer')),
                                   'gmmformer')
  params['clip']['encoder_0']['branches']['attention']['value']['bias'][1, 3] = np.inf
  (tmp_path / 'inf.msgpack').write_bytes(serialization.msgpack_serialize({'params': params}))
  with pytest.raises(ValueError) as error:
    convert.params_file_to_torch(str(tmp_path / 'inf.msgpack'), 'gmmformer',
                                 str(tmp_path / 'sd.npz'))
  assert str(error.value).splitlines()[-1] == (
      f'--params={tmp_path / "inf.msgpack"}: 1 parameter(s) hold NaN or inf values (first: '
      'clip/encoder_0/branches/attention/value/bias, 1 values); refusing to export them')
  assert not (tmp_path / 'sd.npz').exists()
  # An array declaring 2**40 float32 values over 16 bytes is refused, not allocated.
  declared = msgpack.packb({'w': msgpack.ExtType(
      serialization._MsgpackExtType.ndarray,  # pylint: disable=protected-access
      msgpack.packb(((1 << 20, 1 << 20), 'float32', bytes(16))))})
  for name, content in (('garbage', b'\xc1\xc1 not msgpack'), ('torch', b'PK\x03\x04zip'),
                        ('list', serialization.msgpack_serialize([1, 2])),
                        ('declared', declared)):
    (tmp_path / f'{name}.msgpack').write_bytes(content)
    with pytest.raises(ValueError, match=rf'--params={tmp_path / name}.msgpack (is not a flax '
                       'msgpack file|holds no tree of numeric arrays)'):
      convert.params_file_to_torch(str(tmp_path / f'{name}.msgpack'), 'gmmformer',
                                   str(tmp_path / 'sd.npz'))
