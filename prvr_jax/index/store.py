"""The on-disk index: a model's stored representation of a gallery, its ids, and the model.

Layout of an index folder (written by `IndexWriter`, read by `open_index`):

  index.json                 the manifest, written last (its presence means "complete"):
                             format version, its own id (a digest of its content), model
                             name and config fingerprint, the `config.model` section, the
                             parameters' fingerprint, storage dtype, every stored leaf's
                             per-video shape, per shard its video count and of every file the
                             size, mtime, sha256 and a sampled-block digest, and in `info`
                             what produced it (checkpoint, step, data)
  params.npz                 the model's parameters (query encoder and scorer), no pickles
  shards/00000/<leaf>.npy    rows of one shard, one file per stored leaf ('a/b' -> 'a.b')
  shards/00000/<leaf>.scale.npy   int8 only: one float32 scale per stored vector
  shards/00000/ids.json      the shard's video ids, in row order

Storage dtypes: 'float32' (exact), 'bfloat16', or 'int8' with one scale per vector (the last
axis): `x ~ q * scale`, `scale = max|x| / 127`. Masks (leaves named `*mask`), per-vector
norms (`*norms`) and integer leaves (the per-video noise seed) are always stored exactly.

Every open checks each file's size, and its sampled-block digest (`SAMPLE_BLOCKS` blocks)
when its mtime is the one recorded, else its full sha256 (a copied or touched file); `verify`
checks every file's full sha256. ids.json and params.npz are always checked in full.

A gallery larger than host memory is built shard by shard: `IndexWriter.add` holds at most one
shard of rows in memory, and a search reads the shards through memory maps, chunk by chunk.
"""

from collections.abc import Iterator, Mapping, Sequence
import dataclasses
import hashlib
import json
import math
import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from prvr_jax import checkpoint
from prvr_jax import files
from prvr_jax.files import short
from prvr_jax.models import registry
from prvr_jax.models.spec import path_of

FORMAT = 'prvr_jax.index'
FORMAT_VERSION = 1
MANIFEST = 'index.json'
PARAMS_FILE = 'params.npz'
SHARDS_DIR = 'shards'
IDS_FILE = 'ids.json'
STORAGE_DTYPES = ('float32', 'bfloat16', 'int8')
INT8_MAX = 127.0
_HASH_BLOCK = 1 << 24
# A cheap digest checked on every open: this many blocks of `SAMPLE_BYTES`, spread evenly over
# the file (its first and last bytes included).
SAMPLE_BLOCKS = 64
SAMPLE_BYTES = 4096
CANDIDATES_DIR = 'candidates'


class IndexFormatError(ValueError):
  """A damaged, incomplete or mismatching index; the message names the file at fault."""


def exact_leaf(name: str, dtype: np.dtype) -> bool:
  """Whether a stored leaf keeps its values exactly at any storage dtype: masks, integers and
  per-vector norms (`*norms`: one scalar per vector, not a vector to quantize)."""
  return (name.split('/')[-1].endswith(('mask', 'norms'))
          or not np.issubdtype(dtype, np.floating))


def leaf_file(name: str) -> str:
  return name.replace('/', '.') + '.npy'


def scale_file(name: str) -> str:
  return name.replace('/', '.') + '.scale.npy'


def quantize(x: np.ndarray, dtype: str) -> dict[str, np.ndarray]:
  """Float rows -> what is written: {'values'} (+ {'scale'}, `x.shape[:-1]` float32, for int8).

  bfloat16 values are kept as their uint16 bit patterns (.npy has no bfloat16)."""
  x = np.asarray(x, np.float32)
  if dtype == 'float32':
    return {'values': x}
  if dtype == 'bfloat16':
    return {'values': np.asarray(jnp.asarray(x, jnp.bfloat16)).view(np.uint16)}
  scale = np.max(np.abs(x), axis=-1) / INT8_MAX
  safe = np.where(scale > 0, scale, 1.0)[..., None]
  values = np.clip(np.rint(x / safe), -INT8_MAX, INT8_MAX).astype(np.int8)
  return {'values': values, 'scale': scale.astype(np.float32)}


def dequantize(values: jax.Array, scale: jax.Array | None, dtype: str) -> jax.Array:
  """The inverse of `quantize`, on device: float32 rows."""
  if dtype == 'float32':
    return values
  if dtype == 'bfloat16':
    return jax.lax.bitcast_convert_type(values, jnp.bfloat16).astype(jnp.float32)
  return values.astype(jnp.float32) * scale[..., None]


def sha256_of(path: str) -> str:
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    while block := f.read(_HASH_BLOCK):
      digest.update(block)
  return digest.hexdigest()


def sample_digest(path: str) -> str:
  """sha256 of `SAMPLE_BLOCKS` blocks of `SAMPLE_BYTES` spread evenly over the file (the whole
  file when it is smaller): reads a bounded number of bytes whatever the file's size."""
  size = os.path.getsize(path)
  digest = hashlib.sha256(str(size).encode())
  with open(path, 'rb') as f:
    if size <= SAMPLE_BLOCKS * SAMPLE_BYTES:
      digest.update(f.read())
    else:
      for i in range(SAMPLE_BLOCKS):  # integer offsets: the last block ends at the last byte
        f.seek(i * (size - SAMPLE_BYTES) // (SAMPLE_BLOCKS - 1))
        digest.update(f.read(SAMPLE_BYTES))
  return digest.hexdigest()


def file_entry(path: str) -> dict[str, Any]:
  """What a manifest records of a written file: size, mtime, sha256 and sampled digest."""
  return {'bytes': os.path.getsize(path), 'mtime_ns': os.stat(path).st_mtime_ns,
          'sha256': sha256_of(path), 'sample': sample_digest(path)}


def check_file(path: str, entry: Mapping[str, Any], full: bool, listed_in: str) -> bool:
  """Checks a file against its manifest `entry`: its size, then its full sha256 when `full`,
  when its mtime differs from the recorded one or the entry has no sampled digest (an older
  index), else its sampled digest. Returns whether the full sha256 was checked."""
  if not os.path.isfile(path):
    raise IndexFormatError(f'{path} is missing from the index.')
  size = os.path.getsize(path)
  if size != entry.get('bytes'):
    raise IndexFormatError(f'{path} holds {size} bytes, {listed_in} says {entry.get("bytes")}: '
                           'the file is truncated or damaged. Rebuild the index.')
  full = (full or 'sample' not in entry
          or os.stat(path).st_mtime_ns != entry.get('mtime_ns'))
  if full:
    ok = sha256_of(path) == entry.get('sha256')
  else:
    ok = sample_digest(path) == entry['sample']
  if not ok:
    raise IndexFormatError(f'{path} does not match the checksum in {listed_in}: the file is '
                           'damaged or was replaced. Rebuild the index.')
  return full


def _file_entry(folder: str, relative: str) -> dict[str, Any]:
  return file_entry(os.path.join(folder, relative))


def manifest_id(manifest: Mapping[str, Any]) -> str:
  """An index's id: a digest of its manifest without the id (so an edited or foreign
  manifest does not carry a valid one)."""
  body = {k: v for k, v in manifest.items() if k != 'id'}
  text = json.dumps(body, sort_keys=True, separators=(',', ':'))
  return hashlib.sha256(text.encode('utf-8')).hexdigest()[:24]


def params_fingerprint(params: Any) -> str:
  """The parameters' digest (`checkpoint.tree_digest`: dtype, shape and bytes of each leaf),
  comparable with one of a checkpoint's parameters."""
  return checkpoint.tree_digest(params)


def flatten_params(params: Any) -> dict[str, np.ndarray]:
  """'a/b/c' path -> host array, for `params.npz`."""
  return {path_of(path): np.asarray(jax.device_get(leaf))
          for path, leaf in jax.tree_util.tree_leaves_with_path(params)}


@dataclasses.dataclass(frozen=True)
class Shard:
  """One shard of an open index: `arrays[leaf]` = {'values'(, 'scale')} memory maps."""
  name: str
  ids: tuple[str, ...]
  arrays: Mapping[str, Mapping[str, np.ndarray]]

  def __len__(self) -> int:
    return len(self.ids)


class IndexWriter:
  """Writes an index folder shard by shard.

    writer = IndexWriter(out_dir, config_model, params, dtype='int8', shard_videos=50_000)
    for stored, ids in encoded_batches:   # host pytrees with leading axis B, B video ids
      writer.add(stored, ids)
    writer.close()                        # flushes the last shard, writes index.json

  The folder must not exist or be empty (`overwrite=True` replaces an existing index).
  Rows are kept in the order added; ids must be unique. `durable=False` skips the fsync of
  the shard files (a scratch index, e.g. a benchmark's: several times faster to write on a
  disk, but a crash can leave the shards written last incomplete).
  """

  def __init__(self, out_dir: str, config_model: ml_collections.ConfigDict, params: Any,
               dtype: str = 'float32', shard_videos: int = 100_000, overwrite: bool = False,
               info: Mapping[str, Any] | None = None, durable: bool = True):
    if config_model.get('noise') == 'per_pair':
      raise ValueError("config.model.noise='per_pair' draws evaluation noise per (query, video) "
                       'pair, which an index of videos cannot store; build the index with '
                       "--config.model.noise=per_video (the default)")
    if dtype not in STORAGE_DTYPES:
      raise ValueError(f'Index storage dtype {dtype!r}; expected one of {STORAGE_DTYPES}.')
    if shard_videos < 1:
      raise ValueError(f'shard_videos={shard_videos}; expected a positive count.')
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
      raise ValueError(f'{out_dir} is a file, not an index folder.')
    if os.path.isdir(out_dir) and os.listdir(out_dir):
      if not overwrite:
        raise ValueError(f'{out_dir} is not empty; choose a new folder or pass overwrite.')
      remove_index(out_dir)
    os.makedirs(os.path.join(out_dir, SHARDS_DIR), exist_ok=True)
    self.out_dir = out_dir
    self.config_model = config_model
    self.dtype = dtype
    self.shard_videos = shard_videos
    self.durable = durable
    self.info = dict(info or {})
    self.spec = registry.get_spec(config_model)
    self.leaves = {name: (tuple(s.shape), np.dtype(s.dtype))
                   for name, s in self.spec.stored_per_video(config_model).items()}
    flat = flatten_params(params)
    self.params_fingerprint = params_fingerprint(params)
    files.write_atomic(os.path.join(out_dir, PARAMS_FILE),
                       lambda f: np.savez(f, **flat))
    self.params_entry = _file_entry(out_dir, PARAMS_FILE)
    self.shards: list[dict[str, Any]] = []
    self.seen: set[str] = set()
    self.pending: list[tuple[dict[str, np.ndarray], list[str]]] = []
    self.pending_rows = 0
    self.closed = False

  def add(self, stored: Mapping[str, Any], ids: Sequence[str]) -> None:
    """Appends rows: `stored` the model's encoding pytree (leading axis B) on the host or
    device, `ids` the B video ids."""
    flat = {path_of(path): np.asarray(jax.device_get(leaf))
            for path, leaf in jax.tree_util.tree_leaves_with_path(stored)}
    if set(flat) != set(self.leaves):
      raise ValueError(f'Encoded videos hold {sorted(flat)}, but {self.spec.name} stores '
                       f'{sorted(self.leaves)}.')
    ids = [str(i) for i in ids]
    for name, array in flat.items():
      shape, _ = self.leaves[name]
      if array.shape != (len(ids),) + shape:
        raise ValueError(f'Encoded leaf {name!r} has shape {array.shape}, expected '
                         f'{(len(ids),) + shape} for {len(ids)} ids.')
    for name, array in flat.items():
      if np.issubdtype(array.dtype, np.inexact):
        bad = ~np.isfinite(array.reshape(len(ids), -1)).all(axis=1)
        if bad.any():
          raise ValueError(f'{self.out_dir}: video {short(ids[int(np.flatnonzero(bad)[0])])} '
                           f'holds NaN or infinite values in leaf {name!r} ({int(bad.sum())} '
                           'such videos); refusing to index them.')
    for video_id in ids:
      if video_id in self.seen:
        raise ValueError(f'Video id {short(video_id)} is added to the index twice.')
      self.seen.add(video_id)
    start = 0
    while start < len(ids):
      take = min(len(ids) - start, self.shard_videos - self.pending_rows)
      self.pending.append(({k: v[start:start + take] for k, v in flat.items()},
                           ids[start:start + take]))
      self.pending_rows += take
      start += take
      if self.pending_rows == self.shard_videos:
        self._flush()

  def _flush(self) -> None:
    if not self.pending_rows:
      return
    name = f'{len(self.shards):05d}'
    folder = os.path.join(self.out_dir, SHARDS_DIR, name)
    os.makedirs(folder)
    ids = [i for _, chunk_ids in self.pending for i in chunk_ids]
    entry: dict[str, Any] = {'name': name, 'num_videos': len(ids), 'files': {}}
    outputs = {IDS_FILE: files.json_writer(ids)}
    for leaf, (_, leaf_dtype) in self.leaves.items():
      rows = np.concatenate([chunk[leaf] for chunk, _ in self.pending])
      if exact_leaf(leaf, leaf_dtype):
        parts = {'values': rows}
      else:
        parts = quantize(rows, self.dtype)
        self._check_quantized(leaf, parts, ids)
      outputs[leaf_file(leaf)] = files.npy_writer(parts['values'])
      if 'scale' in parts:
        outputs[scale_file(leaf)] = files.npy_writer(parts['scale'])
    files.publish(folder, outputs, marker=IDS_FILE, sync=self.durable)
    entry['files'] = {f: _file_entry(folder, f) for f in sorted(outputs)}
    self.shards.append(entry)
    self.pending, self.pending_rows = [], 0

  def _check_quantized(self, leaf: str, parts: Mapping[str, np.ndarray],
                       ids: Sequence[str]) -> None:
    """Refuses finite rows that the storage dtype cannot hold (a bfloat16 overflow)."""
    values = parts['values']
    if self.dtype == 'bfloat16':
      bad = ((values & 0x7F80) == 0x7F80).reshape(len(ids), -1).any(axis=1)
    elif 'scale' in parts:
      bad = ~np.isfinite(parts['scale']).reshape(len(ids), -1).all(axis=1)
    else:
      return
    if bad.any():
      raise ValueError(f'{self.out_dir}: video {short(ids[int(np.flatnonzero(bad)[0])])} has '
                       f'values in leaf {leaf!r} that {self.dtype} storage turns infinite; '
                       'refusing to index it (choose float32).')

  def close(self) -> 'Index':
    """Writes the last shard and the manifest; returns the index, opened."""
    if self.closed:
      raise ValueError(f'{self.out_dir}: the index writer is already closed.')
    self._flush()
    if not self.shards:
      raise ValueError(f'{self.out_dir}: no videos were added to the index.')
    fingerprint = checkpoint.model_fingerprint(self.config_model, self.spec)
    manifest = {
        'format': FORMAT, 'format_version': FORMAT_VERSION, **fingerprint,
        'config_model': self.config_model.to_dict(), 'dtype': self.dtype,
        'leaves': {k: {'shape': list(shape), 'dtype': dt.name,
                       'exact': exact_leaf(k, dt)} for k, (shape, dt) in self.leaves.items()},
        'num_videos': sum(s['num_videos'] for s in self.shards),
        'bytes_per_video': bytes_per_video(self.leaves, self.dtype),
        'params': self.params_entry, 'params_fingerprint': self.params_fingerprint,
        'shards': self.shards, 'created': files.utc_now(), 'info': self.info}
    manifest = json.loads(json.dumps(manifest))  # as it will be read back
    manifest['id'] = manifest_id(manifest)
    files.write_json(os.path.join(self.out_dir, MANIFEST), manifest)
    self.closed = True
    return open_index(self.out_dir)


def bytes_per_video(leaves: Mapping[str, tuple[tuple[int, ...], np.dtype]], dtype: str) -> int:
  """Bytes one video occupies in an index of storage `dtype` (int8 scales included)."""
  total = 0
  for name, (shape, leaf_dtype) in leaves.items():
    count = math.prod(shape)
    if exact_leaf(name, leaf_dtype):
      total += count * leaf_dtype.itemsize
    elif dtype == 'int8':
      total += count + 4 * math.prod(shape[:-1])
    else:
      total += count * (2 if dtype == 'bfloat16' else 4)
  return total


class Index:
  """An open index folder. Build with `IndexWriter` / `build.build_index`, open with
  `open_index`.

  Attributes:
    path, manifest: the folder and its index.json.
    config_model: the `config.model` it was built with.
    dtype: storage dtype.
    shards: the shards, in row order (memory maps).
    ids: every video id in row order.
  """

  def __init__(self, path: str, manifest: dict[str, Any], shards: list[Shard]):
    self.path = path
    self.manifest = manifest
    self.config_model = ml_collections.ConfigDict(manifest['config_model'])
    self.dtype = manifest['dtype']
    self.shards = shards
    self.ids = tuple(i for s in shards for i in s.ids)
    self.spec = registry.get_spec(self.config_model)
    self.verified = 'sampled'  # set by open_index: 'sampled' or 'full' (every file's sha256)

  @property
  def id(self) -> str | None:
    """The manifest's id (None for an index written before ids were recorded)."""
    return self.manifest.get('id')

  def provenance(self) -> dict[str, Any]:
    """What produced this index: its path and id, the checkpoint (path, source, step), the
    parameters' fingerprint, the data, and how its files were checked when opened."""
    info = self.manifest.get('info', {})
    return {'index': self.path, 'index_id': self.id, 'model': self.manifest['model'],
            'dtype': self.dtype, 'checkpoint': info.get('checkpoint'),
            'checkpoint_source': info.get('checkpoint_source'), 'step': info.get('step'),
            'params_fingerprint': self.manifest.get('params_fingerprint'),
            'split': info.get('split'), 'data': info.get('data'),
            'created': self.manifest.get('created'), 'verified': self.verified}

  def __len__(self) -> int:
    return len(self.ids)

  @property
  def leaves(self) -> dict[str, dict[str, Any]]:
    return self.manifest['leaves']

  def check_config(self, config: ml_collections.ConfigDict, flag: str = '--config') -> None:
    """Raises when `config.model` is not the model this index was built with."""
    want = checkpoint.model_fingerprint(config.model, registry.get_spec(config.model))
    have = {k: self.manifest.get(k) for k in want}
    if have != want:
      raise IndexFormatError(
          f'{self.path} was built by model {have["model"]!r} (model config hash '
          f'{have["model_config_hash"]}), but {flag} describes model {want["model"]!r} (hash '
          f'{want["model_config_hash"]}). Use the config the index was built with, or rebuild '
          'the index with this model.')

  def params(self) -> Any:
    """The model's parameters (host arrays), checked against the model's shapes."""
    path = os.path.join(self.path, PARAMS_FILE)
    if sha256_of(path) != self.manifest['params']['sha256']:
      raise IndexFormatError(f'{path} does not match its checksum in {MANIFEST}: the file is '
                             'damaged or was replaced. Rebuild the index.')
    shapes = self.spec.param_shapes(self.config_model)
    with np.load(path, allow_pickle=False) as data:
      stored = {k: data[k] for k in data.files}
    want = {path_of(p): s for p, s in jax.tree_util.tree_leaves_with_path(shapes)}
    if set(stored) != set(want):
      raise IndexFormatError(
          f'{path} holds parameters {sorted(set(stored) ^ set(want))[:5]} that do not match '
          f'model {self.spec.name} of {self.path}/{MANIFEST}.')
    for name, shape in want.items():
      if stored[name].shape != shape.shape:
        raise IndexFormatError(f'{path}: parameter {name} has shape {stored[name].shape}, '
                               f'the model expects {shape.shape}.')
    return jax.tree_util.tree_map_with_path(
        lambda p, s: stored[path_of(p)].astype(s.dtype), shapes)

  def prefix(self, num_videos: int) -> 'Index':
    """A view of the first `num_videos` rows (the same files, nothing copied or written): a
    smaller gallery to search, e.g. for a cost-versus-size curve from one build."""
    if not 0 < num_videos <= len(self):
      raise ValueError(f'{self.path} holds {len(self)} videos: no prefix of {num_videos}.')
    shards, left = [], num_videos
    for shard in self.shards:
      take = min(left, len(shard))
      shards.append(Shard(shard.name, shard.ids[:take],
                          {leaf: {part: array[:take] for part, array in parts.items()}
                           for leaf, parts in shard.arrays.items()}))
      left -= take
      if not left:
        break
    view = Index(self.path, self.manifest, shards)
    view.verified = self.verified
    return view

  def rows(self) -> Iterator[tuple[int, Shard]]:
    """(first row, shard) of every shard."""
    start = 0
    for shard in self.shards:
      yield start, shard
      start += len(shard)

  def verify(self) -> None:
    """Checks the sha256 of every file against the manifest (reads the whole index)."""
    entries = [(PARAMS_FILE, self.manifest['params'])]
    for shard in self.manifest['shards']:
      entries += [(os.path.join(SHARDS_DIR, shard['name'], f), e)
                  for f, e in shard['files'].items()]
    for relative, entry in entries:
      check_file(os.path.join(self.path, relative), entry, True, MANIFEST)
    self.verified = 'full'


def _manifest(path: str) -> dict[str, Any]:
  manifest_path = os.path.join(path, MANIFEST)
  if not os.path.isdir(path):
    raise FileNotFoundError(f'Index folder {path} does not exist.')
  if not os.path.isfile(manifest_path):
    raise IndexFormatError(f'{path} holds no {MANIFEST}: not an index, or its build did not '
                           'finish.')
  manifest = files.read_json(manifest_path, IndexFormatError)
  if not isinstance(manifest, dict) or manifest.get('format') != FORMAT:
    raise IndexFormatError(f'{manifest_path} is not a {FORMAT} manifest.')
  if manifest.get('format_version') != FORMAT_VERSION:
    raise IndexFormatError(f'{manifest_path} has format version '
                           f'{manifest.get("format_version")}; this prvr_jax reads version '
                           f'{FORMAT_VERSION}.')
  missing = [k for k in ('model', 'model_config_hash', 'config_model', 'dtype', 'leaves',
                         'shards', 'params', 'num_videos') if k not in manifest]
  if missing or manifest['dtype'] not in STORAGE_DTYPES:
    raise IndexFormatError(f'{manifest_path} lacks {missing} or has an unknown dtype.')
  for shard in manifest['shards'] if isinstance(manifest['shards'], list) else [None]:
    names = shard.get('files') if isinstance(shard, dict) else None
    if (not isinstance(names, dict) or not isinstance(shard.get('name'), str)
        or not shard['name'].isdigit()
        or not all(isinstance(n, str) and n == os.path.basename(n) and n not in ('.', '..')
                   for n in names)):
      raise IndexFormatError(f'{manifest_path}: a shard entry is not a shard of this format '
                             f'({short(shard)}).')
  if 'id' in manifest and manifest['id'] != manifest_id(manifest):
    raise IndexFormatError(f'{manifest_path} was changed after the index was built: its id '
                           f'{manifest["id"]} does not match its content. Rebuild the index.')
  return manifest


def _checked_file(path: str, entry: Mapping[str, Any], full: bool = False) -> str:
  check_file(path, entry, full, 'the manifest')
  return path


def _open_shard(path: str, manifest: dict[str, Any], entry: dict[str, Any],
                full: bool = False) -> Shard:
  folder = os.path.join(path, SHARDS_DIR, entry['name'])
  listed = entry['files']
  ids_path = _checked_file(os.path.join(folder, IDS_FILE), listed.get(IDS_FILE, {'bytes': -1}),
                           full=True)
  with open(ids_path, encoding='utf-8') as f:
    ids = json.load(f)
  n = entry['num_videos']
  if not isinstance(ids, list) or len(ids) != n or not all(isinstance(i, str) for i in ids):
    raise IndexFormatError(f'{ids_path} does not hold the {n} video ids of its shard.')
  arrays = {}
  for leaf, desc in manifest['leaves'].items():
    shape = tuple(desc['shape'])
    parts = {'values': (leaf_file(leaf), (n,) + shape)}
    if not desc['exact'] and manifest['dtype'] == 'int8':
      parts['scale'] = (scale_file(leaf), (n,) + shape[:-1])
    arrays[leaf] = {}
    for part, (name, want_shape) in parts.items():
      file_path = _checked_file(os.path.join(folder, name), listed.get(name, {'bytes': -1}),
                                full)
      try:
        array = np.load(file_path, mmap_mode='r', allow_pickle=False)
      except ValueError as e:
        raise IndexFormatError(f'{file_path} is not a readable .npy file ({e}).') from None
      if array.shape != want_shape:
        raise IndexFormatError(f'{file_path} has shape {array.shape}, the manifest implies '
                               f'{want_shape}.')
      arrays[leaf][part] = array
  return Shard(entry['name'], tuple(ids), arrays)


def open_index(path: str, config: ml_collections.ConfigDict | None = None,
               verify: bool = False) -> Index:
  """Opens an index folder: checks its manifest (and its id), every file's size, shape and
  sampled digest (its full sha256 when its mtime changed, or with `verify` for every file), the
  ids and the parameters in full, and with `config` that the index is of `config.model`."""
  path = os.path.abspath(path)
  manifest = _manifest(path)
  _checked_file(os.path.join(path, PARAMS_FILE), manifest['params'], full=True)
  shards = [_open_shard(path, manifest, entry, verify) for entry in manifest['shards']]
  index = Index(path, manifest, shards)
  index.verified = 'full' if verify else 'sampled'
  if len(index) != manifest['num_videos']:
    raise IndexFormatError(f'{path}/{MANIFEST}: the shards hold {len(index)} videos, the '
                           f'manifest says {manifest["num_videos"]}.')
  if len(set(index.ids)) != len(index.ids):
    raise IndexFormatError(f'{path}: a video id appears in two rows.')
  if config is not None:
    index.check_config(config)
  return index


def _is_own_temporary(name: str, ours: set[str]) -> bool:
  """Whether `name` is a temporary file `files.publish` leaves beside one of `ours`."""
  return (name.startswith('.') and name.endswith('.tmp')
          and any(name.startswith(f'.{own}.') for own in ours))


def _own_files(path: str, manifest: Mapping[str, Any]) -> dict[str, set[str]]:
  """folder (relative) -> the file names of an index's manifest in it (its candidate
  files included when `candidates/candidates.json` is of our format)."""
  own = {'': {MANIFEST, PARAMS_FILE}, SHARDS_DIR: set()}
  for shard in manifest['shards']:
    own[os.path.join(SHARDS_DIR, str(shard['name']))] = set(shard['files'])
  meta = os.path.join(path, CANDIDATES_DIR, 'candidates.json')
  try:
    with open(meta, encoding='utf-8') as f:
      if json.load(f).get('format') == 'prvr_jax.candidates':
        own[CANDIDATES_DIR] = {'candidates.json', 'candidates.faiss'}
  except (OSError, ValueError, AttributeError):
    pass
  return own


def remove_index(path: str) -> None:
  """Deletes an index folder for `overwrite`: only when it is verifiably one of ours (a
  manifest of our format whose id matches its content) and holds nothing but the files that
  manifest lists and our temporary files; refuses (deleting nothing) otherwise."""
  try:
    manifest = _manifest(path)
  except IndexFormatError as e:
    raise ValueError(f'Refusing to overwrite {path}: it is not a prvr_jax index ({e}).'
                     ) from None
  if 'id' not in manifest:
    raise ValueError(f'Refusing to overwrite {path}: its {MANIFEST} records no index id (an '
                     'index of an older prvr_jax, or not ours); delete the folder yourself.')
  own = _own_files(path, manifest)
  found = []
  for root, dirs, names in os.walk(path):
    relative = os.path.relpath(root, path)
    relative = '' if relative == '.' else relative
    for name in dirs + names:
      item = os.path.join(relative, name)
      if os.path.islink(os.path.join(root, name)):
        raise ValueError(f'Refusing to overwrite {path}: it holds the link {item}, which its '
                         f'{MANIFEST} does not list.')
      if name in dirs and item in own:
        continue
      if (name in names and relative in own
          and (name in own[relative] or _is_own_temporary(name, own[relative]))):
        found.append(item)
        continue
      raise ValueError(f'Refusing to overwrite {path}: it holds {item}, which its {MANIFEST} '
                       'does not list (not ours to delete); choose another --out or move it.')
  # The manifest last: an interrupted removal leaves a folder a later overwrite accepts.
  for item in sorted(found, key=lambda i: i == MANIFEST):
    os.unlink(os.path.join(path, item))
  for folder in sorted(own, key=len, reverse=True):
    if folder and os.path.isdir(os.path.join(path, folder)):
      os.rmdir(os.path.join(path, folder))
