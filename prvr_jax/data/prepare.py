r"""Feature shards: a TFDS builder writing TFRecord shards of a release, and their manifest.

  prvr-prepare --config=configs/gmmformer_v2.py:tvr \
      --config.data.dir=/data/ms-sl/tvr --out=/data/shards/tvr

One record per video (`shard_features`, float32 stored as raw bytes, so they read back
bit-exact), written in first-appearance order without shuffling, so the same release gives
byte-identical shards. Resumable per split: a split made from the same inputs is kept, an
interrupted or stale one rebuilt. Moment spans come from the optional moments file
(`check.split_moments`). Details: docs/data_pipeline.md.
"""

import collections
import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

from etils import epath
import numpy as np
import tensorflow_datasets as tfds

from tensorflow_datasets.core import writer as tfds_writer

from prvr_jax import files
from prvr_jax.files import short
from prvr_jax.data import catalogue
from prvr_jax.data import check
from prvr_jax.data import preprocess
from prvr_jax.data import release as release_lib
from prvr_jax.data.shard_format import FORMAT, FORMAT_VERSION, MANIFEST, ShardError

_log = logging.getLogger(__name__)

LOCK_FILE = '.prepare.lock'
BUILDER_NAME = 'prvr_features'
# Aim for shards of about this size, and at least this many per split (host splitting).
TARGET_SHARD_BYTES = 256 << 20
MIN_SHARDS = 8


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


class _CanonicalExampleWriter(tfds_writer.ExampleWriter):
  """Writes tf.Examples with their feature map sorted by key.

  Protobuf serialises map fields in hash order, which varies between processes; the
  sorted form makes the same input give byte-identical shards.
  """

  def write(self, path, examples):
    from tensorflow.core.example import example_pb2  # pylint: disable=g-import-not-at-top
    canonical = ((key, example_pb2.Example.FromString(data).SerializeToString(deterministic=True))
                 for key, data in examples)
    return super().write(path, canonical)


@dataclasses.dataclass
class PrvrConfig(tfds.core.BuilderConfig):
  """One collection / feature of the release, and the preprocessing settings.

  `splits=()` builds every split that has a caption file.
  """
  collection: str = ''
  visual_feature: str | None = None
  text_feature: str = 'roberta'
  splits: tuple[str, ...] = ()
  num_clips: int = preprocess.NUM_CLIPS
  max_frames: int = preprocess.MAX_FRAMES
  max_query_len: int = preprocess.MAX_QUERY_LEN
  skip_bad_items: bool = False


class PrvrFeatures(tfds.core.GeneratorBasedBuilder,
                   skip_registration=__name__ == '__main__'):
  """PRVR video features (MS-SL release), one record per video with all its captions."""

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
    return self.dataset_info_from_configs(
        features=shard_features(), disable_shuffling=True,
        homepage='https://github.com/HuiGuanLab/ms-sl')

  def _open_release(self, manual_dir) -> release_lib.Release:
    if self._release is None:
      cfg = self.builder_config
      self._release = release_lib.Release(
          os.fspath(manual_dir), cfg.collection, cfg.visual_feature, cfg.text_feature,
          num_clips=cfg.num_clips, max_frames=cfg.max_frames, max_query_len=cfg.max_query_len,
          skip_bad_items=cfg.skip_bad_items)
    return self._release

  def _example_writer(self) -> tfds_writer.ExampleWriter:
    return _CanonicalExampleWriter(file_format=self.info.file_format)

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    release = self._open_release(dl_manager.manual_dir)
    names = self.builder_config.splits or release.splits
    return {name: self._generate_examples(release, name) for name in names}

  def _generate_examples(self, release: release_lib.Release, name: str):
    split = release.split(name)
    yield from video_examples(split, check.split_moments(release, split))


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


def _written_counts(paths: Sequence[str]) -> list[tuple[list[int], list[int]]]:
  """Per shard file: the `video_order` and caption count of each record, read back."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  spec = {'video_order': tf.io.FixedLenFeature([], tf.int64),
          'caption_order': tf.io.VarLenFeature(tf.int64)}
  out = []
  for path in paths:
    orders, counts = [], []
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
      example = tf.io.parse_single_example(record, spec)
      orders.append(int(example['video_order']))
      counts.append(int(tf.size(example['caption_order'].values)))
    out.append((orders, counts))
  return out


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


def _auto_num_shards(split: release_lib.ReleaseSplit, release: release_lib.Release) -> int:
  frames = sum(min(split.num_frames(v), release.max_frames) + release.num_clips
               for v in split.video_ids)
  est_bytes = 4 * frames * split.visual_dim
  return max(MIN_SHARDS, -(-est_bytes // TARGET_SHARD_BYTES))


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


def prepare_shards(release_dir: str, out_dir: str, *, collection: str | None = None,
                   visual_feature: str | None = None, text_feature: str = 'roberta',
                   splits: Sequence[str] | None = None,
                   num_clips: int = preprocess.NUM_CLIPS, max_frames: int = preprocess.MAX_FRAMES,
                   max_query_len: int = preprocess.MAX_QUERY_LEN,
                   visual_dim: int | None = None, query_dim: int | None = None,
                   skip_bad_items: bool = False, num_shards: int = 0,
                   train_split: str = 'train', allow_split_overlap: bool = False) -> str:
  """Writes (or finishes) the shard folder `out_dir` of a release; returns its manifest path.

  The release arguments are `release.Release`'s; `splits` defaults to every split with a
  caption file; `num_shards=0` aims at 256 MiB a shard, at least 8. A re-run keeps the splits
  made from the same inputs (`input_fingerprint`). `train_split` may share no video with
  another split unless `allow_split_overlap` (then recorded and warned about).
  """
  if num_shards < 0:
    raise ValueError(f'--num_shards={num_shards}: the number of shards per split must be '
                     'positive, or 0 for about 256 MiB per shard')
  manifest_path = os.path.join(out_dir, MANIFEST)
  if (os.path.isdir(out_dir) and set(os.listdir(out_dir)) - {LOCK_FILE}
      and not os.path.isfile(manifest_path)):
    raise ShardError(f'refusing to write shards into {out_dir}: it is a non-empty folder '
                     f'without {MANIFEST}, not a shard folder; choose a new or empty --out')
  os.makedirs(out_dir, exist_ok=True)
  with files.folder_lock(out_dir, LOCK_FILE, 'preparation of these shards', '--out'):
    release = release_lib.Release(
        release_dir, collection, visual_feature, text_feature, num_clips=num_clips,
        max_frames=max_frames, max_query_len=max_query_len, visual_dim=visual_dim,
        query_dim=query_dim, skip_bad_items=skip_bad_items)
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
    manifest = {'format': FORMAT, 'format_version': FORMAT_VERSION, 'complete': False,
                'builder': {'name': BUILDER_NAME, 'version': str(PrvrFeatures.VERSION)},
                'preprocessing': settings, 'splits': {}}
    if os.path.isfile(manifest_path):
      with open(manifest_path, encoding='utf-8') as f:
        old = json.load(f)
      if old.get('preprocessing') != settings:
        raise ShardError(f'{manifest_path} was prepared with other settings '
                         f'({short(old.get("preprocessing"), 300)}); use another --out or '
                         'delete it')
      manifest['splits'] = {k: v for k, v in old.get('splits', {}).items() if k in splits}
      manifest.update({k: old[k] for k in ('visual_dim', 'query_dim') if k in old})
    files.write_json(manifest_path, manifest)  # marks the folder as ours before writing into it

    for name in splits:
      fingerprint = input_fingerprint(release, name, settings)
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
      n = num_shards or _auto_num_shards(split, release)
      config = PrvrConfig(
          name=f'{release.collection}-{visual_feature or text_feature}-{name}', splits=(name,),
          **{k: v for k, v in settings.items() if k not in ('normalize', 'l2_eps')})
      builder = PrvrFeatures(data_dir=out_dir, config=config, release=release)
      _log.info('split %s: %d videos, %d captions -> %d shards in %s', name,
                len(split.video_ids), len(split.caption_ids), n, builder.data_dir)
      # Regenerate, never reuse a dataset TFDS finds in the folder: it may be of other inputs.
      builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
          manual_dir=release_dir, num_shards=min(n, len(split.video_ids)),
          download_mode=tfds.download.GenerateMode.REUSE_CACHE_IF_EXISTS))
      if split.skipped:
        _log.warning('split %s: skipped %d bad item(s): %s', name, len(split.skipped),
                     split.skipped[0][1])

      paths = [os.path.join(builder.data_dir, os.fspath(f))
               for f in builder.info.splits[name].filenames]
      written = _written_counts(paths)
      orders = [o for shard_orders, _ in written for o in shard_orders]
      counts = [c for _, shard_counts in written for c in shard_counts]
      if sorted(orders) != list(range(len(split.video_ids))) or sum(counts) != len(
          split.caption_ids):
        raise ShardError(f'the shards of split {name!r} in {builder.data_dir} hold {len(orders)} '
                         f'videos and {sum(counts)} captions, but the split has '
                         f'{len(split.video_ids)} videos and {len(split.caption_ids)} captions; '
                         'delete the folder and prepare again')
      shards = [{'file': os.path.relpath(path, out_dir), 'num_videos': len(shard_orders),
                 'num_captions': sum(shard_counts), 'bytes': os.path.getsize(path),
                 'sha256': files.sha256_file(path)}
                for path, (shard_orders, shard_counts) in zip(paths, written)]
      index_file = f'index-{name}.json'
      _write_index(os.path.join(out_dir, index_file), split, moments)
      manifest['splits'][name] = _split_summary(
          split, moments, shards, counts, index_file,
          files.sha256_file(os.path.join(out_dir, index_file)), fingerprint)
      manifest['visual_dim'] = split.visual_dim
      manifest['query_dim'] = split.query_dim
      files.write_json(manifest_path, manifest)

    manifest['split_overlaps'] = split_overlaps(out_dir, manifest, train_split)
    files.write_json(manifest_path, manifest)
    check.check_split_overlaps(release.layout.collection_dir, manifest['split_overlaps'],
                               allow_split_overlap)
    manifest['complete'] = True
    files.write_json(manifest_path, manifest)
    return manifest_path


def prepare_from_config(config, out_dir: str, num_shards: int = 0) -> str:
  """`prepare_shards` for `config.data.dir` with the settings of an ml_collections config."""
  data, model = config.data, config.model
  return prepare_shards(
      data.dir, out_dir, collection=data.get('collection') or None,
      visual_feature=data.get('visual_feature') or None,
      text_feature=data.get('text_feature', 'roberta'), splits=check.config_splits(data),
      num_clips=model.get('num_clips', preprocess.NUM_CLIPS),
      max_frames=model.get('max_frames', preprocess.MAX_FRAMES),
      max_query_len=model.get('max_query_len', preprocess.MAX_QUERY_LEN),
      visual_dim=model.get('visual_dim'), query_dim=model.get('query_dim'),
      skip_bad_items=data.get('skip_bad_items', False), num_shards=num_shards,
      train_split=data.get('train_split', 'train'),
      allow_split_overlap=data.get('allow_split_overlap', False))
