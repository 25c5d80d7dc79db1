r"""Official PyTorch checkpoints <-> prvr_jax parameters, for every model with an official format.

Reading: `load_torch_checkpoint` accepts the official `best.ckpt` (a dict with `state_dict`,
written by the official `save_ckpt`) or a bare state_dict file. With torch installed it uses
`torch.load(..., weights_only=True)`; without torch a restricted reader of the torch zip format
builds numpy arrays from the storage records. Neither executes code from the file: the only
globals admitted are the tensor-rebuild functions, storage types and `OrderedDict`, plus the
official BertAdam schedule classes (stored in `optimizer.param_groups`), which are replaced by
an inert placeholder.

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
import pickle
import re
import zipfile
from typing import Any

import jax
import ml_collections
import numpy as np

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


@dataclasses.dataclass(frozen=True)
class _StorageType:
  name: str


def _rebuild_tensor(storage, storage_offset, size, stride, requires_grad=False,
                    backward_hooks=None, metadata=None):
  """`torch._utils._rebuild_tensor_v2` on a numpy storage: a copied strided view."""
  del requires_grad, backward_hooks, metadata
  size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
  if len(size) != len(stride) or any(s < 0 for s in size + stride) or storage_offset < 0:
    raise pickle.UnpicklingError(f'bad tensor record: size {size}, stride {stride}, '
                                 f'offset {storage_offset}')
  if any(s == 0 for s in size):
    return np.zeros(size, storage.dtype)
  last = storage_offset + sum((n - 1) * s for n, s in zip(size, stride))
  if last >= storage.size:
    raise pickle.UnpicklingError(f'tensor of size {size} / stride {stride} at offset '
                                 f'{storage_offset} overruns its storage of {storage.size}')
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
    **{(_OFFICIAL_SCHEDULE_MODULE, name): OfficialObject for name in _OFFICIAL_SCHEDULES},
}


class _RestrictedUnpickler(pickle.Unpickler):
  """Unpickles `data.pkl` of a torch zip checkpoint, admitting only `_TORCH_GLOBALS`."""

  def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str, byteorder: str,
               path: str):
    super().__init__(io.BytesIO(data))
    self._archive, self._prefix, self._byteorder, self._path = archive, prefix, byteorder, path
    self._storages: dict[str, np.ndarray] = {}

  def find_class(self, module: str, name: str) -> Any:
    try:
      return _TORCH_GLOBALS[(module, name)]
    except KeyError:
      raise pickle.UnpicklingError(
          f'{self._path}: refusing to load global {module}.{name}; a torch checkpoint holds '
          'only tensors, storages and plain containers') from None

  def persistent_load(self, pid: Any) -> np.ndarray:
    if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == 'storage'
            and isinstance(pid[1], _StorageType)):
      raise pickle.UnpicklingError(f'{self._path}: unexpected persistent id {pid!r}')
    _, storage_type, key, _, numel = pid  # the location (e.g. 'cuda:0') is irrelevant here
    if key not in self._storages:
      self._storages[key] = self._storage_array(storage_type.name, str(key), int(numel))
    return self._storages[key]

  def _storage_array(self, type_name: str, key: str, numel: int) -> np.ndarray:
    record = f'{self._prefix}data/{key}'
    try:
      raw = self._archive.read(record)
    except KeyError:
      raise pickle.UnpicklingError(f'{self._path}: missing storage record {record}') from None
    dtype = _STORAGE_DTYPES[type_name]
    if dtype == 'bfloat16':
      bits = np.frombuffer(raw, dtype=np.dtype('uint16').newbyteorder(self._byteorder))
      array = (bits.astype(np.uint32) << 16).view(np.float32)
    else:
      array = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder(self._byteorder))
    if array.size != numel:
      raise pickle.UnpicklingError(f'{self._path}: storage {record} holds {array.size} '
                                   f'elements, its header says {numel}')
    return array.astype(array.dtype.newbyteorder('='))


def read_torch_zip(path: str) -> Any:
  """The object saved by `torch.save` at `path`, read without torch; tensors become numpy.

  Raises `pickle.UnpicklingError` (naming the file) for anything but tensors, storages and
  plain containers, and `ValueError` for files that are not torch zip checkpoints.
  """
  if not zipfile.is_zipfile(path):
    raise ValueError(f'{path} is not a torch zip checkpoint (torch >= 1.6 format); '
                     'legacy torch files are not supported')
  with zipfile.ZipFile(path) as archive:
    pickles = [n for n in archive.namelist() if n.endswith('data.pkl') and n.count('/') <= 1]
    if len(pickles) != 1:
      raise ValueError(f'{path}: expected one data.pkl record in the torch zip, found {pickles}')
    prefix = pickles[0][:-len('data.pkl')]
    names = set(archive.namelist())
    byteorder = 'little'
    if prefix + 'byteorder' in names:
      byteorder = archive.read(prefix + 'byteorder').decode().strip()
    if byteorder not in ('little', 'big'):
      raise ValueError(f'{path}: unknown byteorder {byteorder!r}')
    byteorder = '<' if byteorder == 'little' else '>'
    return _RestrictedUnpickler(archive.read(pickles[0]), archive, prefix, byteorder,
                                path).load()


def _torch_load(path: str) -> Any:
  """`torch.load(weights_only=True)` that also admits the official schedule classes as inert
  placeholders; tensors become numpy."""
  import torch  # pylint: disable=g-import-not-at-top
  placeholders = [(OfficialObject, f'{_OFFICIAL_SCHEDULE_MODULE}.{name}')
                  for name in _OFFICIAL_SCHEDULES]
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


def load_torch_checkpoint(path: str, use_torch: bool | None = None) -> dict[str, np.ndarray]:
  """The state_dict (torch names -> numpy arrays) of an official checkpoint or state_dict file.

  Args:
    path: the official `best.ckpt` (a dict with 'state_dict') or a `torch.save`d state_dict.
    use_torch: read with torch (True), with the torch-free reader (False), or torch when it
      is importable (None).
  """
  if use_torch is None:
    use_torch = _torch_available()
  obj = _torch_load(path) if use_torch else read_torch_zip(path)
  if isinstance(obj, dict) and 'state_dict' in obj:
    obj = obj['state_dict']
  if not isinstance(obj, dict) or not all(isinstance(v, np.ndarray) for v in obj.values()):
    raise ValueError(f'{path} holds neither a state_dict nor a dict with a "state_dict" entry')
  return {str(k): v for k, v in obj.items()}


# ---------------------------------------------------------------------------------------------
# Name mapping.

def _flatten(tree: Any) -> dict[tuple[str, ...], Any]:
  return {tuple(str(getattr(k, 'key', k)) for k in path): leaf
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def _unflatten(flat: dict[tuple[str, ...], Any]) -> dict[str, Any]:
  tree: dict[str, Any] = {}
  for path, leaf in flat.items():
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = leaf
  return tree


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
        f'  {title} ({len(items)}):\n' + '\n'.join(f'    {i}' for i in items)
        for title, items in problems))
  return _unflatten(flat)


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
    params = torch_to_params(load_torch_checkpoint(args.checkpoint), args.model)
    with open(args.out, 'wb') as f:
      f.write(serialization.msgpack_serialize(params))
    print(f'wrote {args.out}: {sum(x.size for x in jax.tree_util.tree_leaves(params)):,} '
          f'{args.model} parameters')
    return
  with open(args.params, 'rb') as f:
    params = serialization.msgpack_restore(f.read())
  state_dict = params_to_torch(params.get('params', params), args.model)
  if args.out.endswith('.npz'):
    np.savez(args.out, **state_dict)
  else:
    import torch  # pylint: disable=g-import-not-at-top
    torch.save(collections.OrderedDict((k, torch.from_numpy(v)) for k, v in state_dict.items()),
               args.out)
  print(f'wrote {args.out}: {len(state_dict)} official {args.model} tensors')


if __name__ == '__main__':
  from absl import app, flags  # pylint: disable=g-import-not-at-top,g-multiple-import
  flags.DEFINE_enum('model', None, convertible_models(), 'model name', required=True)
  flags.DEFINE_string('checkpoint', None, 'official best.ckpt or state_dict file to convert')
  flags.DEFINE_string('params', None, 'flax msgpack params to export to torch names')
  flags.DEFINE_string('out', None, '.msgpack (import); .npz or a torch file (export)',
                      required=True)
  app.run(main)
