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
  """
  video_batches: Callable[[], Iterable[Mapping[str, np.ndarray]]]
  query_batches: Callable[[], Iterable[Mapping[str, np.ndarray]]]
  video_ids: Sequence[str]
  caption_ids: Sequence[str]
  moment_ratio: np.ndarray | None = None
