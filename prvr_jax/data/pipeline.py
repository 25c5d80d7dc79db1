"""`tf.data` pipelines over feature shards: training batches and evaluation streams.

  shards = pipeline.open_shards(shard_dir)
  it = pipeline.train_iterator(shards, global_batch_size=128, seed=0, start_step=step)
  index = pipeline.eval_index(shards, 'test')          # ordered ids, ground truth, spans
  for batch in pipeline.eval_videos(shards, 'test', global_batch_size=100): ...

Whole shard files are split across hosts (a contiguous block per `process_index`); every host
yields the same number of batches (numpy dicts of the batch contract, docs/design.md), padded
with masked items. Training is deterministic for a seed and host count, and `start_step`
replays exactly the batches of an uninterrupted run (docs/data_pipeline.md).
"""

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from prvr_jax import files
from prvr_jax import metrics
from prvr_jax.files import short
from prvr_jax.data import frames
from prvr_jax.data import shard_format

_log = logging.getLogger(__name__)

_OVERFLOW_TAG = 'PRVR_QUERY_OVERFLOW'
_VERIFIED: set[tuple[str, int, int, str]] = set()
_CYCLE_LENGTH = 8  # shard files read in parallel (and interleaved) per host


@dataclasses.dataclass(frozen=True)
class Shard:
  """One TFRecord file of a split."""
  path: str
  num_videos: int
  num_captions: int
  bytes: int
  sha256: str


@dataclasses.dataclass(frozen=True)
class ShardSplit:
  """A split of a shard folder, as recorded in its manifest."""
  name: str
  shards: tuple[Shard, ...]
  num_videos: int
  num_captions: int
  max_captions_per_video: int
  caption_count_histogram: dict[int, int]
  has_spans: bool
  skipped: tuple[tuple[str, str], ...]
  index_path: str
  index_sha256: str

  def host_shards(self, process_index: int, process_count: int) -> tuple[Shard, ...]:
    """The contiguous block of shard files read by host `process_index`."""
    if not 0 <= process_index < process_count:
      raise ValueError(f'process_index={process_index} not in [0, process_count={process_count})')
    bounds = np.linspace(0, len(self.shards), process_count + 1).round().astype(int)
    return self.shards[bounds[process_index]:bounds[process_index + 1]]

  def max_queries(self, num_videos: int) -> int:
    """Most captions any `num_videos` videos of the split can have together."""
    total, left = 0, num_videos
    for count in sorted(self.caption_count_histogram, reverse=True):
      take = min(left, self.caption_count_histogram[count])
      total, left = total + take * count, left - take
      if not left:
        break
    return total


@dataclasses.dataclass(frozen=True)
class ShardDataset:
  """A shard folder: its manifest, feature dims and preprocessing settings."""
  dir: str
  visual_dim: int
  query_dim: int
  num_clips: int
  max_frames: int
  max_query_len: int
  preprocessing: dict[str, Any]
  splits: dict[str, ShardSplit]

  split_overlaps: dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def manifest_path(self) -> str:
    return os.path.join(self.dir, shard_format.MANIFEST)

  def identity(self) -> dict[str, Any]:
    """What the data is, independent of where it lies: the collection and features it was
    prepared from, and per split a sha256 of its shards' and index's sha256s (prepared
    shards are byte-identical for the same inputs). Recorded in checkpoints, compared on
    resume and evaluation."""
    def digest(split):
      parts = [s.sha256 for s in split.shards] + [split.index_sha256]
      return hashlib.sha256(' '.join(parts).encode()).hexdigest()[:16]
    return {'collection': self.preprocessing.get('collection'),
            'visual_feature': self.preprocessing.get('visual_feature'),
            'text_feature': self.preprocessing.get('text_feature'),
            'splits': {name: digest(split) for name, split in sorted(self.splits.items())}}

  def split(self, name: str) -> ShardSplit:
    if name not in self.splits:
      raise KeyError(f'split {name!r} is not in {self.manifest_path} '
                     f'(it has {sorted(self.splits)})')
    return self.splits[name]


def open_shards(path: str) -> ShardDataset:
  """Reads `<path>/manifest.json` and checks that every shard file is there, at its size."""
  path = os.path.abspath(os.fspath(path))
  manifest_path = os.path.join(path, shard_format.MANIFEST)
  if not os.path.isfile(manifest_path):
    raise shard_format.ShardError(f'{manifest_path} does not exist: {path} is not a shard folder '
                                  '(write one with `prvr-prepare`)')
  with open(manifest_path, encoding='utf-8') as f:
    try:
      manifest = json.load(f)
    except json.JSONDecodeError as e:
      raise shard_format.ShardError(f'{manifest_path} is not valid JSON: {e}') from None
  if (manifest.get('format') != shard_format.FORMAT
      or manifest.get('format_version') != shard_format.FORMAT_VERSION):
    raise shard_format.ShardError(f'{manifest_path}: not a {shard_format.FORMAT} '
                                  f'v{shard_format.FORMAT_VERSION} manifest')
  if not manifest.get('complete'):
    raise shard_format.ShardError(f'{manifest_path}: preparation did not finish; run '
                                  '`prvr-prepare` again with the same --out to finish it')
  try:
    return _shard_dataset(path, manifest, manifest_path)
  except (KeyError, TypeError, ValueError, AttributeError) as e:
    if isinstance(e, shard_format.ShardError):
      raise
    raise shard_format.ShardError(
        f'{manifest_path} is malformed ({type(e).__name__}: {short(str(e), quote=False)}); '
        'prepare the shards again') from None


def _inside(folder: str, relative: str, manifest_path: str) -> str:
  """`folder/relative`, refused when it would lie outside `folder` (a hostile manifest)."""
  target = os.path.normpath(os.path.join(folder, relative))
  if os.path.isabs(relative) or os.path.commonpath([folder, target]) != folder:
    raise shard_format.ShardError(f'{manifest_path} lists a file outside its folder: '
                                  f'{short(relative)}')
  return target


def _shard_dataset(path: str, manifest: dict[str, Any], manifest_path: str) -> ShardDataset:
  """The `ShardDataset` of a parsed manifest, every listed file checked."""
  splits = {}
  for name, s in manifest['splits'].items():
    shards = tuple(Shard(_inside(path, d['file'], manifest_path), d['num_videos'],
                         d['num_captions'], d['bytes'], d['sha256']) for d in s['shards'])
    for shard in shards:
      if not os.path.isfile(shard.path):
        raise shard_format.ShardError(
            f'shard {shard.path} (listed in {manifest_path}) is missing')
      size = os.path.getsize(shard.path)
      if size != shard.bytes:
        raise shard_format.ShardError(
            f'shard {shard.path} has {size} bytes but {manifest_path} says {shard.bytes}: the '
            'file is corrupted or truncated')
    splits[name] = ShardSplit(
        name=name, shards=shards, num_videos=s['num_videos'], num_captions=s['num_captions'],
        max_captions_per_video=s['max_captions_per_video'],
        caption_count_histogram={int(k): v for k, v in s['caption_count_histogram'].items()},
        has_spans=s['has_spans'], skipped=tuple(tuple(x) for x in s['skipped']),
        index_path=_inside(path, s['index']['file'], manifest_path),
        index_sha256=s['index']['sha256'])
  pre = manifest['preprocessing']
  overlaps = manifest.get('split_overlaps', {})
  if overlaps:
    _log.warning('%s was prepared with a training split that shares videos with other splits '
                 '(allow_split_overlap): %s; metrics on those splits are not a clean test.',
                 path, ', '.join(f'{k}: {v["videos"]} videos' for k, v in overlaps.items()))
  return ShardDataset(dir=path, visual_dim=manifest['visual_dim'], query_dim=manifest['query_dim'],
                      num_clips=pre['num_clips'], max_frames=pre['max_frames'],
                      max_query_len=pre['max_query_len'], preprocessing=pre, splits=splits,
                      split_overlaps=overlaps)


def verify_checksums(shards: Sequence[Shard]) -> None:
  """Checks the sha256 of each file once per process; raises ShardError naming a bad one."""
  for shard in shards:
    stat = os.stat(shard.path)
    key = (shard.path, stat.st_size, stat.st_mtime_ns, shard.sha256)
    if key in _VERIFIED:
      continue
    actual = files.sha256_file(shard.path)
    if actual != shard.sha256:
      raise shard_format.ShardError(
          f'shard {shard.path} is corrupted: its sha256 is {actual} but the manifest says '
          f'{shard.sha256}; prepare the shards again')
    _VERIFIED.add(key)


def _hosts(process_index: int | None, process_count: int | None) -> tuple[int, int]:
  if process_index is None or process_count is None:
    import jax  # pylint: disable=g-import-not-at-top
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  return process_index, process_count


def _local(global_size: int, process_count: int, flag: str) -> int:
  if global_size < 1 or global_size % process_count:
    raise ValueError(f'{flag}={global_size} must be a positive multiple of the number of '
                     f'hosts ({process_count})')
  return global_size // process_count


class _Parser:
  """Turns a serialized record into padded per-video tensors (shapes of the batch contract)."""

  def __init__(self, shards: ShardDataset, video: bool = True, captions: bool = True):
    self.lc, self.lf, self.lq = shards.num_clips, shards.max_frames, shards.max_query_len
    self.dv, self.dq = shards.visual_dim, shards.query_dim
    self.video, self.captions = video, captions
    self.spec = {'video_order': tf.io.FixedLenFeature([], tf.int64)}
    if video:
      self.spec.update({'clip_feats/value': tf.io.FixedLenFeature([], tf.string),
                        'frame_feats/value': tf.io.FixedLenFeature([], tf.string),
                        'num_frames': tf.io.FixedLenFeature([], tf.int64)})
    if captions:
      self.spec.update({'caption_feats/value': tf.io.FixedLenFeature([], tf.string),
                        'caption_lengths': tf.io.VarLenFeature(tf.int64),
                        'caption_order': tf.io.VarLenFeature(tf.int64)})

  def __call__(self, serialized: tf.Tensor) -> dict[str, tf.Tensor]:
    ex = tf.io.parse_single_example(serialized, self.spec)
    out = {'video_order': ex['video_order']}
    if self.video:
      n = tf.cast(ex['num_frames'], tf.int32)
      frames = tf.reshape(tf.io.decode_raw(ex['frame_feats/value'], tf.float32), [n, self.dv])
      out['clip_feats'] = tf.reshape(tf.io.decode_raw(ex['clip_feats/value'], tf.float32),
                                     [self.lc, self.dv])
      # Unpadded: `padded_batch` pads frames to Lf in the same copy that batches them.
      out['frame_feats'] = frames
      out['frame_mask'] = tf.ones([n])
    if self.captions:
      lengths = tf.cast(tf.sparse.to_dense(ex['caption_lengths']), tf.int32)
      tokens = tf.reshape(tf.io.decode_raw(ex['caption_feats/value'], tf.float32), [-1, self.dq])
      ragged = tf.RaggedTensor.from_row_lengths(tokens, lengths, validate=False)
      out['query_feats'] = ragged.to_tensor(shape=[None, self.lq, self.dq])
      out['query_mask'] = tf.sequence_mask(lengths, self.lq, tf.float32)
      out['caption_order'] = tf.sparse.to_dense(ex['caption_order'])
      out['num_queries'] = tf.size(lengths)
    return out


class _NumpyIterator:
  """Numpy batches of a tf.data pipeline with a known length (`None`: unbounded)."""

  def __init__(self, ds: tf.data.Dataset, length: int | None, max_queries: int = 0):
    options = tf.data.Options()
    options.deterministic = True
    self._it = ds.with_options(options).as_numpy_iterator()
    self._length = length
    self._max_queries = max_queries

  def __iter__(self) -> '_NumpyIterator':
    return self

  def __len__(self) -> int:
    if self._length is None:
      raise TypeError('an unbounded iterator has no length')
    return self._length

  def __next__(self) -> dict[str, np.ndarray]:
    try:
      return next(self._it)
    except tf.errors.InvalidArgumentError as e:
      if _OVERFLOW_TAG not in str(e):
        raise
      raise ValueError(
          f'a training batch has more captions than config.data.max_queries_per_batch='
          f'{self._max_queries}; raise it, or set it to 0 (automatic: enough for any batch). '
          'Captions are never dropped.') from None


class TrainIterator(_NumpyIterator):
  """This host's training batches (numpy dicts of the training-batch contract): known up
  front, `steps_per_epoch` (the same on every host), `local_batch_size` (videos per host batch,
  `B`), `num_query_slots` (`Q`) and `start_step` (the global step of the first batch)."""

  def __init__(self, ds, length, max_queries, *, steps_per_epoch, local_batch_size, start_step):
    super().__init__(ds, length, max_queries)
    self.steps_per_epoch = steps_per_epoch
    self.local_batch_size = local_batch_size
    self.num_query_slots = max_queries
    self.start_step = start_step


def steps_per_epoch(split: ShardSplit, global_batch_size: int, process_count: int = 1) -> int:
  """Batches per epoch on every host: the busiest host's videos over the local batch, rounded up."""
  local = _local(global_batch_size, process_count, 'global_batch_size')
  most = max(sum(s.num_videos for s in split.host_shards(i, process_count))
             for i in range(process_count))
  return max(1, -(-most // local))


def _video_shapes(shards: ShardDataset) -> dict[str, list[int]]:
  """`padded_batch` shapes of the video fields: frames padded to Lf."""
  return {'video_order': [], 'clip_feats': [shards.num_clips, shards.visual_dim],
          'frame_feats': [shards.max_frames, shards.visual_dim], 'frame_mask': [shards.max_frames]}


def _pad_video(shards: ShardDataset) -> dict[str, tf.Tensor]:
  lc, lq, dv, dq = shards.num_clips, shards.max_query_len, shards.visual_dim, shards.query_dim
  return {'video_order': tf.constant(-1, tf.int64),
          'clip_feats': tf.zeros([lc, dv]), 'frame_feats': tf.zeros([0, dv]),
          'frame_mask': tf.zeros([0]), 'query_feats': tf.zeros([0, lq, dq]),
          'query_mask': tf.zeros([0, lq]), 'caption_order': tf.zeros([0], tf.int64),
          'num_queries': tf.constant(0, tf.int32)}


def _collate(num_slots: int, shards: ShardDataset):
  """Concatenates the captions of a padded batch of videos into `num_slots` query slots."""
  lq, dq = shards.max_query_len, shards.query_dim

  def collate(b: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    num_videos = tf.shape(b['num_queries'])[0]
    per_video = tf.shape(b['query_feats'])[1]
    real = tf.sequence_mask(b['num_queries'], per_video)            # [B, C]
    video_of = tf.broadcast_to(tf.range(num_videos)[:, None], tf.shape(real))
    feats = tf.boolean_mask(b['query_feats'], real)                  # [n, Lq, Dq]
    mask = tf.boolean_mask(b['query_mask'], real)
    video = tf.boolean_mask(video_of, real)
    n = tf.shape(feats)[0]
    check = tf.debugging.assert_less_equal(
        n, num_slots, message=f'{_OVERFLOW_TAG}: batch has more captions than query slots')
    with tf.control_dependencies([check]):
      pad = num_slots - n
    return {
        'clip_feats': b['clip_feats'],
        'frame_feats': b['frame_feats'],
        'frame_mask': b['frame_mask'],
        'video_valid': b['video_order'] >= 0,
        'query_feats': tf.ensure_shape(tf.pad(feats, [[0, pad], [0, 0], [0, 0]]),
                                       [num_slots, lq, dq]),
        'query_mask': tf.ensure_shape(tf.pad(mask, [[0, pad], [0, 0]]), [num_slots, lq]),
        'query_valid': tf.range(num_slots) < n,
        'query_video': tf.ensure_shape(tf.pad(video, [[0, pad]]), [num_slots]),
    }

  return collate


def _seed(*values: int) -> int:
  """A 31-bit seed mixed from integers (stable across processes)."""
  digest = hashlib.sha256(repr(values).encode()).digest()
  return int.from_bytes(digest[:4], 'little') & 0x7FFFFFFF


def train_iterator(shards: ShardDataset, split: str = 'train', *, global_batch_size: int,
                   seed: int, start_step: int = 0, num_epochs: int | None = None,
                   max_queries_per_batch: int = 0, process_index: int | None = None,
                   process_count: int | None = None, shuffle_buffer: int = 1024,
                   verify: bool = True, prefetch: int = 2) -> TrainIterator:
  """Shuffled, repeated training batches of this host, from global step `start_step`.

  `global_batch_size` videos (a multiple of `process_count`) a step; epoch `e` is shuffled by
  `(seed, e, process_index)` (files, then records through `shuffle_buffer`); `start_step`
  resumes exactly; `num_epochs` stops at the end of that epoch (None: forever);
  `max_queries_per_batch` query slots a host batch (0: enough for any batch); hosts default to
  jax's; `verify` checks the sha256 of this host's shard files (once per process).
  """
  s, mine, local, process_count = _host_split(shards, split, global_batch_size, process_index,
                                              process_count, verify)
  num_local = sum(x.num_videos for x in mine)
  spe = steps_per_epoch(s, global_batch_size, process_count)
  auto_q = s.max_queries(local)
  num_slots = max_queries_per_batch or auto_q
  frames.keep_tf_off_accelerators()

  start_epoch, skip_batches = divmod(start_step, spe)
  files = tf.constant([x.path for x in mine], tf.string, shape=[len(mine)])
  per_epoch = spe * local
  base_seed = _seed(seed, process_index, process_count)
  parse = _Parser(shards)

  def epoch(e: tf.Tensor) -> tf.data.Dataset:
    epoch_seed = (base_seed + e * 1_000_003) % 0x7FFFFFFF
    skip = tf.where(e == start_epoch, tf.constant(skip_batches * local, tf.int64), 0)
    order = tf.random.experimental.stateless_shuffle(
        tf.range(len(mine)), seed=tf.stack([tf.constant(base_seed, tf.int64), e]))
    records = tf.data.Dataset.from_tensor_slices(tf.gather(files, order)).interleave(
        lambda f: tf.data.TFRecordDataset(f, buffer_size=8 << 20),
        cycle_length=max(1, min(_CYCLE_LENGTH, len(mine))), block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    videos = (records.shuffle(shuffle_buffer, seed=epoch_seed)
              .skip(tf.minimum(skip, num_local))
              .map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True))
    pads = (tf.data.Dataset.from_tensors(_pad_video(shards))
            .repeat(per_epoch - num_local).skip(tf.maximum(skip - num_local, 0)))
    return videos.concatenate(pads)

  last = num_epochs if num_epochs is not None else np.iinfo(np.int64).max
  if num_epochs is not None and start_step > spe * num_epochs:
    raise ValueError(f'start_step={start_step} is past the end ({num_epochs} epochs of {spe} steps)')
  lq, dq = shards.max_query_len, shards.query_dim
  ds = (tf.data.Dataset.range(start_epoch, last).flat_map(epoch)
        .padded_batch(local, padded_shapes={
            **_video_shapes(shards), 'query_feats': [None, lq, dq], 'query_mask': [None, lq],
            'caption_order': [None], 'num_queries': []}, drop_remainder=True)
        .map(_collate(num_slots, shards), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .prefetch(prefetch))
  length = None if num_epochs is None else spe * num_epochs - start_step
  return TrainIterator(ds, length, num_slots, steps_per_epoch=spe, local_batch_size=local,
                       start_step=start_step)


@dataclasses.dataclass(frozen=True)
class EvalIndex:
  """Ordered ids of an evaluation split."""
  video_ids: list[str]  # [Nv] score-matrix columns, in first-appearance order
  caption_ids: list[str]  # [Nq] score-matrix rows, in caption-file order
  caption_video_index: np.ndarray  # [Nq] int64 ground-truth column of each caption
  spans: np.ndarray  # [Nq, 2] float32 moment (start, end) in seconds, -1 when unknown
  durations: np.ndarray  # [Nq] float32 duration of each caption's video, -1 when unknown

  @property
  def has_spans(self) -> bool:
    return bool(len(self.durations)) and bool((self.durations > 0).all())

  @property
  def moment_ratio(self) -> np.ndarray | None:
    """`[Nq]` moment length / video length of each caption (`metrics.moment_ratio`), or None
    when the split has no spans."""
    return metrics.moment_ratio(self.spans, self.durations) if self.has_spans else None


def eval_index(shards: ShardDataset, split: str) -> EvalIndex:
  """The ordered ids, ground truth and moment spans of `split`."""
  s = shards.split(split)
  with open(s.index_path, 'rb') as f:
    data = f.read()
  if hashlib.sha256(data).hexdigest() != s.index_sha256:
    raise shard_format.ShardError(f'{s.index_path} is corrupted (sha256 differs from the manifest)')
  index = json.loads(data)
  return EvalIndex(
      video_ids=index['video_ids'], caption_ids=index['caption_ids'],
      caption_video_index=np.asarray(index['caption_video_index'], np.int64),
      spans=np.asarray(index['spans'], np.float32).reshape(-1, 2),
      durations=np.asarray(index['durations'], np.float32))


def _host_split(shards, split, global_batch_size, process_index, process_count, verify):
  """(split, this host's shard files, local batch size, host count), checksums verified."""
  process_index, process_count = _hosts(process_index, process_count)
  local = _local(global_batch_size, process_count, 'global_batch_size')
  s = shards.split(split)
  if s.skipped:
    _log.warning('split %r of %s: %d bad item(s) were skipped when the shards were prepared '
                 '(skip_bad_items); first: %s: %s', s.name, shards.dir, len(s.skipped),
                 *s.skipped[0])
  mine = s.host_shards(process_index, process_count)
  if verify:
    verify_checksums(mine)
  return s, mine, local, process_count


def _eval_records(shards, split, global_batch_size, process_index, process_count, verify, count,
                  **parse):
  """(this host's parsed records in file order, local batch size, batches on every host, this
  host's items); `count(shard)`: its videos or captions."""
  s, mine, local, process_count = _host_split(shards, split, global_batch_size, process_index,
                                              process_count, verify)
  most = max(sum(count(x) for x in s.host_shards(i, process_count)) for i in range(process_count))
  frames.keep_tf_off_accelerators()
  records = tf.data.TFRecordDataset(tf.constant([x.path for x in mine], tf.string),
                                    num_parallel_reads=None, buffer_size=8 << 20)
  parsed = records.map(_Parser(shards, **parse), num_parallel_calls=tf.data.AUTOTUNE,
                       deterministic=True)
  return parsed, local, -(-most // local), sum(count(x) for x in mine)


def split_records(shards: ShardDataset, split: str, *, verify: bool = True
                  ) -> Iterator[dict[str, np.ndarray]]:
  """Every video record of `split` once, in file order (first-appearance order), unpadded.

  Yields numpy dicts `video_order` (its column), `clip_feats [Lc, Dv]`, `frame_feats [n, Dv]`,
  `query_feats [c, Lq, Dq]`, `query_mask [c, Lq]` and `caption_order [c]` (its captions'
  rows in caption-file order).
  """
  parsed, _, _, _ = _eval_records(shards, split, 1, 0, 1, verify, lambda x: x.num_videos)
  options = tf.data.Options()
  options.deterministic = True
  for record in parsed.with_options(options).as_numpy_iterator():
    yield {k: record[k] for k in ('video_order', 'clip_feats', 'frame_feats', 'query_feats',
                                  'query_mask', 'caption_order')}


def eval_videos(shards: ShardDataset, split: str, *, global_batch_size: int,
                process_index: int | None = None, process_count: int | None = None,
                verify: bool = True, prefetch: int = 2) -> Iterator[dict[str, np.ndarray]]:
  """Every video of `split` once across hosts, in first-appearance order within a host.

  Yields numpy dicts `clip_feats [B, Lc, Dv]`, `frame_feats [B, Lf, Dv]`,
  `frame_mask [B, Lf]`, `video_index [B]` int64 (the score-matrix column, -1 = padding);
  `len()` batches, the same number on every host.
  """
  parsed, local, num_batches, n = _eval_records(
      shards, split, global_batch_size, process_index, process_count, verify,
      lambda x: x.num_videos, captions=False)
  pad = {k: v for k, v in _pad_video(shards).items()
         if k in ('video_order', 'clip_feats', 'frame_feats', 'frame_mask')}
  ds = (parsed.concatenate(tf.data.Dataset.from_tensors(pad).repeat(num_batches * local - n))
        .padded_batch(local, padded_shapes=_video_shapes(shards), drop_remainder=True)
        .map(lambda b: {'clip_feats': b['clip_feats'], 'frame_feats': b['frame_feats'],
                        'frame_mask': b['frame_mask'], 'video_index': b['video_order']})
        .prefetch(prefetch))
  return _NumpyIterator(ds, num_batches)


def eval_queries(shards: ShardDataset, split: str, *, global_batch_size: int,
                 process_index: int | None = None, process_count: int | None = None,
                 verify: bool = True, prefetch: int = 2) -> Iterator[dict[str, np.ndarray]]:
  """Every caption of `split` once across hosts, grouped by video within a host.

  Yields numpy dicts `query_feats [Q, Lq, Dq]`, `query_mask [Q, Lq]`, `query_index [Q]`
  int64 (row in caption-file order, -1 = padding), `query_video_index [Q]` int64 (the
  ground-truth video's column, i.e. its index in `EvalIndex.video_ids`); `len()` batches,
  the same number on every host.
  """
  parsed, local, num_batches, n = _eval_records(
      shards, split, global_batch_size, process_index, process_count, verify,
      lambda x: x.num_captions, video=False)
  lq, dq = shards.max_query_len, shards.query_dim

  def captions(v):
    return tf.data.Dataset.from_tensor_slices({
        'query_feats': v['query_feats'], 'query_mask': v['query_mask'],
        'query_index': v['caption_order'],
        'query_video_index': tf.fill([v['num_queries']], v['video_order'])})

  pad = {'query_feats': tf.zeros([lq, dq]), 'query_mask': tf.zeros([lq]),
         'query_index': tf.constant(-1, tf.int64), 'query_video_index': tf.constant(-1, tf.int64)}
  ds = (parsed.flat_map(captions)
        .concatenate(tf.data.Dataset.from_tensors(pad).repeat(num_batches * local - n))
        .batch(local, drop_remainder=True).prefetch(prefetch))
  return _NumpyIterator(ds, num_batches)
