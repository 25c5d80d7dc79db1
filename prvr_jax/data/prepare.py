r"""Feature shards: TFRecord shards of a release written in streaming, and their manifest.

  prvr-prepare --config=configs/gmmformer_v2.py:tvr \
      --config.data.dir=/data/ms-sl/tvr --out=/data/shards/tvr

One record per video (`shard_features`, float32 stored as raw bytes, so they read back
bit-exact), in first-appearance order cut into contiguous shards (TFDS's boundaries), each
shard streamed to its file by a small pool of worker processes: memory holds a few videos per
worker whatever the release size, and the same release gives byte-identical shards whatever
the number of workers. Resumable: a split made from the same inputs is kept, and an
interrupted split keeps its finished shards (verified by size and sha256) and writes only the
missing ones. Each split is also a TFDS dataset (`dataset_info.json`, `features.json`). Moment
spans come from the optional moments file (`check.split_moments`). Details:
docs/data_pipeline.md.
"""

import collections
from concurrent import futures
import contextlib
import dataclasses
import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import struct
import sys
import time
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from etils import epath
import numpy as np
import tensorflow_datasets as tfds

from tensorflow_datasets.core import dataset_builder as tfds_dataset_builder
from tensorflow_datasets.core import example_serializer

from prvr_jax import files
from prvr_jax.files import short
from prvr_jax.data import catalogue
from prvr_jax.data import check
from prvr_jax.data.collection import release_settings
from prvr_jax.data import preprocess
from prvr_jax.data import release as release_lib
from prvr_jax.data.shard_format import FORMAT, FORMAT_VERSION, MANIFEST, ShardError

_log = logging.getLogger(__name__)

LOCK_FILE = '.prepare.lock'
BUILDER_NAME = 'prvr_features'
# Aim for shards of about this size, and at least this many per split (host splitting).
TARGET_SHARD_BYTES = 256 << 20
MIN_SHARDS = 8
# A split's finished shards (size, sha256, counts read back), kept in its TFDS folder while the
# split is being written; a shard being written has this suffix until it is complete.
PROGRESS_FILE = 'prepare-progress.json'
PARTIAL_SUFFIX = '.partial'
# Worker processes by default: the usable CPUs, at most this many; splits estimated below
# `PARALLEL_MIN_BYTES` are written in-process (starting workers would cost more).
MAX_DEFAULT_WORKERS = 8
PARALLEL_MIN_BYTES = 64 << 20


def shard_features() -> tfds.features.FeaturesDict:
  """The TFDS feature spec of one video record."""
  f32 = dict(dtype=np.float32, encoding=tfds.features.Encoding.BYTES)
  return tfds.features.FeaturesDict({
      'video_id': tfds.features.Text(),
      'video_order': tfds.features.Scalar(dtype=np.int64),
      'clip_feats': tfds.features.Tensor(shape=(None, None), **f32),
      'frame_feats': tfds.features.Tensor(shape=(None, None), **f32),
      'num_frames': tfds.features.Scalar(dtype=np.int64),
      'caption_ids': tfds.features.Sequence(tfds.features.Text()),
      'caption_order': tfds.features.Tensor(shape=(None,), dtype=np.int64),
      'caption_lengths': tfds.features.Tensor(shape=(None,), dtype=np.int64),
      'caption_feats': tfds.features.Tensor(shape=(None, None), **f32),
      'spans': tfds.features.Tensor(shape=(None, 2), dtype=np.float32),
      'duration': tfds.features.Scalar(dtype=np.float32),
  })


def video_examples(split: release_lib.ReleaseSplit,
                   moments: dict[str, tuple[float, float, float]],
                   video_ids: Sequence[str] | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
  """Yields `(video_order, record)` for the split's videos in first-appearance order."""
  caption_row = {c: i for i, c in enumerate(split.caption_ids)}
  order = {v: i for i, v in enumerate(split.video_ids)}
  for video_id in split.video_ids if video_ids is None else video_ids:
    clips, frames = split.video_features(video_id)
    cap_ids = split.captions_of(video_id)
    caps = [split.caption_features(c) for c in cap_ids]
    spans = np.full((len(cap_ids), 2), -1, np.float32)
    duration = -1.0
    for i, c in enumerate(cap_ids):
      if c in moments:
        spans[i] = moments[c][:2]
        duration = moments[c][2]
    yield order[video_id], {
        'video_id': video_id,
        'video_order': order[video_id],
        'clip_feats': clips,
        'frame_feats': frames,
        'num_frames': len(frames),
        'caption_ids': cap_ids,
        'caption_order': np.array([caption_row[c] for c in cap_ids], np.int64),
        'caption_lengths': np.array([len(x) for x in caps], np.int64),
        'caption_feats': np.concatenate(caps, axis=0),
        'spans': spans,
        'duration': np.float32(duration),
    }


class _RecordSerializer:
  """Serialises a `video_examples` record as TFDS would (the FeaturesDict's encoding, then
  `tf.train.Example`), in canonical form: protobuf writes map fields in a per-process hash
  order, the feature map sorted by key (`deterministic=True`) makes the same input give
  byte-identical shards."""

  def __init__(self):
    self.features = shard_features()
    self._serializer = example_serializer.ExampleSerializer(self.features.get_serialized_info())

  def __call__(self, record: dict[str, Any]) -> bytes:
    example = self._serializer.get_tf_example(self.features.encode_example(record))
    return example.SerializeToString(deterministic=True)


def shard_bounds(num_videos: int, num_shards: int) -> list[int]:
  """`[0, ..., num_videos]`: shard `i` holds videos `bounds[i]:bounds[i + 1]`, TFDS's contiguous
  boundaries (`round(n * i / N)`), so the files match those TFDS's own writer makes."""
  if not 1 <= num_shards <= num_videos:
    raise ValueError(f'cannot cut {num_videos} videos into {num_shards} shards')
  return [round(num_videos * i / num_shards) for i in range(num_shards + 1)]


def _read_back(path: str) -> dict[str, Any]:
  """A written shard file read back: its size, sha256, and per record the `video_order` and
  caption count (the manifest's counts are those of the files, never of what was meant)."""
  from tensorflow.core.example import example_pb2  # pylint: disable=g-import-not-at-top
  digest, orders, counts = hashlib.sha256(), [], []
  size = os.path.getsize(path)
  with open(path, 'rb') as f:
    while header := f.read(12):  # TFRecord: length (8), its crc (4), data, data crc (4)
      length = struct.unpack('<Q', header[:8])[0] if len(header) == 12 else -1
      if length > size - f.tell():  # bounded by the file, whatever the header declares
        length = -1
      data = f.read(length) if length >= 0 else b''
      footer = f.read(4)
      if length < 0 or len(data) != length or len(footer) != 4:
        raise ShardError(f'shard {path} ends in a truncated record')
      digest.update(header)
      digest.update(data)
      digest.update(footer)
      feature = example_pb2.Example.FromString(data).features.feature
      orders.append(int(feature['video_order'].int64_list.value[0]))
      counts.append(len(feature['caption_order'].int64_list.value))
  return {'bytes': os.path.getsize(path), 'sha256': digest.hexdigest(), 'video_orders': orders,
          'caption_counts': counts}


def _write_shard(split: release_lib.ReleaseSplit, moments: dict, video_ids: Sequence[str],
                 path: str, serialize: Callable[[dict[str, Any]], bytes]) -> dict[str, Any]:
  """Streams the records of `video_ids` into `path` (as `path.partial`, renamed when complete);
  returns what `_read_back` reads and `example_bytes`, the records' summed length (TFDS's
  `num_bytes`)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  partial = path + PARTIAL_SUFFIX
  example_bytes = 0
  try:
    with tf.io.TFRecordWriter(partial) as writer:
      for _, record in video_examples(split, moments, video_ids):
        data = serialize(record)
        example_bytes += len(data)
        writer.write(data)
        if not split.release.video_h5:  # only this video's rows stay mapped
          split.release.bigfile.drop_pages()
    info = _read_back(partial)
    os.replace(partial, path)
  finally:
    if os.path.lexists(partial):
      os.remove(partial)
  return {'file': os.path.basename(path), **info, 'example_bytes': example_bytes}


@dataclasses.dataclass(frozen=True)
class _ShardTask:
  """One shard of a split: its videos `start:stop` and, when an earlier run finished it, what
  was recorded then (the file is kept if it still matches)."""
  index: int
  path: str
  start: int
  stop: int
  recorded: dict[str, Any] | None = None


def _ensure_shard(split: release_lib.ReleaseSplit, moments: dict, task: _ShardTask,
                  serialize: Callable[[dict[str, Any]], bytes]) -> dict[str, Any]:
  """Keeps the shard file of `task` if it matches its record (size and sha256), else writes
  it; returns its record with `kept`."""
  rec = task.recorded
  if rec is not None:
    if (os.path.isfile(task.path) and os.path.getsize(task.path) == rec['bytes']
        and files.sha256_file(task.path) == rec['sha256']):
      return {**rec, 'kept': True}
    _log.warning('shard %s does not match what was recorded when it was written (size or '
                 'sha256); writing it again', task.path)
  if os.path.lexists(task.path):
    os.remove(task.path)
  return {**_write_shard(split, moments, split.video_ids[task.start:task.stop], task.path,
                         serialize), 'kept': False}


@dataclasses.dataclass(frozen=True)
class _ReleaseArgs:
  """What a worker process needs to open the release itself (`release.Release`'s arguments)."""
  root: str
  collection: str | None
  visual_feature: str | None
  text_feature: str
  num_clips: int
  max_frames: int
  max_query_len: int
  visual_dim: int | None
  query_dim: int | None
  skip_bad_items: bool
  frame_map: str | None = None
  normalize: bool | None = None

  def open(self) -> release_lib.Release:
    return release_lib.Release(
        self.root, self.collection, self.visual_feature, self.text_feature,
        num_clips=self.num_clips, max_frames=self.max_frames, max_query_len=self.max_query_len,
        visual_dim=self.visual_dim, query_dim=self.query_dim, skip_bad_items=self.skip_bad_items,
        frame_map=self.frame_map, normalize=self.normalize)


_WORKER: dict[str, Any] = {}  # per worker process: the opened release, its splits' moments


def _worker_shard(args: _ReleaseArgs, name: str, num_videos: int, task: _ShardTask
                  ) -> dict[str, Any]:
  """`_ensure_shard` in a worker process, which opens the release itself (once)."""
  if _WORKER.get('args') != args:
    _WORKER.clear()
    _WORKER.update(args=args, release=args.open(), moments={}, serialize=_RecordSerializer())
  release = _WORKER['release']
  split = release.split(name)
  if name not in _WORKER['moments']:
    _WORKER['moments'][name] = check.split_moments(release, split)
  if len(split.video_ids) != num_videos:
    raise ShardError(f'split {name!r} of {args.root} has {len(split.video_ids)} videos in a '
                     f'worker but {num_videos} when preparation started: the release changed '
                     'while it was being prepared')
  return _ensure_shard(split, _WORKER['moments'][name], task, _WORKER['serialize'])


def default_workers() -> int:
  """Worker processes when none are asked for: the usable CPUs, at most `MAX_DEFAULT_WORKERS`."""
  try:
    cpus = len(os.sched_getaffinity(0))
  except AttributeError:  # not on Linux
    cpus = os.cpu_count() or 1
  return max(1, min(cpus, MAX_DEFAULT_WORKERS))


@contextlib.contextmanager
def _bare_main() -> Iterator[None]:
  """Makes `__main__` a bare module meanwhile: a spawned process imports the parent's main
  module again (multiprocessing's rule), which would re-run a script that calls
  `prepare_shards` outside an `if __name__ == '__main__':` guard. Workers need nothing there."""
  main = sys.modules['__main__']
  sys.modules['__main__'] = types.ModuleType('__main__')
  try:
    yield
  finally:
    sys.modules['__main__'] = main


def _worker_start(parent: int, args: _ReleaseArgs, splits: Sequence[str]) -> None:
  """Worker start-up, while the parent gets ready: ends the worker when the preparing process
  dies (Linux), so a killed preparation leaves no worker writing into the folder that a re-run
  then resumes; imports TensorFlow (the TFRecord writer) and opens the release and `splits`.
  A failure here is left to the first shard, which raises it naming the file at fault."""
  try:
    import ctypes  # pylint: disable=g-import-not-at-top
    import signal  # pylint: disable=g-import-not-at-top
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):  # not Linux: the pool's own checks end it later
    pass
  if os.getppid() != parent:  # died before the request took effect
    os._exit(1)  # pylint: disable=protected-access
  try:
    import tensorflow  # pylint: disable=g-import-not-at-top,unused-import
    release = args.open()
    for name in splits:
      release.split(name)
    _WORKER.update(args=args, release=release, moments={}, serialize=_RecordSerializer())
  except Exception:  # pylint: disable=broad-except
    _WORKER.clear()


class _Workers:
  """The worker processes of a preparation: `size` fresh interpreters (spawned: TensorFlow is
  not fork-safe), started when a split first needs them and shared by the splits."""

  def __init__(self, size: int, args: _ReleaseArgs, splits: Sequence[str]):
    self.size, self.args, self.splits = size, args, tuple(splits)
    self._pool: futures.ProcessPoolExecutor | None = None

  @property
  def started(self) -> bool:
    return self._pool is not None

  def start(self) -> None:
    """Starts the workers (they get ready in the background)."""
    if self._pool is None:
      self._pool = futures.ProcessPoolExecutor(
          self.size, mp_context=multiprocessing.get_context('spawn'),
          initializer=_worker_start, initargs=(os.getpid(), self.args, self.splits))
      with _bare_main():  # the workers start at the first submit
        self._pool.submit(int)

  def run(self, tasks: Sequence[_ShardTask], split: release_lib.ReleaseSplit,
          done: Callable[[_ShardTask, dict[str, Any]], None]) -> None:
    """Runs `_ensure_shard` for `tasks` in the workers; calls `done` as each shard finishes."""
    self.start()
    with _bare_main():
      pending = {self._pool.submit(_worker_shard, self.args, split.name, len(split.video_ids),
                                   task): task for task in tasks}
    try:
      for future in futures.as_completed(pending):
        done(pending[future], future.result())
    except BaseException:
      for future in pending:
        future.cancel()
      raise

  def close(self) -> None:
    if self._pool is not None:
      self._pool.shutdown(cancel_futures=True)
      self._pool = None


def _run_tasks(tasks: Sequence[_ShardTask], workers: _Workers | None,
               split: release_lib.ReleaseSplit, moments: dict,
               done: Callable[[_ShardTask, dict[str, Any]], None]) -> None:
  """Runs `_ensure_shard` for `tasks`, in `workers` or in-process (None, or a single task)."""
  if workers is None or len(tasks) <= 1:
    serialize = _RecordSerializer()
    for task in tasks:
      done(task, _ensure_shard(split, moments, task, serialize))
  else:
    workers.run(tasks, split, done)


def _split_info(name: str, template: Any, shards: Sequence[dict[str, Any]]) -> tfds.core.SplitInfo:
  """The TFDS split info of written shards (`template`: the builder's file name template)."""
  return tfds.core.SplitInfo(
      name=name, shard_lengths=[len(s['video_orders']) for s in shards],
      num_bytes=sum(s['example_bytes'] for s in shards), filename_template=template)


class _LocalDatasetInfo(tfds.core.DatasetInfo):
  """The info of a builder whose datasets are never in TFDS's bucket of pre-computed infos.

  TFDS looks there whenever a builder opens a folder not yet prepared, and each look leaves an
  empty temporary folder behind (`tmp*tfds` in the system's temp folder).
  """

  def initialize_from_bucket(self) -> None:
    """Nothing to fetch: the info comes from the builder's code until it is prepared."""


@dataclasses.dataclass
class PrvrConfig(tfds.core.BuilderConfig):
  """One collection / feature of the release, and the preprocessing settings.

  `splits=()` builds every split that has a caption file; `frame_map` and `normalize` are
  `release.Release`'s (None: the layout's defaults).
  """
  collection: str = ''
  visual_feature: str | None = None
  text_feature: str = 'roberta'
  splits: tuple[str, ...] = ()
  num_clips: int = preprocess.NUM_CLIPS
  max_frames: int = preprocess.MAX_FRAMES
  max_query_len: int = preprocess.MAX_QUERY_LEN
  skip_bad_items: bool = False
  frame_map: str | None = None
  normalize: bool | None = None


class PrvrFeatures(tfds_dataset_builder.FileReaderBuilder,
                   skip_registration=__name__ == '__main__'):
  """PRVR video features (MS-SL release), one record per video with all its captions.

  A TFDS builder that writes its shards itself, streaming (`_write_shard`, in-process), so
  `download_and_prepare` gives the files `prepare_shards` gives and never sorts a split in
  memory (TFDS's own writer does, even without shuffling).
  """

  VERSION = tfds.core.Version('1.0.0')
  RELEASE_NOTES = {'1.0.0': 'Initial release.'}
  MANUAL_DOWNLOAD_INSTRUCTIONS = """
  Download the MS-SL feature release (https://github.com/HuiGuanLab/ms-sl) and point
  `manual_dir` at the folder holding `<collection>/TextData` and
  `<collection>/FeatureData/<visual_feature>` (or at the collection folder itself).
  QVHighlights: convert the Moment-DETR release first with
  `prvr-write-qvhighlights` (docs/qvhighlights.md).
  """
  # The catalogue's BigFile releases (MS-SL's, QVHighlights), and the synthetic benchmark.
  BUILDER_CONFIGS = [
      *(PrvrConfig(name=e.collection, collection=e.collection, visual_feature=e.visual_feature,
                   text_feature=e.text_feature)
        for e in catalogue.CATALOGUE.values() if e.layout == 'bigfile'),
      PrvrConfig(name='synthetic', collection='synthetic', visual_feature='synthetic'),
  ]
  # TFDS infers this through `importlib_resources`, which it does not install; the
  # result (this file, whose folder has no checksums.tsv) is the same.
  code_path = epath.Path(__file__)

  def __init__(self, *, release: release_lib.Release | None = None, **kwargs):
    """`release`: an opened `Release` to read (else one is opened from the manual dir)."""
    self._release = release
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return _LocalDatasetInfo(builder=self, features=shard_features(), disable_shuffling=True,
                             homepage='https://github.com/HuiGuanLab/ms-sl')

  def _open_release(self, manual_dir) -> release_lib.Release:
    if self._release is None:
      cfg = self.builder_config
      self._release = release_lib.Release(
          os.fspath(manual_dir), cfg.collection, cfg.visual_feature, cfg.text_feature,
          num_clips=cfg.num_clips, max_frames=cfg.max_frames, max_query_len=cfg.max_query_len,
          skip_bad_items=cfg.skip_bad_items, frame_map=cfg.frame_map, normalize=cfg.normalize)
    return self._release

  def _download_and_prepare(self, dl_manager: tfds.download.DownloadManager,
                             download_config: tfds.download.DownloadConfig | None = None) -> None:
    """Writes every split's shards into `self.data_dir`; `download_config.num_shards` per split
    (default: about `TARGET_SHARD_BYTES` each, at least `MIN_SHARDS`)."""
    release = self._open_release(dl_manager.manual_dir)
    serialize = _RecordSerializer()
    infos = []
    for name in self.builder_config.splits or release.splits:
      split = release.split(name)
      moments = check.split_moments(release, split)
      num_shards = ((download_config and download_config.num_shards)
                    or _auto_num_shards(split, release))
      num_shards = min(num_shards, len(split.video_ids))
      template = self._get_filename_template(split_name=name)
      bounds = shard_bounds(len(split.video_ids), num_shards)
      shards = [_write_shard(split, moments, split.video_ids[bounds[i]:bounds[i + 1]],
                             os.fspath(template.sharded_filepath(shard_index=i,
                                                                 num_shards=num_shards)),
                             serialize)
                for i in range(num_shards)]
      infos.append(_split_info(name, template, shards))
    self.info.set_splits(tfds.core.SplitDict(infos))


# Input files up to this size are fingerprinted by their content, larger ones (the feature
# arrays) by size and modification time: re-hashing tens of GB on every run would cost minutes.
_HASHED_BYTES = 64 << 20


def _file_identity(path: str) -> dict[str, Any] | None:
  if not os.path.isfile(path):
    return None
  stat = os.stat(path)
  if stat.st_size <= _HASHED_BYTES:
    return {'sha256': files.sha256_file(path)}
  return {'bytes': stat.st_size, 'mtime_ns': stat.st_mtime_ns}


def input_fingerprint(release: release_lib.Release, split: str, settings: dict[str, Any]) -> str:
  """sha256 of what a split's shards are made from: the preprocessing settings, the caption
  and moments files, and the feature files (paths relative to the collection folder)."""
  layout = release.layout
  paths = [layout.caption_path(split), release.layout.moments_path(split), *layout.feature_files()]
  record = {'settings': settings,
            'files': {os.path.relpath(p, layout.collection_dir): _file_identity(p) for p in paths}}
  return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def split_overlaps(out_dir: str, manifest: dict[str, Any], train_split: str
                   ) -> dict[str, dict[str, Any]]:
  """Videos shared by `train_split` and each other split: 'train&test' -> count, examples."""
  def videos(name):
    entry = manifest['splits'][name]
    with open(os.path.join(out_dir, entry['index']['file']), encoding='utf-8') as f:
      return json.load(f)['video_ids']
  shared = release_lib.shared_videos(
      {name: videos(name) for name in sorted(manifest['splits'])}, train_split)
  return {f'{train_split}&{name}': {'videos': len(ids), 'first': ids[:3]}
          for name, ids in shared.items()}


def _estimated_bytes(split: release_lib.ReleaseSplit, release: release_lib.Release) -> int:
  """About the bytes of a split's shards: its clip and frame features."""
  frames = sum(min(split.num_frames(v), release.max_frames) + release.num_clips
               for v in split.video_ids)
  return 4 * frames * split.visual_dim


def _auto_num_shards(split: release_lib.ReleaseSplit, release: release_lib.Release) -> int:
  return max(MIN_SHARDS, -(-_estimated_bytes(split, release) // TARGET_SHARD_BYTES))


def _split_summary(split: release_lib.ReleaseSplit, moments: dict, shards: list[dict],
                   counts: list[int], index_file: str, index_sha: str,
                   fingerprint: str) -> dict[str, Any]:
  """The manifest entry of a split; `counts`: captions per video as read back from the
  written shards."""
  histogram = collections.Counter(counts)
  return {
      'num_videos': sum(s['num_videos'] for s in shards),
      'num_captions': sum(s['num_captions'] for s in shards),
      'max_captions_per_video': max(counts),
      'caption_count_histogram': {str(k): histogram[k] for k in sorted(histogram)},
      'has_spans': bool(moments),
      'skipped': [list(item) for item in split.skipped],
      'index': {'file': index_file, 'sha256': index_sha},
      'input_fingerprint': fingerprint,
      'shards': shards,
  }


def _write_index(path: str, split: release_lib.ReleaseSplit, moments: dict) -> None:
  """Ordered ids of an eval split: videos (first appearance), captions (file order)."""
  unknown = (-1.0, -1.0, -1.0)
  files.write_json(path, {
      'video_ids': split.video_ids,
      'caption_ids': split.caption_ids,
      'caption_video_index': split.caption_video_index().tolist(),
      'spans': [list(moments.get(c, unknown)[:2]) for c in split.caption_ids],
      'durations': [moments.get(c, unknown)[2] for c in split.caption_ids],
  })


def _split_done(out_dir: str, entry: dict | None, fingerprint: str) -> bool:
  """Whether a manifest entry was made from the same inputs and its shard and index files are
  all there, at their sizes."""
  if not entry or entry.get('input_fingerprint') != fingerprint:
    return False
  paths = [(os.path.join(out_dir, d['file']), d['bytes']) for d in entry['shards']]
  return (os.path.isfile(os.path.join(out_dir, entry['index']['file']))
          and all(os.path.isfile(p) and os.path.getsize(p) == n for p, n in paths))


def _shard_name(name: str, index: int, num_shards: int) -> str:
  """TFDS's file name of a shard (`{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}`)."""
  return f'{BUILDER_NAME}-{name}.tfrecord-{index:05d}-of-{num_shards:05d}'


def _resume_tasks(split_dir: str, name: str, fingerprint: str, num_videos: int,
                  num_shards: int) -> list[_ShardTask]:
  """The shards of a split to write, or to keep if they still match their record.

  A split folder whose progress file records the same inputs and shard count keeps its
  recorded shards; any other is emptied (it is ours: `<out>/prvr_features/...`). Unfinished
  files (`.partial`), shard files without a record, and TFDS temporary folders left by an
  interrupted run are removed.
  """
  progress = None
  if os.path.isfile(os.path.join(split_dir, PROGRESS_FILE)):
    with open(os.path.join(split_dir, PROGRESS_FILE), encoding='utf-8') as f:
      try:
        progress = json.load(f)
      except json.JSONDecodeError:  # written atomically, so damaged by hand: start over
        _log.warning('split %s: %s is not valid JSON', name, f.name)
  expected = {'input_fingerprint': fingerprint, 'num_videos': num_videos,
              'num_shards': num_shards}
  if progress is None or {k: progress.get(k) for k in expected} != expected:
    if os.path.isdir(split_dir):
      _log.info('split %s: emptying %s (made from other inputs, or unfinished and without a '
                'record)', name, split_dir)
      shutil.rmtree(split_dir)
    progress = {**expected, 'shards': {}}
  config_dir = os.path.dirname(split_dir)
  if os.path.isdir(config_dir):
    for entry in os.listdir(config_dir):  # a killed TFDS generation (earlier versions)
      if entry.startswith('incomplete.') and os.path.isdir(os.path.join(config_dir, entry)):
        _log.info('removing %s, left by an interrupted preparation', entry)
        shutil.rmtree(os.path.join(config_dir, entry))
  os.makedirs(split_dir, exist_ok=True)
  names = {_shard_name(name, i, num_shards): i for i in range(num_shards)}
  recorded = {r['file']: r for r in progress['shards'].values() if r['file'] in names}
  for entry in os.listdir(split_dir):
    stale = entry.endswith(PARTIAL_SUFFIX) and entry[:-len(PARTIAL_SUFFIX)] in names
    if stale or (entry in names and entry not in recorded):
      _log.info('split %s: removing %s, left unfinished by an interrupted run', name, entry)
      os.remove(os.path.join(split_dir, entry))
  files.write_json(os.path.join(split_dir, PROGRESS_FILE), progress)
  bounds = shard_bounds(num_videos, num_shards)
  return [_ShardTask(i, os.path.join(split_dir, f), bounds[i], bounds[i + 1], recorded.get(f))
          for f, i in names.items()]


def _write_split(split_dir: str, name: str, fingerprint: str, num_shards: int,
                 tasks: Sequence[_ShardTask], workers: _Workers | None,
                 split: release_lib.ReleaseSplit, moments: dict) -> list[dict[str, Any]]:
  """Writes (or keeps) every shard of `tasks`, recording each finished one in the split's
  progress file; returns their records in shard order."""
  progress_path = os.path.join(split_dir, PROGRESS_FILE)
  progress = {'input_fingerprint': fingerprint, 'num_videos': len(split.video_ids),
              'num_shards': num_shards, 'shards': {}}
  results: dict[int, dict[str, Any]] = {}
  start, finished, videos = time.monotonic(), 0, 0

  def done(task: _ShardTask, record: dict[str, Any]) -> None:
    nonlocal finished, videos
    kept = record.pop('kept')
    results[task.index] = record
    progress['shards'] = {str(i): results[i] for i in sorted(results)}
    files.write_json(progress_path, progress)
    finished += 1
    if kept:
      what = 'kept (its size and sha256 match)'
    else:
      videos += task.stop - task.start
      what = f'written ({videos / max(time.monotonic() - start, 1e-9):.1f} videos/s)'
    _log.info('split %s: shard %d of %d %s; %d of %d shards done', name, task.index + 1,
              num_shards, what, finished, len(tasks))

  # Already recorded shards stay recorded while they are verified.
  for task in tasks:
    if task.recorded is not None:
      results[task.index] = task.recorded
  _run_tasks(tasks, workers, split, moments, done)
  return [results[i] for i in range(num_shards)]


def _write_tfds_metadata(builder: PrvrFeatures, name: str, shards: Sequence[dict[str, Any]]
                         ) -> None:
  """Makes a split folder a TFDS dataset: `dataset_info.json` (with the shard lengths),
  `features.json`, and the builder's default config (`prvr_features/.config`)."""
  info = builder.info
  template = builder._get_filename_template(split_name=name)  # pylint: disable=protected-access
  info.set_splits(tfds.core.SplitDict([_split_info(name, template, shards)]))
  info.write_to_directory(builder.data_dir)
  config_dir = os.path.join(os.path.dirname(os.path.dirname(builder.data_dir)), '.config')
  os.makedirs(config_dir, exist_ok=True)
  default = {'default_config_name': builder.get_default_builder_config().name}
  files.write_atomic(os.path.join(config_dir, 'metadata.json'),
                     lambda f: f.write(json.dumps(default).encode()))


def _own_manifest(out_dir: str, manifest_path: str) -> dict[str, Any] | None:
  """The shard manifest of `out_dir` (None: there is none); raises when the file is not one of
  ours (its `format`): such a folder is never written into."""
  if not os.path.lexists(manifest_path):
    return None
  try:
    if os.path.islink(manifest_path):
      raise ValueError('a link')
    with open(manifest_path, encoding='utf-8') as f:
      manifest = json.load(f)
  except (OSError, ValueError) as e:
    manifest = e
  if not isinstance(manifest, dict) or manifest.get('format') != FORMAT:
    raise ShardError(f'refusing to write shards into {out_dir}: its {MANIFEST} is not a '
                     f'{FORMAT} manifest, so the folder is not a shard folder; choose a new or '
                     f'empty --out (file: {manifest_path})')
  return manifest


def check_out(release_dir: str, out_dir: str) -> None:
  """Refuses an `--out` that is not ours to write into: the release itself (its root or a
  collection folder, or a folder holding it), a non-empty folder without a shard manifest,
  one with a foreign manifest."""
  manifest_path = os.path.join(out_dir, MANIFEST)
  if (files.inside(release_dir, out_dir)
      or os.path.isdir(os.path.join(out_dir, 'TextData'))):  # a collection folder
    raise ShardError(f'refusing to write shards into {out_dir}: it is (or holds) the release '
                     f'being read ({release_dir}); choose a new or empty --out')
  if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
    raise ShardError(f'refusing to write shards into {out_dir}: it is not a folder; choose a '
                     'new or empty --out')
  if os.path.isdir(out_dir) and set(os.listdir(out_dir)) - {LOCK_FILE}:
    if not os.path.lexists(manifest_path):
      raise ShardError(f'refusing to write shards into {out_dir}: it is a non-empty folder '
                       f'without {MANIFEST}, not a shard folder; choose a new or empty --out')
    _own_manifest(out_dir, manifest_path)


def prepare_shards(release_dir: str, out_dir: str, *, collection: str | None = None,
                   visual_feature: str | None = None, text_feature: str = 'roberta',
                   splits: Sequence[str] | None = None,
                   num_clips: int = preprocess.NUM_CLIPS, max_frames: int = preprocess.MAX_FRAMES,
                   max_query_len: int = preprocess.MAX_QUERY_LEN,
                   visual_dim: int | None = None, query_dim: int | None = None,
                   skip_bad_items: bool = False, num_shards: int = 0,
                   train_split: str = 'train', allow_split_overlap: bool = False,
                   workers: int | None = None, frame_map: str | None = None,
                   normalize: bool | None = None) -> str:
  """Writes (or finishes) the shard folder `out_dir` of a release; returns its manifest path.

  The release arguments are `release.Release`'s (`frame_map`, `normalize`: the CLIP
  layout's construction, recorded in the manifest); `splits` defaults to every split with a
  caption file; `num_shards=0` aims at 256 MiB a shard, at least 8. A re-run keeps the splits
  made from the same inputs (`input_fingerprint`) and the finished shards of an interrupted
  split. `train_split` may share no video with another split unless `allow_split_overlap`
  (then recorded and warned about). `workers`: processes writing shards (None: `default_workers`,
  in-process for a small split); the files are the same for any number.
  """
  if num_shards < 0:
    raise ValueError(f'--num_shards={num_shards}: the number of shards per split must be '
                     'positive, or 0 for about 256 MiB per shard')
  if workers is not None and workers < 1:
    raise ValueError(f'--workers={workers}: the number of worker processes must be positive '
                     '(or 0 on the command line for the default)')
  manifest_path = os.path.join(out_dir, MANIFEST)
  check_out(release_dir, out_dir)
  os.makedirs(out_dir, exist_ok=True)
  with files.folder_lock(out_dir, LOCK_FILE, 'preparation of these shards', '--out'):
    release_args = _ReleaseArgs(
        release_dir, collection, visual_feature, text_feature, num_clips,
        max_frames, max_query_len, visual_dim, query_dim, skip_bad_items, frame_map or None,
        normalize)
    release = release_args.open()
    splits = tuple(splits or release.splits)
    settings = {
        'collection': release.collection,
        'visual_feature': visual_feature,
        'text_feature': text_feature,
        'num_clips': num_clips,
        'max_frames': max_frames,
        'max_query_len': max_query_len,
        'normalize': release.normalize,
        'l2_eps': preprocess.L2_EPS,
        'skip_bad_items': skip_bad_items,
    }
    if release.frame_map:  # recorded only when set: the manifests written before it still match
      settings['frame_map'] = release.frame_map
    manifest = {'format': FORMAT, 'format_version': FORMAT_VERSION, 'complete': False,
                'builder': {'name': BUILDER_NAME, 'version': str(PrvrFeatures.VERSION)},
                'preprocessing': settings, 'splits': {}}
    old = _own_manifest(out_dir, manifest_path)  # again, under the lock
    if old is not None:
      if old.get('preprocessing') != settings:
        raise ShardError(f'{manifest_path} was prepared with other settings '
                         f'({short(old.get("preprocessing"), 300)}); use another --out or '
                         'delete it')
      manifest['splits'] = {k: v for k, v in old.get('splits', {}).items() if k in splits}
      manifest.update({k: old[k] for k in ('visual_dim', 'query_dim') if k in old})
    files.write_json(manifest_path, manifest)  # marks the folder as ours before writing into it

    fingerprints = {name: input_fingerprint(release, name, settings) for name in splits}
    pending = [name for name in splits
               if not _split_done(out_dir, manifest['splits'].get(name), fingerprints[name])]
    pool = _Workers(workers or default_workers(), release_args, pending)
    feature_bytes = sum(os.path.getsize(p) for p in release.layout.feature_files())
    if pending and pool.size > 1 and (workers is not None or feature_bytes >= PARALLEL_MIN_BYTES):
      pool.start()  # while this process checks the splits
    try:
      for name in splits:
        fingerprint = fingerprints[name]
        entry = manifest['splits'].get(name)
        if _split_done(out_dir, entry, fingerprint):
          _log.info('split %s: already prepared in %s', name, out_dir)
          continue
        if entry:
          _log.warning('split %s: its release files changed since it was prepared in %s; '
                       'rebuilding it', name, out_dir)
          del manifest['splits'][name]
          manifest['complete'] = False
          files.write_json(manifest_path, manifest)
        split = release.split(name)
        moments = check.split_moments(release, split)
        n = min(num_shards or _auto_num_shards(split, release), len(split.video_ids))
        config = PrvrConfig(
            name=f'{release.collection}-{visual_feature or text_feature}-{name}', splits=(name,),
            normalize=normalize,
            **{k: v for k, v in settings.items() if k not in ('normalize', 'l2_eps')})
        split_dir = os.path.join(out_dir, BUILDER_NAME, config.name, str(PrvrFeatures.VERSION))
        tasks = _resume_tasks(split_dir, name, fingerprint, len(split.video_ids), n)
        # Once started, the workers also take the small splits: the parent then never holds
        # TensorFlow (most of a writer's memory) beside them.
        parallel = pool.size > 1 and len(tasks) > 1 and (
            workers is not None or pool.started
            or _estimated_bytes(split, release) >= PARALLEL_MIN_BYTES)
        _log.info('split %s: %d videos, %d captions -> %d shards in %s (%d to write, %s)', name,
                  len(split.video_ids), len(split.caption_ids), n, split_dir,
                  sum(t.recorded is None for t in tasks),
                  f'{min(pool.size, len(tasks))} worker processes' if parallel else 'in-process')
        shards = _write_split(split_dir, name, fingerprint, n, tasks, pool if parallel else None,
                              split, moments)
        if split.skipped:
          _log.warning('split %s: skipped %d bad item(s): %s', name, len(split.skipped),
                       split.skipped[0][1])

        orders = [o for s in shards for o in s['video_orders']]
        counts = [c for s in shards for c in s['caption_counts']]
        if sorted(orders) != list(range(len(split.video_ids))) or sum(counts) != len(
            split.caption_ids):
          raise ShardError(f'the shards of split {name!r} in {split_dir} hold {len(orders)} '
                           f'videos and {sum(counts)} captions, but the split has '
                           f'{len(split.video_ids)} videos and {len(split.caption_ids)} captions; '
                           'delete the folder and prepare again')
        builder = PrvrFeatures(data_dir=out_dir, config=config, release=release)
        if os.path.abspath(os.fspath(builder.data_dir)) != os.path.abspath(split_dir):
          raise ShardError(f'TFDS puts split {name!r} in {builder.data_dir}, not {split_dir}')
        _write_tfds_metadata(builder, name, shards)
        shards = [{'file': os.path.relpath(os.path.join(split_dir, s['file']), out_dir),
                   'num_videos': len(s['video_orders']), 'num_captions': sum(s['caption_counts']),
                   'bytes': s['bytes'], 'sha256': s['sha256']} for s in shards]
        index_file = f'index-{name}.json'
        _write_index(os.path.join(out_dir, index_file), split, moments)
        manifest['splits'][name] = _split_summary(
            split, moments, shards, counts, index_file,
            files.sha256_file(os.path.join(out_dir, index_file)), fingerprint)
        manifest['visual_dim'] = split.visual_dim
        manifest['query_dim'] = split.query_dim
        files.write_json(manifest_path, manifest)
        os.remove(os.path.join(split_dir, PROGRESS_FILE))  # the manifest now records the split
    finally:
      pool.close()

    manifest['split_overlaps'] = split_overlaps(out_dir, manifest, train_split)
    files.write_json(manifest_path, manifest)
    check.check_split_overlaps(release.layout.collection_dir, manifest['split_overlaps'],
                               allow_split_overlap)
    manifest['complete'] = True
    files.write_json(manifest_path, manifest)
    return manifest_path


def prepare_from_config(config, out_dir: str, num_shards: int = 0,
                        workers: int | None = None) -> str:
  """`prepare_shards` for `config.data.dir` with the settings of an ml_collections config."""
  data = config.data
  return prepare_shards(
      data.dir, out_dir, splits=check.config_splits(data), num_shards=num_shards,
      train_split=data.get('train_split', 'train'),
      allow_split_overlap=data.get('allow_split_overlap', False), workers=workers,
      **release_settings(config))
