"""prvr_jax.clip: parity with open_clip and Hugging Face CLIPModel, weight files, tokenizer.

The parity fixtures (tests/fixtures/clip/README.md) hold a tiny randomised open_clip CLIP's
state dict, the same weights under Hugging Face names, fixed inputs, and the features torch
computed; nothing here needs torch. Full-size models are only ever shaped (`jax.eval_shape`).
"""

import functools
import gzip
import hashlib
import importlib.util
import json
import re
import struct
import tracemalloc
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import support
from prvr_jax.clip import model as model_lib
from prvr_jax.clip import tokenizer as tokenizer_lib
from prvr_jax.clip import weights
from prvr_jax.clip.model import CLIP, CLIPConfig
from prvr_jax.models.spec import count_params

FIXTURES = support.FIXTURES / 'clip'
# The fixture model (tests/fixtures/clip/README.md).
TINY = CLIPConfig(embed_dim=24, image_size=32, patch_size=8, vision_width=48, vision_layers=2,
                  vision_heads=4, context_length=16, vocab_size=100, text_width=32,
                  text_layers=2, text_heads=4)
# Parity with the reference code: 1e-5 of each array's magnitude (docs/testing.md).
PARITY_RTOL = 1e-5


def _state(name: str) -> dict[str, np.ndarray]:
  """The fixture's weights as float32 (stored as float16: every value is exact in it)."""
  with np.load(FIXTURES / name) as f:
    return {k[len('state/'):]: (f[k].astype(np.float32) if f[k].dtype == np.float16 else f[k])
            for k in f.files if k.startswith('state/')}


@functools.cache
def _fixture(name: str) -> dict[str, np.ndarray]:
  with np.load(FIXTURES / name) as f:
    return {k: f[k] for k in f.files if not k.startswith('state/')}


@functools.cache
def _forward(dtype=jnp.float32):
  return jax.jit(CLIP(TINY, dtype=dtype).apply)


def _inputs():
  ref = _fixture('clip_tiny.npz')
  return ref['images'].astype(np.float32), ref['tokens']


def _assert_same_params(a, b):
  assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves(b)):
    np.testing.assert_array_equal(x, y, err_msg=jax.tree_util.keystr(path))


# ----------------------------------------------------------------------------- model


def test_full_size_parameter_counts_equal_open_clip():
  # open_clip 3.3.0: sum(p.numel()) of ViT-B-32-quickgelu / ViT-B-16-quickgelu.
  assert count_params(model_lib.param_shapes(model_lib.VIT_B_32)) == 151_277_313
  assert count_params(model_lib.param_shapes(model_lib.VIT_B_16)) == 149_620_737
  assert model_lib.CONFIGS == {'ViT-B/32': model_lib.VIT_B_32, 'ViT-B/16': model_lib.VIT_B_16}
  assert model_lib.VIT_B_16.patch_size == 16 and model_lib.VIT_B_16.grid_size == 14


def test_init_matches_the_parameter_shapes():
  variables = jax.jit(CLIP(TINY).init)(jax.random.key(0), *model_lib.example_inputs(TINY))
  params = variables['params']
  assert (jax.tree.map(lambda x: (x.shape, x.dtype), params)
          == jax.tree.map(lambda x: (x.shape, x.dtype), model_lib.param_shapes(TINY)))
  np.testing.assert_allclose(params['logit_scale'], np.log(1 / 0.07), rtol=1e-6)
  attn = params['text']['transformer']['resblocks_0']['attn']
  assert attn['query']['kernel'].shape == (32, 4, 8) and attn['out']['kernel'].shape == (4, 8, 32)


@pytest.mark.parametrize('loader', ['openai', 'huggingface'])
def test_parity_with_the_reference_features(loader):
  """Our towers on the fixture weights give open_clip's (openai) and Hugging Face
  CLIPModel's (huggingface) features for the same inputs."""
  if loader == 'openai':
    config, params = weights.from_torch_state_dict(_state('clip_tiny.npz'), TINY)
    ref = _fixture('clip_tiny.npz')
  else:
    config, params = weights.from_huggingface(_state('clip_tiny_hf.npz'), TINY)
    ref = _fixture('clip_tiny_hf.npz')
  assert config == TINY
  image_features, text_features, logit_scale = _forward()({'params': params}, *_inputs())
  support.assert_close(image_features, ref['image_features'], PARITY_RTOL)
  support.assert_close(text_features, ref['text_features'], PARITY_RTOL)
  assert float(logit_scale) == float(_state('clip_tiny.npz')['logit_scale'])


def test_both_loaders_give_the_same_parameters():
  _assert_same_params(weights.from_torch_state_dict(_state('clip_tiny.npz'), TINY)[1],
                      weights.from_huggingface(_state('clip_tiny_hf.npz'), TINY)[1])


def test_text_padding_after_eot_does_not_matter():
  """Rows cut after their EOT (causal mask) give the same features as the full context."""
  _, params = weights.from_torch_state_dict(_state('clip_tiny.npz'), TINY)
  _, tokens = _inputs()
  rows = [0, 2]  # EOT at positions 5 and 1
  cut = jax.jit(functools.partial(CLIP(TINY).apply, method='encode_text'))(
      {'params': params}, tokens[rows, :8])
  support.assert_close(cut, _fixture('clip_tiny.npz')['text_features'][rows], PARITY_RTOL)


def test_bfloat16_compute_stays_close_to_float32():
  _, params = weights.from_torch_state_dict(_state('clip_tiny.npz'), TINY)
  image_features, text_features, _ = _forward(jnp.bfloat16)({'params': params}, *_inputs())
  assert image_features.dtype == text_features.dtype == jnp.bfloat16
  ref = _fixture('clip_tiny.npz')
  # bfloat16 rounds to 8 significant bits (unit roundoff 3.9e-3) after every op of ~10 chained
  # matmuls, LayerNorms and softmaxes; measured 1.8e-2 (image) and 6.5e-3 (text) of the
  # features' magnitude.
  support.assert_close(image_features, ref['image_features'], 8e-2)
  support.assert_close(text_features, ref['text_features'], 8e-2)


def test_input_shape_errors():
  params = model_lib.param_shapes(TINY)
  with pytest.raises(ValueError, match=r'images \[N, 32, 32, 3\] \(NHWC\), got \(1, 3, 32, 32\)'):
    jax.eval_shape(functools.partial(CLIP(TINY).apply, method='encode_image'),
                   {'params': params}, jnp.zeros((1, 3, 32, 32)))
  with pytest.raises(ValueError, match=r'L <= 16, got \(1, 17\)'):
    jax.eval_shape(functools.partial(CLIP(TINY).apply, method='encode_text'),
                   {'params': params}, jnp.zeros((1, 17), jnp.int32))
  with pytest.raises(ValueError, match='not a multiple of patch_size'):
    CLIPConfig(**{**TINY.__dict__, 'image_size': 30})


# ----------------------------------------------------------------------------- weight mapping


def _shape_only(entries):
  """A state dict of zero-stride arrays with the names and shapes of `entries` (no memory)."""
  return {name: np.broadcast_to(np.float32(0), shape) for name, shape, _ in entries}


@pytest.mark.parametrize('name', ['ViT-B/32', 'ViT-B/16'])
def test_config_inferred_from_full_size_shapes(name):
  config = model_lib.CONFIGS[name]
  assert weights.infer_config(_shape_only(weights.openai_names(config))) == config
  assert (weights.infer_huggingface_config(_shape_only(weights.huggingface_names(config)))
          == config)


def test_small_model_read_without_a_config():
  config = CLIPConfig(embed_dim=8, image_size=8, patch_size=4, vision_width=64, vision_layers=1,
                      vision_heads=1, context_length=4, vocab_size=10, text_width=128,
                      text_layers=2, text_heads=2)
  got, params = weights.from_torch_state_dict(_shape_only(weights.openai_names(config)))
  assert got == config
  assert count_params(params) == count_params(model_lib.param_shapes(config))
  assert weights.from_huggingface(_shape_only(weights.huggingface_names(config)))[0] == config


def test_heads_cannot_be_inferred_for_widths_off_the_64_grid():
  with pytest.raises(weights.WeightsError, match='attention heads of width 48.*pass a config'):
    weights.from_torch_state_dict(_state('clip_tiny.npz'))


def test_mapping_errors_name_the_keys():
  state = _state('clip_tiny.npz')
  cases = [
      ({**state, 'visual.extra.weight': np.zeros(3, np.float32)},
       r"1 unknown keys:\n  visual.extra.weight"),
      ({k: v for k, v in state.items() if k != 'visual.ln_pre.bias'},
       r'1 missing keys:\n  visual.ln_pre.bias'),
      ({**state, 'visual.proj': state['visual.proj'].T},
       r'1 wrong shapes:\n  visual.proj: \(24, 48\), expected \(48, 24\)'),
      ({k: v for k, v in state.items() if not k.startswith('transformer.resblocks.1.')},
       r'12 missing keys:\n  transformer.resblocks.1.ln_1.weight'),
  ]
  for bad, message in cases:
    with pytest.raises(weights.WeightsError, match=message):
      weights.from_torch_state_dict(bad, TINY)
  # A config with other sizes names every key whose shape differs.
  with pytest.raises(weights.WeightsError, match=r'token_embedding.weight: \(100, 32\), '
                     r'expected \(101, 32\)'):
    weights.from_torch_state_dict(state, CLIPConfig(**{**TINY.__dict__, 'vocab_size': 101}))


def test_openai_metadata_scalars_must_agree_with_the_config():
  state = _state('clip_tiny.npz')
  meta = {'input_resolution': np.int64(32), 'context_length': np.int64(16),
          'vocab_size': np.int64(100)}
  _assert_same_params(weights.from_torch_state_dict({**state, **meta}, TINY)[1],
                      weights.from_torch_state_dict(state, TINY)[1])
  with pytest.raises(weights.WeightsError, match="'input_resolution' is .*224.* image_size=32"):
    weights.from_torch_state_dict({**state, 'input_resolution': np.int64(224)}, TINY)


def test_huggingface_only_position_ids_are_ignored():
  tensors = _state('clip_tiny_hf.npz')
  assert 'text_model.embeddings.position_ids' in tensors
  with pytest.raises(weights.WeightsError, match=r'unknown keys:\n  text_model.extra_buffer'):
    weights.from_huggingface({**tensors, 'text_model.extra_buffer': np.zeros(2)}, TINY)
  with pytest.raises(weights.WeightsError,
                     match=r'missing keys:\n  vision_model.encoder.layers.0.self_attn.k_proj.bias'):
    weights.from_huggingface({k: v for k, v in tensors.items()
                              if k != 'vision_model.encoder.layers.0.self_attn.k_proj.bias'},
                             TINY)


# ----------------------------------------------------------------------------- files

_DTYPES = {'F32': '<f4', 'F16': '<f2', 'I64': '<i8', 'I32': '<i4', 'F64': '<f8', 'U8': 'u1'}


def _write_safetensors(path, tensors, metadata=None):
  """A .safetensors file written by hand: {name: (dtype name, shape, raw bytes)}."""
  header, data = {}, b''
  for name, (dtype, shape, raw) in tensors.items():
    header[name] = {'dtype': dtype, 'shape': list(shape),
                    'data_offsets': [len(data), len(data) + len(raw)]}
    data += raw
  if metadata is not None:
    header['__metadata__'] = metadata
  text = json.dumps(header).encode()
  text += b' ' * (-len(text) % 8)  # the format pads the header to 8 bytes
  path.write_bytes(struct.pack('<Q', len(text)) + text + data)
  return path


def _tensor(array):
  array = np.asarray(array)
  name = {v: k for k, v in _DTYPES.items()}[array.dtype.newbyteorder('<').str]
  return name, array.shape, array.astype(array.dtype.newbyteorder('<')).tobytes()


def test_read_safetensors_round_trip(tmp_path):
  f32 = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
  values = np.array([1.0, -2.5, 3.140625, 0.0, -0.0078125, 65280.0], np.float32)  # bf16-exact
  bf16 = (values.view(np.uint32) >> 16).astype('<u2').tobytes()
  path = _write_safetensors(tmp_path / 'a.safetensors', {
      'f32': _tensor(f32), 'f16': _tensor(f32.astype(np.float16)),
      'bf16': ('BF16', (2, 3), bf16), 'i64': _tensor(np.array([[-1, 2**40]], np.int64)),
      'i32': _tensor(np.array([7, -8], np.int32)), 'scalar': _tensor(np.float32(2.5)),
      'empty': _tensor(np.zeros((0, 3), np.float32))}, metadata={'format': 'pt'})
  got = weights.read_safetensors(str(path))
  assert sorted(got) == ['bf16', 'empty', 'f16', 'f32', 'i32', 'i64', 'scalar']
  np.testing.assert_array_equal(got['f32'], f32)
  assert got['f16'].dtype == np.float16
  np.testing.assert_array_equal(got['f16'], f32.astype(np.float16))
  assert got['bf16'].dtype == np.float32
  np.testing.assert_array_equal(got['bf16'], values.reshape(2, 3))
  np.testing.assert_array_equal(got['i64'], [[-1, 2**40]])
  np.testing.assert_array_equal(got['i32'], [7, -8])
  assert got['scalar'].shape == () and got['scalar'] == 2.5
  assert got['empty'].shape == (0, 3)
  got['f32'][0, 0] = 1  # writable


def test_read_safetensors_refuses_malformed_files(tmp_path):
  good = {'w': _tensor(np.ones((2, 2), np.float32)), 'b': _tensor(np.ones(2, np.float32))}
  data = _write_safetensors(tmp_path / 'good.safetensors', good).read_bytes()
  cases = {
      'truncated': (data[:-4], r"tensor 'b': data_offsets \[16, 24\] lie outside the file's "
                               r'20 data bytes'),
      'short': (data[:5], 'truncated safetensors file'),
      'header_length': (struct.pack('<Q', 10**6) + data[8:], 'header length 1000000 exceeds'),
      'not_json': (struct.pack('<Q', 4) + b'{{{{', 'header is not JSON'),
  }
  header = json.loads(data[8:8 + struct.unpack('<Q', data[:8])[0]])
  for name, change, message in (
      ('offset', {'data_offsets': [16, 40]}, r"tensor 'b': data_offsets \[16, 40\] lie outside"),
      ('size', {'shape': [3]}, r"tensor 'b': data_offsets \[16, 24\] hold 8 bytes, but F32 "
                               r'\[3\] needs 12'),
      ('dtype', {'dtype': 'F8_E4M3'}, r"tensor 'b': unsupported dtype 'F8_E4M3'")):
    text = json.dumps({**header, 'b': {**header['b'], **change}}).encode()
    cases[name] = (struct.pack('<Q', len(text)) + text + data[-24:], message)
  for name, (content, message) in cases.items():
    path = tmp_path / f'{name}.safetensors'
    path.write_bytes(content)
    with pytest.raises(ValueError, match=message) as error:
      weights.read_safetensors(str(path))
    assert str(path) in str(error.value), name


def test_load_safetensors_of_both_namings(tmp_path):
  expected = weights.from_torch_state_dict(_state('clip_tiny.npz'), TINY)[1]
  hf = _write_safetensors(tmp_path / 'model.safetensors', {
      k: _tensor(v) for k, v in _state('clip_tiny_hf.npz').items()})
  config, params = weights.load(str(hf), TINY)
  assert config == TINY
  _assert_same_params(params, expected)
  # open_clip also publishes safetensors with its own names; DDP checkpoints prefix 'module.'.
  openai = _write_safetensors(tmp_path / 'open_clip.safetensors', {
      f'module.{k}': _tensor(v) for k, v in _state('clip_tiny.npz').items()})
  _assert_same_params(weights.load(str(openai), TINY)[1], expected)


def test_read_safetensors_refuses_tensors_sharing_bytes_before_allocating(tmp_path):
  """80 tensors on one byte range would be read 80 times over: refused from the header, naming
  the file and a tensor, with no more memory taken than a fraction of the file."""
  block = np.ones(1 << 16, np.float32).tobytes()  # 256 KiB
  header = {f'w{i}': {'dtype': 'F32', 'shape': [1 << 16], 'data_offsets': [0, len(block)]}
            for i in range(80)}
  text = json.dumps(header).encode()
  path = tmp_path / 'aliased.safetensors'
  path.write_bytes(struct.pack('<Q', len(text)) + text + block)
  tracemalloc.start()
  try:
    with pytest.raises(ValueError) as error:
      weights.read_safetensors(str(path))
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  last = str(error.value).splitlines()[-1]
  assert str(path) in last and re.search(r"tensor 'w\d+' .* overlaps tensor 'w\d+'", last)
  assert peak < len(block) // 4
  # A partial overlap too; empty tensors may share an offset.
  good = _write_safetensors(tmp_path / 'good.safetensors', {
      'a': _tensor(np.ones(4, np.float32)), 'b': _tensor(np.ones(4, np.float32)),
      'e': _tensor(np.zeros(0, np.float32))}).read_bytes()
  n = struct.unpack('<Q', good[:8])[0]
  header = json.loads(good[8:8 + n])
  assert header['e']['data_offsets'] == [32, 32]
  header['e']['data_offsets'] = [16, 16]
  empty_shared = json.dumps(header).encode()
  (tmp_path / 'empty.safetensors').write_bytes(
      struct.pack('<Q', len(empty_shared)) + empty_shared + good[8 + n:])
  assert weights.read_safetensors(str(tmp_path / 'empty.safetensors'))['e'].shape == (0,)
  header['b']['data_offsets'] = [8, 24]
  header['e']['data_offsets'] = [24, 24]
  partial = json.dumps(header).encode()
  (tmp_path / 'partial.safetensors').write_bytes(
      struct.pack('<Q', len(partial)) + partial + good[8 + n:])
  with pytest.raises(ValueError, match=r"partial.safetensors: tensor 'b' \(data_offsets "
                     r"\[8, 24\]\) overlaps tensor 'a' \(\[0, 16\]\)"):
    weights.read_safetensors(str(tmp_path / 'partial.safetensors'))


def _write_torch_zip(path, state):
  """A torch.save zip of float32 tensors {name: array}, written without torch: protocol-2
  opcodes of {name: torch._utils._rebuild_tensor_v2(storage, 0, shape, stride, False, {})}."""
  text = lambda s: b'X' + struct.pack('<I', len(s)) + s.encode()
  integer = lambda x: b'J' + struct.pack('<i', x)
  ints = lambda xs: b'(' + b''.join(integer(x) for x in xs) + b't'
  body = b''
  for key, (name, array) in enumerate(state.items()):
    array = np.array(array, np.float32, order='C')  # keeps 0-d arrays 0-d
    strides = [s // 4 for s in array.strides]
    body += (text(name) + b'ctorch._utils\n_rebuild_tensor_v2\n('
             + b'(' + text('storage') + b'ctorch\nFloatStorage\n' + text(str(key))
             + text('cpu') + integer(array.size) + b'tQ'
             + integer(0) + ints(array.shape) + ints(strides)
             + b'\x89ccollections\nOrderedDict\n)Rt' + b'R')
  with zipfile.ZipFile(path, 'w') as archive:
    archive.writestr('archive/data.pkl', b'\x80\x02}(' + body + b'u.')
    archive.writestr('archive/byteorder', 'little')
    archive.writestr('archive/version', '3\n')
    for key, array in enumerate(state.values()):
      archive.writestr(f'archive/data/{key}', np.asarray(array, '<f4').tobytes())
  return path


def test_load_torch_state_dict(tmp_path):
  state = _state('clip_tiny.npz')
  path = _write_torch_zip(tmp_path / 'clip.pt', state)
  config, params = weights.load(str(path), TINY)
  assert config == TINY
  _assert_same_params(params, weights.from_torch_state_dict(state, TINY)[1])


def test_non_finite_clip_weights_are_refused_by_every_reader(tmp_path):
  """A NaN or inf in any CLIP weight (as `config.model.clip_weights` would feed training) is
  refused, the last line naming the file and the tensor: safetensors of both namings, torch
  files, float64 values beyond float32's range, and state dicts passed directly."""
  state, hf = _state('clip_tiny.npz'), _state('clip_tiny_hf.npz')
  nan_state = {**state, 'visual.proj': state['visual.proj'].copy()}
  nan_state['visual.proj'][3, 5] = np.nan
  inf_hf = {**hf, 'text_projection.weight': hf['text_projection.weight'].copy()}
  inf_hf['text_projection.weight'][0, :2] = -np.inf
  huge = {**state, 'ln_final.bias': state['ln_final.bias'].astype(np.float64)}
  huge['ln_final.bias'][0] = 1e300
  files = {
      'open_clip.safetensors': (_write_safetensors(
          tmp_path / 'open_clip.safetensors', {k: _tensor(v) for k, v in nan_state.items()}),
          "'visual.proj', 1 of 1152 values"),
      'model.safetensors': (_write_safetensors(
          tmp_path / 'model.safetensors', {k: _tensor(v) for k, v in inf_hf.items()}),
          "'text_projection.weight', 2 of 768 values"),
      'clip.pt': (_write_torch_zip(tmp_path / 'clip.pt', nan_state),
                  "'visual.proj', 1 of 1152 values"),
      'f64.safetensors': (_write_safetensors(
          tmp_path / 'f64.safetensors', {k: _tensor(v) for k, v in huge.items()}),
          "'ln_final.bias', 1 of 32 values"),
  }
  for name, (path, tensor) in files.items():
    with pytest.raises(weights.WeightsError) as error:
      weights.load(str(path), TINY)
    last = str(error.value).splitlines()[-1]
    assert last.startswith(str(path)) and tensor in last, (name, last)
    assert 'NaN or inf' in last
  with pytest.raises(weights.WeightsError, match=r"1 tensor\(s\) hold NaN or inf values "
                     r"\(first: 'visual.proj'"):
    weights.from_torch_state_dict(nan_state, TINY)


def test_load_refuses_torchscript_and_unknown_files(tmp_path):
  # (Not named ViT-B-32.pt: a file of that name is first checked against OpenAI's sha256,
  # test_known_openai_files_are_verified_by_sha256.)
  path = tmp_path / 'jit_model.pt'
  with zipfile.ZipFile(path, 'w') as archive:
    for name in ('data.pkl', 'constants.pkl', 'code/__torch__/model.py', 'version'):
      archive.writestr(f'ViT-B-32/{name}', b'')
  with pytest.raises(ValueError, match='TorchScript archive.*Re-save its state dict'):
    weights.load(str(path))
  (tmp_path / 'clip.npz').write_bytes(b'')
  with pytest.raises(ValueError, match="unknown CLIP checkpoint suffix '.npz'"):
    weights.load(str(tmp_path / 'clip.npz'))
  with pytest.raises(FileNotFoundError, match='absent.pt'):
    weights.load(str(tmp_path / 'absent.pt'))


def test_known_openai_files_are_verified_by_sha256(tmp_path):
  # A file named as an OpenAI release is refused before it is read when its hash differs,
  # naming the file, the published and the actual hash; other names are not checked.
  fake = tmp_path / 'ViT-B-32.pt'
  fake.write_bytes(b'not the released weights')
  actual = hashlib.sha256(b'not the released weights').hexdigest()
  expected = weights.OPENAI_SHA256['ViT-B-32.pt']
  for call in (weights.verify_known_file, weights.load):
    with pytest.raises(weights.WeightsError) as error:
      call(str(fake))
    last = str(error.value).splitlines()[-1]
    assert str(fake) in last and expected in last and actual in last, last
  other = tmp_path / 'my_clip.pt'
  other.write_bytes(b'x')
  assert weights.verify_known_file(str(other)) is None
  # The published digests: 64 hex digits each, one per released file.
  assert all(len(h) == 64 and int(h, 16) >= 0 for h in weights.OPENAI_SHA256.values())
  assert len(set(weights.OPENAI_SHA256.values())) == len(weights.OPENAI_SHA256)


# ----------------------------------------------------------------------------- tokenizer

# Merges of a hand-made vocabulary: 512 byte tokens, then these (ids 512..), SOT, EOT.
MERGES = ['c a', 'ca t</w>', 'd o', 'do g</w>', 'a b', 'b c</w>']


def _vocab(tmp_path, gz=True):
  text = '#version: 0.2\n' + '\n'.join(MERGES) + '\n'
  path = tmp_path / ('vocab.txt.gz' if gz else 'vocab.txt')
  path.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
  return str(path)


def test_tokenizer_on_a_hand_made_vocabulary(tmp_path):
  tok = tokenizer_lib.Tokenizer(_vocab(tmp_path))
  sot, eot = 512 + len(MERGES), 513 + len(MERGES)
  assert (tok.sot_token, tok.eot_token, tok.vocab_size) == (sot, eot, 514 + len(MERGES))
  # 'a' is byte 97, the 65th printable byte: 'a' = 64, 'a</w>' = 256 + 64 (as in CLIP's vocab).
  assert tok.encode('a') == [320]
  assert tok.encode('  A   CAT\n\tdog ') == [320, 513, 515]
  assert tok.encode('abc') == [516, 258 + 64]  # 'a b' outranks 'b c</w>': ab, c</w>
  assert tok.encode('cats!') == [512, 83, 256 + 82, 256]  # ca, t, s</w>, !</w> ('!' = byte 0)
  assert tok.decode(tok.encode('A cat, a dog.')) == 'a cat , a dog . '
  rows = tok(['a cat', 'DOG'], context_length=5)
  assert rows.dtype == np.int32
  np.testing.assert_array_equal(rows, [[sot, 320, 513, eot, 0], [sot, 515, eot, 0, 0]])
  np.testing.assert_array_equal(tokenizer_lib.Tokenizer(_vocab(tmp_path, gz=False))('cat'),
                                tok('cat'))


def test_tokenizer_context_length(tmp_path):
  tok = tokenizer_lib.Tokenizer(_vocab(tmp_path))
  caption = 'cat dog ' * 40
  with pytest.raises(ValueError, match=r"caption 'cat dog cat dog .{44}' has 82 tokens.*"
                                       r'context length 77.*truncate=True'):
    tok(['a cat', caption])
  row = tok(caption, truncate=True)[0]
  assert row.shape == (77,)
  assert row[0] == tok.sot_token and row[-1] == tok.eot_token
  np.testing.assert_array_equal(row[1:76], ([513, 515] * 38)[:75])
  assert tok('cat dog cat', context_length=5).shape == (1, 5)  # exactly full


def test_vocabulary_path(tmp_path, monkeypatch):
  with pytest.raises(FileNotFoundError, match='not found: .*missing.txt.gz'):
    tokenizer_lib.Tokenizer(str(tmp_path / 'missing.txt.gz'))
  monkeypatch.setenv(tokenizer_lib.VOCAB_ENV, _vocab(tmp_path))
  assert tokenizer_lib.default_vocab_path() == _vocab(tmp_path)
  assert tokenizer_lib.Tokenizer().encode('cat') == [513]


CAPTIONS = ['A photo of a CAT.', 'Two dogs    playing\tfetch!!',
            "it's the man's 3rd time; he'll win 2,000 $", 'Café über naïve — "quotes" &amp; more',
            '日本語のテキスト', 'emoji 🙂 ok', 'a_b__c-d', "don't STOP", 'word ' * 100]


@pytest.mark.skipif(tokenizer_lib.regex is None, reason='the regex package is not installed')
def test_re_fallback_pattern_splits_like_the_regex_pattern():
  import re  # pylint: disable=g-import-not-at-top
  fallback = re.compile(tokenizer_lib.re_pattern(), re.IGNORECASE)
  pattern = tokenizer_lib.regex.compile(tokenizer_lib.REGEX_PATTERN,
                                        tokenizer_lib.regex.IGNORECASE)
  for caption in CAPTIONS + ['<|startoftext|>x<|endoftext|>', 'tab\u00a0nbsp ﬁne ①',
                             'x²+½ ⅫI 一二三 ٣٤ mi½ ²æñæl']:
    text = tokenizer_lib.clean(caption)
    assert fallback.findall(text) == pattern.findall(text), caption


def _open_clip():
  if importlib.util.find_spec('open_clip') is None:
    pytest.skip('open_clip is not installed')
  try:
    import open_clip  # pylint: disable=g-import-not-at-top
  except Exception as e:  # pylint: disable=broad-except
    pytest.skip(f'open_clip does not import here: {e}')
  return open_clip


def test_tokenizer_parity_with_open_clip():
  open_clip = _open_clip()
  tok = tokenizer_lib.Tokenizer()  # open_clip's own vocabulary file
  assert tok.vocab_size == 49408 and (tok.sot_token, tok.eot_token) == (49406, 49407)
  # open_clip always truncates; ours does with truncate=True.
  np.testing.assert_array_equal(tok(CAPTIONS, truncate=True),
                                open_clip.tokenize(CAPTIONS).numpy())
  reference = open_clip.tokenizer.SimpleTokenizer()
  for caption in CAPTIONS:
    assert tok.encode(caption) == reference.encode(caption), caption


def test_random_weights_spec_and_byte_vocabulary(tmp_path):
  """`random:<backbone>[:<seed>]` gives CLIP's parameter tree (seeded), a bad one names the
  value; `write_vocab` gives a vocabulary whose ids fit the tiny CLIP."""
  config, params = weights.load_spec('random:tiny:3')
  assert config == model_lib.TINY
  assert jax.tree.map(np.shape, params) == jax.tree.map(np.shape, model_lib.param_shapes(config))
  again = weights.load_spec('random:tiny:3')[1]
  other = weights.load_spec('random:tiny')[1]
  assert all(jax.tree.leaves(jax.tree.map(np.array_equal, params, again)))
  assert not all(jax.tree.leaves(jax.tree.map(np.array_equal, params, other)))
  with pytest.raises(ValueError, match=r'--clip_weights=random:huge: expected random:<backbone>'):
    weights.load_spec('random:huge')
  tokens = tokenizer_lib.Tokenizer(tokenizer_lib.write_vocab(tmp_path / 'v.txt.gz', ['c a']))(
      ['a cat'], config.context_length)
  assert tokens.shape == (1, config.context_length) and 0 < tokens.max() < config.vocab_size
