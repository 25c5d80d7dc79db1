r"""QVHighlights (the Moment-DETR release) as a PRVR benchmark, written in the release layout.

ProtoPRVR (ICCV 2025, appendix) merges the 150-second segments of one YouTube source into one
video, in time order; every query keeps its moment, shifted to where its segment starts in the
merged video. Our train is the release's train; its val is both our `val` and our `test` (the
release's test split has no moments). A frame row is concat(l2(SlowFast), l2(CLIP)) `[2816]`
of one 2-second clip, as Moment-DETR's loader builds it. Inputs, output and every rule:
docs/qvhighlights.md.

  prvr-write-qvhighlights --annotations=moment_detr/data \
      --features=moment_detr/features --out=/data/prvr

writes `<out>/qvhighlights/`, read with `Release(out, 'qvhighlights', 'slowfast_clip',
'clip_text')`.
"""

import dataclasses
import json
import logging
import math
import os
import re
import zipfile
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from prvr_jax.data import preprocess
from prvr_jax.data import release as release_lib
from prvr_jax.files import listing, short

_log = logging.getLogger(__name__)

COLLECTION = 'qvhighlights'
VISUAL_FEATURE = 'slowfast_clip'
TEXT_FEATURE = 'clip_text'
CLIP_SECONDS = 2.0
MAX_SEGMENT_CLIPS = 75  # Moment-DETR's max_v_l: a 150 s segment in 2 s clips
SLOWFAST_DIM, CLIP_DIM, QUERY_DIM = 2304, 512, 512
# Our split -> the release split read for it (the release's val is our val and our test).
DEFAULT_SPLITS: Mapping[str, str] = {'train': 'train', 'val': 'val', 'test': 'val'}
ANNOTATION_FILE = 'highlight_{}_release.jsonl'
SLOWFAST_DIR, CLIP_DIR, TEXT_DIR = 'slowfast_features', 'clip_features', 'clip_text_features'

_YOUTUBE_ID = re.compile(r'[A-Za-z0-9_-]+')

DataError = release_lib.DataError


@dataclasses.dataclass(frozen=True)
class Query:
  """One annotation line: a query on one 150-second segment `vid` of a YouTube source."""
  qid: int
  query: str
  vid: str
  youtube_id: str
  source_start: float  # seconds: where the segment starts in the YouTube source
  source_end: float
  duration: float  # seconds of the segment
  windows: tuple[tuple[float, float], ...]  # seconds from the segment's start
  where: str  # 'file:line'

  @property
  def cap_id(self) -> str:
    return f'{self.youtube_id}#{self.qid}'


@dataclasses.dataclass(frozen=True)
class Segment:
  """A segment's place in its merged video: from `offset` for `seconds` (seconds)."""
  vid: str
  source_start: float
  offset: float
  seconds: float


@dataclasses.dataclass(frozen=True)
class Caption:
  """A query of a merged video; `windows` in seconds of the merged video."""
  cap_id: str
  qid: int
  query: str
  vid: str
  windows: tuple[tuple[float, float], ...]
  clipped: bool  # a window ran past its segment's features and was cut there

  @property
  def moment(self) -> tuple[float, float]:
    """The span from the first window's start to the last window's end."""
    return min(s for s, _ in self.windows), max(e for _, e in self.windows)


@dataclasses.dataclass(frozen=True)
class Video:
  """One YouTube source: its segments in time order and one split's captions."""
  video_id: str
  segments: tuple[Segment, ...]
  captions: tuple[Caption, ...]

  @property
  def duration(self) -> float:
    return self.segments[-1].offset + self.segments[-1].seconds


@dataclasses.dataclass(frozen=True)
class SplitCounts:
  """What one split of the converted release holds."""
  videos: int
  queries: int
  segments: int  # segments of its videos (those of other splits' queries included)
  clipped_windows: int  # captions with a window cut at its segment's feature end


def _number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parse_vid(vid: str) -> tuple[str, float, float]:
  """`<youtube_id>_<start>_<end>` -> (youtube_id, start, end); the id may contain '_'."""
  parts = vid.rsplit('_', 2)
  if len(parts) != 3 or not _YOUTUBE_ID.fullmatch(parts[0]):
    raise ValueError
  start, end = float(parts[1]), float(parts[2])
  if not (math.isfinite(start) and math.isfinite(end) and 0 <= start < end):
    raise ValueError
  return parts[0], start, end


def parse_query(row, where: str) -> Query:
  """Checks one decoded annotation line (`where`: 'file:line', for messages)."""
  if not isinstance(row, dict):
    raise DataError(f'{where}: expected a JSON object, got {type(row).__name__}')
  missing = [k for k in ('qid', 'query', 'vid', 'duration', 'relevant_windows') if k not in row]
  if missing:
    raise DataError(f'{where}: qid {short(row.get("qid"))}: missing key(s) {missing}')
  qid, query, vid, duration = row['qid'], row['query'], row['vid'], row['duration']
  if not isinstance(qid, int) or isinstance(qid, bool) or qid < 0:
    raise DataError(f'{where}: qid {short(qid)} is not a non-negative integer')
  if not isinstance(query, str) or not query.strip():
    raise DataError(f'{where}: qid {qid}: empty or non-string query {short(query)}')
  try:
    youtube_id, start, end = parse_vid(vid)
  except (AttributeError, ValueError):
    raise DataError(f'{where}: qid {qid}: vid {short(vid)} is not <youtube_id>_<start>_<end> '
                    '(id of letters, digits, "_" and "-"; 0 <= start < end seconds)') from None
  if not _number(duration) or not 0 < duration <= end - start:
    raise DataError(f'{where}: qid {qid}: duration {short(duration)} is not in (0, {end - start}] '
                    f'(the length of segment {vid})')
  windows = row['relevant_windows']
  if not isinstance(windows, list) or not windows:
    raise DataError(f'{where}: qid {qid}: relevant_windows {short(windows)} is not a non-empty '
                    'list')
  for w in windows:
    if not (isinstance(w, list) and len(w) == 2 and all(_number(t) for t in w)
            and 0 <= w[0] <= w[1] <= duration):
      raise DataError(f'{where}: qid {qid}: window {short(w)} is outside its segment {vid} '
                      f'(needs [s, e] with 0 <= s <= e <= duration={duration})')
  return Query(qid=qid, query=' '.join(query.split()), vid=vid, youtube_id=youtube_id,
               source_start=start, source_end=end, duration=float(duration),
               windows=tuple((float(s), float(e)) for s, e in windows), where=where)


def read_annotations(path: str) -> list[Query]:
  """Parses one Moment-DETR annotation file (JSON lines, never evaluated), in file order."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f'QVHighlights annotation file {path} does not exist')
  queries = []
  first = {}
  with open(path, 'rb') as f:
    for lineno, raw in enumerate(f, 1):
      where = f'{path}:{lineno}'
      if not raw.strip():
        continue
      try:
        row = json.loads(raw)
      except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f'{where}: not a JSON line ({e})') from None
      q = parse_query(row, where)
      if q.qid in first:
        raise DataError(f'{where}: duplicate qid {q.qid} (first on {first[q.qid]})')
      first[q.qid] = where
      queries.append(q)
  if not queries:
    raise DataError(f'{path}: no queries')
  return queries


def read_splits(annotation_dir: str, splits: Mapping[str, str] = DEFAULT_SPLITS
                ) -> dict[str, list[Query]]:
  """Our split -> its queries, each release file read once."""
  read: dict[str, list[Query]] = {}
  for name in dict.fromkeys(splits.values()):
    read[name] = read_annotations(os.path.join(annotation_dir, ANNOTATION_FILE.format(name)))
  return {ours: read[theirs] for ours, theirs in splits.items()}


def _segments_by_source(queries: Iterable[Query]) -> dict[str, list[Query]]:
  """youtube_id -> one query per segment, in time order; checks qids and segments agree."""
  by_qid: dict[int, Query] = {}
  by_vid: dict[str, Query] = {}
  for q in queries:
    other = by_qid.setdefault(q.qid, q)
    if other.where != q.where:
      raise DataError(f'{q.where}: duplicate qid {q.qid} (also on {other.where})')
    other = by_vid.setdefault(q.vid, q)
    if other.duration != q.duration:
      raise DataError(f'{q.where}: segment {q.vid} has duration {q.duration}, but '
                      f'{other.duration} on {other.where}')
  sources: dict[str, list[Query]] = {}
  for q in sorted(by_vid.values(), key=lambda q: q.source_start):
    segments = sources.setdefault(q.youtube_id, [])
    if segments and q.source_start < segments[-1].source_end:
      raise DataError(f'{q.where}: segment {q.vid} overlaps segment {segments[-1].vid} '
                      f'({segments[-1].where}) of the same YouTube source')
    segments.append(q)
  return sources


def merge_videos(splits: Mapping[str, Sequence[Query]],
                 segment_seconds: Mapping[str, float] | None = None) -> dict[str, list[Video]]:
  """Merges the segments of each YouTube source into one video; returns split -> videos.

  A video holds every segment of its source found in any split (one video id means the same
  features in every split), in time order; a split's videos are the sources of its queries in
  first-appearance order. `segment_seconds` (vid -> its features' length in seconds; default:
  the annotated `duration`) places the segments; windows past it are cut (`Caption.clipped`).
  """
  sources = _segments_by_source(q for queries in splits.values() for q in queries)
  placed: dict[str, list[Segment]] = {}
  for youtube_id, segments in sources.items():
    offset, placed[youtube_id] = 0.0, []
    for q in segments:
      seconds = q.duration if segment_seconds is None else float(segment_seconds[q.vid])
      placed[youtube_id].append(Segment(q.vid, q.source_start, offset, seconds))
      offset += seconds
  where = {s.vid: s for segments in placed.values() for s in segments}

  out = {}
  for name, queries in splits.items():
    captions: dict[str, list[Caption]] = {}
    for q in queries:
      seg = where[q.vid]
      windows = tuple((seg.offset + min(s, seg.seconds), seg.offset + min(e, seg.seconds))
                      for s, e in q.windows)
      clipped = any(e > seg.seconds for _, e in q.windows)
      captions.setdefault(q.youtube_id, []).append(
          Caption(q.cap_id, q.qid, q.query, q.vid, windows, clipped))
    out[name] = [Video(v, tuple(placed[v]), tuple(caps)) for v, caps in captions.items()]
  return out


def video_tables(annotation_dir: str, splits: Mapping[str, str] = DEFAULT_SPLITS
                 ) -> dict[str, list[Video]]:
  """The merged videos of each split from the annotation files alone (segment lengths from
  their annotated durations)."""
  return merge_videos(read_splits(annotation_dir, splits))


def count(videos: Sequence[Video]) -> SplitCounts:
  """The counts of one split's videos."""
  return SplitCounts(videos=len(videos), queries=sum(len(v.captions) for v in videos),
                     segments=sum(len(v.segments) for v in videos),
                     clipped_windows=sum(c.clipped for v in videos for c in v.captions))


def split_overlaps(tables: Mapping[str, Sequence[Video]], train_split: str = 'train'
                   ) -> dict[str, list[str]]:
  """Video ids `train_split` shares with each other split: 'train&val' -> ids."""
  shared = release_lib.shared_videos(
      {name: [v.video_id for v in videos] for name, videos in tables.items()}, train_split)
  return {f'{train_split}&{name}': ids for name, ids in shared.items()}


def feature_paths(feature_dir: str, vid: str) -> tuple[str, str]:
  """The SlowFast and CLIP `.npz` files of a segment."""
  return (os.path.join(feature_dir, SLOWFAST_DIR, f'{vid}.npz'),
          os.path.join(feature_dir, CLIP_DIR, f'{vid}.npz'))


def text_feature_path(feature_dir: str, qid: int) -> str:
  """The CLIP token `.npz` file of a query."""
  return os.path.join(feature_dir, TEXT_DIR, f'qid{qid}.npz')


def _npz_rows(path: str, key: str, max_rows: int | None, what: str
              ) -> tuple[np.ndarray | None, list]:
  """The first `max_rows` rows (all: None) of `key` in an .npz archive, and its keys; None for
  a missing key.

  The member's `.npy` header is read first and its declared shape checked against
  `release.MAX_FEATURE_ELEMENTS` before anything is allocated (a member of a few MB may inflate
  to GB); of a C-ordered array only the rows asked are decompressed. Object arrays (pickles)
  are refused. A member read to its end has its CRC checked by `zipfile`.
  """
  with zipfile.ZipFile(path) as zf:
    names = zf.namelist()
    keys = [n[:-4] if n.endswith('.npy') else n for n in names]
    name = key + '.npy' if key + '.npy' in names else key if key in names else None
    if name is None:
      return None, keys
    with zf.open(name) as f:
      version = np.lib.format.read_magic(f)
      if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
      elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
      else:
        raise ValueError(f'.npy format version {version} of {key!r} is not supported')
      if dtype.hasobject:
        raise ValueError(f'{key!r} holds Python objects (a pickle), refused')
      release_lib.check_elements(shape, path, f'{key!r} of the {what}')
      if not shape:  # a scalar: refused by the caller
        return np.zeros((), dtype), keys
      # A Fortran-ordered array has no contiguous rows: it is read whole (within the cap).
      n = shape[0] if max_rows is None or fortran else min(shape[0], max_rows)
      size = n * math.prod(shape[1:]) * dtype.itemsize
      data = f.read(size)
      if len(data) != size:
        raise ValueError(f'{key!r} is truncated ({len(data)} of {size} bytes)')
      if n == shape[0]:
        f.read(1)  # reaches the member's end: zipfile checks its CRC
  if fortran:
    x = np.frombuffer(data, dtype).reshape(shape[::-1]).transpose()
  else:
    x = np.frombuffer(data, dtype).reshape((n, *shape[1:]))
  return x[:max_rows] if max_rows is not None else x, keys


def _load_npz(path: str, key: str, dim: int, what: str, max_rows: int | None = None
              ) -> np.ndarray:
  """`key` of an .npz file as float32 `[n >= 1, dim]` (its first `max_rows` rows: the rows
  used), finite (pickles refused); bounded by `release.MAX_FEATURE_ELEMENTS` (`_npz_rows`)."""
  try:
    x, keys = _npz_rows(path, key, max_rows, what)
  except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
    if isinstance(e, DataError):
      raise
    raise DataError(f'{path} ({what}): cannot read as .npz ({e.__class__.__name__}: {e})') from None
  if x is None:
    raise DataError(f'{path} ({what}): no array {key!r} (it has {keys})')
  if x.ndim != 2 or x.shape[0] == 0 or x.dtype.kind != 'f':
    raise DataError(f'{path} ({what}): {key!r} is {x.dtype} of shape {x.shape}, expected float '
                    f'[n >= 1, {dim}]')
  if x.shape[1] != dim:
    raise DataError(f'{path} ({what}): {key!r} has feature dim {x.shape[1]}, expected {dim}')
  x = x.astype(np.float32)
  bad = ~np.isfinite(x).all(axis=1)
  if bad.any():
    raise DataError(f'{path} ({what}): NaN/Inf in row {int(np.argmax(bad))} '
                    f'({int(bad.sum())} bad row(s))')
  return x


def segment_features(feature_dir: str, vid: str) -> np.ndarray:
  """Frame rows `[n <= 75, 2816]` float32 of a segment, as Moment-DETR's loader builds them."""
  slowfast_path, clip_path = feature_paths(feature_dir, vid)
  parts = [_load_npz(slowfast_path, 'features', SLOWFAST_DIM, f'SlowFast features of {vid}',
                     MAX_SEGMENT_CLIPS),
           _load_npz(clip_path, 'features', CLIP_DIM, f'CLIP features of {vid}',
                     MAX_SEGMENT_CLIPS)]
  n = min(MAX_SEGMENT_CLIPS, *(len(x) for x in parts))
  return np.concatenate([preprocess.l2_normalize(x[:n]) for x in parts], axis=1)


def _check_inputs(feature_dir: str, videos: Sequence[Video], queries: Iterable[Query]) -> None:
  """Raises listing every missing feature file (before anything is written)."""
  paths = [p for v in videos for s in v.segments for p in feature_paths(feature_dir, s.vid)]
  paths += [text_feature_path(feature_dir, q.qid) for q in queries]
  missing = [p for p in paths if not os.path.isfile(p)]
  if missing:
    raise FileNotFoundError(f'{len(missing)} of {len(paths)} feature files are missing under '
                            f'{feature_dir}:\n{listing(missing, limit=release_lib.MAX_LISTED)}')


def build_release(annotation_dir: str, feature_dir: str, out_dir: str, *,
                  splits: Mapping[str, str] = DEFAULT_SPLITS) -> dict[str, SplitCounts]:
  """Converts the Moment-DETR release (`annotation_dir` of `highlight_<split>_release.jsonl`,
  `feature_dir` of the three feature folders) into `<out_dir>/qvhighlights/` (`out_dir` new or
  empty); `splits`: our split -> the release split read for it. Returns split -> counts."""
  if os.path.isdir(out_dir) and os.listdir(out_dir):
    raise FileExistsError(f'refusing to write into --out={out_dir}: it is not empty '
                          f'({short(sorted(os.listdir(out_dir)))}); choose a new or empty folder')
  queries = read_splits(annotation_dir, splits)
  tables = merge_videos(queries)
  all_videos = list({v.video_id: v for videos in tables.values() for v in videos}.values())
  all_queries = list({q.qid: q for qs in queries.values() for q in qs}.values())
  _check_inputs(feature_dir, all_videos, all_queries)

  with release_lib.ReleaseWriter(out_dir, COLLECTION, VISUAL_FEATURE, TEXT_FEATURE) as writer:
    seconds = {}  # segment vid -> seconds of its features
    for v in all_videos:
      for s in v.segments:
        x = segment_features(feature_dir, s.vid)
        writer.add_video(v.video_id, x, [f'{s.vid}_{k}' for k in range(len(x))])
        seconds[s.vid] = len(x) * CLIP_SECONDS
    tables = merge_videos(queries, seconds)
    for name, videos in tables.items():
      writer.write_captions(name, ((c.cap_id, c.query) for v in videos for c in v.captions))
      writer.write_moments(name, ((c.cap_id, *c.moment, v.duration)
                                  for v in videos for c in v.captions))
    for q in all_queries:
      writer.add_caption_features(q.cap_id, _load_npz(
          text_feature_path(feature_dir, q.qid), 'last_hidden_state', QUERY_DIM,
          f'CLIP text features of qid {q.qid}'))

  counts = {name: count(videos) for name, videos in tables.items()}
  clipped = list(dict.fromkeys(f'{c.cap_id} (segment {c.vid})' for videos in tables.values()
                               for v in videos for c in v.captions if c.clipped))
  if clipped:
    _log.warning('%d caption(s) have a window past the end of their segment\'s features, cut '
                 'there:\n%s', len(clipped), listing(clipped, limit=release_lib.MAX_LISTED))
  for pair, shared in split_overlaps(tables).items():
    _log.warning('%s share %d YouTube source(s) (e.g. %s): prepare refuses these splits unless '
                 'config.data.allow_split_overlap=True', pair, len(shared), short(shared[:3]))
  return counts
