"""Text-video frozen features: precomputed CLIP features of a `text_video.TextVideoSplit`
written in AMDNet's CLIP release layout (`write_feature_release`) and read back as (video,
caption) pair batches (`feature_pairs`), so that models train on CPU from features.

  prvr-write-text-video --dataset=msrvtt --annotations=T-MASS/data/MSRVTT \
      --frame_features=msrvtt_frames.h5 --text_features=msrvtt_text.h5 --out=/data/tv

read back with `release.Release(out, 'msrvtt', 'clip_frames', 'clip')`.
"""

import dataclasses
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from prvr_jax.data import frames as frames_lib
from prvr_jax.data import release as release_lib
from prvr_jax.data import text_video
from prvr_jax.data.release import DataError
from prvr_jax.data.text_video import CLIP_DIM, TEXT_FEATURE, VISUAL_FEATURE
from prvr_jax.files import listing, short


@dataclasses.dataclass(frozen=True)
class FeatureCounts:
  """What one split of a written feature release holds."""
  videos: int
  captions: int
  short_videos: int  # videos with fewer frame features than num_frames (last one repeated)


def _check_features(h5: release_lib.H5Features, ids: Sequence[str], kind: str, dim: int,
                    frames: bool) -> None:
  """Raises listing ids absent from `h5` (metadata only), or naming one of a wrong shape."""
  missing = []
  for i in ids:
    shape = h5.shape_or_none(i)
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
      raise DataError(f'{kind} {short(i)} has features of shape {shape} in {h5.path}, '
                      f'expected {expected} (--dim={dim})')
    release_lib.check_elements(shape, h5.path, f'{kind} {short(i)}')
  if missing:
    raise DataError(f'{len(missing)} of {len(ids)} {kind}s have no features in {h5.path}:\n'
                    f'{listing(missing, limit=release_lib.MAX_LISTED)}')


def _read_finite(h5: release_lib.H5Features, key: str, kind: str,
                 rows: np.ndarray | None = None) -> np.ndarray:
  """`key`'s features (only `rows`, when given) as float32, refused unless finite floats; the
  read is bounded by `release.MAX_FEATURE_ELEMENTS` (`H5Features.read`)."""
  x = h5.read(key, rows)
  if x.dtype.kind != 'f':
    raise DataError(f'{kind} {short(key)} has {x.dtype} features in {h5.path}, expected floats')
  x = x.astype(np.float32)
  if not np.isfinite(x).all():
    raise DataError(f'{kind} {short(key)}: NaN/Inf in its features in {h5.path}')
  return x


def _merged(splits: Mapping[str, text_video.TextVideoSplit]) -> tuple[list[str], dict[str, tuple]]:
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


def write_feature_release(splits: Mapping[str, text_video.TextVideoSplit], frame_features_h5: str,
                          text_features_h5: str, out_root: str, collection: str, *,
                          num_frames: int = frames_lib.NUM_FRAMES, dim: int = CLIP_DIM
                          ) -> dict[str, FeatureCounts]:
  """Writes precomputed CLIP features of `splits` as `<out_root>/<collection>/` (CLIP layout).

  `splits` maps our split names to their `TextVideoSplit`s; `frame_features_h5` holds
  video_id -> per-frame CLIP image features `[n_frames, dim]`, `text_features_h5` caption_id ->
  the CLIP sentence feature (projected EOT token) `[dim]` or `[1, dim]`; `num_frames` are kept
  per video (`sample_frame_indices(n_frames, num_frames, 'uniform')`). Captions are stored
  under `<video_id>#<caption_id>`; everything is checked before anything is written. Returns
  split -> counts.
  """
  if not splits:
    raise ValueError('no splits to write')
  text_video.check_id(collection, 'collection', 'write_feature_release', video=True)
  videos, captions = _merged(splits)
  with release_lib.H5Features(frame_features_h5, 'frame features') as vf, \
       release_lib.H5Features(text_features_h5, 'text features') as tf5:
    _check_features(vf, videos, 'video', dim, frames=True)  # declared shapes, capped
    _check_features(tf5, list(dict.fromkeys(c for c, _, _ in captions.values())), 'caption',
                    dim, frames=False)
    n_frames = {v: vf.shape(v)[0] for v in videos}
    with release_lib.ReleaseWriter(out_root, collection, VISUAL_FEATURE, TEXT_FEATURE) as writer:
      for v in videos:
        idx = frames_lib.sample_frame_indices(n_frames[v], num_frames, 'uniform', video=v)
        writer.add_video(v, _read_finite(vf, v, 'video', idx))  # only the rows kept
      for name, split in splits.items():
        writer.write_captions(name, (
            (split.release_caption_id(c, v), t) for c, v, t in split.captions))
      for rid, (cap_id, _, _) in captions.items():
        writer.add_caption_features(rid, _read_finite(tf5, cap_id, 'caption').reshape(1, dim))
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
    text_video.check_batching(batch_size, num_epochs, len(s.caption_ids), drop_remainder,
                              f'split {split!r}')
    video_of = s.caption_video_index().astype(np.int32)
    vid0 = s.video_ids[0]
    shape = s.raw_video_features(vid0).shape
    epoch = 0
    while num_epochs is None or epoch < num_epochs:
      order = text_video.pair_order(len(s.caption_ids), batch_size, shuffle=shuffle, seed=seed,
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
