r"""Text-video retrieval data (T-MASS / X-Pool): MSR-VTT, DiDeMo and LSMDC.

* Annotation readers (`read_msrvtt`, `read_didemo`, `read_lsmdc`, `read_split`) build each
  split the way the official T-MASS loaders do, as a `TextVideoSplit`: its videos and its
  (caption_id, video_id, text) pairs in the official order.
* `frame_dataset`: a `tf.data` pipeline of (video frames, tokenized caption) pairs from folders
  of frame images (`<frames_root>/<video_id>/*.jpg`), CLIP preprocessing inside the pipeline
  (`prvr_jax.data.frames`).
* Frozen-feature mode: `write_feature_release` writes precomputed CLIP features (HDF5 in)
  as a release folder in AMDNet's CLIP layout (`prvr_jax.data.release`), `num_frames`
  uniformly sampled frame features `[num_frames, 512]` per video and one sentence feature
  `[1, 512]` per caption, so that models train on CPU from features:

    python -m prvr_jax.data.text_video --dataset=msrvtt --annotations=T-MASS/data/MSRVTT \
        --frame_features=msrvtt_frames.h5 --text_features=msrvtt_text.h5 --out=/data/tv

  read back with `release.Release(out, 'msrvtt', 'clip_frames', 'clip')`.

Layouts, commands, every choice against the official code and the errors: docs/text_video_data.md.
"""

import collections
import csv
import dataclasses
import io
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence

import h5py
import numpy as np
import tensorflow as tf

from prvr_jax.data import frames as frames_lib
from prvr_jax.data import release as release_lib
from prvr_jax.files import listing, short

_log = logging.getLogger(__name__)

DataError = release_lib.DataError

DATASETS = ('msrvtt', 'didemo', 'lsmdc')
VISUAL_FEATURE = 'clip_frames'  # the name recorded for the visual feature (config.data)
TEXT_FEATURE = 'clip'  # release.py's CLIP layout: one sentence vector per caption
CLIP_DIM = 512  # ViT-B/32 and ViT-B/16 projections
# Our release split -> the official split read for it. The official code has no validation
# split: it selects checkpoints on the test split, so our `val` is the test split too.
DEFAULT_SPLITS: Mapping[str, str] = {'train': 'train', 'val': 'test', 'test': 'test'}

MSRVTT_DATA = 'MSRVTT_data.json'
MSRVTT_TRAIN = {'9k': 'MSRVTT_train.9k.csv', '7k': 'MSRVTT_train.7k.csv'}
MSRVTT_TEST = 'MSRVTT_JSFUSION_test.csv'
DIDEMO_FILE = 'didemo_{}_label.csv'
DIDEMO_COLUMNS = ['success', 'video_path', 'starts', 'ends', 'text', 'formatted_data']
DIDEMO_SPAN = (0, 31)  # seconds: every row of the shipped files (the whole <= 30 s video)
LSMDC_FILES = {'train': 'LSMDC16_annos_training.csv',
               'test': 'LSMDC16_challenge_1000_publictect.csv',  # sic, the official name
               'val': 'LSMDC16_annos_val.csv'}  # not read by the official code
LSMDC_SKIPPED = ('1012_Unbreakable_00.05.16.065-00.05.21.941',)  # skipped by the official reader

_MAX_LISTED = 5


# ----------------------------------------------------------------------------- the split


@dataclasses.dataclass(frozen=True)
class TextVideoSplit:
  """One split: its videos and its caption pairs, in the official order.

  Attributes:
    dataset: 'msrvtt', 'didemo' or 'lsmdc'.
    name: the official split read ('train', 'test'; 'val' where a file exists).
    video_ids: unique video ids, in the official order (first appearance); the frame folder
      of a video is `<frames_root>/<video_id>`.
    captions: `(caption_id, video_id, text)` in the official item order (training pairs,
      evaluation rows); caption ids are unique (the key of the text features).
    video_files: video_id -> its video file, relative to the official `--videos_dir`.
    source: the annotation file(s) read.
    skipped: `(id, reason)` of rows the official reader skips too.
  """
  dataset: str
  name: str
  video_ids: list[str]
  captions: list[tuple[str, str, str]]
  video_files: dict[str, str]
  source: str
  skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)

  def __post_init__(self):
    what = f'{self.dataset} split {self.name!r} ({self.source})'
    if not self.captions:
      raise DataError(f'{what} has no captions')
    if len(set(self.video_ids)) != len(self.video_ids):
      dup = next(v for v, c in collections.Counter(self.video_ids).items() if c > 1)
      raise DataError(f'{what}: duplicate video id {short(dup)}')
    for v in self.video_ids:
      _check_id(v, 'video id', what, video=True)
    videos, seen = set(self.video_ids), set()
    for cap_id, vid, text in self.captions:
      _check_id(cap_id, 'caption id', what)
      if cap_id in seen:
        raise DataError(f'{what}: duplicate caption id {short(cap_id)}')
      seen.add(cap_id)
      if vid not in videos:
        raise DataError(f'{what}: caption {short(cap_id)} is of video {short(vid)}, which is '
                        'not in the split\'s video list')
      if not text.strip():
        raise DataError(f'{what}: caption {short(cap_id)} is empty')
    without = videos - {vid for _, vid, _ in self.captions}
    if without:
      raise DataError(f'{what}: {len(without)} video(s) have no caption, e.g. '
                      f'{short(sorted(without)[:3])}')

  @property
  def caption_ids(self) -> list[str]:
    return [c for c, _, _ in self.captions]

  def caption_video_index(self) -> np.ndarray:
    """`[num_captions]` int32: the index in `video_ids` of each caption's video."""
    column = {v: i for i, v in enumerate(self.video_ids)}
    return np.array([column[v] for _, v, _ in self.captions], dtype=np.int32)

  def captions_of(self, video_id: str) -> list[str]:
    """Caption ids of one video, in split order."""
    return [c for c, v, _ in self.captions if v == video_id]

  def release_caption_id(self, caption_id: str, video_id: str) -> str:
    """`<video_id>#<caption_id>`: the caption's id in a release (release.video_id_of)."""
    return f'{video_id}#{caption_id}'


def _check_id(value: str, kind: str, where: str, video: bool = False) -> None:
  """Ids become file names, HDF5 keys and `<video_id>#<caption_id>` release ids."""
  bad = (not value or value != value.strip() or any(ch.isspace() for ch in value)
         or '/' in value or value in ('.', '..') or (video and '#' in value))
  if bad:
    rule = 'whitespace, "/"' + (', "#"' if video else '')
    raise DataError(f'{where}: {kind} {short(value)} is empty or holds {rule} (ids name '
                    'folders, HDF5 keys and <video_id>#<caption_id> release ids)')


def _require(path: str, what: str) -> str:
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{what}: annotation file {path} does not exist')
  return path


def _open_text(path: str) -> io.TextIOWrapper:
  return open(path, encoding='utf-8', newline='')


def _csv_rows(path: str, what: str) -> Iterator[tuple[int, list[str]]]:
  """(line number where the row starts, fields) of a comma-separated file."""
  try:
    with _open_text(path) as f:
      reader = csv.reader(f)
      line = 1
      for row in reader:
        yield line, row
        line = reader.line_num + 1
  except UnicodeDecodeError as e:
    raise DataError(f'{path}: not UTF-8 text ({e}) [{what}]') from None
  except csv.Error as e:
    raise DataError(f'{path}:{reader.line_num}: malformed CSV ({e}) [{what}]') from None


def _csv_table(path: str, columns: Sequence[str], what: str) -> Iterator[tuple[int, dict]]:
  """(line, {column: value}) of a CSV with a header naming at least `columns`."""
  rows = _csv_rows(path, what)
  first = next(rows, None)
  if first is None:
    raise DataError(f'{path}: empty file, expected a header with columns {list(columns)}')
  header = first[1]
  missing = [c for c in columns if c not in header]
  if missing:
    raise DataError(f'{path}:1: header {short(header)} lacks column(s) {missing}')
  for line, row in rows:
    if not any(x.strip() for x in row):
      continue  # blank line
    if len(row) != len(header):
      raise DataError(f'{path}:{line}: {len(row)} fields, expected {len(header)} '
                      f'({", ".join(header)})')
    yield line, dict(zip(header, row))


# ----------------------------------------------------------------------------- MSR-VTT


def _msrvtt_sentences(path: str) -> list[tuple[str, str, str]]:
  """(sen_id, video_id, caption) of every entry of MSRVTT_data.json's 'sentences', in order."""
  try:
    with open(path, 'rb') as f:
      db = json.load(f)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise DataError(f'{path}: not a JSON file ({e})') from None
  sentences = db.get('sentences') if isinstance(db, dict) else None
  if not isinstance(sentences, list):
    raise DataError(f'{path}: expected an object with a "sentences" list '
                    f'(keys: {short(sorted(db)) if isinstance(db, dict) else type(db).__name__})')
  out, first = [], {}
  for i, s in enumerate(sentences):
    where = f'{path}: sentences[{i}]'
    if not isinstance(s, dict) or any(k not in s for k in ('caption', 'video_id', 'sen_id')):
      raise DataError(f'{where}: expected an object with caption, video_id, sen_id, got '
                      f'{short(s)}')
    sen_id, vid, caption = s['sen_id'], s['video_id'], s['caption']
    if isinstance(sen_id, bool) or not isinstance(sen_id, (int, str)) or not str(sen_id).strip():
      raise DataError(f'{where}: sen_id {short(sen_id)} is not an integer or a string')
    if not isinstance(vid, str) or not isinstance(caption, str):
      raise DataError(f'{where} (sen_id {short(sen_id)}): video_id and caption must be strings')
    sen_id = str(sen_id)
    if sen_id in first:
      raise DataError(f'{where}: duplicate sen_id {short(sen_id)} (first at sentences'
                      f'[{first[sen_id]}])')
    first[sen_id] = i
    out.append((sen_id, vid, caption))
  return out


def read_msrvtt(annotation_dir: str, split: str, train_file: str = '9k') -> TextVideoSplit:
  """MSR-VTT as the official loader: 'train' = the videos of `MSRVTT_train.<train_file>.csv`
  with all their captions of `MSRVTT_data.json` (caption id: `sen_id`); 'test' = the 1k-A
  rows of `MSRVTT_JSFUSION_test.csv` (caption id: its `key`, text: its `sentence`)."""
  if split == 'train':
    if train_file not in MSRVTT_TRAIN:
      raise ValueError(f'train_file must be one of {sorted(MSRVTT_TRAIN)}, got {train_file!r}')
    csv_path = _require(os.path.join(annotation_dir, MSRVTT_TRAIN[train_file]), 'MSR-VTT train')
    json_path = _require(os.path.join(annotation_dir, MSRVTT_DATA), 'MSR-VTT train')
    video_ids, line_of = [], {}
    for line, row in _csv_table(csv_path, ['video_id'], 'MSR-VTT train videos'):
      vid = row['video_id'].strip()
      _check_id(vid, 'video id', f'{csv_path}:{line}', video=True)
      if vid in line_of:
        raise DataError(f'{csv_path}:{line}: duplicate video id {short(vid)} (first on line '
                        f'{line_of[vid]})')
      line_of[vid] = line
      video_ids.append(vid)
    by_video: dict[str, list[tuple[str, str, str]]] = {v: [] for v in video_ids}
    for sen_id, vid, caption in _msrvtt_sentences(json_path):
      if vid in by_video:  # sentences of other videos (the test split's) are not this split's
        _check_id(sen_id, 'caption id (sen_id)', json_path)
        if not caption.strip():
          raise DataError(f'{json_path}: sentence {short(sen_id)} of video {short(vid)} is '
                          'empty')
        by_video[vid].append((sen_id, vid, caption))
    without = [v for v in video_ids if not by_video[v]]
    if without:
      raise DataError(f'{len(without)} video(s) of {csv_path} have no sentence in {json_path}, '
                      f'e.g. {short(without[:3])} (line {line_of[without[0]]}): wrong file?')
    captions = [c for v in video_ids for c in by_video[v]]
    return TextVideoSplit('msrvtt', 'train', video_ids, captions,
                          {v: f'{v}.mp4' for v in video_ids}, f'{csv_path} + {json_path}')
  if split == 'test':
    path = _require(os.path.join(annotation_dir, MSRVTT_TEST), 'MSR-VTT test')
    captions, line_of = [], {}
    for line, row in _csv_table(path, ['key', 'video_id', 'sentence'], 'MSR-VTT test'):
      key, vid, text = row['key'].strip(), row['video_id'].strip(), row['sentence']
      where = f'{path}:{line}'
      _check_id(key, 'caption id (key)', where)
      _check_id(vid, 'video id', where, video=True)
      if not text.strip():
        raise DataError(f'{where}: caption {short(key)} has an empty sentence')
      if key in line_of:
        raise DataError(f'{where}: duplicate key {short(key)} (first on line {line_of[key]})')
      line_of[key] = line
      captions.append((key, vid, text))
    video_ids = list(dict.fromkeys(v for _, v, _ in captions))
    return TextVideoSplit('msrvtt', 'test', video_ids, captions,
                          {v: f'{v}.mp4' for v in video_ids}, path)
  raise ValueError(f'MSR-VTT split must be "train" or "test" (the official splits), got '
                   f'{split!r}')


# ----------------------------------------------------------------------------- DiDeMo


def _didemo_time(value: str, where: str, column: str) -> int:
  """'tensor([[31]])', 'tensor([0])' or '31' -> int, as the official parser."""
  m = re.fullmatch(r'\s*(?:tensor)?[\[\(]*\s*(-?\d+)\s*[\]\)]*\s*', value)
  if m is None:
    raise DataError(f'{where}: {column} {short(value)} is not an integer (or tensor([[n]]))')
  return int(m.group(1))


def read_didemo(annotation_dir: str, split: str) -> TextVideoSplit:
  """DiDeMo as the official loader: one row of `didemo_<split>_label.csv` per video, its
  captions already joined into one paragraph (`text`), in file order.

  Video id: the video file's name without extension (its frame folder); caption id: the
  official `data_id` (`<split>_data_id_00042`, from `formatted_data`).
  """
  if split not in ('train', 'val', 'test'):
    raise ValueError(f'DiDeMo split must be train, val or test, got {split!r}')
  path = _require(os.path.join(annotation_dir, DIDEMO_FILE.format(split)), 'DiDeMo')
  captions, video_files, line_of, cap_line = [], {}, {}, {}
  for line, row in _csv_table(path, DIDEMO_COLUMNS, 'DiDeMo'):
    where = f'{path}:{line}'
    file_name = row['video_path'].replace('\\', '/').rsplit('/', 1)[-1]
    vid = os.path.splitext(file_name)[0]
    _check_id(vid, 'video id (video file name without extension)', where, video=True)
    data_id = row['formatted_data'].replace('\\', '/').rsplit('/', 1)[-1].split('.')[0]
    head, _, number = data_id.rpartition('_')
    if not head or not number.isdigit():
      raise DataError(f'{where}: formatted_data {short(row["formatted_data"])} does not end in '
                      '<name>_<number>.pth')
    cap_id = f'{head}_{int(number):05d}'
    start = max(_didemo_time(row['starts'], where, 'starts'), 0)
    end = max(_didemo_time(row['ends'], where, 'ends'), 0)
    start, end = min(start, end), max(start, end)
    end += start == end
    if (start, end) != DIDEMO_SPAN:
      raise DataError(f'{where}: span [{start}, {end}] s; only whole-video rows '
                      f'{list(DIDEMO_SPAN)} (every row of the shipped files) are supported')
    if not row['text'].strip():
      raise DataError(f'{where}: video {short(vid)} has an empty text')
    if vid in line_of:
      raise DataError(f'{where}: video {short(vid)} again (first on line {line_of[vid]})')
    if cap_id in cap_line:
      raise DataError(f'{where}: duplicate data id {short(cap_id)} (first on line '
                      f'{cap_line[cap_id]})')
    line_of[vid], cap_line[cap_id] = line, line
    video_files[vid] = file_name
    captions.append((cap_id, vid, row['text']))
  if not captions:
    raise DataError(f'{path}: no rows')
  return TextVideoSplit('didemo', split, list(video_files), captions, video_files, path)


# ----------------------------------------------------------------------------- LSMDC


def read_lsmdc(annotation_dir: str, split: str) -> TextVideoSplit:
  """LSMDC as the official loader: one clip per line of the tab-separated file (6 fields:
  clip id, 4 times, sentence), its sentence the caption; caption id = clip id.

  Train: `LSMDC16_annos_training.csv`; test: `LSMDC16_challenge_1000_publictect.csv`;
  val (not read by the official code): `LSMDC16_annos_val.csv`. A leading '"' of a clip id is
  dropped and clips the official reader skips (`LSMDC_SKIPPED`) are skipped and recorded.
  """
  if split not in LSMDC_FILES:
    raise ValueError(f'LSMDC split must be one of {sorted(LSMDC_FILES)}, got {split!r}')
  path = _require(os.path.join(annotation_dir, LSMDC_FILES[split]), 'LSMDC')
  captions, skipped, line_of = [], [], {}
  try:
    with open(path, encoding='utf-8', newline='') as f:
      lines = f.read().splitlines()
  except UnicodeDecodeError as e:
    raise DataError(f'{path}: not UTF-8 text ({e})') from None
  for lineno, raw in enumerate(lines, 1):
    where = f'{path}:{lineno}'
    line = raw.strip()
    if not line:
      continue
    fields = line.split('\t')
    if len(fields) != 6:
      raise DataError(f'{where}: {len(fields)} tab-separated fields, expected 6 (clip id, '
                      f'4 times, sentence): {short(line)}')
    clip_id, caption = fields[0].removeprefix('"'), fields[5]
    if '"' in clip_id:
      raise DataError(f'{where}: clip id {short(fields[0])} has a quote inside')
    _check_id(clip_id, 'clip id', where, video=True)
    if any(k in clip_id for k in LSMDC_SKIPPED):
      skipped.append((clip_id, f'{where}: skipped by the official reader'))
      continue
    if not caption.strip():
      raise DataError(f'{where}: clip {short(clip_id)} has an empty sentence')
    if clip_id in line_of:
      raise DataError(f'{where}: duplicate clip id {short(clip_id)} (first on line '
                      f'{line_of[clip_id]})')
    line_of[clip_id] = lineno
    captions.append((clip_id, clip_id, caption))
  if not captions:
    raise DataError(f'{path}: no clips')
  video_ids = [v for _, v, _ in captions]
  files = {v: f'{v.split(".")[0][:-3]}/{v}.avi' for v in video_ids}
  return TextVideoSplit('lsmdc', split, video_ids, captions, files, path, skipped)


# ----------------------------------------------------------------------------- by name


def read_split(dataset: str, annotation_dir: str, split: str, **kwargs) -> TextVideoSplit:
  """`read_<dataset>(annotation_dir, split, **kwargs)`."""
  readers = {'msrvtt': read_msrvtt, 'didemo': read_didemo, 'lsmdc': read_lsmdc}
  if dataset not in readers:
    raise ValueError(f'dataset must be one of {DATASETS}, got {dataset!r}')
  if not os.path.isdir(annotation_dir):
    raise FileNotFoundError(f'{dataset} annotation folder {annotation_dir} does not exist')
  return readers[dataset](annotation_dir, split, **kwargs)


def read_splits(dataset: str, annotation_dir: str,
                splits: Mapping[str, str] = DEFAULT_SPLITS, **kwargs
                ) -> dict[str, TextVideoSplit]:
  """Our split name -> the official split read for it (each read once)."""
  read = {s: read_split(dataset, annotation_dir, s, **kwargs)
          for s in dict.fromkeys(splits.values())}
  return {ours: read[theirs] for ours, theirs in splits.items()}


# ----------------------------------------------------------------------------- frames pipeline


def _tokens(tokenize: Callable[[list[str]], np.ndarray], texts: list[str]) -> np.ndarray:
  tokens = np.asarray(tokenize(texts))
  if tokens.ndim != 2 or tokens.shape[0] != len(texts) or tokens.dtype.kind not in 'iu':
    raise ValueError(f'tokenize(texts) must return integers [len(texts)={len(texts)}, '
                     f'context_len], got {tokens.dtype} {tokens.shape}')
  limits = np.iinfo(np.int32)
  if tokens.size and (tokens.min() < limits.min or tokens.max() > limits.max):
    raise ValueError('tokenize(texts) returned token ids outside int32')
  return tokens.astype(np.int32)


def pair_order(num_pairs: int, batch_size: int, *, shuffle: bool, seed: int, epoch: int,
               drop_remainder: bool) -> np.ndarray:
  """Caption indices `[num_batches * batch_size]` int64 of one epoch, -1 = padding.

  In split order, or permuted by `default_rng([seed, epoch, 0])` when `shuffle`; the last
  partial batch is dropped (`drop_remainder`) or filled with -1.
  """
  order = np.arange(num_pairs)
  if shuffle:
    order = np.random.default_rng([seed, epoch, 0]).permutation(num_pairs)
  if drop_remainder:
    return order[:num_pairs - num_pairs % batch_size]
  return np.concatenate([order, np.full((-num_pairs) % batch_size, -1, np.int64)])


def _check_batching(batch_size: int, num_epochs: int | None, num_pairs: int,
                    drop_remainder: bool, what: str) -> None:
  if batch_size < 1:
    raise ValueError(f'batch_size must be >= 1, got {batch_size}')
  if num_epochs is not None and num_epochs < 1:
    raise ValueError(f'num_epochs must be >= 1 or None (forever), got {num_epochs}')
  if drop_remainder and num_pairs < batch_size:
    raise ValueError(f'batch_size={batch_size} with drop_remainder: the {num_pairs} pairs of '
                     f'{what} make no full batch')


class FrameBatches:
  """Batches of (frames, tokens) pairs of one split; see `frame_dataset`.

  Attributes:
    dataset: the `tf.data.Dataset` of batch dicts.
    batch_size, num_examples (pairs per epoch), batches_per_epoch, num_epochs.
    frame_files: video_id -> its frame image paths, in order.
  """

  def __init__(self, split: TextVideoSplit, frames_root: str, *,
               tokenize: Callable[[list[str]], np.ndarray], batch_size: int,
               num_frames: int, mode: str, train_augment: bool, shuffle: bool, seed: int,
               num_epochs: int | None, drop_remainder: bool, size: int,
               num_parallel_calls: int):
    _check_batching(batch_size, num_epochs, len(split.captions), drop_remainder,
                    f'split {split.name!r}')
    if mode not in frames_lib.SAMPLE_MODES:
      raise ValueError(f'mode must be one of {frames_lib.SAMPLE_MODES}, got {mode!r}')
    if num_frames < 1 or size < 1:
      raise ValueError(f'num_frames and size must be >= 1, got {num_frames}, {size}')
    frames_lib.keep_tf_off_accelerators()
    self.split = split
    self.batch_size, self.num_epochs = batch_size, num_epochs
    self.num_frames, self.mode, self.size = num_frames, mode, size
    self.tokens = _tokens(tokenize, [t for _, _, t in split.captions])
    self.video_index = split.caption_video_index()
    self.frame_files = self._list_frames(split, os.fspath(frames_root))
    n = len(split.captions)
    self.num_examples = n
    self.batches_per_epoch = n // batch_size if drop_remainder else -(-n // batch_size)
    self._shuffle, self._seed, self._drop = shuffle, seed, drop_remainder
    self.dataset = self._build(train_augment, num_parallel_calls)

  @staticmethod
  def _list_frames(split: TextVideoSplit, root: str) -> dict[str, list[str]]:
    if not os.path.isdir(root):
      raise FileNotFoundError(f'frames root {root} does not exist')
    out, missing = {}, []
    for vid in split.video_ids:
      folder = os.path.join(root, vid)
      if not os.path.isdir(folder):
        missing.append(f'video {vid}: {folder}')
        continue
      out[vid] = frames_lib.list_frame_files(folder, vid)
    if missing:
      raise FileNotFoundError(
          f'{len(missing)} of {len(split.video_ids)} videos of {split.dataset} split '
          f'{split.name!r} have no frame folder <frames_root>/<video_id>:\n'
          f'{listing(missing, limit=_MAX_LISTED)}')
    return out

  def __len__(self) -> int:
    """Batches in all (`num_epochs` epochs); raises for an endless stream."""
    if self.num_epochs is None:
      raise TypeError('an endless stream (num_epochs=None) has no length')
    return self.batches_per_epoch * self.num_epochs

  def _examples(self) -> Iterator[tuple]:
    """One epoch after another: (paths [T], video_index, caption_index, tokens, seed, valid)."""
    t = self.num_frames
    blank = ([b''] * t, -1, -1, np.zeros_like(self.tokens[0]), np.zeros(2, np.int64), False)
    epoch = 0
    while self.num_epochs is None or epoch < self.num_epochs:
      order = pair_order(self.num_examples, self.batch_size, shuffle=self._shuffle,
                         seed=self._seed, epoch=epoch, drop_remainder=self._drop)
      rng = np.random.default_rng([self._seed, epoch, 1])
      for c in order:
        if c < 0:
          yield blank
          continue
        v = int(self.video_index[c])
        vid = self.split.video_ids[v]
        paths = self.frame_files[vid]
        idx = frames_lib.sample_frame_indices(len(paths), t, self.mode, rng, video=vid)
        seed = rng.integers(0, 2**31 - 1, size=2, dtype=np.int64)
        yield [paths[i].encode() for i in idx], v, int(c), self.tokens[c], seed, True
      epoch += 1

  def _build(self, train_augment: bool, num_parallel_calls: int) -> tf.data.Dataset:
    t, size = self.num_frames, self.size
    context = self.tokens.shape[1]
    signature = (tf.TensorSpec([t], tf.string), tf.TensorSpec([], tf.int32),
                 tf.TensorSpec([], tf.int32), tf.TensorSpec([context], tf.int32),
                 tf.TensorSpec([2], tf.int64), tf.TensorSpec([], tf.bool))
    ds = tf.data.Dataset.from_generator(self._examples, output_signature=signature)

    def decode(paths):
      return frames_lib.decode_frames([p.decode() for p in paths.numpy()])

    def load(paths, video_index, caption_index, tokens, seed, valid):
      def read():
        x = tf.py_function(decode, [paths], tf.uint8)
        x.set_shape([t, None, None, 3])
        if train_augment:
          return frames_lib.clip_train_augment(x, seed, size)
        return frames_lib.clip_preprocess(x, size)

      frames = tf.cond(valid, read, lambda: tf.zeros([t, size, size, 3], tf.float32))
      return {'frames': frames, 'tokens': tokens, 'video_index': video_index,
              'caption_index': caption_index, 'valid': valid}

    ds = ds.map(load, num_parallel_calls=num_parallel_calls, deterministic=True)
    return ds.batch(self.batch_size, drop_remainder=True).prefetch(2)

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    it = self.dataset.as_numpy_iterator()
    while True:
      try:
        batch = next(it)
      except StopIteration:
        return
      except tf.errors.OpError as e:
        found = re.search(r'(?:DataError|FileNotFoundError): (.+)', e.message)
        if found:
          raise DataError(found.group(1)) from None
        raise
      yield batch


def frame_dataset(split: TextVideoSplit, frames_root: str, *,
                  tokenize: Callable[[list[str]], np.ndarray], batch_size: int,
                  num_frames: int = frames_lib.NUM_FRAMES, mode: str = 'uniform',
                  train_augment: bool = False, shuffle: bool = False, seed: int = 0,
                  num_epochs: int | None = 1, drop_remainder: bool = False,
                  size: int = frames_lib.CLIP_SIZE,
                  num_parallel_calls: int = tf.data.AUTOTUNE) -> FrameBatches:
  """(video, caption) pairs of `split` as batches, one pair per caption (the official items).

  Iterating yields numpy dicts:

    frames        [B, num_frames, size, size, 3] float32, CLIP-normalised
    tokens        [B, context_len] int32, `tokenize([text, ...])` rows
    video_index   [B] int32, the video's index in `split.video_ids` (-1: padding)
    caption_index [B] int32, the caption's index in `split.captions` (-1: padding)
    valid         [B] bool, False for padding pairs

  Args:
    split: a `TextVideoSplit`.
    frames_root: folder of `<video_id>/` frame folders (jpg / jpeg / png, natural order).
    tokenize: texts -> int token ids `[N, context_len]` (the CLIP tokenizer; injected).
    batch_size: pairs per batch.
    num_frames: frames sampled per video (`frames.sample_frame_indices`).
    mode: frame sampling, 'uniform' (evaluation; T-MASS's default for training too) or 'rand'.
    train_augment: T-MASS's training transform (`frames.clip_train_augment`: random resized
      crop, flip) instead of the evaluation transform (`frames.clip_preprocess`).
    shuffle: shuffle the pairs every epoch (training); else split order (evaluation).
    seed: seeds the shuffling, 'rand' sampling and augmentation (per epoch, reproducible).
    num_epochs: epochs to yield (None: forever).
    drop_remainder: drop the last partial batch of each epoch; else it is filled with
      padding pairs (`valid` False, zero frames and tokens), so every batch has `batch_size`.
    size: crop size (224).
  """
  return FrameBatches(split, frames_root, tokenize=tokenize, batch_size=batch_size,
                      num_frames=num_frames, mode=mode, train_augment=train_augment,
                      shuffle=shuffle, seed=seed, num_epochs=num_epochs,
                      drop_remainder=drop_remainder, size=size,
                      num_parallel_calls=num_parallel_calls)


# ----------------------------------------------------------------------------- frozen features


@dataclasses.dataclass(frozen=True)
class FeatureCounts:
  """What one split of a written feature release holds."""
  videos: int
  captions: int
  short_videos: int  # videos with fewer frame features than num_frames (last one repeated)


def _open_h5(path: str, what: str) -> h5py.File:
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{what} file {path} does not exist')
  try:
    return h5py.File(path, 'r')
  except OSError as e:
    raise DataError(f'{path}: cannot open as HDF5 ({e}) [{what}]') from None


def _shape(h5: h5py.File, key: str) -> tuple[int, ...] | None:
  ds = h5.get(key)
  return ds.shape if isinstance(ds, h5py.Dataset) else None


def _check_features(h5: h5py.File, ids: Sequence[str], kind: str, dim: int, frames: bool
                    ) -> None:
  """Raises listing ids absent from `h5` (metadata only), or naming one of a wrong shape."""
  missing = []
  for i in ids:
    shape = _shape(h5, i)
    if shape is None:
      missing.append(i)
      continue
    if frames:
      ok = len(shape) == 2 and shape[0] >= 1 and shape[1] == dim
      expected = f'[n_frames >= 1, {dim}]'
    else:
      ok = shape in ((dim,), (1, dim))
      expected = f'[{dim}] or [1, {dim}]'
    if not ok:
      raise DataError(f'{kind} {short(i)} has features of shape {shape} in {h5.filename}, '
                      f'expected {expected} (--dim={dim})')
  if missing:
    raise DataError(f'{len(missing)} of {len(ids)} {kind}s have no features in {h5.filename}:\n'
                    f'{listing(missing, limit=_MAX_LISTED)}')


def _read_finite(h5: h5py.File, key: str, kind: str) -> np.ndarray:
  x = h5[key][...]
  if x.dtype.kind != 'f':
    raise DataError(f'{kind} {short(key)} has {x.dtype} features in {h5.filename}, expected '
                    'floats')
  x = x.astype(np.float32)
  if not np.isfinite(x).all():
    raise DataError(f'{kind} {short(key)}: NaN/Inf in its features in {h5.filename}')
  return x


def _merged(splits: Mapping[str, TextVideoSplit]) -> tuple[list[str], dict[str, tuple]]:
  """Every video id (first appearance over the splits), every caption by its release id."""
  videos, captions = {}, {}
  for name, split in splits.items():
    videos.update(dict.fromkeys(split.video_ids))
    for cap_id, vid, text in split.captions:
      rid = split.release_caption_id(cap_id, vid)
      other = captions.setdefault(rid, (cap_id, text, name))
      if ' '.join(other[1].split()) != ' '.join(text.split()):
        raise DataError(f'caption {short(rid)} has another text in split {name!r} than in '
                        f'split {other[2]!r}')
  return list(videos), captions


def write_feature_release(splits: Mapping[str, TextVideoSplit], frame_features_h5: str,
                          text_features_h5: str, out_root: str, collection: str, *,
                          num_frames: int = frames_lib.NUM_FRAMES, dim: int = CLIP_DIM
                          ) -> dict[str, FeatureCounts]:
  """Writes precomputed CLIP features of `splits` as `<out_root>/<collection>/` (CLIP layout).

  Args:
    splits: our split name ('train', 'val', 'test') -> its `TextVideoSplit`.
    frame_features_h5: video_id -> per-frame CLIP image features `[n_frames, dim]`.
    text_features_h5: caption_id -> CLIP sentence feature (projected EOT token) `[dim]` or
      `[1, dim]`.
    out_root: release root; `<out_root>/<collection>` must not exist yet.
    num_frames: frames kept per video, `sample_frame_indices(n_frames, num_frames, 'uniform')`.

  Writes `TextData/<collection><split>.caption.txt` (`<video_id>#<caption_id> <text>`),
  `TextData/clip_ViT_B_32_<collection>_query_feat.hdf5` (release caption id -> `[1, dim]`) and
  `FeatureData/new_clip_vit_32_<collection>_vid_features.hdf5` (video_id ->
  `[num_frames, dim]`), all float32. Everything is checked before anything is written; the
  folder appears complete or not at all. Returns split -> counts.
  """
  if not splits:
    raise ValueError('no splits to write')
  _check_id(collection, 'collection', 'write_feature_release', video=True)
  final = os.path.join(os.fspath(out_root), collection)
  if os.path.lexists(final):
    raise FileExistsError(f'{final} exists; write the release into a new folder')
  videos, captions = _merged(splits)
  with _open_h5(frame_features_h5, 'frame features') as vf, \
       _open_h5(text_features_h5, 'text features') as tf5:
    _check_features(vf, videos, 'video', dim, frames=True)
    _check_features(tf5, list(dict.fromkeys(c for c, _, _ in captions.values())), 'caption',
                    dim, frames=False)
    n_frames = {v: vf[v].shape[0] for v in videos}
    partial = final + '.partial'
    if os.path.lexists(partial):
      shutil.rmtree(partial)
    os.makedirs(partial)
    try:
      layout = release_lib.Layout(partial, collection, VISUAL_FEATURE, TEXT_FEATURE)
      os.makedirs(os.path.dirname(layout.clip_video_feature_path))
      with h5py.File(layout.clip_video_feature_path, 'w') as out:
        for v in videos:
          idx = frames_lib.sample_frame_indices(n_frames[v], num_frames, 'uniform', video=v)
          out.create_dataset(v, data=_read_finite(vf, v, 'video')[idx])
      os.makedirs(layout.text_dir)
      for name, split in splits.items():
        release_lib.write_captions(layout.caption_path(name), (
            (split.release_caption_id(c, v), t) for c, v, t in split.captions))
      with h5py.File(layout.query_feature_path, 'w') as out:
        for rid, (cap_id, _, _) in captions.items():
          out.create_dataset(rid, data=_read_finite(tf5, cap_id, 'caption').reshape(1, dim))
      os.rename(partial, final)
    except BaseException:
      shutil.rmtree(partial, ignore_errors=True)
      raise
  return {name: FeatureCounts(len(s.video_ids), len(s.captions),
                              sum(n_frames[v] < num_frames for v in s.video_ids))
          for name, s in splits.items()}


def feature_pairs(release_root: str, collection: str, split: str, *, batch_size: int,
                  shuffle: bool = False, seed: int = 0, num_epochs: int | None = 1,
                  drop_remainder: bool = False) -> Iterator[dict[str, np.ndarray]]:
  """(video, caption) pairs of a feature release (`write_feature_release`) as numpy batches,
  in the order of `frame_dataset` (one pair per caption; `pair_order`):

    video_feats   [B, num_frames, D] float32, the stored frame features
    text_feats    [B, D] float32, the caption's sentence feature
    video_index   [B] int32, the video's index in the split's videos (-1: padding)
    caption_index [B] int32, the caption's row in the split's caption file (-1: padding)
    valid         [B] bool, False for padding pairs (zero features)

  Features are read from the HDF5 files batch by batch (nothing is loaded whole).
  """
  rel = release_lib.Release(release_root, collection, VISUAL_FEATURE, TEXT_FEATURE)
  try:
    s = rel.split(split)
    _check_batching(batch_size, num_epochs, len(s.caption_ids), drop_remainder,
                    f'split {split!r}')
    video_of = s.caption_video_index().astype(np.int32)
    vid0 = s.video_ids[0]
    shape = s.raw_video_features(vid0).shape
    epoch = 0
    while num_epochs is None or epoch < num_epochs:
      order = pair_order(len(s.caption_ids), batch_size, shuffle=shuffle, seed=seed,
                         epoch=epoch, drop_remainder=drop_remainder)
      for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        video = np.zeros((batch_size, *shape), np.float32)
        text = np.zeros((batch_size, s.query_dim), np.float32)
        for k, c in enumerate(rows):
          if c >= 0:
            vid = s.video_ids[video_of[c]]
            x = s.raw_video_features(vid)
            if x.shape != shape:
              raise DataError(f'video {short(vid)} has features of shape {x.shape} in '
                              f'{rel.clip_videos.path}, but video {short(vid0)} {shape}')
            video[k] = x
            text[k] = s.caption_features(s.caption_ids[c])[0]
        valid = rows >= 0
        yield {'video_feats': video, 'text_feats': text,
               'video_index': np.where(valid, video_of[np.maximum(rows, 0)], -1).astype(np.int32),
               'caption_index': rows.astype(np.int32), 'valid': valid}
      epoch += 1
  finally:
    rel.close()


# ----------------------------------------------------------------------------- command line


def parse_splits(text: str) -> dict[str, str]:
  """'train=train,val=test,test=test' -> {ours: official}."""
  out = {}
  for item in text.split(','):
    ours, sep, theirs = item.strip().partition('=')
    if not sep or not ours or not theirs:
      raise ValueError(f'--splits={text!r}: expected ours=official pairs separated by commas, '
                       'e.g. train=train,val=test,test=test')
    out[ours] = theirs
  return out


def main(argv: Sequence[str]) -> None:
  del argv
  from absl import flags  # pylint: disable=g-import-not-at-top
  fl = flags.FLAGS
  kwargs = {'train_file': fl.msrvtt_train} if fl.dataset == 'msrvtt' else {}
  splits = read_splits(fl.dataset, fl.annotations, parse_splits(fl.splits), **kwargs)
  collection = fl.collection or fl.dataset
  counts = write_feature_release(splits, fl.frame_features, fl.text_features, fl.out,
                                 collection, num_frames=fl.num_frames, dim=fl.dim)
  for name, c in counts.items():
    print(f'{name} ({splits[name].name}): {c.videos} videos, {c.captions} captions, '
          f'{c.short_videos} with fewer than {fl.num_frames} frames')
  print(f'wrote {os.path.join(fl.out, collection)}; read it with '
        f'release.Release({fl.out!r}, {collection!r}, {VISUAL_FEATURE!r}, {TEXT_FEATURE!r})')


if __name__ == '__main__':
  from absl import app, flags  # pylint: disable=g-import-not-at-top,g-multiple-import
  flags.DEFINE_enum('dataset', None, list(DATASETS), 'which dataset', required=True)
  flags.DEFINE_string('annotations', None, 'folder of the official annotation files '
                      '(T-MASS data/MSRVTT, data/Didemo, data/LSMDC)', required=True)
  flags.DEFINE_string('frame_features', None, 'HDF5: video_id -> [n_frames, dim] CLIP image '
                      'features', required=True)
  flags.DEFINE_string('text_features', None, 'HDF5: caption_id -> [dim] CLIP sentence '
                      'features', required=True)
  flags.DEFINE_string('out', None, 'release root (gets <collection>/)', required=True)
  flags.DEFINE_string('collection', None, 'collection name (default: the dataset)')
  flags.DEFINE_string('splits', 'train=train,val=test,test=test',
                      'our split = official split, comma separated')
  flags.DEFINE_enum('msrvtt_train', '9k', sorted(MSRVTT_TRAIN), 'MSR-VTT training list')
  flags.DEFINE_integer('num_frames', frames_lib.NUM_FRAMES, 'frames kept per video')
  flags.DEFINE_integer('dim', CLIP_DIM, 'CLIP feature dim')
  logging.basicConfig(level=logging.INFO)
  app.run(main)
