r"""Text-video retrieval annotations (T-MASS / X-Pool): MSR-VTT, DiDeMo and LSMDC.

The readers (`read_msrvtt`, `read_didemo`, `read_lsmdc`, `read_split`) build each split as the
official T-MASS loaders do: a `TextVideoSplit` of videos and (caption_id, video_id, text) pairs
in the official order; `pair_order` orders those pairs in batches. Frames in:
`text_video_frames`; precomputed CLIP features: `text_video_features`. Layouts, every choice
against the official code and the errors: docs/text_video_data.md.
"""

import collections
import csv
import dataclasses
import logging
import os
import re
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from prvr_jax import files
from prvr_jax.data import release as release_lib
from prvr_jax.files import short

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


# ----------------------------------------------------------------------------- the split


@dataclasses.dataclass(frozen=True)
class TextVideoSplit:
  """One split: its videos and its caption pairs, in the official order.

  `video_ids` are unique, in first appearance (a video's frame folder is
  `<frames_root>/<video_id>`); `captions` are in the official item order (training pairs,
  evaluation rows), their ids unique (the key of the text features).
  """
  dataset: str  # 'msrvtt', 'didemo' or 'lsmdc'
  name: str  # the official split read ('train', 'test'; 'val' where a file exists)
  video_ids: list[str]
  captions: list[tuple[str, str, str]]  # (caption_id, video_id, text)
  video_files: dict[str, str]  # video_id -> its video file, relative to `--videos_dir`
  source: str  # the annotation file(s) read
  skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (id, reason)

  def __post_init__(self):
    what = f'{self.dataset} split {self.name!r} ({self.source})'
    if not self.captions:
      raise DataError(f'{what} has no captions')
    if len(set(self.video_ids)) != len(self.video_ids):
      dup = next(v for v, c in collections.Counter(self.video_ids).items() if c > 1)
      raise DataError(f'{what}: duplicate video id {short(dup)}')
    for v in self.video_ids:
      check_id(v, 'video id', what, video=True)
    videos, seen = set(self.video_ids), set()
    for cap_id, vid, text in self.captions:
      check_id(cap_id, 'caption id', what)
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


def check_id(value: str, kind: str, where: str, video: bool = False) -> None:
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


def _csv_rows(path: str, what: str) -> Iterator[tuple[int, list[str]]]:
  """(line number where the row starts, fields) of a comma-separated file."""
  try:
    with open(path, encoding='utf-8', newline='') as f:
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
  db = files.read_json(path, DataError)
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
      check_id(vid, 'video id', f'{csv_path}:{line}', video=True)
      release_lib.check_unique(line_of, vid, line, f'{csv_path}:{line}', 'duplicate video id {}')
      video_ids.append(vid)
    by_video: dict[str, list[tuple[str, str, str]]] = {v: [] for v in video_ids}
    for sen_id, vid, caption in _msrvtt_sentences(json_path):
      if vid in by_video:  # sentences of other videos (the test split's) are not this split's
        check_id(sen_id, 'caption id (sen_id)', json_path)
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
      check_id(key, 'caption id (key)', where)
      check_id(vid, 'video id', where, video=True)
      if not text.strip():
        raise DataError(f'{where}: caption {short(key)} has an empty sentence')
      release_lib.check_unique(line_of, key, line, where, 'duplicate key {}')
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
  """DiDeMo as the official loader: one row of `didemo_<split>_label.csv` per video (video id:
  its file name without extension), its captions already one paragraph (`text`); caption id:
  the official `data_id` (`<split>_data_id_00042`)."""
  if split not in ('train', 'val', 'test'):
    raise ValueError(f'DiDeMo split must be train, val or test, got {split!r}')
  path = _require(os.path.join(annotation_dir, DIDEMO_FILE.format(split)), 'DiDeMo')
  captions, video_files, line_of, cap_line = [], {}, {}, {}
  for line, row in _csv_table(path, DIDEMO_COLUMNS, 'DiDeMo'):
    where = f'{path}:{line}'
    file_name = row['video_path'].replace('\\', '/').rsplit('/', 1)[-1]
    vid = os.path.splitext(file_name)[0]
    check_id(vid, 'video id (video file name without extension)', where, video=True)
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
    release_lib.check_unique(line_of, vid, line, where, 'video {} again')
    release_lib.check_unique(cap_line, cap_id, line, where, 'duplicate data id {}')
    video_files[vid] = file_name
    captions.append((cap_id, vid, row['text']))
  if not captions:
    raise DataError(f'{path}: no rows')
  return TextVideoSplit('didemo', split, list(video_files), captions, video_files, path)


# ----------------------------------------------------------------------------- LSMDC


def read_lsmdc(annotation_dir: str, split: str) -> TextVideoSplit:
  """LSMDC as the official loader: one clip per line of `LSMDC_FILES[split]` (6 tab-separated
  fields: clip id, 4 times, sentence); caption id = clip id, a leading '"' dropped; the clips
  the official reader skips (`LSMDC_SKIPPED`) are skipped and recorded."""
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
    check_id(clip_id, 'clip id', where, video=True)
    if any(k in clip_id for k in LSMDC_SKIPPED):
      skipped.append((clip_id, f'{where}: skipped by the official reader'))
      continue
    if not caption.strip():
      raise DataError(f'{where}: clip {short(clip_id)} has an empty sentence')
    release_lib.check_unique(line_of, clip_id, lineno, where, 'duplicate clip id {}')
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


# ----------------------------------------------------------------------------- pair order


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


def pair_steps(num_pairs: int, batch_size: int, drop_remainder: bool = False) -> int:
  """Batches per epoch of `pair_order`: ceil(pairs / batch), floor with `drop_remainder`."""
  return num_pairs // batch_size if drop_remainder else -(-num_pairs // batch_size)


def check_batching(batch_size: int, num_epochs: int | None, num_pairs: int,
                    drop_remainder: bool, what: str) -> None:
  if batch_size < 1:
    raise ValueError(f'batch_size must be >= 1, got {batch_size}')
  if num_epochs is not None and num_epochs < 1:
    raise ValueError(f'num_epochs must be >= 1 or None (forever), got {num_epochs}')
  if drop_remainder and num_pairs < batch_size:
    raise ValueError(f'batch_size={batch_size} with drop_remainder: the {num_pairs} pairs of '
                     f'{what} make no full batch')
