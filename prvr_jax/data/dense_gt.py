r"""Dense multi-ground-truth files: several verified positive videos per query (prvr-ea's layout).

  captions, truth = dense_gt.locate(config, run_data_dir)  # the two files
  dense = dense_gt.read(captions, truth)                    # read and checked, ids only
  targets = dense_gt.align(dense, split.caption_ids, split.video_ids, 'test')  # by key

Two files describe one evaluation split (docs/dense_eval.md):

* `<stem>.caption.txt`: a caption file (`<video_id>#<n> <caption>` per line, as a release's
  split caption files). Its videos are the candidates every dense query is ranked against.
* `<stem>.gt.jsonl`: one JSON object per line, the query's caption id under `query_id` and
  the list of its positive video ids under `gt_video_ids` (prvr-ea also reads the list as
  `video_ids` or `videos`; other keys, e.g. `caption`, are ignored). Its queries are the ones
  evaluated.

`read` refuses, naming the file, the line and the query: malformed JSON, a line that is not
such an object, a query listed twice, a query without positives, a positive listed twice, a
positive that is not a video of the caption file, a query whose caption is missing from the
caption file. Nothing in a file is evaluated or trusted for a size: lines are read up to
`MAX_LINE_BYTES`, JSON is parsed by `json` (no NaN / Infinity, no repeated keys). This module
only reads; nothing generates or prepares dense files here.
"""

from collections.abc import Sequence
import dataclasses
import json
import os
from typing import Any

import numpy as np

from prvr_jax import files
from prvr_jax.data import release as release_lib
from prvr_jax.data.release import DataError, video_id_of
from prvr_jax.eval.splits import DenseTargets
from prvr_jax.files import short

CAPTION_SUFFIX = '.caption.txt'
GT_SUFFIX = '.gt.jsonl'
# The keys prvr-ea reads a query's positives from, in its order of preference.
POSITIVE_KEYS = ('gt_video_ids', 'video_ids', 'videos')
MAX_LINE_BYTES = 1 << 20  # a ground-truth line longer than this is refused, not read


@dataclasses.dataclass(frozen=True)
class DenseGroundTruth:
  """The two dense files of a split, read and checked (ids only).

  Attributes:
    caption_path, gt_path: the files read.
    caption_ids: the caption file's ids, in file order.
    video_ids: the candidate videos (the caption file's), in first-appearance order.
    query_ids: the evaluated queries, in ground-truth file order.
    positives: each query's positive video ids, in file order.
    lines: each query's line in the ground-truth file.
    sha256: 'captions' / 'ground_truth' -> sha256 of the file.
  """
  caption_path: str
  gt_path: str
  caption_ids: list[str]
  video_ids: list[str]
  query_ids: list[str]
  positives: list[tuple[str, ...]]
  lines: list[int]
  sha256: dict[str, str]


def default_stem(collection: str) -> str:
  """prvr-ea's file stem of a collection: `tvrdenseval_v` (TVR's video-only queries, the
  released TVR files) or `<collection>denseval`."""
  return 'tvrdenseval_v' if collection == 'tvr' else f'{collection}denseval'


def locate(config: Any, data_dir: str) -> tuple[str, str]:
  """(caption file, ground-truth file) of `config`'s dense evaluation.

  `config.data.dense_gt` / `config.data.dense_captions` when set (either alone: the other is
  its sibling, `<stem>.gt.jsonl` <-> `<stem>.caption.txt`); else prvr-ea's layout: the stem
  `default_stem(config.data.collection)` in `config.data.dir` (a release's collection folder),
  its `TextData/`, or `<collection>/` below it (a data root, prvr-ea's `PRVR_DATA_ROOT`); for the
  synthetic benchmark (empty `data.dir`) in `data_dir` (the run's prepared data folder, where
  `synthetic` writes them). Raises naming the flags.
  """
  data = config.data
  gt_path, caption_path = data.get('dense_gt', ''), data.get('dense_captions', '')
  if gt_path or caption_path:
    if not caption_path:
      if not gt_path.endswith(GT_SUFFIX):
        raise ValueError(f'--config.data.dense_gt={gt_path} does not end in {GT_SUFFIX}: set '
                         '--config.data.dense_captions to its caption file too')
      caption_path = gt_path[:-len(GT_SUFFIX)] + CAPTION_SUFFIX
    if not gt_path:
      if not caption_path.endswith(CAPTION_SUFFIX):
        raise ValueError(f'--config.data.dense_captions={caption_path} does not end in '
                         f'{CAPTION_SUFFIX}: set --config.data.dense_gt to its ground-truth '
                         'file too')
      gt_path = caption_path[:-len(CAPTION_SUFFIX)] + GT_SUFFIX
    for path, flag in ((caption_path, 'dense_captions'), (gt_path, 'dense_gt')):
      if not os.path.isfile(path):
        raise FileNotFoundError(f'dense evaluation: {path} does not exist '
                                f'(--config.data.{flag})')
    return caption_path, gt_path
  root = data.dir or data_dir
  collection = data.get('collection', '')
  stem = default_stem(collection)
  tried = []
  for folder in (root, os.path.join(root, 'TextData'), os.path.join(root, collection)):
    gt_path = os.path.join(folder, stem + GT_SUFFIX)
    caption_path = os.path.join(folder, stem + CAPTION_SUFFIX)
    tried.append(gt_path)
    if os.path.isfile(gt_path):
      if not os.path.isfile(caption_path):
        raise FileNotFoundError(f'dense evaluation: {gt_path} has no caption file beside it '
                                f'({caption_path}); set --config.data.dense_captions')
      return caption_path, gt_path
  raise FileNotFoundError('dense evaluation (--config.eval.protocol=dense): no dense ground '
                          f'truth found; tried {", ".join(tried)}. Set '
                          '--config.data.dense_gt (and --config.data.dense_captions)')


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
  keys = [k for k, _ in pairs]
  if len(set(keys)) != len(keys):
    raise ValueError(f'key {next(k for k in keys if keys.count(k) > 1)!r} appears twice')
  return dict(pairs)


def _no_constant(name: str) -> None:
  raise ValueError(f'{name} is not JSON')


def _lines(path: str):
  """(line number, text) of every line of `path`, each at most `MAX_LINE_BYTES` bytes."""
  with open(path, 'rb') as f:
    lineno = 0
    while True:
      raw = f.readline(MAX_LINE_BYTES + 1)
      if not raw:
        return
      lineno += 1
      if len(raw) > MAX_LINE_BYTES and not raw.endswith(b'\n'):
        raise DataError(f'{path}:{lineno}: line longer than {MAX_LINE_BYTES} bytes: not one '
                        'dense query (refused before reading it)')
      if lineno == 1:
        raw = raw.removeprefix(b'\xef\xbb\xbf')  # a UTF-8 BOM
      try:
        yield lineno, raw.decode('utf-8')
      except UnicodeDecodeError as e:
        raise DataError(f'{path}:{lineno}: not UTF-8 text (byte {e.start} of the line)') from None


def read(caption_path: str, gt_path: str) -> DenseGroundTruth:
  """Reads and checks the dense caption and ground-truth files (module docstring); raises
  `release.DataError` whose message (one line) names the file, the line or query, and the
  problem."""
  captions = release_lib.read_captions(caption_path)
  caption_ids = [cap_id for cap_id, _ in captions]
  known_captions = set(caption_ids)
  video_ids = release_lib.video_ids_in_order(captions)
  known_videos = set(video_ids)
  if not os.path.isfile(gt_path):
    raise FileNotFoundError(f'dense evaluation: {gt_path} does not exist')
  query_ids, positives, lines, first_line = [], [], [], {}
  for lineno, text in _lines(gt_path):
    if not text.strip():
      continue
    where = f'{gt_path}:{lineno}'
    try:
      item = json.loads(text, object_pairs_hook=_no_repeated_keys, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
      raise DataError(f'{where}: malformed JSON ({short(str(e), quote=False)})') from None
    if not isinstance(item, dict):
      raise DataError(f'{where}: expected an object {{"query_id": ..., "gt_video_ids": [...]}}, '
                      f'got {type(item).__name__}')
    query_id = item.get('query_id')
    if not isinstance(query_id, str) or not query_id.strip():
      raise DataError(f'{where}: no query_id (a non-empty string), got {short(query_id)}')
    release_lib.check_unique(first_line, query_id, lineno, where, 'query {} listed twice')
    key = next((k for k in POSITIVE_KEYS if k in item), None)
    videos = item.get(key) if key else None
    if not isinstance(videos, list) or not videos:
      raise DataError(f'{where}: query {short(query_id)} has no positives (needs a non-empty '
                      f'list {POSITIVE_KEYS[0]!r}; got {short(videos)})')
    seen = set()
    for video in videos:
      if not isinstance(video, str) or not video:
        raise DataError(f'{where}: query {short(query_id)}: positive {short(video)} is not a '
                        'video id (a non-empty string)')
      if video in seen:
        raise DataError(f'{where}: query {short(query_id)} lists positive video {short(video)} '
                        'twice')
      seen.add(video)
      if video not in known_videos:
        raise DataError(f'{where}: query {short(query_id)}: unknown positive video '
                        f'{short(video)}: no caption of {caption_path} belongs to it (the '
                        'candidate videos are that file\'s)')
    if query_id not in known_captions:
      raise DataError(f'{where}: dense query {short(query_id)} has no caption in '
                      f'{caption_path}')
    query_ids.append(query_id)
    positives.append(tuple(videos))
    lines.append(lineno)
  if not query_ids:
    raise DataError(f'{gt_path}: no dense queries')
  return DenseGroundTruth(caption_path, gt_path, caption_ids, video_ids, query_ids, positives,
                          lines, {'captions': files.sha256_file(caption_path),
                                  'ground_truth': files.sha256_file(gt_path)})


def align(dense: DenseGroundTruth, caption_ids: Sequence[str], video_ids: Sequence[str],
          split: str) -> DenseTargets:
  """`dense` by the keys of an evaluation split (`EvalSplit.caption_ids` / `.video_ids`):
  every dense query must be a query of the split and every candidate video a video of it
  (else the files describe other data: raises naming the file and the id)."""
  query_key = {cap_id: i for i, cap_id in enumerate(caption_ids)}
  video_key = {video: i for i, video in enumerate(video_ids)}
  for video in dense.video_ids:
    if video not in video_key:
      raise DataError(f'{dense.caption_path}: video {short(video)} is not a video of the '
                      f'evaluated split {split!r} ({len(video_ids)} videos): the dense files '
                      'describe other data')
  for query_id, lineno in zip(dense.query_ids, dense.lines):
    if query_id not in query_key:
      raise DataError(f'{dense.gt_path}:{lineno}: dense query {short(query_id)} is not a query '
                      f'of the evaluated split {split!r} ({len(caption_ids)} queries): the '
                      'dense files describe other data')
  columns = np.sort(np.array([video_key[v] for v in dense.video_ids], np.int64))
  position = {video_ids[key]: i for i, key in enumerate(columns)}
  width = max(len(p) for p in dense.positives)
  positives = np.full((len(dense.query_ids), width), -1, np.int64)
  for row, videos in enumerate(dense.positives):
    positives[row, :len(videos)] = [position[v] for v in videos]
  return DenseTargets(
      rows=np.array([query_key[q] for q in dense.query_ids], np.int64), columns=columns,
      positives=positives,
      own=np.array([position[video_id_of(q)] for q in dense.query_ids], np.int64),
      query_ids=list(dense.query_ids), positive_ids=[list(p) for p in dense.positives],
      files={'captions': dense.caption_path, 'ground_truth': dense.gt_path,
             'captions_sha256': dense.sha256['captions'],
             'ground_truth_sha256': dense.sha256['ground_truth']})
