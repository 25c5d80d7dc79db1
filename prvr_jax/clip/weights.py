"""CLIP weights from OpenAI / open_clip state dicts and Hugging Face `CLIPModel` tensors.

Nothing read from a file is executed: `.safetensors` files are parsed here with numpy
(`read_safetensors`), torch files by `prvr_jax.torch_file.load_torch_checkpoint` (a
restricted unpickler without torch, `torch.load(weights_only=True)` with it).

  config, params = weights.load('ViT-B-32.state_dict.pt')   # or HF 'model.safetensors'
  image_features = CLIP(config).apply({'params': params}, images, method='encode_image')

Both mappings are strict: a missing or unknown tensor, one of another shape, or one holding
NaN or inf values is an error that names it (and the file). Every reader is bounded by the
file: a header declaring more than the file holds, or tensors sharing bytes, is refused before
anything is allocated. The attention head counts are not in the weights: without a `config`
they are taken as width / 64, as in every OpenAI ViT model (B/32, B/16: 12 image, 8 text
heads).
"""

from collections.abc import Callable, Mapping
import json
import math
import os
import re
import struct
import zipfile
from typing import Any

from flax import traverse_util
import jax
import numpy as np

from prvr_jax import torch_file
from prvr_jax.clip import model as model_lib
from prvr_jax.clip.model import CLIPConfig
from prvr_jax.files import listing
from prvr_jax.files import sha256_file

Params = dict[str, Any]
# The width of an attention head in every OpenAI CLIP ViT.
HEAD_WIDTH = 64
# safetensors' own bound on the JSON header.
MAX_SAFETENSORS_HEADER_BYTES = 100 * 2**20
_SAFETENSORS_DTYPES = {
    'F64': np.dtype('<f8'), 'F32': np.dtype('<f4'), 'F16': np.dtype('<f2'),
    'BF16': np.dtype('<u2'), 'I64': np.dtype('<i8'), 'I32': np.dtype('<i4'),
    'I16': np.dtype('<i2'), 'I8': np.dtype('i1'), 'U8': np.dtype('u1'), 'BOOL': np.dtype('?'),
}
# Scalars OpenAI's TorchScript models keep beside the weights (its `build_model` drops them).
_OPENAI_METADATA = {'input_resolution': 'image_size', 'context_length': 'context_length',
                    'vocab_size': 'vocab_size'}
# Buffers older transformers versions saved with the weights.
HF_BUFFERS = ('vision_model.embeddings.position_ids', 'text_model.embeddings.position_ids')
# A T-MASS checkpoint (its official `CLIPStochastic`) holds a Hugging Face `CLIPModel` under
# this prefix, beside its head (`pool_frames.*`, `stochastic.*`).
TMASS_CLIP_PREFIX = 'clip.'


class WeightsError(ValueError):
  """A checkpoint that does not match the CLIP architecture (or config) it is read into."""


# ---------------------------------------------------------------------------------------------
# Name maps: a list of (torch name, torch shape, {our path: torch array -> our array}).

Converter = Callable[[np.ndarray], np.ndarray]
Entry = tuple[str, tuple[int, ...], dict[str, Converter]]


def _copy(a: np.ndarray) -> np.ndarray:
  return a


def _linear(a: np.ndarray) -> np.ndarray:
  return a.T


def _heads_in(heads: int) -> Converter:
  """torch Linear weight [H*D, W] -> query/key/value kernel [W, H, D]; bias [H*D] -> [H, D]."""
  def convert(a):
    return a.T.reshape(a.shape[1], heads, -1) if a.ndim == 2 else a.reshape(heads, -1)
  return convert


def _heads_out(heads: int) -> Converter:
  """torch out_proj weight [W, H*D] -> out kernel [H, D, W]."""
  return lambda a: a.T.reshape(heads, -1, a.shape[0])


def _part(i: int, convert: Converter) -> Converter:
  """Part i of three along the leading axis (query, key, value of `in_proj_*`), converted."""
  return lambda a: convert(np.split(a, 3)[i])


def _layer_norm(torch_name: str, ours: str, width: int) -> list[Entry]:
  return [(f'{torch_name}.weight', (width,), {f'{ours}/scale': _copy}),
          (f'{torch_name}.bias', (width,), {f'{ours}/bias': _copy})]


def _linear_entries(torch_name: str, ours: str, d_in: int, d_out: int) -> list[Entry]:
  return [(f'{torch_name}.weight', (d_out, d_in), {f'{ours}/kernel': _linear}),
          (f'{torch_name}.bias', (d_out,), {f'{ours}/bias': _copy})]


def _openai_block(src: str, dst: str, width: int, heads: int, mlp: int) -> list[Entry]:
  qkv = ('query', 'key', 'value')
  return [
      *_layer_norm(f'{src}.ln_1', f'{dst}/ln_1', width),
      (f'{src}.attn.in_proj_weight', (3 * width, width),
       {f'{dst}/attn/{n}/kernel': _part(i, _heads_in(heads)) for i, n in enumerate(qkv)}),
      (f'{src}.attn.in_proj_bias', (3 * width,),
       {f'{dst}/attn/{n}/bias': _part(i, _heads_in(heads)) for i, n in enumerate(qkv)}),
      (f'{src}.attn.out_proj.weight', (width, width),
       {f'{dst}/attn/out/kernel': _heads_out(heads)}),
      (f'{src}.attn.out_proj.bias', (width,), {f'{dst}/attn/out/bias': _copy}),
      *_layer_norm(f'{src}.ln_2', f'{dst}/ln_2', width),
      *_linear_entries(f'{src}.mlp.c_fc', f'{dst}/c_fc', width, mlp),
      *_linear_entries(f'{src}.mlp.c_proj', f'{dst}/c_proj', mlp, width),
  ]


def _hf_block(src: str, dst: str, width: int, heads: int, mlp: int) -> list[Entry]:
  entries = _layer_norm(f'{src}.layer_norm1', f'{dst}/ln_1', width)
  for short_name, ours in (('q', 'query'), ('k', 'key'), ('v', 'value')):
    entries += [(f'{src}.self_attn.{short_name}_proj.weight', (width, width),
                 {f'{dst}/attn/{ours}/kernel': _heads_in(heads)}),
                (f'{src}.self_attn.{short_name}_proj.bias', (width,),
                 {f'{dst}/attn/{ours}/bias': _heads_in(heads)})]
  return entries + [
      (f'{src}.self_attn.out_proj.weight', (width, width),
       {f'{dst}/attn/out/kernel': _heads_out(heads)}),
      (f'{src}.self_attn.out_proj.bias', (width,), {f'{dst}/attn/out/bias': _copy}),
      *_layer_norm(f'{src}.layer_norm2', f'{dst}/ln_2', width),
      *_linear_entries(f'{src}.mlp.fc1', f'{dst}/c_fc', width, mlp),
      *_linear_entries(f'{src}.mlp.fc2', f'{dst}/c_proj', mlp, width),
  ]


def _conv(a: np.ndarray) -> np.ndarray:
  return a.transpose(2, 3, 1, 0)  # [W, 3, P, P] -> [P, P, 3, W]


def openai_names(config: CLIPConfig) -> list[Entry]:
  """Every tensor of an OpenAI / open_clip state dict for `config`: (name, shape, how it
  becomes which of our parameters)."""
  c = config
  vw, tw, p = c.vision_width, c.text_width, c.patch_size
  entries = [
      ('visual.conv1.weight', (vw, 3, p, p), {'visual/patch_embed/kernel': _conv}),
      ('visual.class_embedding', (vw,), {'visual/class_embedding': _copy}),
      ('visual.positional_embedding', (c.grid_size ** 2 + 1, vw),
       {'visual/positional_embedding': _copy}),
      *_layer_norm('visual.ln_pre', 'visual/ln_pre', vw),
      *_layer_norm('visual.ln_post', 'visual/ln_post', vw),
      ('visual.proj', (vw, c.embed_dim), {'visual/proj/kernel': _copy}),
      ('token_embedding.weight', (c.vocab_size, tw), {'text/token_embedding/embedding': _copy}),
      ('positional_embedding', (c.context_length, tw), {'text/positional_embedding': _copy}),
      *_layer_norm('ln_final', 'text/ln_final', tw),
      ('text_projection', (tw, c.embed_dim), {'text/text_projection/kernel': _copy}),
      ('logit_scale', (), {'logit_scale': _copy}),
  ]
  for i in range(c.vision_layers):
    entries += _openai_block(f'visual.transformer.resblocks.{i}',
                             f'visual/transformer/resblocks_{i}', vw, c.vision_heads,
                             c.mlp_ratio * vw)
  for i in range(c.text_layers):
    entries += _openai_block(f'transformer.resblocks.{i}', f'text/transformer/resblocks_{i}',
                             tw, c.text_heads, c.mlp_ratio * tw)
  return entries


def huggingface_names(config: CLIPConfig) -> list[Entry]:
  """Every tensor of a Hugging Face `CLIPModel` for `config` (buffers aside)."""
  c = config
  vw, tw, p = c.vision_width, c.text_width, c.patch_size
  v, t = 'vision_model', 'text_model'
  entries = [
      (f'{v}.embeddings.patch_embedding.weight', (vw, 3, p, p),
       {'visual/patch_embed/kernel': _conv}),
      (f'{v}.embeddings.class_embedding', (vw,), {'visual/class_embedding': _copy}),
      (f'{v}.embeddings.position_embedding.weight', (c.grid_size ** 2 + 1, vw),
       {'visual/positional_embedding': _copy}),
      *_layer_norm(f'{v}.pre_layrnorm', 'visual/ln_pre', vw),  # sic
      *_layer_norm(f'{v}.post_layernorm', 'visual/ln_post', vw),
      ('visual_projection.weight', (c.embed_dim, vw), {'visual/proj/kernel': _linear}),
      (f'{t}.embeddings.token_embedding.weight', (c.vocab_size, tw),
       {'text/token_embedding/embedding': _copy}),
      (f'{t}.embeddings.position_embedding.weight', (c.context_length, tw),
       {'text/positional_embedding': _copy}),
      *_layer_norm(f'{t}.final_layer_norm', 'text/ln_final', tw),
      ('text_projection.weight', (c.embed_dim, tw), {'text/text_projection/kernel': _linear}),
      ('logit_scale', (), {'logit_scale': _copy}),
  ]
  for i in range(c.vision_layers):
    entries += _hf_block(f'{v}.encoder.layers.{i}', f'visual/transformer/resblocks_{i}', vw,
                         c.vision_heads, c.mlp_ratio * vw)
  for i in range(c.text_layers):
    entries += _hf_block(f'{t}.encoder.layers.{i}', f'text/transformer/resblocks_{i}', tw,
                         c.text_heads, c.mlp_ratio * tw)
  return entries


# ---------------------------------------------------------------------------------------------
# Config inference.

def _shape(tensors: Mapping[str, Any], name: str, ndim: int) -> tuple[int, ...]:
  if name not in tensors:
    raise WeightsError(f'cannot infer the CLIP config: missing key {name!r}')
  shape = tuple(np.shape(tensors[name]))
  if len(shape) != ndim:
    raise WeightsError(f'cannot infer the CLIP config: {name!r} has shape {shape}, expected '
                       f'{ndim} dimensions')
  return shape


def _count_layers(tensors: Mapping[str, Any], prefix: str) -> int:
  pattern = re.compile(re.escape(prefix) + r'(\d+)\.')
  indices = {int(m.group(1)) for k in tensors if (m := pattern.match(k))}
  if not indices:
    raise WeightsError(f'cannot infer the CLIP config: no key starts with {prefix!r}<N>.')
  return max(indices) + 1  # a gap is reported as missing keys by the strict mapping


def _make_config(embed_dim, vision_width, patch, positions, vision_layers, context_length,
                 vocab_size, text_width, text_layers, name) -> CLIPConfig:
  grid = math.isqrt(positions - 1)
  if grid * grid != positions - 1:
    raise WeightsError(f'cannot infer the CLIP config: {name!r} has {positions} positions, '
                       'not a square grid plus the class token')
  for width in (vision_width, text_width):
    if width % HEAD_WIDTH:
      raise WeightsError(f'cannot infer the attention heads of width {width} (not a multiple of '
                         f'{HEAD_WIDTH}); pass a config')
  return CLIPConfig(embed_dim=embed_dim, image_size=grid * patch, patch_size=patch,
                    vision_width=vision_width, vision_layers=vision_layers,
                    vision_heads=vision_width // HEAD_WIDTH, context_length=context_length,
                    vocab_size=vocab_size, text_width=text_width, text_layers=text_layers,
                    text_heads=text_width // HEAD_WIDTH)


def infer_config(state_dict: Mapping[str, Any]) -> CLIPConfig:
  """The `CLIPConfig` of an OpenAI / open_clip state dict, from its shapes (heads = width / 64,
  QuickGELU)."""
  vision_width, _, patch, _ = _shape(state_dict, 'visual.conv1.weight', 4)
  vocab_size, text_width = _shape(state_dict, 'token_embedding.weight', 2)
  return _make_config(
      embed_dim=_shape(state_dict, 'text_projection', 2)[1], vision_width=vision_width,
      patch=patch, positions=_shape(state_dict, 'visual.positional_embedding', 2)[0],
      vision_layers=_count_layers(state_dict, 'visual.transformer.resblocks.'),
      context_length=_shape(state_dict, 'positional_embedding', 2)[0], vocab_size=vocab_size,
      text_width=text_width, text_layers=_count_layers(state_dict, 'transformer.resblocks.'),
      name='visual.positional_embedding')


def infer_huggingface_config(tensors: Mapping[str, Any]) -> CLIPConfig:
  """The `CLIPConfig` of Hugging Face `CLIPModel` tensors, from their shapes (heads = width /
  64, QuickGELU)."""
  vision_width, _, patch, _ = _shape(tensors, 'vision_model.embeddings.patch_embedding.weight',
                                     4)
  vocab_size, text_width = _shape(tensors, 'text_model.embeddings.token_embedding.weight', 2)
  positions = 'vision_model.embeddings.position_embedding.weight'
  return _make_config(
      embed_dim=_shape(tensors, 'text_projection.weight', 2)[0], vision_width=vision_width,
      patch=patch, positions=_shape(tensors, positions, 2)[0],
      vision_layers=_count_layers(tensors, 'vision_model.encoder.layers.'),
      context_length=_shape(tensors, 'text_model.embeddings.position_embedding.weight', 2)[0],
      vocab_size=vocab_size, text_width=text_width,
      text_layers=_count_layers(tensors, 'text_model.encoder.layers.'), name=positions)


# ---------------------------------------------------------------------------------------------
# Mapping.

def _to_params(tensors: Mapping[str, Any], entries: list[Entry], ignored: set[str],
               config: CLIPConfig, what: str) -> Params:
  """Our float32 params from `tensors` by `entries`; every problem reported at once."""
  expected = {name: shape for name, shape, _ in entries}
  missing = [n for n in expected if n not in tensors]
  unknown = [n for n in tensors if n not in expected and n not in ignored]
  wrong = [f'{n}: {tuple(np.shape(tensors[n]))}, expected {expected[n]}'
           for n in expected if n in tensors and tuple(np.shape(tensors[n])) != expected[n]]
  problems = []
  for title, items in (('missing keys', missing), ('unknown keys', unknown),
                       ('wrong shapes', wrong)):
    if items:
      problems.append(f'{len(items)} {title}:\n{listing(items)}')
  if problems:
    raise WeightsError(f'{what} does not match CLIP {config}:\n' + '\n'.join(problems))
  flat, non_finite = {}, []
  for name, _, targets in entries:
    array = np.asarray(tensors[name])
    if not np.issubdtype(array.dtype, np.floating):
      raise WeightsError(f'{what}: {name!r} has dtype {array.dtype}, expected floating point')
    with np.errstate(over='ignore'):  # a float64 beyond float32's range becomes inf: refused
      array = array.astype(np.float32)
    bad = array.size - int(np.count_nonzero(np.isfinite(array)))
    if bad:
      non_finite.append((name, bad, array.size))
      continue
    for path, convert in targets.items():
      flat[path] = np.array(convert(array), order='C')
  if non_finite:
    name, bad, size = non_finite[0]
    raise WeightsError(f'{what}: {len(non_finite)} tensor(s) hold NaN or inf values (first: '
                       f'{name!r}, {bad} of {size} values); refusing to use them')
  params = traverse_util.unflatten_dict(flat, sep='/')
  # Our own bookkeeping: the maps cover exactly the module's parameters.
  leaves = jax.tree_util.tree_flatten_with_path(model_lib.param_shapes(config))[0]
  shapes = {'/'.join(k.key for k in path): leaf.shape for path, leaf in leaves}
  assert shapes == {k: v.shape for k, v in flat.items()}, [
      (k, s, flat[k].shape) for k, s in shapes.items() if flat[k].shape != s]
  return params


def _check_metadata(state_dict: Mapping[str, Any], config: CLIPConfig) -> None:
  for name, field in _OPENAI_METADATA.items():
    if name in state_dict:
      value = np.asarray(state_dict[name])
      if value.shape != () or int(value) != getattr(config, field):
        raise WeightsError(f'{name!r} is {value!r} but the config has {field}='
                           f'{getattr(config, field)}')


def _what(kind: str, source: str | None) -> str:
  return kind if source is None else f'{source} ({kind})'


def from_torch_state_dict(state_dict: Mapping[str, np.ndarray], config: CLIPConfig | None = None,
                          source: str | None = None) -> tuple[CLIPConfig, Params]:
  """(config, params) of an OpenAI / open_clip CLIP state dict (torch names -> arrays).

  `config` None infers it from the shapes (`infer_config`). Accepts OpenAI's TorchScript
  metadata scalars (`input_resolution`, `context_length`, `vocab_size`) when they agree with
  the config. Raises `WeightsError` naming every missing, unknown or misshapen key, or the
  tensors holding NaN or inf values (weights that would poison training or ranking);
  `source` (the file) leads every message.
  """
  if config is None:
    config = infer_config(state_dict)
  _check_metadata(state_dict, config)
  params = _to_params(state_dict, openai_names(config), set(_OPENAI_METADATA), config,
                      _what('the OpenAI / open_clip state dict', source))
  return config, params


def from_huggingface(tensors: Mapping[str, np.ndarray], config: CLIPConfig | None = None,
                     source: str | None = None) -> tuple[CLIPConfig, Params]:
  """(config, params) of Hugging Face `CLIPModel` tensors (e.g. its `model.safetensors`).

  `config` None infers it from the shapes (`infer_huggingface_config`). The `position_ids`
  buffers are skipped; anything else unknown, missing or misshapen, or holding NaN or inf
  values, raises `WeightsError` (led by `source`, the file, when given).
  """
  if config is None:
    config = infer_huggingface_config(tensors)
  params = _to_params(tensors, huggingface_names(config), set(HF_BUFFERS), config,
                      _what('the Hugging Face CLIPModel tensors', source))
  return config, params


# ---------------------------------------------------------------------------------------------
# Files.

# OpenAI's released CLIP files by file name -> the SHA-256 OpenAI publishes for each (the
# hex directory of its download URL, https://openaipublic.azureedge.net/clip/models/<sha256>/
# <name>, as listed in openai/CLIP clip/clip.py).
OPENAI_SHA256 = {
    'RN50.pt': 'afeb0e10f9e5a86da6080e35cf09123aca3b358a0c3e3b6c78a7b63bc04b6762',
    'RN101.pt': '8fa8567bab74a42d41c5915025a8e4538c3bdbe8804a470a72f30b0d94fab599',
    'RN50x4.pt': '7e526bd135e493cef0776de27d5f42653e6b4c8bf9e0f653bb11773263205fdd',
    'RN50x16.pt': '52378b407f34354e150460fe41077663dd5b39c54cd0bfd2b27167a4a06ec9aa',
    'RN50x64.pt': 'be1cfb55d75a9666199fb2206c106743da0f6468c9d327f3e0d0a543a9919d9c',
    'ViT-B-32.pt': '40d365715913c9da98579312b702a82c18be219cc2a73407c4526f58eba950af',
    'ViT-B-16.pt': '5806e77cd80f8b59890b7e101eabd078d9fb84e6937f9e85e4ecb61988df416f',
    'ViT-L-14.pt': 'b8cca3fd41ae0c99ba7e8951adf17d267cdb84cd88be6f7c2e0eca1737a03836',
    'ViT-L-14-336px.pt': '3035c92b350959924f9f00213499208652fc7ea050643e8b385c2dac08641f02',
}


def verify_known_file(path: str) -> str | None:
  """Checks a file named as one of OpenAI's released CLIP files (`OPENAI_SHA256`, e.g.
  `ViT-B-32.pt`) against its published SHA-256 before it is read; raises `WeightsError`
  naming the file, the expected and the actual hash on a mismatch (a corrupt or substituted
  download). Returns the file's sha256 when it was checked, None for another name."""
  expected = OPENAI_SHA256.get(os.path.basename(path))
  if expected is None:
    return None
  actual = sha256_file(path)
  if actual != expected:
    raise WeightsError(f'{path}: not the file OpenAI published as {os.path.basename(path)}: its '
                       f'sha256 is {actual}, expected {expected} (a corrupt or substituted '
                       'download; download it again, or rename a file of other weights)')
  return actual

def _safetensors_entries(path: str, header: Mapping[str, Any], data_size: int
                         ) -> list[tuple[str, str, list[int], int, int]]:
  """(name, dtype name, shape, begin, end) of every tensor a safetensors header declares, each
  checked against the file's `data_size` data bytes, and no two sharing a byte."""
  entries = []
  for name, info in header.items():
    if name == '__metadata__':
      continue
    where = f'{path}: tensor {name!r}'
    if not isinstance(info, dict) or set(info) != {'dtype', 'shape', 'data_offsets'}:
      raise ValueError(f'{where}: expected dtype, shape and data_offsets, got {info!r:.200}')
    dtype = _SAFETENSORS_DTYPES.get(info['dtype'])
    if dtype is None:
      raise ValueError(f'{where}: unsupported dtype {info["dtype"]!r} (supported: '
                       f'{", ".join(_SAFETENSORS_DTYPES)})')
    shape, offsets = info['shape'], info['data_offsets']
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
      raise ValueError(f'{where}: bad shape {shape!r:.200}')
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(type(o) is int for o in offsets)):
      raise ValueError(f'{where}: bad data_offsets {offsets!r:.200}')
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
      raise ValueError(f'{where}: data_offsets [{begin}, {end}] lie outside the file\'s '
                       f'{data_size} data bytes (truncated?)')
    nbytes = math.prod(shape) * dtype.itemsize
    if end - begin != nbytes:
      raise ValueError(f'{where}: data_offsets [{begin}, {end}] hold {end - begin} bytes, '
                       f'but {info["dtype"]} {shape} needs {nbytes}')
    entries.append((name, info['dtype'], shape, begin, end))
  # Tensors sharing bytes would each be read (and allocated) in full: 80 tensors on one 64 MiB
  # range would take 80 x 64 MiB. The format gives each tensor its own bytes; anything else is
  # refused here, so what is read never exceeds the file.
  ranges = sorted((begin, end, name) for name, _, _, begin, end in entries if end > begin)
  for (begin_a, end_a, name_a), (begin_b, end_b, name_b) in zip(ranges, ranges[1:]):
    if begin_b < end_a:
      raise ValueError(f'{path}: tensor {name_b!r} (data_offsets [{begin_b}, {end_b}]) overlaps '
                       f'tensor {name_a!r} ([{begin_a}, {end_a}]); each tensor of a safetensors '
                       'file must have its own bytes (refused before reading any)')
  return entries


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """The tensors of a `.safetensors` file as numpy arrays (BF16 widened to float32).

  The format: an 8-byte little-endian header length N, N bytes of JSON mapping each name to
  `{dtype, shape, data_offsets: [begin, end]}` (offsets into the data after the header), then
  the little-endian data. The header length, every offset and every size are checked against
  the file, and the tensors' byte ranges for overlap, before anything is read: the arrays
  returned hold at most the file's data bytes (twice that for BF16, widened). Raises
  `ValueError` naming the file (and tensor).
  """
  size = os.path.getsize(path)
  with open(path, 'rb') as f:
    prefix = f.read(8)
    if len(prefix) < 8:
      raise ValueError(f'{path}: truncated safetensors file ({size} bytes, no header length)')
    (header_len,) = struct.unpack('<Q', prefix)
    if header_len > min(size - 8, MAX_SAFETENSORS_HEADER_BYTES):
      raise ValueError(f'{path}: safetensors header length {header_len} exceeds the file '
                       f'({size} bytes) or {MAX_SAFETENSORS_HEADER_BYTES} bytes; truncated or '
                       'not a safetensors file')
    try:
      header = json.loads(f.read(header_len).decode('utf-8'))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise ValueError(f'{path}: the safetensors header is not JSON: {e}') from None
    if not isinstance(header, dict):
      raise ValueError(f'{path}: the safetensors header is not a JSON object')
    data_start, data_size = 8 + header_len, size - 8 - header_len
    tensors = {}
    for name, dtype_name, shape, begin, end in _safetensors_entries(path, header, data_size):
      dtype = _SAFETENSORS_DTYPES[dtype_name]
      buffer = bytearray(end - begin)
      f.seek(data_start + begin)
      if f.readinto(buffer) != end - begin:
        raise ValueError(f'{path}: tensor {name!r}: the file ended while reading it')
      array = np.frombuffer(buffer, dtype).reshape(shape)
      if dtype_name == 'BF16':  # bfloat16 is the upper half of a float32
        tensors[name] = (array.astype(np.uint32) << 16).view(np.float32)
      else:
        tensors[name] = array.astype(dtype.newbyteorder('='), copy=False)
  return tensors


def _is_torchscript(path: str) -> bool:
  if not zipfile.is_zipfile(path):
    return False
  with zipfile.ZipFile(path) as archive:
    return any(n.endswith('/constants.pkl') or '/code/' in n for n in archive.namelist())


def load(path: str, config: CLIPConfig | None = None) -> tuple[CLIPConfig, Params]:
  """(config, params) of a CLIP checkpoint file.

  `.safetensors` (read by `read_safetensors`) and `.pt` / `.pth` / `.bin` torch files (read by
  `prvr_jax.torch_file.load_torch_checkpoint`, a state dict or a dict holding it under
  'state_dict'). The names say which mapping applies: Hugging Face `CLIPModel`
  (`vision_model.*`, `text_model.*`; or under `clip.` in a T-MASS checkpoint, whose CLIP is
  taken and head left) or OpenAI / open_clip (`visual.*`, ...). Every weight
  must be finite (as official PRVR checkpoints must be): a NaN or inf is refused naming the
  file and the tensor, whichever reader read it. OpenAI's
  released TorchScript archives are refused (reading them means running their code): re-save
  their state dict once with torch. A file named as one of OpenAI's releases
  (`OPENAI_SHA256`) is first checked against its published SHA-256 (`verify_known_file`).
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{path} does not exist (or is not a file)')
  verify_known_file(path)
  suffix = os.path.splitext(path)[1].lower()
  if suffix == '.safetensors':
    tensors = read_safetensors(path)
  elif suffix in ('.pt', '.pth', '.bin'):
    if _is_torchscript(path):
      raise ValueError(
          f'{path} is a TorchScript archive (as OpenAI\'s released ViT-B-32.pt); its weights '
          'are not read, since that means running code from the file. Re-save its state dict '
          'once with torch: torch.save(torch.jit.load(path, map_location="cpu").state_dict(), '
          '"ViT-B-32.state_dict.pt") (or open_clip.create_model("ViT-B-32-quickgelu", '
          'pretrained="openai").state_dict()), then load that file.')
    tensors = torch_file.load_torch_checkpoint(path)
  else:
    raise ValueError(f'{path}: unknown CLIP checkpoint suffix {suffix!r} (expected .safetensors, '
                     '.pt, .pth or .bin)')
  tensors = torch_file.strip_module_prefix(tensors)
  if any(k.startswith(TMASS_CLIP_PREFIX + 'vision_model.') for k in tensors):
    # A T-MASS checkpoint: its fine-tuned CLIP (the head is the model's, not CLIP's: read the
    # whole model with `--checkpoint` instead).
    tensors = {k[len(TMASS_CLIP_PREFIX):]: v for k, v in tensors.items()
               if k.startswith(TMASS_CLIP_PREFIX)}
  if any(k.startswith(('vision_model.', 'text_model.')) for k in tensors):
    return from_huggingface(tensors, config, source=path)
  return from_torch_state_dict(tensors, config, source=path)


RANDOM_PREFIX = 'random:'


def load_spec(spec: str) -> tuple[CLIPConfig, Params]:
  """(config, params) of a `--clip_weights` value: a CLIP file (`load`), or
  'random:<backbone>[:<seed>]' (backbone 'tiny' or a key of `model.CONFIGS`, seed default 0):
  random-initialised weights for tests, demos and throughput runs (no download). Errors name
  the value."""
  if not spec.startswith(RANDOM_PREFIX):
    return load(spec)
  backbone, _, seed = spec[len(RANDOM_PREFIX):].partition(':')
  try:
    config = model_lib.backbone_config(backbone)
    seed = int(seed or 0)
  except ValueError:
    raise ValueError(f'--clip_weights={spec}: expected {RANDOM_PREFIX}<backbone>[:<seed>], '
                     f"backbone 'tiny' or one of {sorted(model_lib.CONFIGS)}") from None
  init = jax.jit(model_lib.CLIP(config).init)
  return config, init(jax.random.key(seed), *model_lib.example_inputs(config))['params']


def into_model(params: Params, clip_params: Params, source: str = 'the CLIP weights') -> Params:
  """A model's params with CLIP's `visual`, `text` and `logit_scale` replaced by
  `clip_params` (a model that holds CLIP's towers under those names, e.g. T-MASS end to end);
  every replaced tree must have the model's shapes."""
  merged = dict(params)
  for name in ('visual', 'text', 'logit_scale'):
    if name not in params:
      raise WeightsError(f'the model has no {name!r} parameters to take from {source}')
    ours = jax.tree.map(np.shape, params[name])
    theirs = jax.tree.map(np.shape, clip_params[name])
    if ours != theirs:
      raise WeightsError(f'{source}: {name} does not fit the model ({theirs} vs {ours})')
    merged[name] = jax.tree.map(np.asarray, clip_params[name])
  return merged
