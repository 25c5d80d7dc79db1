r"""The one validator: checks a feature release against its catalogue entry before a long run.

  prvr-check --config=configs/ms_sl.py:tvr --config.data.dir=/data/prvr/tvr

reads the release through its own readers (`release`; annotations through `text_video`) and
prints a report ending in a verdict: `VERDICT: OK`, `VERDICT: PROBLEMS (n)` (one line per
problem naming the file and the id) or `VERDICT: NOTHING TO CHECK` (the synthetic benchmark, a
prepared shard folder). `cheap_check` reads no feature value (files, dims from headers and
HDF5 metadata, counts, ids, file sizes against the checksum record); `check_release` also
reads every value once and records or compares a checksum of every file
(`prvr_checksums.json`). Training and `prvr-prepare` call `check_before_run`; `prepare` checks
moments (`split_moments`) and split overlap (`check_split_overlaps`) here; `run_data` compares
shards with the config (`check_shards`). What is checked, and how: docs/data_check.md.
"""

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import tqdm

from prvr_jax import files
from prvr_jax.data import catalogue
from prvr_jax.data import release as release_lib
from prvr_jax.data import shard_format
from prvr_jax.data import text_video
from prvr_jax.files import short

_log = logging.getLogger(__name__)

CHECKSUMS_FILE = 'prvr_checksums.json'
CHECKSUMS_FORMAT = 'prvr_jax.release_checksums'
_BLOCK_BYTES = 32 << 20  # feature.bin is read in blocks of about this size
_LISTED = 20  # problems printed in full


@dataclasses.dataclass
class Report:
  """What a check found.

  Attributes:
    target: the folder checked (collection folder, or annotation folder).
    expected: the catalogue entry compared with (None: no published figures used).
    problems: one line per problem, naming the file and the id.
    notes: facts worth knowing that are not problems.
    counts: split -> videos and captions found in its caption file.
    dims: 'visual' / 'query' -> the data's feature dim.
    checksums: one line on the checksum record.
    nothing_to_check: why there is no release to check ('' when there is one).
    full: whether every value was read.
  """
  target: str
  expected: catalogue.FeatureRelease | None = None
  problems: list[str] = dataclasses.field(default_factory=list)
  notes: list[str] = dataclasses.field(default_factory=list)
  counts: dict[str, catalogue.Count] = dataclasses.field(default_factory=dict)
  dims: dict[str, int] = dataclasses.field(default_factory=dict)
  checksums: str = ''
  nothing_to_check: str = ''
  full: bool = False

  @property
  def ok(self) -> bool:
    return not self.problems

  @property
  def published(self) -> dict[str, catalogue.Count]:
    """Split -> published counts of the catalogue entry (empty without one)."""
    return self.expected.split_counts if self.expected is not None else {}

  @property
  def verdict(self) -> str:
    if self.problems:
      return f'VERDICT: PROBLEMS ({len(self.problems)})'
    return 'VERDICT: NOTHING TO CHECK' if self.nothing_to_check else 'VERDICT: OK'

  def problem(self, text: str) -> None:
    if text not in self.problems:
      self.problems.append(text)

  def format(self) -> str:
    """The printed report; its last block starts with the verdict line."""
    lines = [f'{"full" if self.full else "cheap"} check of {self.target}']
    if self.nothing_to_check:
      lines.append(f'  {self.nothing_to_check}')
    if self.expected is not None:
      lines.append(f'  catalogue: {self.expected.name} ({self.expected.title}); figures: '
                   f'{self.expected.sources}')
    for name, c in self.counts.items():
      p = self.published.get(name)
      against = f' (published {p.videos:,} / {p.captions:,})' if p else ''
      lines.append(f'  {name}: {c.videos:,} videos, {c.captions:,} captions{against}')
    if self.expected is not None and self.expected.total is not None:
      t = self.expected.total
      lines.append(f'  all caption files: published total {t.videos:,} videos / '
                   f'{t.captions:,} captions')
    if self.dims:
      lines.append('  feature dims: ' + ', '.join(f'{k} {v}' for k, v in self.dims.items()))
    if self.checksums:
      lines.append(f'  checksums: {self.checksums}')
    lines += [f'  note: {n}' for n in self.notes]
    lines.append(self.verdict)
    if self.problems:
      lines.append(files.listing(self.problems, indent='  - ', limit=_LISTED, line_chars=1000))
    return '\n'.join(lines)

  def raise_if_problems(self) -> None:
    """Raises `release.DataError` listing the problems (nothing when there are none)."""
    if self.problems:
      raise release_lib.DataError(
          f'{len(self.problems)} problem(s) in the data at {self.target} (full check: '
          f'prvr-check):\n{files.listing(self.problems, limit=_LISTED)}')


def cheap_check(config: Any, expected: catalogue.FeatureRelease | None = None, *,
                use_catalogue: bool = True, record: str | None = None) -> Report:
  """Files, dims (headers, HDF5 metadata), counts, ids and file sizes; reads no feature value.

  `config.data` names the release; `expected` is the catalogue entry compared with (default
  `catalogue.lookup(config)`; none with `use_catalogue=False`: a release of one's own);
  file sizes are compared with the checksum `record` (default
  `<collection folder>/prvr_checksums.json`) when it exists.
  """
  return _Checker(config, expected, use_catalogue, record).run(full=False)


def check_before_run(config: Any) -> Report:
  """`cheap_check(config)` before long work (training, preparing shards): raises
  `release.DataError` listing the problems, or, with `config.data.skip_bad_items` (the run skips
  bad items anyway), logs them as warnings. `config.data.check_published=False` compares with
  no catalogue entry (a subset, or a release of one's own)."""
  report = cheap_check(config, use_catalogue=config.data.get('check_published', True))
  if report.problems and config.data.get('skip_bad_items', False):
    _log.warning('data check found %d problem(s) (config.data.skip_bad_items=True: going on):\n%s',
                 len(report.problems), files.listing(report.problems, limit=_LISTED))
  else:
    report.raise_if_problems()
  return report


def check_release(config: Any, expected: catalogue.FeatureRelease | None = None, *,
                  use_catalogue: bool = True, record: str | None = None,
                  update_record: bool = False, progress: bool = True) -> Report:
  """`cheap_check`, then every feature value and a checksum of every file (one streaming
  pass, a progress bar on stderr with `progress`); records the checksums when no record
  exists (or with `update_record`), else compares them with the record."""
  checker = _Checker(config, expected, use_catalogue, record)
  return checker.run(full=True, update_record=update_record, progress=progress)


def check_shards(shards: Any, config: Any) -> None:
  """Raises naming the `config.model` / `config.data` flag whose value disagrees with the
  shards (a `pipeline.ShardDataset`: their dims, or the collection and features they
  were prepared from)."""
  checks = [('model', flag, value) for flag, value in (
      ('visual_dim', shards.visual_dim), ('query_dim', shards.query_dim),
      ('num_clips', shards.num_clips), ('max_frames', shards.max_frames),
      ('max_query_len', shards.max_query_len))]
  checks += [('data', flag, shards.preprocessing.get(flag))
             for flag in ('collection', 'visual_feature', 'text_feature')]
  for section, flag, value in checks:
    want = config[section].get(flag)
    if want and value is not None and want != value:
      raise ValueError(f'config.{section}.{flag}={want!r} but the shards in {shards.dir} have '
                       f'{flag}={value!r}; set --config.{section}.{flag}={value} if this is the '
                       'data you mean, or point config.data.dir to the right data')
  # The CLIP layout's construction, where the config states it (its CLIP variants): the frame
  # timeline ('' = the rows as stored) and the L2 normalisation.
  for flag, value in (('frame_map', shards.preprocessing.get('frame_map') or ''),
                      ('normalize', shards.preprocessing.get('normalize'))):
    want = config.data.get(flag)
    if want is not None and value is not None and want != value:
      raise ValueError(f'config.data.{flag}={want!r} but the shards in {shards.dir} were '
                       f'prepared with {flag}={value!r}; set --config.data.{flag}={value!r} if '
                       'this is the data you mean, or point config.data.dir to the right data')


def config_splits(data: Any) -> list[str]:
  """The splits `config.data` names (train, val, test; each once, empty names left out)."""
  return list(dict.fromkeys(data.get(k) for k in ('train_split', 'val_split', 'test_split')
                            if data.get(k)))


def moments_of(path: str, caption_ids: list[str], split: str
               ) -> dict[str, tuple[float, float, float]]:
  """The moments of `path` (empty when there is no such file), read with
  `release.read_moments`; raises `release.DataError` when the file leaves some of
  `caption_ids` out (the moment-to-video metrics need every caption)."""
  if not os.path.isfile(path):
    return {}
  moments = release_lib.read_moments(path)
  missing = [c for c in caption_ids if c not in moments]
  if moments and missing:
    raise release_lib.DataError(
        f'{path} gives moments for {len(caption_ids) - len(missing)} of the '
        f'{len(caption_ids)} captions of split {split!r} (first without: '
        f'{short(missing[0])}); the moment-to-video metrics need every caption: complete the '
        'file, or remove it to evaluate without them.')
  return moments


def split_moments(rel: release_lib.Release, split: release_lib.ReleaseSplit
                  ) -> dict[str, tuple[float, float, float]]:
  """The split's moments (`moments_of` its moments file and caption ids): what `prepare`
  uses and `check` reports on."""
  return moments_of(rel.layout.moments_path(split.name), split.caption_ids, split.name)


def check_split_overlaps(collection_dir: str, overlaps: dict[str, dict[str, Any]],
                         allow: bool) -> None:
  """Raises `shard_format.ShardError` on videos the training split shares with other splits
  (`overlaps`: 'train&test' -> {'videos': count, 'first': ids}, as `prepare.split_overlaps`
  records them), or, with `allow` (config.data.allow_split_overlap), logs a warning."""
  if not overlaps:
    return
  described = '; '.join(f'{pair}: {o["videos"]} videos, e.g. {short(o["first"])}'
                        for pair, o in overlaps.items())
  if not allow:
    raise shard_format.ShardError(
        f'{collection_dir}: the training split shares videos with other '
        f'splits ({described}): evaluating on videos seen in training leaks the test set. '
        'Fix the caption files, or set config.data.allow_split_overlap=True to accept it '
        'knowingly (it is then recorded in the manifest and warned about).')
  _log.warning('%s: overlapping splits accepted (allow_split_overlap): %s', collection_dir,
               described)


@contextlib.contextmanager
def _quiet_release_log() -> Iterator[None]:
  """Silences the reader's 'skipped N bad items' warnings: each item is a problem here."""
  logger = logging.getLogger(release_lib.__name__)
  level = logger.level
  logger.setLevel(logging.ERROR)
  try:
    yield
  finally:
    logger.setLevel(level)


_FAILED = object()  # what `_Checker._try` returns when the call raised


class _Checker:
  """One check of `config.data`; `run` fills and returns a `Report`."""

  def __init__(self, config: Any, expected: catalogue.FeatureRelease | None,
               use_catalogue: bool, record: str | None):
    self.config = config
    self.data = config.data
    if expected is None and use_catalogue:
      expected = catalogue.lookup(config)
    self.expected = expected
    self.record = record
    self.report = Report(target=os.path.abspath(self.data.get('dir') or '.'), expected=expected)
    self.rel: release_lib.Release | None = None
    self.bigfile: release_lib.BigFile | None = None
    self.readers: dict[str, release_lib.H5Features] = {}  # path -> opened HDF5 reader
    self.video2frames: dict[str, list[str]] | None = None
    self.unreadable_record = False

  def run(self, full: bool, update_record: bool = False, progress: bool = True) -> Report:
    report = self.report
    report.full = full
    data = self.data
    if data.get('source', 'shards') == 'frames':
      self._check_frames()
      return report
    path = data.get('dir')
    if not path:
      report.target = 'the synthetic benchmark'
      report.nothing_to_check = (
          'config.data.dir is empty: the run uses the embedded synthetic benchmark '
          '(prvr_jax.data.synthetic), generated on the fly; there is no release to check.')
      report.expected = None
      return report
    if not os.path.isdir(path):
      report.problem(f'config.data.dir={path} does not exist')
      return report
    if os.path.isfile(os.path.join(path, shard_format.MANIFEST)):
      report.nothing_to_check = (
          f'config.data.dir={path} is a prepared shard folder ({shard_format.MANIFEST}), whose '
          'records are checked when they are read; check the release it was prepared from.')
      report.expected = None
      return report
    try:
      with _quiet_release_log():
        self._check_release()
      if self.rel is not None:
        recorded = self._read_record()
        if full:
          current = self._stream(progress)
          self._compare_record(recorded, current, update_record)
        elif recorded is not None:
          self._compare_sizes(recorded)
    finally:
      for reader in self.readers.values():
        reader.close()
    return report

  def _try(self, fn: Any, *args: Any, errors: tuple[type[Exception], ...] = (
      release_lib.DataError,), **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)`, or `_FAILED` with the error it raised recorded as a problem."""
    try:
      return fn(*args, **kwargs)
    except errors as e:
      self.report.problem(str(e))
      return _FAILED

  def _count(self, name: str, found: catalogue.Count, where: str) -> None:
    """Records a split's counts; a problem (naming `where`) when they differ from the
    published ones."""
    self.report.counts[name] = found
    want, expected = self.report.published.get(name), self.expected
    if want is not None and found != want:
      self.report.problem(f'{where} has {found.videos:,} videos and {found.captions:,} '
                          f'captions, {expected.name} has {want.videos:,} / '
                          f'{want.captions:,} ({expected.sources})')

  def _open(self) -> bool:
    """Opens the release and its readers; False when nothing further can be checked."""
    data = self.data
    rel = self._try(release_lib.Release, data.dir, data.get('collection') or None,
                    data.get('visual_feature') or None, data.get('text_feature', 'roberta'),
                    skip_bad_items=True, frame_map=data.get('frame_map') or None,
                    errors=(FileNotFoundError, release_lib.DataError, ValueError))
    if rel is _FAILED:
      return False
    self.rel = rel
    self.report.target = rel.layout.collection_dir
    opened = True
    readers = [rel.clip_videos, rel.queries] if rel.video_h5 else [rel.queries]
    if not rel.video_h5:
      for name in ('bigfile', 'video2frames'):  # truncated feature.bin, bad id.txt, shape.txt, ...
        value = self._try(getattr, rel, name)
        setattr(self, name, None if value is _FAILED else value)
        opened = opened and value is not _FAILED
    for reader in readers:
      if self._try(reader.keys) is _FAILED:
        opened = False
      else:
        self.readers[reader.path] = reader
    return opened

  def _split_names(self) -> list[str]:
    """The caption files' splits, the catalogue's and the config's (each once)."""
    names = list(self.rel.splits)
    if self.expected is not None:
      names += [s for s, _ in self.expected.splits]
    return list(dict.fromkeys(names + config_splits(self.data)))

  def _check_release(self) -> None:
    report, expected = self.report, self.expected
    readers_ok = self._open()
    rel = self.rel
    if rel is None:
      return
    if expected is not None:
      for name in expected.extra_files:
        path = os.path.join(rel.layout.collection_dir, name)
        if not os.path.isfile(path):
          report.problem(f'{path}: missing (a file of {expected.name})')
    videos_of: dict[str, list[str]] = {}
    captions: set[str] = set()
    for name in self._split_names():
      path = rel.layout.caption_path(name)
      if not os.path.isfile(path):
        report.problem(f'{path}: missing (caption file of split {name!r})')
        continue
      rows = self._try(release_lib.read_captions, path)
      if rows is _FAILED:
        continue
      videos_of[name] = release_lib.video_ids_in_order(rows)
      captions.update(c for c, _ in rows)
      self._count(name, catalogue.Count(len(videos_of[name]), len(rows)),
                  f'{path}: split {name!r}')
      # The moments as prepare reads them (`split_moments`); without an opened split, against
      # every caption of the file: a bad moments file is reported whatever else fails.
      if not (readers_ok and self._check_split(name)):
        self._try(moments_of, rel.layout.moments_path(name), [c for c, _ in rows], name)
    videos = {v for vs in videos_of.values() for v in vs}
    self._check_dims()
    self._check_totals(list(videos_of), catalogue.Count(len(videos), len(captions)))
    self._check_overlap(videos_of)
    if readers_ok:
      self._note_unused(videos, captions)

  def _check_split(self, name: str) -> bool:
    """Every video and caption of a split, from metadata (the reader's own validation), and
    its moments; False when the split could not be opened (its moments then unchecked)."""
    report = self.report
    split = self._try(self.rel.split, name)  # raises when every item is bad
    if split is _FAILED:
      return False
    self._try(split_moments, self.rel, split)
    for problem in split.problems:
      report.problem(problem)
    if split.visual_dim is not None:
      report.dims.setdefault('visual', split.visual_dim)
    if split.query_dim is not None:
      report.dims.setdefault('query', split.query_dim)
    frames = self.expected.frames_per_video if self.expected is not None else None
    if frames is not None and self.rel.video_h5:
      videos = self.rel.clip_videos
      for v in split.video_ids:
        shape = videos.shape(self.rel.layout.video_key(v))
        if shape[0] != frames:
          report.problem(f'{videos.path}: video {short(v)} has {shape[0]} frame features, '
                         f'{self.expected.name} has {frames} per video')
    return True

  def _check_dims(self) -> None:
    rel, report, model = self.rel, self.report, self.config.model
    sources = {'visual': (rel.layout.clip_video_feature_path if rel.video_h5 else
                          os.path.join(rel.layout.feature_dir, 'shape.txt')),
               'query': rel.layout.query_feature_path}
    for kind, actual in report.dims.items():
      wanted = {f'config.model.{kind}_dim=': model.get(f'{kind}_dim')}
      if self.expected is not None:
        wanted[f'{self.expected.name} has '] = getattr(self.expected, f'{kind}_dim')
      wrong = [f'{who}{dim}' for who, dim in wanted.items() if dim is not None and dim != actual]
      if wrong:
        report.problem(f'{sources[kind]}: {kind} feature dim {actual}, but '
                       + ' and '.join(wrong))

  def _check_totals(self, splits: list[str], found: catalogue.Count) -> None:
    """The distinct videos and captions of the caption files read (`splits`) against the
    published total."""
    total = self.expected.total if self.expected is not None else None
    if total is None or not splits:
      return
    if found != total:
      self.report.problem(
          f'{self.rel.layout.text_dir}: the caption files ({", ".join(splits)}) hold '
          f'{found.videos:,} distinct videos and {found.captions:,} captions, '
          f'{self.expected.name} has {total.videos:,} / {total.captions:,} in all '
          f'({self.expected.sources})')

  def _check_overlap(self, videos_of: dict[str, list[str]]) -> None:
    train = self.data.get('train_split', 'train')
    if self.data.get('allow_split_overlap', False):
      return
    for name, shared in release_lib.shared_videos(videos_of, train).items():
      self.report.problem(
          f'{self.rel.layout.caption_path(name)}: split {name!r} shares {len(shared)} '
          f'video(s) with the training split {train!r}, e.g. {short(shared[0])} (test '
          'leakage; config.data.allow_split_overlap=True accepts it)')

  def _note_unused(self, videos: set[str], captions: set[str]) -> None:
    """Stored ids no caption file uses (not an error: releases may hold more)."""
    rel, report = self.rel, self.report
    stored = [(rel.queries.path, 'caption', rel.queries.keys(), captions)]
    if rel.video_h5:
      keys = {rel.layout.video_key(v) for v in videos}
      stored.append((rel.clip_videos.path, 'video', rel.clip_videos.keys(), keys))
    else:
      stored.append((rel.layout.video2frames_path, 'video', self.video2frames.keys(), videos))
      used = {f for v in videos if v in self.video2frames for f in self.video2frames[v]}
      stored.append((self.bigfile.folder, 'frame', self.bigfile.ids, used))
    for path, kind, ids, used in stored:
      unused = [i for i in ids if i not in used]
      if unused:
        report.notes.append(f'{path}: {len(unused):,} {kind} id(s) no caption file uses, '
                            f'e.g. {short(unused[0])}')

  def _files(self) -> list[str]:
    """Every file of the release that exists: caption files, feature files, extra files."""
    layout = self.rel.layout
    paths = [layout.caption_path(s) for s in self._split_names()] + layout.feature_files()
    if self.expected is not None:
      paths += [os.path.join(layout.collection_dir, f) for f in self.expected.extra_files]
    return [p for p in dict.fromkeys(paths) if os.path.isfile(p)]

  def _stream(self, progress: bool) -> dict[str, dict[str, Any]]:
    """Reads every file once: checks values, returns relative path -> checksum entry."""
    paths = self._files()
    total = sum(os.path.getsize(p) for p in paths)
    out = {}
    with tqdm.tqdm(total=total, unit='B', unit_scale=True,
                   desc='checking', disable=not progress, file=sys.stderr) as bar:
      for path in paths:
        size = os.path.getsize(path)
        start = bar.n
        if self.bigfile is not None and path == self.bigfile.bin_path:
          digest, of = self._stream_bigfile(bar), 'bytes'
        elif path in self.readers:
          digest, of = self._stream_h5(self.readers[path], bar), 'hdf5 datasets'
        else:
          digest, of = files.sha256_file(path, bar.update), 'bytes'
        bar.update(max(0, size - (bar.n - start)))
        rel_path = os.path.relpath(path, self.rel.layout.collection_dir)
        out[rel_path] = {'bytes': size, 'sha256': digest, 'of': of}
    self.report.notes.append(f'read {len(paths)} files ({total:,} bytes): every feature value '
                             'checked')
    return out

  def _stream_bigfile(self, bar: tqdm.tqdm) -> str:
    """sha256 of feature.bin and a problem per video with non-finite frame rows."""
    bigfile = self.bigfile
    dim = bigfile.dim
    # An unreadable video2frames.txt is a problem already: its rows are then named by frame id.
    video_of = {f: v for v, frames in (self.video2frames or {}).items() for f in frames}
    bad: dict[str, list[str]] = {}
    digest = hashlib.sha256()
    rows_per_block = max(1, _BLOCK_BYTES // (4 * dim))
    with open(bigfile.bin_path, 'rb') as f:
      for start in range(0, len(bigfile), rows_per_block):
        block = np.fromfile(f, dtype='<f4', count=min(rows_per_block, len(bigfile) - start) * dim)
        digest.update(block)
        bar.update(block.nbytes)
        for row in np.flatnonzero(~np.isfinite(block.reshape(-1, dim)).all(axis=1)):
          frame = bigfile.ids[start + int(row)]
          bad.setdefault(video_of.get(frame, ''), []).append(frame)
    for video, frames in bad.items():
      who = f'video {short(video)}' if video else 'no video (video2frames.txt lists none)'
      self.report.problem(f'{bigfile.bin_path}: NaN/Inf in {len(frames)} frame row(s) of {who}, '
                          f'e.g. frame id {short(frames[0])}')
    return digest.hexdigest()

  def _stream_h5(self, reader: release_lib.H5Features, bar: tqdm.tqdm) -> str:
    """sha256 of every dataset (name, dtype, shape, values; name order), and a problem per id
    whose values are not finite floats."""
    digest = hashlib.sha256()
    for key in sorted(reader.keys()):
      try:
        x = np.ascontiguousarray(reader.read(key))
      except release_lib.DataError as e:  # a group, not a dataset
        self.report.problem(str(e))
        continue
      except (OSError, RuntimeError) as e:  # a damaged file
        self.report.problem(f'{reader.path}: cannot read {reader.kind} {short(key)} ({e})')
        continue
      digest.update(f'{key}\0{x.dtype.str}\0{x.shape}\0'.encode())
      digest.update(x)
      bar.update(x.nbytes)
      if x.dtype.kind != 'f':
        self.report.problem(f'{reader.path}: {reader.kind} {short(key)} has {x.dtype} features, '
                            'expected floats')
      elif not np.isfinite(x).all():
        self.report.problem(f'{reader.path}: NaN/Inf in the features of {reader.kind} '
                            f'{short(key)} ({int((~np.isfinite(x)).sum())} value(s))')
    return digest.hexdigest()

  @property
  def record_path(self) -> str:
    return self.record or os.path.join(self.rel.layout.collection_dir, CHECKSUMS_FILE)

  def _read_record(self) -> dict[str, Any] | None:
    """The record, or None when there is none; a file that is no record (another of the user's
    files, one of the release's) is a problem, and is never replaced, not even with
    --update_record."""
    path = self.record_path
    if os.path.lexists(path) and not os.path.isfile(path):
      self.report.problem(f'{path}: not a file, so not a checksum record of '
                          'prvr_jax.data.check; pass another --record')
      self.unreadable_record = True
      return None
    if not os.path.isfile(path):
      return None
    try:
      with open(path, encoding='utf-8') as f:
        record = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
      record = e
    if not (isinstance(record, dict) and record.get('format') == CHECKSUMS_FORMAT
            and isinstance(record.get('files'), dict)):
      self.report.problem(f'{path}: not a checksum record of prvr_jax.data.check ({short(record)}'
                          '); it is left as it is: delete it yourself, or pass another --record')
      self.unreadable_record = True
      return None
    return record

  def _compare_sizes(self, record: dict[str, Any]) -> None:
    changed = 0
    for rel_path, entry in record['files'].items():
      path = os.path.join(self.rel.layout.collection_dir, rel_path)
      if os.path.isfile(path) and os.path.getsize(path) != entry.get('bytes'):
        changed += 1
        self.report.problem(f'{path}: {os.path.getsize(path):,} bytes, {entry.get("bytes")!r} '
                            f'when its checksum was recorded ({self.record_path}, '
                            f'{record.get("recorded")})')
    self.report.checksums = (f'{changed} file(s) changed size since {record.get("recorded")} '
                             f'({self.record_path}); contents are compared by the full check')

  def _compare_record(self, record: dict[str, Any] | None, current: dict[str, dict[str, Any]],
                      update: bool) -> None:
    report, path = self.report, self.record_path
    if record is not None and not update:
      changed = []
      for rel_path, entry in record['files'].items():
        now = current.get(rel_path)
        full_path = os.path.join(self.rel.layout.collection_dir, rel_path)
        if now is None:
          changed.append(f'{full_path}: recorded in {path} but not read now (missing?)')
        elif now['sha256'] != entry.get('sha256'):
          changed.append(f'{full_path}: content changed since its checksum was recorded '
                         f'({record.get("recorded")}): sha256 {short(entry.get("sha256"), 16)} '
                         f'-> {now["sha256"][:16]}...')
      for problem in changed:
        report.problem(problem)
      new = [p for p in current if p not in record['files']]
      if new:
        report.notes.append(f'{len(new)} file(s) not in the checksum record, e.g. {new[0]}')
      report.checksums = (f'{len(changed)} of {len(record["files"])} recorded file(s) changed '
                          f'since {record.get("recorded")} ({path}; --update_record accepts '
                          'the current files)')
      return
    if self.unreadable_record:  # someone else's file: never overwritten
      report.checksums = f'not compared, not recorded ({path} is no checksum record)'
      return
    new_record = {'format': CHECKSUMS_FORMAT, 'version': 1, 'recorded': files.utc_now(),
                  'collection_dir': self.rel.layout.collection_dir, 'files': current}
    try:
      files.write_json(path, new_record)
    except OSError as e:
      report.notes.append(f'could not write the checksum record {path} ({e}); pass --record=PATH')
      report.checksums = f'not recorded ({len(current)} files)'
      return
    report.checksums = f'{"updated" if record else "recorded"} {len(current)} files in {path}'

  def _check_frames(self) -> None:
    """Annotations and frame folders (`config.data.source='frames'`)."""
    data, report = self.data, self.report
    missing = [f for f in ('annotations', 'frames_dir') if not data.get(f)]
    if missing:
      report.problem('config.data.source=frames needs ' + ' and '.join(
          f'--config.data.{f}' for f in missing))
      return
    report.target = os.path.abspath(data.annotations)
    report.notes.append('annotations and frame folders: counts and frame lists are checked; '
                        'images are not decoded or checksummed')
    # Imported here: it imports TensorFlow.
    from prvr_jax.data import frames as frames_lib  # pylint: disable=g-import-not-at-top
    splits = self._try(text_video.read_splits, data.collection, data.annotations,
                       errors=(FileNotFoundError, release_lib.DataError, ValueError))
    if splits is _FAILED:
      return
    for name, split in splits.items():
      self._count(name, catalogue.Count(len(split.video_ids), len(split.captions)),
                  f'{split.source}: split {name!r} ({split.dataset} {split.name})')
    videos = dict.fromkeys(v for s in splits.values() for v in s.video_ids)
    for v in tqdm.tqdm(videos, desc='frame folders', unit='video', disable=not report.full,
                       file=sys.stderr):
      self._try(frames_lib.list_frame_files, os.path.join(data.frames_dir, v), v,
                errors=(FileNotFoundError, release_lib.DataError))
