"""Every video of a collection, captions or none: what `prvr-index build --split=all` indexes.

  data, videos, identity = collection.all_videos(config)   # EvalSplit with no queries

A collection of users' own videos (`prvr-extract`: AMDNet's CLIP layout, an
`extract_manifest.json`, no caption files) or a release whose videos are all wanted: the
videos of its feature file, read and preprocessed by `release.ReleaseSplit.video_features`
(the rows the prepared shards of the same config hold: `max_frames` uniform sampling,
`num_clips` averaging, normalisation), batched as the shard pipeline batches them (frames
zero-padded to `max_frames`, a mask, `video_index` -1 at padding). Nothing is written.

`videos` holds what is known of each video: its duration in seconds (the extract manifest's,
else a moments file's), its source file and thumbnail (extract manifest), absolute paths.
"""

from collections.abc import Iterator, Mapping, Sequence
import logging
import os
from typing import Any

import numpy as np

from prvr_jax import files
from prvr_jax.data import extract as extract_lib
from prvr_jax.data import preprocess
from prvr_jax.data import release as release_lib

_log = logging.getLogger(__name__)

SHARD_MANIFEST = 'manifest.json'


def release_settings(config: Any) -> dict[str, Any]:
  """The `release.Release` arguments of an ml_collections config (`config.data` and the
  preprocessing sizes of `config.model`): what its shards are prepared with."""
  data, model = config.data, config.model
  return dict(
      collection=data.get('collection') or None,
      visual_feature=data.get('visual_feature') or None,
      text_feature=data.get('text_feature', 'roberta'),
      num_clips=model.get('num_clips', preprocess.NUM_CLIPS),
      max_frames=model.get('max_frames', preprocess.MAX_FRAMES),
      max_query_len=model.get('max_query_len', preprocess.MAX_QUERY_LEN),
      visual_dim=model.get('visual_dim'), query_dim=model.get('query_dim'),
      skip_bad_items=data.get('skip_bad_items', False),
      frame_map=data.get('frame_map') or None, normalize=data.get('normalize'))


def query_layout(config: Any) -> dict[str, Any]:
  """How the data feeds the model's queries (recorded in an index, read by text search):
  {'text_feature': the release layout, 'normalize': whether query features are L2-normalised,
  'max_query_len', 'clip_vocab': the CLIP vocabulary its captions were tokenised with}."""
  settings = release_settings(config)
  normalize = settings['normalize']
  return {'text_feature': settings['text_feature'],
          'normalize': bool(release_lib.default_normalize(settings['text_feature'])
                            if normalize is None else normalize),
          'max_query_len': settings['max_query_len'],
          'clip_vocab': config.data.get('clip_vocab') or None}


# ----------------------------------------------------------------------------- manifest


def read_extract_manifest(collection_dir: str) -> dict[str, Any] | None:
  """The collection's validated extract manifest (`extract.read_manifest`), or None where it
  has none (a release)."""
  if not os.path.isfile(os.path.join(collection_dir, extract_lib.MANIFEST)):
    return None
  return extract_lib.read_manifest(collection_dir)


def _inside(collection_dir: str, path: str | None) -> str | None:
  """An absolute path: `path` as is when absolute, else relative to the collection."""
  if not path:
    return None
  return os.path.normpath(path if os.path.isabs(path) else os.path.join(collection_dir, path))


def video_info(release: release_lib.Release, video_ids: list[str]
               ) -> dict[str, dict[str, Any]]:
  """video id -> {'duration', 'source', 'thumbnail'} (seconds / absolute paths, None where
  unknown) of the videos with anything known: the extract manifest's entries, else the
  durations of the collection's moments files (one per caption split)."""
  layout = release.layout
  manifest = read_extract_manifest(layout.collection_dir)
  wanted = set(video_ids)
  out: dict[str, dict[str, Any]] = {}
  if manifest is not None:
    for video_id, entry in manifest['videos'].items():
      if video_id in wanted:
        duration = float(entry['duration'])  # 0: unknown (a stream without a duration)
        out[video_id] = {'duration': duration if duration > 0 else None,
                         'source': _inside(layout.collection_dir, entry.get('source')),
                         'thumbnail': _inside(layout.collection_dir, entry.get('thumbnail'))}
    return out
  caption_splits = release_lib._caption_splits  # pylint: disable=protected-access
  for split in caption_splits(layout.collection_dir, layout.collection):
    path = layout.moments_path(split)
    if not os.path.isfile(path):
      continue
    for cap_id, (_, _, duration) in release_lib.read_moments(path).items():
      video_id = release_lib.video_id_of(cap_id)
      if video_id in wanted:
        out[video_id] = {'duration': float(duration), 'source': None, 'thumbnail': None}
  return out


# ----------------------------------------------------------------------------- videos


def video_batch(split: release_lib.ReleaseSplit, video_ids: Sequence[str], size: int,
                first_key: int = 0) -> dict[str, np.ndarray]:
  """The model inputs of `video_ids` (at most `size`) as one batch padded to `size` rows:
  `clip_feats [size, num_clips, Dv]`, `frame_feats [size, max_frames, Dv]` and `frame_mask`
  (frames zero-padded, as the shard pipeline pads them), `video_index` (`first_key` + row;
  -1 for padding)."""
  rel = split.release
  items = [split.video_features(v) for v in video_ids]
  dim = items[0][0].shape[1]
  batch = {'clip_feats': np.zeros((size, rel.num_clips, dim), np.float32),
           'frame_feats': np.zeros((size, rel.max_frames, dim), np.float32),
           'frame_mask': np.zeros((size, rel.max_frames), np.float32),
           'video_index': np.full((size,), -1, np.int64)}
  for row, (clips, frames) in enumerate(items):
    batch['clip_feats'][row] = clips
    batch['frame_feats'][row, :len(frames)] = frames
    batch['frame_mask'][row, :len(frames)] = 1
    batch['video_index'][row] = first_key + row
  return batch


class _Batches:
  """Sized iterator of the padded video batches of a videos-only split."""

  def __init__(self, split: release_lib.ReleaseSplit, batch_size: int):
    self.split, self.batch_size = split, batch_size

  def __len__(self) -> int:
    return -(-len(self.split.video_ids) // self.batch_size)

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    ids, size = self.split.video_ids, self.batch_size
    for start in range(0, len(ids), size):
      yield video_batch(self.split, ids[start:start + size], size, start)
    self.split.release.close()


def open_recorded(identity: Mapping[str, Any]) -> release_lib.ReleaseSplit | None:
  """The videos-only split of the collection an index of every video recorded (`all_videos`'
  identity), or None where the index is of a release split or the collection is gone."""
  if identity.get('split') != release_lib.ALL_SPLIT or not os.path.isdir(
      identity.get('collection_dir') or ''):
    return None
  rel = release_lib.Release(
      identity['collection_dir'], identity['collection'], identity.get('visual_feature'),
      identity['text_feature'], num_clips=identity['num_clips'],
      max_frames=identity['max_frames'], normalize=identity['normalize'],
      frame_map=identity.get('frame_map'), videos_only=True)
  return rel.split(release_lib.ALL_SPLIT)


def open_videos(config: Any) -> release_lib.Release:
  """The videos-only `release.Release` of `config.data.dir` with the config's settings. A
  `data.frame_map` timeline the collection does not hold (users' own videos: none) is dropped
  with a warning: the rows are then read as stored."""
  data = config.data
  if not data.dir or not os.path.isdir(data.dir):
    raise FileNotFoundError(f'config.data.dir={data.dir!r} is not a collection folder: '
                            '--split=all reads the videos of a collection\'s FeatureData/.')
  if os.path.isfile(os.path.join(data.dir, SHARD_MANIFEST)):
    raise ValueError(f'config.data.dir={data.dir} is a shard folder; --split=all reads a '
                     'collection folder (FeatureData/, as prvr-extract or a release holds).')
  settings = release_settings(config)
  if settings['frame_map']:
    probe = release_lib.Release(data.dir, **{**settings, 'frame_map': None}, videos_only=True)
    layout = release_lib.Layout(probe.layout.collection_dir, probe.collection,
                                settings['visual_feature'], settings['text_feature'],
                                settings['frame_map'])
    if not os.path.isfile(layout.frame_map_path):
      _log.warning('%s has no frame timeline %s (config.data.frame_map=%r): its rows are read '
                   'as stored.', probe.layout.collection_dir, layout.frame_map_path,
                   settings['frame_map'])
      return probe
  return release_lib.Release(data.dir, **settings, videos_only=True)


def all_videos(config: Any) -> tuple[Any, dict[str, dict[str, Any]], dict[str, Any]]:
  """(the videos-only `EvalSplit` of every video of `config.data.dir`'s feature file, in
  `config.eval.video_batch_size` batches; `video_info` of its videos; the data's identity:
  collection, its folder, layout, settings, number of videos, and the extract manifest's
  sha256 where there is one)."""
  from prvr_jax.eval.splits import EvalSplit  # pylint: disable=g-import-not-at-top
  release = open_videos(config)
  split = release.split(release_lib.ALL_SPLIT)
  batch_size = config.eval.video_batch_size
  data = EvalSplit(video_batches=lambda: _Batches(split, batch_size),
                   query_batches=lambda: iter(()), video_ids=list(split.video_ids),
                   caption_ids=[])
  manifest_path = os.path.join(release.layout.collection_dir, extract_lib.MANIFEST)
  identity = {'collection': release.collection,
              'collection_dir': release.layout.collection_dir,
              'visual_feature': release.layout.visual_feature,
              'text_feature': release.text_feature, 'frame_map': release.frame_map,
              'normalize': release.normalize, 'num_clips': release.num_clips,
              'max_frames': release.max_frames, 'split': release_lib.ALL_SPLIT,
              'num_videos': len(split.video_ids), 'skipped': len(split.skipped),
              'extract_manifest_sha256': (files.sha256_file(manifest_path)
                                          if os.path.isfile(manifest_path) else None)}
  return data, video_info(release, list(split.video_ids)), identity


def split_video_info(durations: Mapping[str, float]) -> dict[str, dict[str, Any]]:
  """`video_info` entries of known durations (seconds > 0) only."""
  return {v: {'duration': float(d), 'source': None, 'thumbnail': None}
          for v, d in durations.items() if d is not None and d > 0}
