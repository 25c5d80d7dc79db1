"""Evaluation splits: the video and query streams of a split, with their ids (a run's data
makes them: `prvr_jax.data.protocol.RunData.eval_split`).

Every item carries a key: a video's key is its index in `video_ids` (the split's videos in
first-appearance order), a query's key its index in `caption_ids` (caption-file order), and
each query names its ground-truth video by key. The evaluator matches queries to videos by
these keys only, so the order of the batches does not matter.
"""

from collections.abc import Callable, Iterable, Mapping, Sequence
import dataclasses
import hashlib

import numpy as np

VIDEO_KEY = 'video_index'
QUERY_KEY = 'query_index'
GROUND_TRUTH_KEY = 'query_video_index'
# A stable int32 of each video's id, for models whose scores draw noise per video (T-MASS):
# unlike the key, it does not change when the split holds other videos.
VIDEO_SEED = 'video_seed'


def video_seeds(video_ids: Sequence[str]) -> np.ndarray:
  """`[Nv]` int32 seed of each video id: the first 31 bits of its SHA-256."""
  return np.array([int.from_bytes(hashlib.sha256(v.encode()).digest()[:4], 'little')
                   & 0x7FFFFFFF for v in video_ids], np.int32)


@dataclasses.dataclass(frozen=True)
class DenseTargets:
  """The dense multi-ground-truth targets of a split (`prvr_jax.data.dense_gt.align`): several
  positive videos per query, by key (docs/dense_eval.md).

  Attributes:
    rows: `[Nd]` query key of each dense query (ground-truth file order).
    columns: `[Nc]` the candidate videos' keys, ascending (the videos of the dense caption
      file; ties still break by video key).
    positives: `[Nd, P]` each query's positives as positions in `columns`, -1 = padding.
    own: `[Nd]` position in `columns` of each query's own video (its caption id's video).
    query_ids: `[Nd]` query ids.
    positive_ids: `[Nd]` each query's positive video ids, in file order.
    files: where the targets come from: `captions` and `ground_truth` (paths) and their
      `captions_sha256` / `ground_truth_sha256`.
  """
  rows: np.ndarray
  columns: np.ndarray
  positives: np.ndarray
  own: np.ndarray
  query_ids: Sequence[str]
  positive_ids: Sequence[Sequence[str]]
  files: Mapping[str, str]


@dataclasses.dataclass
class EvalSplit:
  """One evaluation split.

  Attributes:
    video_batches: returns a fresh iterator of global-view video batches: the model's video
      inputs and `video_index [B]` int64, the video's key (-1 = padding).
    query_batches: returns a fresh iterator of global-view query batches: the model's query
      inputs, `query_index [Q]` int64, the query's key (-1 = padding), and
      `query_video_index [Q]` int64, the key of its ground-truth video.
    video_ids: `[Nv]` video ids (key -> id).
    caption_ids: `[Nq]` caption ids (key -> id).
    moment_ratio: `[Nq]` moment length / video length by query key, or None.
    dense: the dense multi-ground-truth targets (`DenseTargets`), or None: the evaluator then
      reports the dense metrics (`dense_*`) beside the single-ground-truth ones.
  """
  video_batches: Callable[[], Iterable[Mapping[str, np.ndarray]]]
  query_batches: Callable[[], Iterable[Mapping[str, np.ndarray]]]
  video_ids: Sequence[str]
  caption_ids: Sequence[str]
  moment_ratio: np.ndarray | None = None
  dense: DenseTargets | None = None
