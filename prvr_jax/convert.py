r"""Official PyTorch checkpoints <-> prvr_jax parameters, for every model with an official format.

Reading: `load_torch_checkpoint` accepts the official checkpoints (GMMFormer's and AMDNet's
`best.ckpt`, a dict with `state_dict` written by their `save_ckpt`; MS-SL's
`model.ckpt`, a dict with `model` and its EasyDict `model_cfg`) or a bare state_dict file.
With torch installed it uses `torch.load(..., weights_only=True)`; without torch a restricted
reader of the torch zip format builds numpy arrays from the storage records. Neither executes
code from the file: the only globals admitted are the tensor-rebuild functions, storage types
and `OrderedDict`, plus the official BertAdam schedule classes (in `optimizer.param_groups`)
and MS-SL's `easydict.EasyDict` config, which are replaced by inert placeholders.

Mapping (`torch_to_params` / `params_to_torch`): each model declares its name map
(`ModelSpec.official`, built from `prvr_jax.models.torch_names`): Dense kernels are torch
`weight.T`, LayerNorm `scale`/`bias` are torch `weight`/`bias`, the K parallel blocks
`attn0..attnK-1` of a GMM block are stacked on the leading axis of `branches`.

  python -m prvr_jax.convert --model=gmmformer_v2 --checkpoint=best.ckpt --out=params.msgpack
  python -m prvr_jax.convert --model=gmmformer_v2 --params=params.msgpack --out=state_dict.npz
"""

import collections
import dataclasses
import io
import math
import os
import pickle
import re
import zipfile
from typing import Any

from flax import traverse_util
import jax
import ml_collections
import numpy as np

from prvr_jax import files
from prvr_jax.files import short
from prvr_jax.models import registry
from prvr_jax.models.spec import OfficialCheckpoint

# ---------------------------------------------------------------------------------------------
# Reading torch checkpoints.

# Storage class name -> numpy dtype (bfloat16 is widened to float32 by `_storage_array`).
_STORAGE_DTYPES = {
    'FloatStorage': np.float32, 'DoubleStorage': np.float64, 'HalfStorage': np.float16,
    'BFloat16Storage': 'bfloat16', 'LongStorage': np.int64, 'IntStorage': np.int32,
    'ShortStorage': np.int16, 'CharStorage': np.int8, 'ByteStorage': np.uint8,
    'BoolStorage': np.bool_,
}
# The official optimizer state holds one of these schedule objects per param group.
_OFFICIAL_SCHEDULES = ('ConstantLR', 'WarmupCosineSchedule', 'WarmupCosineWithHardRestartsSchedule',
                       'WarmupCosineWithWarmupRestartsSchedule', 'WarmupConstantSchedule',
                       'WarmupLinearSchedule')
_OFFICIAL_SCHEDULE_MODULE = 'Opts.optimization'
# MS-SL's checkpoint stores its config as an EasyDict (a dict subclass).
_OFFICIAL_CONFIG_CLASS = ('easydict', 'EasyDict')


class OfficialObject:
  """Inert stand-in for a non-tensor object of the official code (e.g. its LR schedule).

  Accepts any constructor arguments and keeps the pickled state as attributes; it has no
  behaviour, so loading it runs no code from the checkpoint.
  """

  def __init__(self, *args, **kwargs):
    del args, kwargs

  def __setstate__(self, state):
    if isinstance(state, dict):
      self.__dict__.update(state)


# Inert stand-ins: the schedules become `OfficialObject`s, MS-SL's EasyDict an `OrderedDict`
# (the one dict type whose items and attribute state both readers, ours and torch's
# weights-only unpickler, restore without running code).
_OFFICIAL_GLOBALS = {
    **{(_OFFICIAL_SCHEDULE_MODULE, name): OfficialObject for name in _OFFICIAL_SCHEDULES},
    _OFFICIAL_CONFIG_CLASS: collections.OrderedDict,
}


@dataclasses.dataclass(frozen=True)
class _StorageType:
  name: str


# Bounds checked before anything is read or allocated. The pickle of a state_dict (names and
# tensor headers) is a few hundred KB; tensor data must be exactly what the headers declare.
MAX_PICKLE_BYTES = 64 << 20
MAX_SMALL_RECORD_BYTES = 64


@dataclasses.dataclass(frozen=True)
class _StorageStub:
  """A storage's element count and dtype, for the validation pass (no data read)."""
  size: int
  dtype: np.dtype


def _rebuild_tensor(storage, storage_offset, size, stride, requires_grad=False,
                    backward_hooks=None, metadata=None):
  """`torch._utils._rebuild_tensor_v2` on a numpy storage: a copied strided view (None for a
  `_StorageStub`). A tensor must address only elements of its storage and hold no more
  elements than it has (no zero or overlapping strides), so copying it costs no more memory
  than the file's own data."""
  del requires_grad, backward_hooks, metadata
  size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
  if len(size) != len(stride) or any(s < 0 for s in size + stride) or storage_offset < 0:
    raise pickle.UnpicklingError(f'bad tensor record: size {size}, stride {stride}, '
                                 f'offset {storage_offset}')
  numel = math.prod(size)
  if numel > storage.size:
    raise pickle.UnpicklingError(f'a tensor of size {size} (stride {stride}) declares {numel} '
                                 f'elements but its storage holds {storage.size}')
  if numel and storage_offset + sum((n - 1) * s for n, s in zip(size, stride)) >= storage.size:
    raise pickle.UnpicklingError(f'tensor of size {size} / stride {stride} at offset '
                                 f'{storage_offset} overruns its storage of {storage.size}')
  if isinstance(storage, _StorageStub):
    return None
  if not numel:
    return np.zeros(size, storage.dtype)
  itemsize = storage.dtype.itemsize
  view = np.lib.stride_tricks.as_strided(storage[storage_offset:], size,
                                         tuple(s * itemsize for s in stride), writeable=False)
  return np.array(view)


def _rebuild_parameter(data, requires_grad=False, backward_hooks=None):
  del requires_grad, backward_hooks
  return data


_TORCH_GLOBALS = {
    ('collections', 'OrderedDict'): collections.OrderedDict,
    ('torch._utils', '_rebuild_tensor_v2'): _rebuild_tensor,
    ('torch._utils', '_rebuild_parameter'): _rebuild_parameter,
    **{('torch', name): _StorageType(name) for name in _STORAGE_DTYPES},
    **_OFFICIAL_GLOBALS,
}


def _record(archive: zipfile.ZipFile, name: str, limit: int, path: str,
            exact: bool = False) -> zipfile.ZipInfo:
  """Record `name`, refused (before inflating anything) when its declared size exceeds
  `limit` (differs from it with `exact`)."""
  try:
    info = archive.getinfo(name)
  except KeyError:
    raise pickle.UnpicklingError(f'{path}: missing record {name}') from None
  if info.file_size > limit or (exact and info.file_size != limit):
    expected = f'{limit} bytes' if exact else f'at most {limit} bytes'
    raise pickle.UnpicklingError(
        f'{path}: record {name} declares {info.file_size} bytes, expected {expected} from its '
        'header; the file is not a well-formed torch checkpoint (refused before reading it)')
  return info


class _RestrictedUnpickler(pickle.Unpickler):
  """Unpickles `data.pkl` of a torch zip checkpoint, admitting only `_TORCH_GLOBALS`.

  With `materialize=False` storages are not read: every tensor header is checked against
  its storage record's declared size, and tensors come back as None.
  """

  def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str, byteorder: str,
               path: str, materialize: bool):
    super().__init__(io.BytesIO(data))
    self._archive, self._prefix, self._byteorder, self._path = archive, prefix, byteorder, path
    self._materialize = materialize
    self._storages: dict[str, np.ndarray | _StorageStub] = {}

  def find_class(self, module: str, name: str) -> Any:
    try:
      return _TORCH_GLOBALS[(module, name)]
    except KeyError:
      raise pickle.UnpicklingError(
          f'{self._path}: refusing to load global {short(f"{module}.{name}", quote=False)}: prvr_jax reads '
          'only tensors, storages and plain containers (a state_dict, or the official '
          "checkpoint's dict with one), and never runs code from a checkpoint") from None

  def persistent_load(self, pid: Any) -> np.ndarray | _StorageStub:
    if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == 'storage'
            and isinstance(pid[1], _StorageType) and isinstance(pid[4], int) and pid[4] >= 0):
      raise pickle.UnpicklingError(f'{self._path}: unexpected persistent id {short(pid)}')
    _, storage_type, key, _, numel = pid  # the location (e.g. 'cuda:0') is irrelevant here
    key = str(key)
    if key not in self._storages:
      self._storages[key] = self._storage(storage_type.name, key, numel)
    return self._storages[key]

  def _storage(self, type_name: str, key: str, numel: int) -> np.ndarray | _StorageStub:
    dtype = _STORAGE_DTYPES[type_name]
    record_dtype = np.dtype('uint16' if dtype == 'bfloat16' else dtype)
    info = _record(self._archive, f'{self._prefix}data/{key}', numel * record_dtype.itemsize,
                   self._path, exact=True)
    if not self._materialize:
      return _StorageStub(numel, np.dtype(np.float32 if dtype == 'bfloat16' else dtype))
    array = np.frombuffer(self._archive.read(info),
                          dtype=record_dtype.newbyteorder(self._byteorder))
    if dtype == 'bfloat16':
      array = (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(array.dtype.newbyteorder('='))


def read_torch_zip(path: str, materialize: bool = True) -> Any:
  """The object saved by `torch.save` at `path`, read without torch; tensors become numpy.

  Nothing is inflated or allocated beyond what the file's headers declare, and those are
  checked first: the pickle is at most `MAX_PICKLE_BYTES`, every storage record holds exactly
  its declared elements, every tensor lies inside its storage. `materialize=False` only
  checks (tensors come back as None).

  Raises `pickle.UnpicklingError` (naming the file) for anything but tensors, storages and
  plain containers or for malformed records, `ValueError` for files that are not torch zip
  checkpoints.
  """
  if not zipfile.is_zipfile(path):
    raise ValueError(f'{path} is not a torch zip checkpoint (torch >= 1.6 format); '
                     'legacy torch files are not supported')
  with zipfile.ZipFile(path) as archive:
    pickles = [n for n in archive.namelist() if n.endswith('data.pkl') and n.count('/') <= 1]
    if len(pickles) != 1:
      raise ValueError(f'{path}: expected one data.pkl record in the torch zip, found '
                       f'{short(pickles)}')
    prefix = pickles[0][:-len('data.pkl')]
    byteorder = 'little'
    if prefix + 'byteorder' in set(archive.namelist()):
      byteorder = archive.read(_record(archive, prefix + 'byteorder', MAX_SMALL_RECORD_BYTES,
                                       path)).decode(errors='replace').strip()
    if byteorder not in ('little', 'big'):
      raise ValueError(f'{path}: unknown byteorder {short(byteorder)}')
    byteorder = '<' if byteorder == 'little' else '>'
    data = archive.read(_record(archive, pickles[0], MAX_PICKLE_BYTES, path))
    return _RestrictedUnpickler(data, archive, prefix, byteorder, path, materialize).load()


def _torch_load(path: str) -> Any:
  """`torch.load(weights_only=True)` that also admits the official schedule and config classes
  as inert placeholders; tensors become numpy. The file first passes `read_torch_zip`'s checks,
  so torch never reads a record larger than declared or builds a tensor beyond its storage."""
  import torch  # pylint: disable=g-import-not-at-top
  read_torch_zip(path, materialize=False)
  placeholders = [(cls, f'{module}.{name}') for (module, name), cls in _OFFICIAL_GLOBALS.items()]
  with torch.serialization.safe_globals(placeholders):
    obj = torch.load(path, map_location='cpu', weights_only=True)

  def to_numpy(x):
    if isinstance(x, torch.Tensor):
      x = x.detach()
      return (x.float() if x.dtype == torch.bfloat16 else x).numpy().copy()
    if isinstance(x, dict):
      return type(x)((k, to_numpy(v)) for k, v in x.items())
    if isinstance(x, (list, tuple)):
      return type(x)(to_numpy(v) for v in x)
    return x
  return to_numpy(obj)


def _torch_available() -> bool:
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    return False
  return hasattr(torch.serialization, 'safe_globals')


# Where the official checkpoints keep the state_dict: GMMFormer / AMDNet `save_ckpt`, MS-SL.
_STATE_DICT_ENTRIES = ('state_dict', 'model')


def load_torch_checkpoint(path: str, use_torch: bool | None = None) -> dict[str, np.ndarray]:
  """The state_dict (torch names -> numpy arrays) of an official checkpoint or state_dict file.

  Args:
    path: an official checkpoint (a dict with the state_dict under 'state_dict' or 'model')
      or a state_dict written by `torch.save`.
    use_torch: read with torch (True), with the torch-free reader (False), or torch when it
      is importable (None).
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{path} does not exist (or is not a file)')
  if use_torch is None:
    use_torch = _torch_available()
  obj = _torch_load(path) if use_torch else read_torch_zip(path)
  for entry in _STATE_DICT_ENTRIES:
    if isinstance(obj, dict) and isinstance(obj.get(entry), dict):
      obj = obj[entry]
      break
  if not isinstance(obj, dict) or not all(isinstance(v, np.ndarray) for v in obj.values()):
    raise ValueError(f'{path} holds neither a state_dict nor a dict with one under '
                     f'{" or ".join(repr(e) for e in _STATE_DICT_ENTRIES)}')
  return {str(k): v for k, v in obj.items()}


# ---------------------------------------------------------------------------------------------
# Name mapping.

def _flatten(tree: Any) -> dict[tuple[str, ...], Any]:
  return {tuple(str(getattr(k, 'key', k)) for k in path): leaf
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def _to_ours(array: np.ndarray, kind: str, shape: tuple[int, ...]) -> np.ndarray:
  if kind == 'transpose':
    return array.T if array.ndim == 2 else array
  if kind == 'reshape' and array.size == int(np.prod(shape)):
    return array.reshape(shape)
  return array


def _to_torch(array: np.ndarray, kind: str, torch_shape: tuple[int, ...]) -> np.ndarray:
  if kind == 'transpose':
    return array.T
  if kind == 'reshape':
    return array.reshape(torch_shape)
  return array


def _fmt(path: tuple[str, ...]) -> str:
  return '/'.join(path)


def official_format(model_name: str) -> OfficialCheckpoint:
  """The official-checkpoint description of a registered model; errors for models without."""
  spec = registry.get_spec(model_name)
  if spec.official is None:
    raise ValueError(f'{model_name} has no official PyTorch checkpoint format; convertible '
                     f'models: {convertible_models()}')
  return spec.official


def convertible_models() -> list[str]:
  """Registered models that read official PyTorch checkpoints."""
  return [n for n in registry.names() if registry.get_spec(n).official is not None]


def infer_model_config(state_dict: dict[str, np.ndarray],
                       model_name: str) -> ml_collections.ConfigDict:
  """A `config.model` with the dims an official state_dict determines (the model's defaults
  for the rest)."""
  fields = official_format(model_name).infer_config(_strip_module_prefix(state_dict))
  return ml_collections.ConfigDict({'name': model_name, **fields})


def _strip_module_prefix(state_dict: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """Drops the 'module.' prefix of checkpoints saved from `nn.DataParallel`."""
  if state_dict and all(k.startswith('module.') for k in state_dict):
    return {k[len('module.'):]: v for k, v in state_dict.items()}
  return state_dict


def torch_to_params(state_dict: dict[str, np.ndarray], model_name: str,
                    config_model: Any = None) -> dict[str, Any]:
  """Official state_dict (torch names -> arrays) -> our params tree.

  Every tensor is used exactly once and every shape is checked against `jax.eval_shape` of
  our model's init for `config_model` (default: `infer_model_config`). Raises one ValueError
  listing all missing, unused and mis-shaped keys.
  """
  state_dict = _strip_module_prefix(dict(state_dict))
  if config_model is None:
    config_model = infer_model_config(state_dict, model_name)
  config_model = ml_collections.ConfigDict(
      config_model.to_dict() if isinstance(config_model, ml_collections.ConfigDict)
      else dict(config_model))
  if config_model.get('name', model_name) != model_name:
    raise ValueError(f'config_model.name {config_model.name!r} != model_name {model_name!r}')
  config_model.name = model_name
  shapes = registry.get_spec(model_name).param_shapes(config_model)
  expected = _flatten(shapes)
  leaves = official_format(model_name).names(shapes)

  flat, missing, misshaped, used = {}, [], [], set()
  for leaf in leaves:
    want = expected.get(leaf.path)
    if want is None:
      missing.append(f'our {_fmt(leaf.path)} (for torch {leaf.names[0]}) is not a parameter '
                     f'of {model_name} with this config_model')
      continue
    want_shape = tuple(want.shape[1:] if leaf.stacked else want.shape)
    arrays = []
    for name in leaf.names:
      if name not in state_dict:
        missing.append(f'{name} (-> {_fmt(leaf.path)}, expected shape {want_shape})')
        continue
      used.add(name)
      array = _to_ours(np.asarray(state_dict[name]), leaf.kind, want_shape)
      if tuple(array.shape) != want_shape:
        misshaped.append(f'{name} {tuple(np.shape(state_dict[name]))} -> {_fmt(leaf.path)} '
                         f'expects {want_shape}' + (' per branch' if leaf.stacked else ''))
        continue
      arrays.append(array.astype(want.dtype))
    if len(arrays) == len(leaf.names):
      flat[leaf.path] = np.stack(arrays) if leaf.stacked else arrays[0]
  unused = [f'{k} {tuple(np.shape(v))}' for k, v in state_dict.items() if k not in used]
  unmapped = [f'{_fmt(p)} {tuple(s.shape)}' for p, s in expected.items()
              if p not in {leaf.path for leaf in leaves}]
  problems = [(title, items) for title, items in (
      ('missing torch keys', missing), ('unused torch keys', unused),
      ('mis-shaped torch keys', misshaped),
      (f'parameters of our {model_name} without an official counterpart', unmapped)) if items]
  if problems:
    raise ValueError(f'cannot convert the state_dict to {model_name} params:\n' + '\n'.join(
        f'  {title} ({len(items)}):\n' + files.listing(items, indent='    ', line_chars=120)
        for title, items in problems))
  return traverse_util.unflatten_dict(flat)


def params_to_torch(params: Any, model_name: str) -> dict[str, np.ndarray]:
  """Our params tree -> official state_dict (torch names -> numpy arrays, torch layouts)."""
  flat = {path: np.asarray(leaf) for path, leaf in _flatten(params).items()}
  leaves = official_format(model_name).names(params)
  known = {leaf.path for leaf in leaves}
  if set(flat) != known:
    raise ValueError(
        f'params do not match the official {model_name}: missing '
        f'{sorted(_fmt(p) for p in known - set(flat))}, '
        f'without an official counterpart {sorted(_fmt(p) for p in set(flat) - known)}')
  out = {}
  for leaf in leaves:
    array = flat[leaf.path]
    parts = list(array) if leaf.stacked else [array]
    torch_shape = (1, 1) + array.shape if leaf.kind == 'reshape' else None
    for name, part in zip(leaf.names, parts, strict=True):
      out[name] = np.ascontiguousarray(_to_torch(part, leaf.kind, torch_shape))
  return out


def torch_names(params: Any, model_name: str) -> Any:
  """Pytree like `params` of the official name of each leaf.

  Stacked branch leaves stand for `attn0..attnK-1` and are named with `attn*`, e.g.
  'clip_encoder.attn*.self.query.weight'. Leaves with no official counterpart (ablation
  options such as the `weighted` aggregation's `branch_logits`) keep their own path joined
  with dots.
  """
  names = {leaf.path: (re.sub(r'attn0\.', 'attn*.', leaf.names[0], count=1) if leaf.stacked
                       else leaf.names[0]) for leaf in official_format(model_name).names(params)}

  def name_of(path, _):
    key = tuple(str(getattr(k, 'key', k)) for k in path)
    return names.get(key, '.'.join(key))
  return jax.tree_util.tree_map_with_path(name_of, params)


# ---------------------------------------------------------------------------------------------
# Command line.

def main(argv):
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top
  from flax import serialization  # pylint: disable=g-import-not-at-top
  args = flags.FLAGS
  if bool(args.checkpoint) == bool(args.params):
    raise ValueError('pass exactly one of --checkpoint (torch -> msgpack) and --params '
                     '(msgpack -> torch names)')
  if args.checkpoint:
    state_dict = load_torch_checkpoint(args.checkpoint)
    bad = [k for k, v in state_dict.items() if not np.isfinite(v).all()]
    if bad:
      raise ValueError(f'{args.checkpoint}: {len(bad)} tensor(s) hold NaN or inf values '
                       f'(first: {short(bad[0], quote=False)}); refusing to convert them')
    params = torch_to_params(state_dict, args.model)
    files.write_atomic(args.out, lambda f: f.write(serialization.msgpack_serialize(params)))
    print(f'wrote {args.out}: {sum(x.size for x in jax.tree_util.tree_leaves(params)):,} '
          f'{args.model} parameters')
    return
  if not args.out.endswith('.npz') and not _torch_available():
    raise ValueError(f'--out={args.out}: writing a torch file needs torch installed; write an '
                     '.npz instead')
  with open(args.params, 'rb') as f:
    params = serialization.msgpack_restore(f.read())
  state_dict = params_to_torch(params.get('params', params), args.model)
  if args.out.endswith('.npz'):
    files.write_atomic(args.out, lambda f: np.savez(f, **state_dict))
  else:
    import torch  # pylint: disable=g-import-not-at-top
    tensors = collections.OrderedDict((k, torch.from_numpy(v)) for k, v in state_dict.items())
    files.write_atomic(args.out, lambda f: torch.save(tensors, f))
  print(f'wrote {args.out}: {len(state_dict)} official {args.model} tensors')


if __name__ == '__main__':
  from absl import app, flags  # pylint: disable=g-import-not-at-top,g-multiple-import
  flags.DEFINE_enum('model', None, convertible_models(), 'model name', required=True)
  flags.DEFINE_string('checkpoint', None, 'official best.ckpt or state_dict file to convert')
  flags.DEFINE_string('params', None, 'flax msgpack params to export to torch names')
  flags.DEFINE_string('out', None, '.msgpack (import); .npz or a torch file (export)',
                      required=True)
  app.run(main)
