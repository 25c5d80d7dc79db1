"""The release layout (docs/data_release.md): its readers and its one writer.

A collection folder `<root>/<collection>/` holds `TextData/` (`<collection><split>.caption.txt`
files of `<cap_id> <caption>` lines, the query features HDF5) and `FeatureData/` (a BigFile of
frame rows and `video2frames.txt` in the token layouts 'roberta' and 'clip_text'; AMDNet's
video HDF5 in the CLIP layout 'clip', optionally read along a BigFile's frame timeline
(`frame_map`); MSC-PRVR's video and query-token HDF5 files in the layouts 'msc_clip_l14' and
'msc_slowfast_clip', where ActivityNet's videos are keyed without their `v_`); `Layout` has
every path. The video id of a caption is
its cap_id up to the first '#'. Every problem raises `DataError` (or `FileNotFoundError`)
naming the file and the id at fault; `skip_bad_items=True` skips bad videos / captions instead
and records each one in `ReleaseSplit.skipped`.
"""

import ast
import contextlib
import dataclasses
import functools
import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence

import h5py
import numpy as np

from prvr_jax.data import preprocess
from prvr_jax.files import listing, short

_log = logging.getLogger(__name__)

# MSC-PRVR's own HDF5 files (`<collection>_clip_L14.h5`, and QVHighlights' SlowFast + CLIP
# ones): (FeatureData video file, TextData query-token file) per layout; each file holds one
# dataset per video id / cap_id, read like AMDNet's video HDF5 and the token layouts' queries.
MSC_FEATURE_FILES = {
    'msc_clip_l14': ('%s_clip_L14.h5', '%s_clip_L14.h5'),
    'msc_slowfast_clip': ('%s_slowfast_clip.h5', '%s_slowfast_clip_text.h5'),
}
TEXT_FEATURES = ('roberta', 'clip', 'clip_text', *MSC_FEATURE_FILES)
# Text features of the token layout: a BigFile of frames and a cap_id -> [n_tokens, Dq] HDF5.
TOKEN_TEXT_FEATURES = ('roberta', 'clip_text')
_QUERY_FEATURE_FILES = {
    'roberta': 'roberta_%s_query_feat.hdf5',
    'clip': 'clip_ViT_B_32_%s_query_feat.hdf5',
    'clip_text': 'clip_text_%s_query_feat.hdf5',
}
_SPLIT_ORDER = ('train', 'val', 'test')
# The videos-only split of a collection: every video of its feature file, captions or none
# (`Release(..., videos_only=True).split(ALL_SPLIT)`; users' own videos have no captions).
ALL_SPLIT = 'all'
_CAPTION_SUFFIX = '.caption.txt'
MAX_LISTED = 5  # bad items listed in a data error
# The one cap of every feature reader (docs/reliability.md): the most elements one caption's
# or one video's feature array may declare, or one read may allocate (256 MiB of float32, far
# above any item of the releases: a 10-minute video at 25 fps of 2,816-d rows is 42M). A file
# declaring more is refused from its metadata (HDF5 / .npy header, shape.txt x id list), before
# anything is read or allocated.
MAX_FEATURE_ELEMENTS = 1 << 26


def default_normalize(text_feature: str) -> bool:
  """Whether a layout's features are L2-normalised when `normalize` is not given: the token
  layouts and MSC-PRVR's (as their loaders), not AMDNet's CLIP layout."""
  return text_feature in TOKEN_TEXT_FEATURES or text_feature in MSC_FEATURE_FILES


class DataError(ValueError):
  """Malformed or inconsistent release data; the message names the file and the id."""


def video_id_of(cap_id: str) -> str:
  """Video id of a caption id: the part before the first '#'."""
  return cap_id.split('#', 1)[0]


def _bad_items(problems: Sequence[str], what: str) -> DataError:
  """The error listing bad items, last: its last line names a file and an id."""
  first = f', the first {MAX_LISTED} listed' if len(problems) > MAX_LISTED else ''
  return DataError(f'{len(problems)} bad item(s) in {what}{first}. Fix the data, or pass '
                   'skip_bad_items=True to skip (and record) them:\n'
                   f'{listing(problems[:MAX_LISTED], limit=MAX_LISTED)}')


def _require_files(paths: Sequence[str], what: str) -> None:
  missing = [p for p in paths if not os.path.isfile(p)]
  if missing:
    raise FileNotFoundError(
        f'{what}: missing file(s):\n  ' + '\n  '.join(missing)
        + '\nexpected: ' + ', '.join(paths))


def _too_large(kind: str, item_id: str, shape: tuple[int, ...], path: str) -> str:
  return (f'{kind} {short(item_id)} declares features of shape {shape} in {path}, more than '
          f'{MAX_FEATURE_ELEMENTS} elements: not the features of one {kind} (refused before '
          'reading)')


def _not_floats(kind: str, item_id: str, dtype: np.dtype, path: str) -> str:
  return f'{kind} {short(item_id)} has {dtype} features in {path}, expected floats'


def check_elements(shape: Sequence[int], path: str, what: str) -> None:
  """Raises when `shape` (declared by `path`, for `what`: 'video v1', 'key features', ...) has
  more than `MAX_FEATURE_ELEMENTS` elements: called before a reader allocates it."""
  if math.prod(int(n) for n in shape) > MAX_FEATURE_ELEMENTS:
    raise DataError(f'{what} declares features of shape {tuple(int(n) for n in shape)}, more '
                    f'than {MAX_FEATURE_ELEMENTS} elements (release.MAX_FEATURE_ELEMENTS): not '
                    f'the features of one item, refused before reading, in {path}')


def _dim_error(flag: str, expected: int, actual: int, path: str) -> DataError:
  return DataError(f'{flag}={expected} but {path} has feature dim {actual}; '
                   f'set {flag}={actual} or point to the right features')


# ----------------------------------------------------------------------------- BigFile


class BigFile:
  """A memory-mapped BigFile folder (`feature.bin`, `id.txt`, `shape.txt`)."""

  def __init__(self, folder: str):
    self.folder = os.fspath(folder)
    self.bin_path = os.path.join(self.folder, 'feature.bin')
    id_path = os.path.join(self.folder, 'id.txt')
    shape_path = os.path.join(self.folder, 'shape.txt')
    _require_files([self.bin_path, id_path, shape_path], f'BigFile {self.folder}')

    with open(shape_path) as f:
      fields = f.read().split()
    try:
      num_rows, dim = (int(v) for v in fields)
    except ValueError:
      raise DataError(f'{shape_path}: expected "N D" (two integers), got {" ".join(fields)!r}') from None
    if num_rows < 1 or dim < 1:
      raise DataError(f'{shape_path}: N and D must be positive, got {num_rows} {dim}')

    with open(id_path, 'rb') as f:
      raw = f.read()
    try:
      ids = raw.decode('utf-8').split()
    except UnicodeDecodeError as e:
      raise DataError(f'{id_path}: not UTF-8 text (byte {e.start})') from None
    if len(ids) != num_rows:
      raise DataError(f'{id_path} has {len(ids)} ids but {shape_path} says N={num_rows}')
    self.ids: list[str] = ids
    self._index = {name: row for row, name in enumerate(ids)}
    if len(self._index) != num_rows:
      dup = next(name for row, name in enumerate(ids) if self._index[name] != row)
      raise DataError(f'{id_path}: duplicate frame id {short(dup)}')

    expected = num_rows * dim * 4
    actual = os.path.getsize(self.bin_path)
    if actual != expected:
      raise DataError(f'{self.bin_path}: expected {expected} bytes ({num_rows} x {dim} float32 '
                      f'from {shape_path}) but the file has {actual} bytes (truncated or wrong shape)')
    self.shape = (num_rows, dim)
    self._data = self._open()

  def _open(self) -> np.memmap:
    return np.memmap(self.bin_path, dtype='<f4', mode='r', shape=self.shape)

  def __getstate__(self):
    # Pickling a memmap copies its contents; reopen the mapping instead.
    state = dict(self.__dict__)
    del state['_data']
    return state

  def __setstate__(self, state):
    self.__dict__.update(state)
    self._data = self._open()

  @property
  def dim(self) -> int:
    return self.shape[1]

  def __len__(self) -> int:
    return self.shape[0]

  def __contains__(self, frame_id: str) -> bool:
    return frame_id in self._index

  def rows(self, ids: Sequence[str]) -> np.ndarray:
    """Row indices `[n]` int64 of `ids`."""
    try:
      return np.fromiter((self._index[i] for i in ids), dtype=np.int64, count=len(ids))
    except KeyError as e:
      raise DataError(f'frame id {short(e.args[0])} is not in BigFile {self.folder} (id.txt)') from None

  def read(self, ids: Sequence[str], what: str = 'frames') -> np.ndarray:
    """Feature rows of `ids`, in the given order: `[n, D]` float32 (at most
    `MAX_FEATURE_ELEMENTS` elements: a frame list repeating ids could ask for more than the
    file holds; `what` names the item in that error)."""
    check_elements((len(ids), self.dim), self.bin_path, what)
    return np.asarray(self._data[self.rows(ids)], dtype=np.float32)

  def drop_pages(self) -> None:
    """Unmaps the rows read so far (the kernel keeps them in its page cache): a reader that
    goes through the whole file then holds a bounded resident set, not the file."""
    self._data = self._open()


# ----------------------------------------------------------------------------- text files


class _DuplicateKey(ValueError):
  """A key listed twice in a dict literal (Python and JSON keep the last one silently)."""


def _unique_pairs(pairs: Iterable[tuple]) -> dict:
  out = {}
  for key, value in pairs:
    if key in out:
      raise _DuplicateKey(key)
    out[key] = value
  return out


def _parse_dict_literal(text: str):
  """A Python literal, parsed without `eval`; a dict listing a key twice raises `_DuplicateKey`.

  Fast path: with no '"' and no backslash in the text, every "'" delimits a plain
  string, so the JSON reading of the text with ' -> " is the same value (JSON's parser is
  much faster and leaner than `ast` on a TVR-sized file). Anything JSON rejects
  (tuples, comments, ...) goes to `ast.literal_eval`.
  """
  if '"' not in text and '\\' not in text:
    try:
      return json.loads(text.replace("'", '"'), object_pairs_hook=_unique_pairs)
    except json.JSONDecodeError:
      pass
  tree = ast.parse(text.strip(), mode='eval')
  if isinstance(tree.body, ast.Dict):
    _unique_pairs((ast.literal_eval(k), None) for k in tree.body.keys if k is not None)
  return ast.literal_eval(tree)


def read_video2frames(path: str) -> dict[str, list[str]]:
  """Parses `video2frames.txt` (a dict literal, never passed to `eval`): video id -> frame ids."""
  _require_files([path], 'video2frames')
  with open(path, encoding='utf-8') as f:
    text = f.read()
  try:
    mapping = _parse_dict_literal(text)
  except _DuplicateKey as e:
    raise DataError(f'{path}: video id {short(e.args[0])} is listed twice (one frame list per '
                    'video)') from None
  except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as e:
    line = f':{e.lineno}' if getattr(e, 'lineno', None) else ''
    raise DataError(f'{path}{line}: not a Python dict literal ({e.__class__.__name__}: {e})') from None
  if not isinstance(mapping, dict):
    raise DataError(f'{path}: expected a dict literal video_id -> [frame ids], got {type(mapping).__name__}')
  for video_id, frames in mapping.items():
    if not isinstance(video_id, str):
      raise DataError(f'{path}: video id {short(video_id)} is not a string')
    if not isinstance(frames, (list, tuple)) or not all(isinstance(x, str) for x in frames):
      raise DataError(f'{path}: frames of video {short(video_id)} are not a list of strings')
    if isinstance(frames, tuple):
      mapping[video_id] = list(frames)
  return mapping


def check_unique(seen: dict[str, int], key: str, line: int, where: str, what: str) -> None:
  """Records the line of `key` in `seen`; raises `where: <what with the key> (first on line
  n)` when it was seen before (ids of caption and annotation files)."""
  if key in seen:
    raise DataError(f'{where}: {what.format(short(key))} (first on line {seen[key]})')
  seen[key] = line


def read_captions(path: str) -> list[tuple[str, str]]:
  """Reads a caption file: `[(cap_id, caption)]` in file order. Blank lines are ignored.

  Lines end with '\\n', '\\r\\n' or a lone '\\r' (old Mac files), in any mix.
  """
  _require_files([path], 'captions')
  items = []
  first_line = {}
  with open(path, 'rb') as f:
    raw_lines = f.read().removeprefix(b'\xef\xbb\xbf').splitlines()  # drop a UTF-8 BOM
  for lineno, raw in enumerate(raw_lines, 1):
    try:
      line = raw.decode('utf-8')
    except UnicodeDecodeError as e:
      raise DataError(f'{path}:{lineno}: not UTF-8 text (byte {e.start} of the line)') from None
    if not line.strip():
      continue
    if line[0].isspace():
      raise DataError(f'{path}:{lineno}: line has no caption id (starts with whitespace): {short(line)}')
    parts = line.split(None, 1)
    if len(parts) < 2 or not parts[1].strip():
      raise DataError(f'{path}:{lineno}: caption id {short(parts[0])} has no caption text')
    cap_id, caption = parts[0], parts[1].strip()
    if not video_id_of(cap_id):
      raise DataError(f'{path}:{lineno}: caption id {short(cap_id)} has an empty video id (before "#")')
    check_unique(first_line, cap_id, lineno, f'{path}:{lineno}', 'duplicate caption id {}')
    items.append((cap_id, caption))
  if not items:
    raise DataError(f'{path}: no captions')
  return items


def read_moments(path: str) -> dict[str, tuple[float, float, float]]:
  """Reads a moments file: cap_id -> (start, end, duration) in seconds.

  The one reader of moments (`check` and `prepare` both use it through
  `check.split_moments` / `check.moments_of`): a caption listed twice with different values,
  or a video given two durations, is an error naming both lines (a line repeated exactly is
  kept once).
  """
  moments, line_of, video_line = {}, {}, {}
  with open(path, encoding='utf-8') as f:
    for lineno, line in enumerate(f, 1):
      parts = line.split()
      if not parts:
        continue
      try:
        if len(parts) != 4:
          raise ValueError
        start, end, duration = (float(v) for v in parts[1:])
      except ValueError:
        raise DataError(f'{path}:{lineno}: expected "<cap_id> <start> <end> <duration>", '
                        f'got {short(line.strip())}') from None
      if not (0 <= start <= end <= duration) or not 0 < duration < math.inf:
        raise DataError(
            f'{path}:{lineno}: caption {short(parts[0])} needs 0 <= start <= end <= duration '
            f'and a finite duration > 0, got {start} {end} {duration}')
      cap_id, moment = parts[0], (start, end, duration)
      if cap_id in moments and moments[cap_id] != moment:
        raise DataError(f'{path}:{lineno}: caption {short(cap_id)} has moment {moment} here but '
                        f'{moments[cap_id]} on line {line_of[cap_id]}: one span per caption')
      video = video_id_of(cap_id)
      first = video_line.setdefault(video, (lineno, duration))
      if first[1] != duration:
        raise DataError(f'{path}:{lineno}: video {short(video)} has duration {duration} here but '
                        f'{first[1]} on line {first[0]}: one duration per video')
      moments[cap_id] = moment
      line_of.setdefault(cap_id, lineno)
  return moments


def video_ids_in_order(captions: Iterable[tuple[str, str]]) -> list[str]:
  """Unique video ids of `(cap_id, caption)` items in order of first appearance."""
  return list(dict.fromkeys(video_id_of(cap_id) for cap_id, _ in captions))


# ----------------------------------------------------------------------------- HDF5


def shared_videos(videos_of: Mapping[str, Sequence[str]], train_split: str = 'train'
                  ) -> dict[str, list[str]]:
  """Video ids each other split shares with `train_split` (test leakage), in that split's
  order: other split name -> ids (splits sharing none are left out)."""
  if train_split not in videos_of:
    return {}
  train = set(videos_of[train_split])
  shared = {name: [v for v in videos if v in train]
            for name, videos in videos_of.items() if name != train_split}
  return {name: ids for name, ids in shared.items() if ids}


class H5Features:
  """One HDF5 dataset per id; the file is opened lazily (and again in a forked process).

  `what` names the file in the error when it is missing (default: the class name); as a
  context manager the file is opened on entry and closed on exit.
  """

  kind = 'id'

  def __init__(self, path: str, what: str | None = None):
    self.path = os.fspath(path)
    _require_files([self.path], what or type(self).__name__)
    self._file = None
    self._pid = None

  def __enter__(self) -> 'H5Features':
    self._h5()
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def _h5(self) -> h5py.File:
    if self._file is None or self._pid != os.getpid():
      try:
        self._file = h5py.File(self.path, 'r')
      except OSError as e:
        raise DataError(f'{self.path}: cannot open as HDF5 ({e})') from None
      self._pid = os.getpid()
    return self._file

  def __getstate__(self):
    return {**self.__dict__, '_file': None, '_pid': None}

  def close(self) -> None:
    if self._file is not None and self._pid == os.getpid():
      self._file.close()
    self._file = None

  def keys(self) -> set[str]:
    return set(self._h5().keys())

  def __contains__(self, key: str) -> bool:
    return key in self._h5()

  def _dataset(self, key: str) -> h5py.Dataset:
    ds = self._h5().get(key)
    if not isinstance(ds, h5py.Dataset):
      raise DataError(f'{self.kind} {short(key)} is not in {self.path}')
    return ds

  def shape(self, key: str) -> tuple[int, ...]:
    return self._dataset(key).shape

  def shape_or_none(self, key: str) -> tuple[int, ...] | None:
    """Shape of `key`'s dataset, or None when it is absent or a group (one HDF5 lookup)."""
    ds = self._h5().get(key)
    return ds.shape if isinstance(ds, h5py.Dataset) else None

  def meta_or_none(self, key: str) -> tuple[tuple[int, ...], np.dtype] | None:
    """(shape, dtype) of `key`'s dataset, or None when it is absent or a group (one lookup)."""
    ds = self._h5().get(key)
    return (ds.shape, ds.dtype) if isinstance(ds, h5py.Dataset) else None

  def read(self, key: str, rows: Sequence[int] | None = None) -> np.ndarray:
    """The stored array of `key` (only its `rows`, when given), in its stored dtype.

    The declared shape is checked against `MAX_FEATURE_ELEMENTS` before anything is read
    (HDF5 metadata costs nothing; a small or compressed file may declare any shape), and so is
    the selection of `rows`; a row out of range is an error naming the key.
    """
    ds = self._dataset(key)
    what = f'{self.kind} {short(key)}'
    check_elements(ds.shape, self.path, what)
    if rows is None:
      return ds[...]
    rows = np.asarray(rows, np.int64)
    if ds.ndim == 0 or (rows.size and (rows.min() < 0 or rows.max() >= ds.shape[0])):
      raise DataError(f'{what} has features of shape {ds.shape}, rows {short(rows.tolist())} '
                      f'asked, in {self.path}')
    if not rows.size:
      return np.empty((0, *ds.shape[1:]), ds.dtype)
    unique, inverse = np.unique(rows, return_inverse=True)  # h5py: increasing, no repeats
    return ds[unique][inverse.reshape(-1)]


class CaptionFeatures(H5Features):
  """Query features: cap_id -> token features `[n_tokens, Dq]` (RoBERTa, or CLIP for
  'clip_text'), or AMDNet's CLIP sentence vector `[Dq]` (or `[1, Dq]`)."""
  kind = 'caption id'


ClipQueryFeatures = CaptionFeatures  # AMDNet's CLIP sentence features, read the same way


class ClipVideoFeatures(H5Features):
  """AMDNet CLIP frame features: video_id -> `[n_frames, Dv]`."""
  kind = 'video id'


# ----------------------------------------------------------------------------- layout


@dataclasses.dataclass(frozen=True)
class Layout:
  """Paths of one collection folder."""
  collection_dir: str
  collection: str
  visual_feature: str | None
  text_feature: str
  # CLIP layout: the FeatureData/<frame_map> folder whose video2frames.txt gives the frame
  # timeline the CLIP rows are read along (None: the rows as stored).
  frame_map: str | None = None

  def __post_init__(self):
    if self.text_feature not in TEXT_FEATURES:
      raise ValueError(f'text_feature must be one of {TEXT_FEATURES}, got {self.text_feature!r}')
    if self.frame_map and self.text_feature != 'clip':
      raise ValueError(f'frame_map={self.frame_map!r} reads the CLIP layout along a frame '
                       f'timeline; text_feature={self.text_feature!r} is not the CLIP layout')

  @property
  def text_dir(self) -> str:
    return os.path.join(self.collection_dir, 'TextData')

  @property
  def feature_dir(self) -> str:
    """The BigFile folder (token layout)."""
    return os.path.join(self.collection_dir, 'FeatureData', self.visual_feature or '')

  @property
  def video2frames_path(self) -> str:
    return os.path.join(self.feature_dir, 'video2frames.txt')

  @property
  def video_h5(self) -> bool:
    """Whether videos are one HDF5 dataset each (AMDNet's CLIP and MSC-PRVR's layouts)."""
    return self.text_feature == 'clip' or self.text_feature in MSC_FEATURE_FILES

  @property
  def query_feature_path(self) -> str:
    if self.text_feature in MSC_FEATURE_FILES:
      name = MSC_FEATURE_FILES[self.text_feature][1] % self.collection
    else:
      name = _QUERY_FEATURE_FILES[self.text_feature] % self.collection
    return os.path.join(self.text_dir, name)

  @property
  def clip_video_feature_path(self) -> str:
    """The video HDF5 of the CLIP layout, or of an MSC-PRVR layout."""
    if self.text_feature in MSC_FEATURE_FILES:
      name = MSC_FEATURE_FILES[self.text_feature][0] % self.collection
    else:
      name = f'new_clip_vit_32_{self.collection}_vid_features.hdf5'
    return os.path.join(self.collection_dir, 'FeatureData', name)

  def video_key(self, video_id: str) -> str:
    """The HDF5 key of a video: its id, but in MSC-PRVR's ActivityNet files without the
    caption ids' `v_` prefix (the official loader reads `video_id[2:]`)."""
    if (self.text_feature in MSC_FEATURE_FILES and self.collection == 'activitynet'
        and video_id.startswith('v_')):
      return video_id[2:]
    return video_id

  @property
  def frame_map_path(self) -> str:
    """The video2frames.txt of `frame_map` (CLIP layout)."""
    return os.path.join(self.collection_dir, 'FeatureData', self.frame_map or '',
                        'video2frames.txt')

  def caption_path(self, split: str) -> str:
    return os.path.join(self.text_dir, f'{self.collection}{split}{_CAPTION_SUFFIX}')

  def moments_path(self, split: str) -> str:
    """The optional moment spans of `split` (`ReleaseWriter.write_moments`)."""
    return os.path.join(self.text_dir, f'{self.collection}{split}.moments.txt')

  def video_files(self) -> list[str]:
    """The video feature files of this layout (`feature_files` less the query features)."""
    return [f for f in self.feature_files() if f != self.query_feature_path]

  def feature_files(self) -> list[str]:
    """The feature files this layout reads (caption files aside)."""
    if self.text_feature in MSC_FEATURE_FILES:
      return [self.clip_video_feature_path, self.query_feature_path]
    if self.text_feature == 'clip':
      timeline = [self.frame_map_path] if self.frame_map else []
      return [self.clip_video_feature_path, *timeline, self.query_feature_path]
    bigfile = [os.path.join(self.feature_dir, f) for f in ('feature.bin', 'id.txt', 'shape.txt')]
    return bigfile + [self.video2frames_path, self.query_feature_path]


def _resolve_collection(root: str, collection: str | None) -> tuple[str, str]:
  """(collection_dir, collection) from a root holding `<collection>/` or the folder itself."""
  root = os.path.abspath(os.fspath(root))
  if not os.path.isdir(root):
    raise FileNotFoundError(f'release root {root} does not exist')
  if collection is not None:
    nested = os.path.join(root, collection)
    if os.path.isdir(os.path.join(nested, 'TextData')):
      return nested, collection
    if os.path.isdir(os.path.join(root, 'TextData')) and (
        os.path.basename(root) == collection or _caption_splits(root, collection)):
      return root, collection
    raise FileNotFoundError(
        f'collection {collection!r} not found: expected {os.path.join(nested, "TextData")} '
        f'(or {root} itself to be the collection folder with TextData/{collection}*{_CAPTION_SUFFIX})')
  if os.path.isdir(os.path.join(root, 'TextData')):
    name = os.path.basename(root)
    if _caption_splits(root, name):
      return root, name
    prefixes = sorted({f[:-len(_CAPTION_SUFFIX) - len(s)]
                       for f in os.listdir(os.path.join(root, 'TextData'))
                       for s in _SPLIT_ORDER if f.endswith(s + _CAPTION_SUFFIX)})
    if len(prefixes) == 1:
      return root, prefixes[0]
    raise DataError(f'cannot infer the collection name in {root}/TextData (caption file prefixes: '
                    f'{prefixes}); pass collection=')
  cands = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d, 'TextData')))
  if len(cands) == 1:
    return os.path.join(root, cands[0]), cands[0]
  raise DataError(f'cannot infer the collection in {root}: found {cands or "no"} folders with '
                  'TextData/; pass collection=')


def _resolve_video_collection(root: str, collection: str | None) -> tuple[str, str]:
  """(collection_dir, collection) of a collection that may hold no captions (`FeatureData/`
  only, as `prvr-extract` writes one): `<root>/<collection>/` or `root` itself."""
  root = os.path.abspath(os.fspath(root))
  if not os.path.isdir(root):
    raise FileNotFoundError(f'collection root {root} does not exist')
  if collection:
    for folder in (os.path.join(root, collection), root):
      if os.path.isdir(os.path.join(folder, 'FeatureData')) and (
          folder != root or os.path.basename(root) == collection):
        return folder, collection
    raise FileNotFoundError(f'collection {collection!r} not found: expected '
                            f'{os.path.join(root, collection, "FeatureData")}')
  if os.path.isdir(os.path.join(root, 'FeatureData')):
    return root, os.path.basename(root)
  cands = sorted(d for d in os.listdir(root)
                 if os.path.isdir(os.path.join(root, d, 'FeatureData')))
  if len(cands) == 1:
    return os.path.join(root, cands[0]), cands[0]
  raise DataError(f'cannot infer the collection in {root}: found {cands or "no"} folders with '
                  'FeatureData/; pass collection=')


def _caption_splits(collection_dir: str, collection: str) -> list[str]:
  """The standard splits (train, val, test) whose caption files exist."""
  return [s for s in _SPLIT_ORDER
          if os.path.isfile(os.path.join(collection_dir, 'TextData', f'{collection}{s}{_CAPTION_SUFFIX}'))]


# ----------------------------------------------------------------------------- release


class Release:
  """One collection of the MS-SL feature release (or AMDNet's CLIP layout).

  `root` holds `<collection>/` or is the collection folder (the collection is inferred when
  unambiguous); `visual_feature` names the BigFile folder (unused by 'clip'). `num_clips`,
  `max_frames`, `max_query_len` are the official preprocessing sizes; `normalize` defaults to
  True for the token layouts and MSC-PRVR's (as its loader), False for 'clip' (as AMDNet).
  `frame_map` (CLIP layout only) names a BigFile folder whose `video2frames.txt` gives each
  video's frame timeline: a video is then its CLIP rows read along that timeline
  (`preprocess.timeline_rows`) and pooled in float64, as prvr-ea reads the CLIP release for
  GMMFormer, GMMFormer v2, HLFormer and MS-SL; None reads the rows as stored, pooled in
  float32 (AMDNet, DreamPRVR, Holmes; MSC-PRVR's layouts always).
  `visual_dim` / `query_dim` (`config.model.*_dim`, None: from the data) raise naming the flag
  on a mismatch.
  `check_values` reads every feature of a split when it is opened (else non-finite values
  raise when an item is read). See docs/data_release.md.
  """

  def __init__(self, root: str, collection: str | None = None, visual_feature: str | None = None,
               text_feature: str = 'roberta', *, num_clips: int = preprocess.NUM_CLIPS,
               max_frames: int = preprocess.MAX_FRAMES, max_query_len: int = preprocess.MAX_QUERY_LEN,
               normalize: bool | None = None, visual_dim: int | None = None,
               query_dim: int | None = None, skip_bad_items: bool = False,
               check_values: bool = False, frame_map: str | None = None,
               videos_only: bool = False):
    if text_feature not in TEXT_FEATURES:
      raise ValueError(f'text_feature must be one of {TEXT_FEATURES}, got {text_feature!r}')
    if text_feature in TOKEN_TEXT_FEATURES and not visual_feature:
      raise ValueError(f'text_feature={text_feature!r} needs visual_feature (the FeatureData/<name> '
                       'BigFile folder)')
    if videos_only:
      collection_dir, collection = _resolve_video_collection(root, collection)
    else:
      collection_dir, collection = _resolve_collection(root, collection)
    self.layout = Layout(collection_dir, collection, visual_feature, text_feature,
                         frame_map or None)
    self.num_clips = num_clips
    self.max_frames = max_frames
    self.max_query_len = max_query_len
    self.normalize = default_normalize(text_feature) if normalize is None else normalize
    self.expected_visual_dim = visual_dim
    self.expected_query_dim = query_dim
    self.skip_bad_items = skip_bad_items
    self.check_values = check_values
    self.videos_only = videos_only
    self.splits: tuple[str, ...] = tuple(_caption_splits(collection_dir, collection))
    if videos_only:
      self.splits = (ALL_SPLIT,)
      _require_files(self.layout.video_files(),
                     f'collection {collection_dir} ({text_feature} layout)')
    elif not self.splits:
      expected = ', '.join(self.layout.caption_path(s) for s in _SPLIT_ORDER)
      raise FileNotFoundError(f'no caption files in {self.layout.text_dir}; expected {expected}')
    else:
      if self.layout.frame_map and not os.path.isfile(self.layout.frame_map_path):
        raise FileNotFoundError(
            f'{self.layout.frame_map_path} does not exist: the CLIP rows are read along the '
            f'frame timeline of FeatureData/{self.layout.frame_map} (the MS-SL frame list of '
            "AMDNet's release), which a collection of your own videos (prvr-extract) does not "
            f'have; read its rows as stored with --config.data.frame_map= (config.data.'
            f'frame_map={self.layout.frame_map!r})')
      _require_files(self.layout.feature_files(),
                     f'release {collection_dir} ({text_feature} layout)')
    self._splits: dict[str, ReleaseSplit] = {}

  @property
  def collection(self) -> str:
    return self.layout.collection

  @property
  def text_feature(self) -> str:
    return self.layout.text_feature

  @property
  def is_clip(self) -> bool:
    """AMDNet's CLIP layout (one sentence vector per caption)."""
    return self.layout.text_feature == 'clip'

  @property
  def video_h5(self) -> bool:
    """Videos in one HDF5 file, a dataset per video (`clip` and MSC-PRVR's layouts)."""
    return self.layout.video_h5

  @property
  def frame_map(self) -> str | None:
    return self.layout.frame_map

  # Shared readers, opened on first use.

  @functools.cached_property
  def bigfile(self) -> BigFile:
    bigfile = BigFile(self.layout.feature_dir)
    if self.expected_visual_dim is not None and bigfile.dim != self.expected_visual_dim:
      raise _dim_error('config.model.visual_dim', self.expected_visual_dim, bigfile.dim,
                       os.path.join(bigfile.folder, 'shape.txt'))
    return bigfile

  @functools.cached_property
  def video2frames(self) -> dict[str, list[str]]:
    return read_video2frames(self.layout.video2frames_path)

  @functools.cached_property
  def timeline(self) -> dict[str, list[str]]:
    """video id -> frame ids of the `frame_map` folder's video2frames.txt."""
    return read_video2frames(self.layout.frame_map_path)

  @functools.cached_property
  def clip_videos(self) -> ClipVideoFeatures:
    return ClipVideoFeatures(self.layout.clip_video_feature_path)

  @functools.cached_property
  def queries(self) -> CaptionFeatures:
    return CaptionFeatures(self.layout.query_feature_path)

  def close(self) -> None:
    """Closes the HDF5 files that were opened (they reopen on the next read)."""
    for name in ('clip_videos', 'queries'):
      if name in self.__dict__:
        self.__dict__[name].close()

  def __enter__(self) -> 'Release':
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def feature_video_ids(self) -> list[str]:
    """Every video id of the feature file (HDF5 layouts: its datasets; token layouts: the
    videos of video2frames.txt), sorted."""
    if self.video_h5:
      ids = self.clip_videos.keys()
    else:
      ids = self.video2frames.keys()
    if not ids:
      source = (self.layout.clip_video_feature_path if self.video_h5
                else self.layout.video2frames_path)
      raise DataError(f'{source} holds no video')
    return sorted(ids)

  def split(self, name: str) -> 'ReleaseSplit':
    """The split read from `TextData/<collection><name>.caption.txt` (cached); with
    `videos_only`, `ALL_SPLIT` only: every video of the feature file, no captions."""
    if self.videos_only:
      if name != ALL_SPLIT:
        raise ValueError(f'split {name!r}: a videos-only collection ({self.layout.collection_dir}) '
                         f'has one split, {ALL_SPLIT!r} (every video of its feature file)')
      if name not in self._splits:
        self._splits[name] = ReleaseSplit(self, name, video_ids=self.feature_video_ids())
      return self._splits[name]
    if name not in self._splits:
      path = self.layout.caption_path(name)
      if not os.path.isfile(path):
        raise FileNotFoundError(f'split {name!r}: missing caption file {path} '
                                f'(splits found: {list(self.splits)})')
      self._splits[name] = ReleaseSplit(self, name)
    return self._splits[name]


class ReleaseSplit:
  """Captions of one split, their videos, and preprocessed features on demand.

  Attributes:
    name, caption_file: the split and its caption file.
    captions: `[(cap_id, caption)]` in file order (bad ones removed in skip mode).
    caption_ids: cap ids in file order (eval query rows).
    video_ids: unique video ids in first-appearance order (eval columns).
    skipped: `[(id, reason)]` of skipped videos / captions (skip mode only).
    problems: the problem of each bad video / caption (skip mode; the items skipped because
      of another's problem are in `skipped` only).
  """

  def __init__(self, release: Release, name: str, video_ids: Sequence[str] | None = None):
    self.release = release
    self.name = name
    # `video_ids`: a videos-only split (`ALL_SPLIT`): these videos, no captions.
    self.videos_only = video_ids is not None
    self.caption_file = None if self.videos_only else release.layout.caption_path(name)
    captions = [] if self.videos_only else read_captions(self.caption_file)
    self.skipped: list[tuple[str, str]] = []
    self.problems: list[str] = []
    # The dims of the data (`config.model.*_dim` when given), set by the first item checked.
    self.visual_dim: int | None = release.expected_visual_dim
    self.query_dim: int | None = release.expected_query_dim
    self._set_captions(captions)
    if self.videos_only:
      self.video_ids = list(video_ids)
      self._caps_of = {v: [] for v in self.video_ids}
    self._validate()
    if release.check_values:
      self._validate(values=True)

  def _set_captions(self, captions: list[tuple[str, str]]) -> None:
    self.captions = captions
    self.caption_ids = [c for c, _ in captions]
    self.video_ids = video_ids_in_order(captions)
    self._caps_of: dict[str, list[str]] = {v: [] for v in self.video_ids}
    for cap_id in self.caption_ids:
      self._caps_of[video_id_of(cap_id)].append(cap_id)

  # ---- queries

  def captions_of(self, video_id: str) -> list[str]:
    """Cap ids of `video_id`, in file order."""
    try:
      return self._caps_of[video_id]
    except KeyError:
      raise KeyError(f'video {short(video_id)} has no captions in {self.caption_file}') from None

  def caption_video_index(self) -> np.ndarray:
    """`[num_captions]` int64: column in `video_ids` of each caption's video."""
    column = {v: i for i, v in enumerate(self.video_ids)}
    return np.array([column[video_id_of(c)] for c in self.caption_ids], dtype=np.int64)

  # ---- features

  def num_frames(self, video_id: str) -> int:
    """Raw number of frames (feature rows) of a video."""
    if self.release.frame_map:
      return len(self._timeline_indices(video_id))
    if self.release.video_h5:
      return self.release.clip_videos.shape(self.release.layout.video_key(video_id))[0]
    return len(self._frame_ids(video_id))

  def _timeline_problem(self, video_id: str) -> str | None:
    """What is wrong with a video's frame list in the `frame_map` timeline, or None."""
    rel = self.release
    path = rel.layout.frame_map_path
    frames = rel.timeline.get(video_id)
    if not frames:
      return f'video {short(video_id)} has no frame list in {path}'
    for frame in frames:
      vid, _, index = frame.rpartition('_')
      if vid != video_id or not (index.isascii() and index.isdigit()):
        return (f'video {short(video_id)}: frame id {short(frame)} in {path} is not '
                f'<video id>_<frame index>')
    return None

  def _timeline_indices(self, video_id: str) -> np.ndarray:
    """`[n]` int64 frame indices of a video in the `frame_map` timeline."""
    problem = self._timeline_problem(video_id)
    if problem:
      raise DataError(problem)
    return np.array([int(f.rpartition('_')[2]) for f in self.release.timeline[video_id]],
                    dtype=np.int64)

  def _frame_ids(self, video_id: str) -> list[str]:
    frames = self.release.video2frames.get(video_id)
    if frames is None:
      raise DataError(f'video {short(video_id)} is not in {self.release.layout.video2frames_path}')
    return frames

  def raw_video_features(self, video_id: str) -> np.ndarray:
    """Unprocessed `[n_frames, Dv]` features of a video, in their stored dtype."""
    rel = self.release
    if rel.video_h5:
      key = rel.layout.video_key(video_id)
      x = rel.clip_videos.read(key)
      source = rel.clip_videos.path + ('' if key == video_id else f' (key {short(key)})')
    else:
      frames = self._frame_ids(video_id)
      x = rel.bigfile.read(frames, f'video {short(video_id)} (in {rel.layout.video2frames_path})')
      source = rel.bigfile.bin_path
    if x.ndim != 2 or x.shape[0] == 0:
      raise DataError(f'video {short(video_id)} has no frames (features of shape {x.shape} in {source})')
    bad = ~np.isfinite(x).all(axis=1)
    if bad.any():
      row = int(np.argmax(bad))
      where = f'frame {row}' if rel.video_h5 else f'frame id {short(frames[row])}'
      raise DataError(f'video {short(video_id)}: NaN/Inf in {where} ({int(bad.sum())} bad frame(s)) in {source}')
    if rel.frame_map:
      indices = self._timeline_indices(video_id)
      check_elements((len(indices), x.shape[1]), rel.layout.frame_map_path,
                     f'video {short(video_id)}')
      x = x[preprocess.timeline_rows(indices, x.shape[0])]
    return x

  def video_features(self, video_id: str) -> tuple[np.ndarray, np.ndarray]:
    """Preprocessed (clip features `[num_clips, Dv]`, frame features `[min(n, max_frames), Dv]`), f32."""
    rel = self.release
    # BigFile rows, and prvr-ea's CLIP rows read along a frame timeline, reach the official
    # code as Python floats: it pools them in float64.
    x = self.raw_video_features(video_id)
    x = x.astype(np.float32 if rel.video_h5 and not rel.frame_map else np.float64)
    clips = preprocess.average_to_fixed_length(x, rel.num_clips)
    frames = preprocess.uniform_feature_sampling(x, rel.max_frames)
    if rel.normalize:
      clips, frames = preprocess.l2_normalize(clips), preprocess.l2_normalize(frames)
    return clips.astype(np.float32), frames.astype(np.float32)

  def caption_features(self, cap_id: str) -> np.ndarray:
    """Preprocessed `[min(n_tokens, max_query_len), Dq]` float32 (CLIP sentence vectors: `[1, Dq]`)."""
    rel = self.release
    x = rel.queries.read(cap_id)
    if x.ndim == 1 and rel.is_clip:
      x = x[None]
    if x.ndim != 2 or x.shape[0] == 0 or (rel.is_clip and x.shape[0] != 1):
      raise DataError(f'caption {short(cap_id)} has no token features (shape {x.shape}) in {rel.queries.path}')
    x = preprocess.truncate_tokens(x, rel.max_query_len)
    if not np.isfinite(x).all():
      raise DataError(f'caption {short(cap_id)}: NaN/Inf in its features in {rel.queries.path}')
    if rel.normalize:
      x = preprocess.l2_normalize(x)
    return x.astype(np.float32)

  # ---- validation

  def _check_video(self, video_id: str) -> str | None:
    """Cheap (metadata-only) check of a video; returns the problem or None."""
    rel = self.release
    if rel.video_h5:
      key = rel.layout.video_key(video_id)
      meta = rel.clip_videos.meta_or_none(key)
      if meta is None:
        as_key = '' if key == video_id else f' (as key {short(key)})'
        return f'video {short(video_id)}{as_key} is not in {rel.clip_videos.path}'
      shape, dtype = meta
      if dtype.kind != 'f':
        return _not_floats('video', video_id, dtype, rel.clip_videos.path)
      if len(shape) != 2 or shape[0] == 0:
        return f'video {short(video_id)} has no frames (shape {shape}) in {rel.clip_videos.path}'
      if math.prod(shape) > MAX_FEATURE_ELEMENTS:
        return _too_large('video', video_id, shape, rel.clip_videos.path)
      if rel.frame_map:
        problem = self._timeline_problem(video_id)
        if problem:
          return problem
        if len(rel.timeline[video_id]) * shape[1] > MAX_FEATURE_ELEMENTS:
          return _too_large('video', video_id, (len(rel.timeline[video_id]), shape[1]),
                            rel.layout.frame_map_path)
      dim, source = shape[1], rel.clip_videos.path
    else:
      frames = rel.video2frames.get(video_id)
      if frames is None:
        return f'video {short(video_id)} is not in {rel.layout.video2frames_path} (zero frames)'
      if not frames:
        return f'video {short(video_id)} has an empty frame list in {rel.layout.video2frames_path}'
      if len(frames) * rel.bigfile.dim > MAX_FEATURE_ELEMENTS:
        return _too_large('video', video_id, (len(frames), rel.bigfile.dim),
                          rel.layout.video2frames_path)
      absent = [f for f in frames if f not in rel.bigfile]
      if absent:
        return (f'video {short(video_id)}: frame id {short(absent[0])} ({len(absent)} of {len(frames)} frames) '
                f'is not in BigFile {rel.bigfile.folder}')
      dim, source = rel.bigfile.dim, rel.bigfile.folder
    return self._same_dim('video', video_id, dim, source)

  def _check_caption(self, cap_id: str) -> str | None:
    rel = self.release
    path = rel.queries.path
    meta = rel.queries.meta_or_none(cap_id)
    if meta is None:
      return f'caption id {short(cap_id)} is not in {path}'
    shape, dtype = meta
    if dtype.kind != 'f':
      return _not_floats('caption', cap_id, dtype, path)
    ok_ndims = (1, 2) if rel.is_clip else (2,)
    if len(shape) not in ok_ndims or shape[0] == 0:
      return f'caption {short(cap_id)} has no token features (shape {shape}) in {path}'
    if rel.is_clip and len(shape) == 2 and shape[0] != 1:
      return (f'caption {short(cap_id)} has features of shape {shape} in {path}: the CLIP '
              'layout holds one sentence vector per caption ([Dq] or [1, Dq])')
    if math.prod(shape) > MAX_FEATURE_ELEMENTS:
      return _too_large('caption', cap_id, shape, path)
    return self._same_dim('caption', cap_id, shape[-1], path)

  def _same_dim(self, kind: str, item_id: str, dim: int, source: str) -> str | None:
    """Keeps the first dim of a `kind` ('video' / 'caption'), or returns the problem of an
    item whose dim differs from config.model.{visual,query}_dim or the first item's."""
    which = 'visual' if kind == 'video' else 'query'
    want = getattr(self, f'{which}_dim')
    if want is None:
      setattr(self, f'{which}_dim', dim)
    elif dim != want:
      flag = (f'config.model.{which}_dim' if getattr(self.release, f'expected_{which}_dim')
              is not None else f'the first {kind}\'s dim')
      return f'{kind} {short(item_id)} has feature dim {dim} in {source} but {flag} is {want}'
    return None

  def _check_values(self, item_id: str, read) -> str | None:
    try:
      read(item_id)
    except DataError as e:
      return str(e)
    return None

  def _check_config_dims(self) -> None:
    """Raises when the data's dims disagree with config.model.{visual,query}_dim."""
    rel = self.release
    checks = [] if self.videos_only else [
        ('config.model.query_dim', rel.expected_query_dim, rel.queries, self.caption_ids,
         lambda c: c)]
    if rel.video_h5:
      checks.append(('config.model.visual_dim', rel.expected_visual_dim, rel.clip_videos,
                     self.video_ids, rel.layout.video_key))
    else:
      _ = rel.bigfile  # checks config.model.visual_dim against shape.txt
    for flag, expected, features, ids, key_of in checks:
      if expected is None:
        continue
      shapes = (features.shape_or_none(key_of(i)) for i in ids)
      item, shape = next(((i, sh) for i, sh in zip(ids, shapes) if sh), (None, None))
      if shape is not None and shape[-1] != expected:
        as_key = '' if key_of(item) == item else f', key {short(key_of(item))}'
        raise _dim_error(flag, expected, shape[-1],
                         f'{features.path} ({features.kind} {short(item)}{as_key})')

  def _validate(self, values: bool = False) -> None:
    """Checks every video and caption (metadata only, or every value); raises or skips."""
    rel = self.release
    if values:
      check_video = lambda v: self._check_values(v, self.raw_video_features)
      check_caption = lambda c: self._check_values(c, self.caption_features)
    else:
      self._check_config_dims()
      check_video, check_caption = self._check_video, self._check_caption
    bad_videos = {v: p for v in self.video_ids if (p := check_video(v))}
    bad_captions = {c: p for c in self.caption_ids if (p := check_caption(c))}
    problems = [*bad_videos.values(), *bad_captions.values()]
    if not problems:
      return
    what = (f'split {self.name!r} of {rel.layout.collection_dir} '
            f'({self.caption_file or "every video of its feature file"})')
    if not rel.skip_bad_items:
      raise _bad_items(problems, what)
    if self.videos_only:
      kept_ids = [v for v in self.video_ids if v not in bad_videos]
      if not kept_ids:
        raise _bad_items(problems, what + ' (every item is bad)')
      self.skipped.extend(bad_videos.items())
      self.problems += problems
      self.video_ids = kept_ids
      self._caps_of = {v: [] for v in kept_ids}
      _log.warning('%s: skipped %d video(s) with bad data (see split.skipped); first: %s', what,
                   len(bad_videos), problems[0])
      return
    kept = [(c, t) for c, t in self.captions
            if c not in bad_captions and video_id_of(c) not in bad_videos]
    if not kept:
      raise _bad_items(problems, what + ' (every item is bad)')
    kept_videos = set(video_ids_in_order(kept))
    skipped = list(bad_videos.items()) + list(bad_captions.items())
    skipped += [(c, f'its video {short(video_id_of(c))} was skipped') for c in self.caption_ids
                if video_id_of(c) in bad_videos and c not in bad_captions]
    skipped += [(v, 'all of its captions were skipped') for v in self.video_ids
                if v not in bad_videos and v not in kept_videos]
    n_videos, n_captions = len(self.video_ids) - len(kept_videos), len(self.caption_ids) - len(kept)
    self.skipped.extend(skipped)
    self.problems += problems
    self._set_captions(kept)
    _log.warning('%s: skipped %d video(s) and %d caption(s) with bad data (see split.skipped); '
                 'first: %s', what, n_videos, n_captions, skipped[0][1])


# ----------------------------------------------------------------------------- writers


def write_video2frames(path: str, mapping: Mapping[str, Sequence[str]]) -> None:
  """Writes `video2frames.txt` as a dict literal."""
  literal = {str(v): [str(f) for f in frames] for v, frames in mapping.items()}
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  with open(path, 'w', encoding='utf-8') as f:
    f.write(repr(literal))


def write_captions(path: str, items: Iterable[tuple[str, str]]) -> None:
  """Writes `<cap_id> <caption>` lines."""
  lines = []
  for cap_id, caption in items:
    if not cap_id or any(ch.isspace() for ch in cap_id):
      raise ValueError(f'caption id {short(cap_id)} must be non-empty and free of whitespace')
    caption = ' '.join(caption.split())
    if not caption:
      raise ValueError(f'caption {short(cap_id)} is empty')
    lines.append(f'{cap_id} {caption}\n')
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  with open(path, 'w', encoding='utf-8') as f:
    f.writelines(lines)


def write_caption_features(path: str, mapping: Mapping[str, np.ndarray]) -> None:
  """Writes one float32 HDF5 dataset per id (caption features, or CLIP video features)."""
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  with h5py.File(path, 'w') as f:
    for key, value in mapping.items():
      f.create_dataset(key, data=np.asarray(value, dtype=np.float32))


def _add_clip_video(h5: h5py.File, video_id: str, frames: np.ndarray) -> None:
  """One video's CLIP rows `[n_rows, Dv]` as a float32 dataset named by its id (the CLIP
  layout's video HDF5, written by `ReleaseWriter` and `write_clip_videos`)."""
  h5.create_dataset(video_id, data=np.asarray(frames, dtype=np.float32))


def write_clip_videos(path: str, videos: Iterable[tuple[str, np.ndarray]]) -> int:
  """The CLIP layout's video HDF5 at `path` from `(video_id, [n_rows, Dv])` pairs, one held
  at a time: written to a new temporary file beside `path` and renamed over it (a reader sees
  the old file or the complete new one). Returns the number of videos written."""
  folder, name = os.path.split(os.path.abspath(path))
  os.makedirs(folder, exist_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=f'.{name}.', suffix='.tmp', dir=folder)
  os.close(fd)
  count = 0
  try:
    with h5py.File(tmp, 'w') as h5:
      for video_id, frames in videos:
        if not video_id or '/' in video_id or np.ndim(frames) != 2:
          raise ValueError(f'video {short(video_id)}: need a non-empty id without "/" and rows '
                           f'[n_rows, D], got shape {np.shape(frames)} ({path})')
        _add_clip_video(h5, video_id, frames)
        count += 1
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(tmp)
    raise
  return count


class BigFileWriter:
  """Writes a BigFile folder (feature.bin float32, id.txt, shape.txt) row block by row block,
  holding only the ids in memory."""

  def __init__(self, folder: str):
    self.folder = folder
    os.makedirs(folder, exist_ok=True)
    self._bin = open(os.path.join(folder, 'feature.bin'), 'wb')  # pylint: disable=consider-using-with
    self._ids: list[str] = []
    self._dim: int | None = None

  def add(self, ids: Sequence[str], rows: np.ndarray) -> None:
    """Appends `rows` `[len(ids), D]` under `ids`."""
    rows = np.asarray(rows)
    if rows.ndim != 2 or rows.shape[0] != len(ids) or rows.shape[1] != (self._dim or rows.shape[1]):
      raise ValueError(f'need a [len(ids)={len(ids)}, D={self._dim or "D"}] array, got shape '
                       f'{rows.shape} (BigFile {self.folder})')
    if any(not i or any(ch.isspace() for ch in i) for i in ids):
      raise ValueError('BigFile ids must be unique, non-empty and free of whitespace '
                       f'(BigFile {self.folder})')
    self._dim = rows.shape[1]
    self._bin.write(rows.astype('<f4').tobytes())
    self._ids += ids

  def close(self) -> None:
    """Writes id.txt and shape.txt; raises when an id repeats."""
    self._bin.close()
    if len(set(self._ids)) != len(self._ids):
      raise ValueError('BigFile ids must be unique, non-empty and free of whitespace '
                       f'(BigFile {self.folder})')
    with open(os.path.join(self.folder, 'id.txt'), 'w', encoding='utf-8') as f:
      f.write(' '.join(self._ids))
    with open(os.path.join(self.folder, 'shape.txt'), 'w') as f:
      f.write(f'{len(self._ids)} {self._dim or 0}')

  def abort(self) -> None:
    """Stops writing (the folder is left as it is)."""
    self._bin.close()


# The file a `ReleaseWriter` puts in its `<collection>.partial` folder while writing: a
# `.partial` folder without it is not ours, and is never removed.
PARTIAL_MARKER = '.prvr_release_writer'


class ReleaseWriter:
  """The one writer of the release layout: `<root>/<collection>` written item by item (only
  ids held in memory) as `<collection>.partial`, renamed at the end; an error removes it."""

  def __init__(self, root: str, collection: str, visual_feature: str | None = 'i3d_resnet',
               text_feature: str = 'roberta'):
    if text_feature in MSC_FEATURE_FILES:
      raise ValueError(f'text_feature={text_feature!r}: MSC-PRVR\'s files are read as their '
                       'authors publish them, not written here')
    self.collection_dir = os.path.join(os.fspath(root), collection)
    if os.path.lexists(self.collection_dir):
      raise FileExistsError(f'{self.collection_dir} exists; write the release into a new folder')
    self._partial = self.collection_dir + '.partial'
    self._marker = os.path.join(self._partial, PARTIAL_MARKER)
    if os.path.lexists(self._partial):
      # Removed only when an earlier writer left it (its marker): never a folder of the user's.
      if os.path.islink(self._partial) or not os.path.isfile(self._marker):
        raise FileExistsError(f'{self._partial} exists and was not left by a release writer '
                              f'(no {PARTIAL_MARKER}); move it away, or write the release into '
                              'another folder')
      shutil.rmtree(self._partial)
    self.layout = Layout(self._partial, collection, visual_feature, text_feature)
    os.makedirs(self._partial)
    with open(self._marker, 'w', encoding='utf-8') as f:
      f.write('a release being written by prvr_jax.data.release.ReleaseWriter\n')
    os.makedirs(self.layout.text_dir)
    self._video2frames: dict[str, list[str]] = {}
    if text_feature == 'clip':
      os.makedirs(os.path.dirname(self.layout.clip_video_feature_path))
      self._videos = h5py.File(self.layout.clip_video_feature_path, 'w')
    else:
      self._frames = BigFileWriter(self.layout.feature_dir)
    self._queries = h5py.File(self.layout.query_feature_path, 'w')

  @property
  def _clip(self) -> bool:
    return self.layout.text_feature == 'clip'

  def add_video(self, video_id: str, frames: np.ndarray,
                frame_ids: Sequence[str] | None = None) -> None:
    """Frame features `[n_frames, Dv]` of `video_id`; in the token layouts under `frame_ids`
    (default `<video_id>_<k>`), appended to the video's earlier frames."""
    if self._clip:
      _add_clip_video(self._videos, video_id, frames)
      return
    frame_ids = list(frame_ids or (f'{video_id}_{k}' for k in range(len(frames))))
    self._frames.add(frame_ids, frames)
    self._video2frames.setdefault(video_id, []).extend(frame_ids)

  def add_caption_features(self, cap_id: str, features: np.ndarray) -> None:
    """The query features of caption `cap_id`, stored as float32."""
    self._queries.create_dataset(cap_id, data=np.asarray(features, dtype=np.float32))

  def write_captions(self, split: str, items: Iterable[tuple[str, str]]) -> None:
    """`TextData/<collection><split>.caption.txt`: `<cap_id> <caption>` lines."""
    write_captions(self.layout.caption_path(split), items)

  def write_moments(self, split: str, rows: Iterable[tuple[str, float, float, float]]) -> None:
    """`TextData/<collection><split>.moments.txt`: `<cap_id> <start> <end> <duration>` lines
    (seconds, written exactly: `repr`), read by `read_moments`."""
    with open(self.layout.moments_path(split), 'w', encoding='utf-8') as f:
      for cap_id, start, end, duration in rows:
        f.write(f'{cap_id} {start!r} {end!r} {duration!r}\n')

  def close(self) -> str:
    """Finishes the files and puts the folder in place; returns `collection_dir`."""
    try:
      self._queries.close()
      if self._clip:
        self._videos.close()
      else:
        self._frames.close()
        write_video2frames(self.layout.video2frames_path, self._video2frames)
      os.remove(self._marker)
      os.rename(self._partial, self.collection_dir)
    except BaseException:
      self.abort()
      raise
    return self.collection_dir

  def abort(self) -> None:
    """Removes what was written."""
    self._queries.close()
    if self._clip:
      self._videos.close()
    else:
      self._frames.abort()
    shutil.rmtree(self._partial, ignore_errors=True)

  def __enter__(self) -> 'ReleaseWriter':
    return self

  def __exit__(self, exc_type, *exc) -> None:
    if exc_type is None:
      self.close()
    else:
      self.abort()


def write_release(root: str, collection: str, videos: Mapping[str, np.ndarray],
                  captions: Mapping[str, Sequence[tuple[str, str]]],
                  caption_features: Mapping[str, np.ndarray], visual_feature: str = 'i3d_resnet',
                  text_feature: str = 'roberta') -> str:
  """`ReleaseWriter` over numpy data in memory (tests): `videos` video_id -> `[n_frames, Dv]`,
  `captions` split -> `[(cap_id, caption)]`, `caption_features` cap_id -> `[n_tokens, Dq]`
  (`[Dq]` for CLIP); returns the collection folder."""
  with ReleaseWriter(root, collection, visual_feature, text_feature) as writer:
    for video_id, frames in videos.items():
      writer.add_video(video_id, frames)
    for split, items in captions.items():
      writer.write_captions(split, items)
    for cap_id, features in caption_features.items():
      writer.add_caption_features(cap_id, features)
  return writer.collection_dir
