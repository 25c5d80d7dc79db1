r"""Reading `torch.save` files safely: tensors and plain containers, never code from the file.

`load_torch_checkpoint` returns the state_dict (torch names -> numpy arrays) of a bare
state_dict file or of a checkpoint dict holding one (GMMFormer's and AMDNet's `best.ckpt`
under `state_dict`, MS-SL's `model.ckpt` under `model`, beside its EasyDict `model_cfg`).
With torch installed it uses `torch.load(..., weights_only=True)`; without torch
`read_torch_zip`, a restricted reader of the torch zip format, builds numpy arrays from the
storage records. Neither executes code from the file: the only globals admitted are the
tensor-rebuild functions, storage types and `OrderedDict`, plus the official BertAdam
schedule classes (in `optimizer.param_groups`) and MS-SL's `easydict.EasyDict` config, which
are replaced by inert placeholders. Every header is checked against the file before anything
is read or allocated, and what is allocated is bounded by the file's size
(`MAX_BYTES_PER_FILE_BYTE`), whatever the headers declare: records overlapping in the zip or
inflating far beyond it, and tensors viewing the same storage bytes over and over, are refused
naming the file and the record or tensor.

This module sits on the package's lowest floor (it imports only `prvr_jax.files`): the
official-name mapping (`prvr_jax.convert`) and the CLIP weights (`prvr_jax.clip.weights`)
both read torch files through it.
"""

import collections
import dataclasses
import io
import math
import os
import pickle
import zipfile
from typing import Any

import numpy as np

from prvr_jax.files import short

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
# The storages read, and the tensors built from them, may each take at most this many bytes
# per byte of the file (as numpy arrays, bfloat16 widened to float32, which doubles it). torch
# stores each storage once, uncompressed, so a real checkpoint holds at most the file's size in
# storages and in tensors (twice that for bfloat16, or for weights tied to one storage);
# records overlapping in the zip, or tensors viewing the same bytes again and again, are
# refused before they are allocated.
MAX_BYTES_PER_FILE_BYTE = 2


@dataclasses.dataclass(frozen=True)
class _StorageStub:
  """A storage's element count and dtype, for the validation pass (no data read)."""
  size: int
  dtype: np.dtype


@dataclasses.dataclass(frozen=True, eq=False)
class TensorStub:
  """A tensor's shape and dtype, what the validation pass (`materialize=False`) builds."""
  shape: tuple[int, ...]
  dtype: np.dtype


def _rebuild_tensor(storage, storage_offset, size, stride, requires_grad=False,
                    backward_hooks=None, metadata=None):
  """`torch._utils._rebuild_tensor_v2` on a numpy storage: a copied strided view (a
  `TensorStub` for a `_StorageStub`). A tensor must address only elements of its storage and
  hold no more elements than it has (no zero or overlapping strides), so copying it costs no
  more memory than its storage; `read_torch_zip` bounds all the copies together."""
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
    return TensorStub(size, storage.dtype)
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
    self._storage_keys: dict[int, str] = {}
    self.file_bytes = os.path.getsize(path)
    self.budget = MAX_BYTES_PER_FILE_BYTE * self.file_bytes
    self.storage_bytes = self.tensor_bytes = 0
    # The first tensor that took the tensors past the budget: (tensor, storage record).
    self.over_budget: tuple[Any, str] | None = None

  def find_class(self, module: str, name: str) -> Any:
    if (module, name) == ('torch._utils', '_rebuild_tensor_v2'):
      return self._rebuild_tensor
    try:
      return _TORCH_GLOBALS[(module, name)]
    except KeyError:
      raise pickle.UnpicklingError(
          f'{self._path}: refusing to load global {short(f"{module}.{name}", quote=False)}: '
          'prvr_jax reads only tensors, storages and plain containers (a state_dict, or the '
          "official checkpoint's dict with one), and never runs code from a checkpoint"
      ) from None

  def persistent_load(self, pid: Any) -> np.ndarray | _StorageStub:
    if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == 'storage'
            and isinstance(pid[1], _StorageType) and isinstance(pid[4], int) and pid[4] >= 0):
      raise pickle.UnpicklingError(f'{self._path}: unexpected persistent id {short(pid)}')
    _, storage_type, key, _, numel = pid  # the location (e.g. 'cuda:0') is irrelevant here
    key = str(key)
    if key not in self._storages:
      self._storages[key] = self._storage(storage_type.name, key, numel)
      self._storage_keys[id(self._storages[key])] = key
    return self._storages[key]

  def _rebuild_tensor(self, storage, *args, **kwargs) -> np.ndarray | TensorStub:
    """`_rebuild_tensor`, counting the bytes of the tensors built against the budget: refused
    before the copy when materializing, recorded for `read_torch_zip` to name otherwise."""
    tensor = _rebuild_tensor(storage, *args, **kwargs)
    record = f'{self._prefix}data/{self._storage_keys.get(id(storage), "?")}'
    if isinstance(tensor, TensorStub):
      self.tensor_bytes += math.prod(tensor.shape) * tensor.dtype.itemsize
      if self.tensor_bytes > self.budget and self.over_budget is None:
        self.over_budget = (tensor, record)
    return tensor

  def _storage(self, type_name: str, key: str, numel: int) -> np.ndarray | _StorageStub:
    dtype = _STORAGE_DTYPES[type_name]
    record_dtype = np.dtype('uint16' if dtype == 'bfloat16' else dtype)
    name = f'{self._prefix}data/{key}'
    info = _record(self._archive, name, numel * record_dtype.itemsize, self._path, exact=True)
    self.storage_bytes += numel * (4 if dtype == 'bfloat16' else record_dtype.itemsize)
    if self.storage_bytes > self.budget:
      raise pickle.UnpicklingError(
          f'{self._path}: storage record {name} takes the storages to {self.storage_bytes} '
          f'bytes, more than {MAX_BYTES_PER_FILE_BYTE} x the file\'s {self.file_bytes} bytes: '
          'records overlap in the zip or inflate beyond what torch writes (refused before '
          'reading it)')
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
  checked first, in a pass that reads no storage: the pickle is at most `MAX_PICKLE_BYTES`
  (and `MAX_BYTES_PER_FILE_BYTE` x the file's size), every storage record holds exactly its
  declared elements, every tensor lies inside its storage, and the storages, and the tensors,
  each take at most `MAX_BYTES_PER_FILE_BYTE` x the file's size. `materialize=False` only
  checks (tensors come back as `TensorStub` objects).

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
    pickle_limit = min(MAX_PICKLE_BYTES, MAX_BYTES_PER_FILE_BYTE * os.path.getsize(path))
    data = archive.read(_record(archive, pickles[0], pickle_limit, path))
    checker = _RestrictedUnpickler(data, archive, prefix, byteorder, path, materialize=False)
    checked = checker.load()
    if checker.over_budget is not None:
      tensor, record = checker.over_budget
      name = _key_path(checked, tensor)
      raise pickle.UnpicklingError(
          f'{path}: tensor {short(name, quote=False) if name else "(unnamed)"} '
          f'{list(tensor.shape)} of storage record {record} takes the tensors past '
          f"{MAX_BYTES_PER_FILE_BYTE} x the file's {checker.file_bytes} bytes "
          f'({checker.tensor_bytes} bytes in all): its tensors view the same storage bytes '
          'over and over (refused before reading them)')
    if not materialize:
      return checked
    return _RestrictedUnpickler(data, archive, prefix, byteorder, path, materialize).load()


def _key_path(obj: Any, target: Any, depth: int = 8, seen: set[int] | None = None
              ) -> str | None:
  """The '/'-joined keys under which `target` (an object) lies in containers `obj`, or None.
  Each container is visited once (a pickle may reference one container many times)."""
  if obj is target:
    return ''
  seen = set() if seen is None else seen
  if depth == 0 or id(obj) in seen:
    return None
  seen.add(id(obj))
  if isinstance(obj, OfficialObject):
    obj = obj.__dict__
  if isinstance(obj, dict):
    items = obj.items()
  elif isinstance(obj, (list, tuple)):
    items = enumerate(obj)
  else:
    return None
  for key, value in items:
    found = _key_path(value, target, depth - 1, seen)
    if found is not None:
      return f'{key}/{found}' if found else str(key)
  return None


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


def torch_available() -> bool:
  """Whether torch is importable and has `torch.serialization.safe_globals` (what
  `load_torch_checkpoint` needs to read with torch)."""
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
    use_torch = torch_available()
  obj = _torch_load(path) if use_torch else read_torch_zip(path)
  for entry in _STATE_DICT_ENTRIES:
    if isinstance(obj, dict) and isinstance(obj.get(entry), dict):
      obj = obj[entry]
      break
  if not isinstance(obj, dict) or not all(isinstance(v, np.ndarray) for v in obj.values()):
    raise ValueError(f'{path} holds neither a state_dict nor a dict with one under '
                     f'{" or ".join(repr(e) for e in _STATE_DICT_ENTRIES)}')
  return {str(k): v for k, v in obj.items()}




def strip_module_prefix(state_dict: dict[str, Any]) -> dict[str, Any]:
  """`state_dict` without the 'module.' prefix that checkpoints saved from a
  `nn.DataParallel` / `DistributedDataParallel` model put on every name (unchanged when any
  name lacks it)."""
  if state_dict and all(k.startswith('module.') for k in state_dict):
    return {k[len('module.'):]: v for k, v in state_dict.items()}
  return state_dict
