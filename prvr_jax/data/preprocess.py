"""Feature preprocessing of the official GMMFormer / MS-SL data loaders, in numpy.

The functions reproduce the official numbers, quirks included:

* Segment boundaries are ``round(k * n / m)`` for ``k = 0..m`` with round half to
  even, clipped to ``n - 1`` and used as *exclusive* ends, so the last frame of a
  video is never averaged in (it is only returned on its own when a segment is
  empty, i.e. when its start is not below its end).
* Every function computes in the dtype of its input. The official BigFile reader
  yields Python floats, so the official pipeline pools and normalises video features
  in float64 and casts to float32 only when batching; `prvr_jax.data.release` does the
  same. Query tokens (read from HDF5) stay float32 throughout.
"""

import numpy as np

NUM_CLIPS = 32
MAX_FRAMES = 128
MAX_QUERY_LEN = 30
L2_EPS = 1e-5


def segment_bounds(num_frames: int, num_segments: int,
                   dtype: type = np.float64) -> tuple[np.ndarray, np.ndarray]:
  """Official [start, end) frame bounds of `num_segments` segments, each `[num_segments]` int64.

  `dtype` is the float type the edges `k / num_segments * num_frames` are computed in:
  float32 in the official `average_to_fixed_length` (torch), float64 in
  `uniform_feature_sampling` (numpy); both are exact for power-of-two segment counts.
  """
  if num_frames < 1:
    raise ValueError(f'need at least one frame, got num_frames={num_frames}')
  if num_segments < 1:
    raise ValueError(f'need at least one segment, got num_segments={num_segments}')
  edges = np.arange(num_segments + 1, dtype=dtype) / dtype(num_segments) * dtype(num_frames)
  # np.round rounds half to even, like torch.round in the official code.
  edges = np.minimum(np.round(edges).astype(np.int64), num_frames - 1)
  return edges[:-1], edges[1:]


def _pool_segments(x: np.ndarray, num_segments: int, edge_dtype: type) -> np.ndarray:
  """Mean of x[start:end] per segment, or x[start] when the segment is empty."""
  starts, ends = segment_bounds(x.shape[0], num_segments, edge_dtype)
  counts = np.maximum(ends - starts, 1)
  # Accumulate row by row in the input dtype, vectorised over segments: the same
  # summation order as np.mean over axis 0, so float32 results match it bit for bit.
  acc = x[starts]  # a copy; also the value of an empty segment
  for offset in range(1, int(counts.max())):
    live = offset < counts
    acc[live] += x[starts[live] + offset]
  acc /= counts.astype(x.dtype)[:, None]
  return acc


def _check_2d(x: np.ndarray, name: str) -> np.ndarray:
  x = np.asarray(x)
  if x.ndim != 2:
    raise ValueError(f'{name} expects a [n, D] array, got shape {x.shape}')
  if x.shape[0] == 0:
    raise ValueError(f'{name} got an empty sequence (shape {x.shape})')
  if not np.issubdtype(x.dtype, np.floating):
    x = x.astype(np.float32)
  return x


def average_to_fixed_length(x: np.ndarray, num_segments: int = NUM_CLIPS) -> np.ndarray:
  """Pools `[n, D]` frame features into `[num_segments, D]` clip features (official rule)."""
  x = _check_2d(x, 'average_to_fixed_length')
  return _pool_segments(x, num_segments, np.float32)


def uniform_feature_sampling(x: np.ndarray, max_len: int | None = MAX_FRAMES) -> np.ndarray:
  """Pools `[n, D]` to `[max_len, D]` when `n > max_len`, else returns `x` unchanged."""
  x = _check_2d(x, 'uniform_feature_sampling')
  if max_len is None or x.shape[0] <= max_len:
    return x
  return _pool_segments(x, max_len, np.float64)


def l2_normalize(x: np.ndarray, eps: float = L2_EPS) -> np.ndarray:
  """`x / (||x||_2 + eps)` over the last axis (note: eps is added to the norm)."""
  x = np.asarray(x)
  return x / (np.linalg.norm(x, axis=-1, keepdims=True) + eps)


def timeline_rows(frame_indices: np.ndarray, num_rows: int) -> np.ndarray:
  """Rows of a `[num_rows, D]` feature array that stand for the frames `frame_indices` of
  another extraction's timeline (a BigFile's `video2frames.txt`: frame `i` of `0..last`):
  row `round(i / last * (num_rows - 1))`, half to even, clipped to the last row; every index
  unchanged when `last` is 0. prvr-ea reads the CLIP release this way for the models whose
  loaders walk a BigFile's frame list (docs/data_release.md), so a video keeps the frame count
  of that extraction. `[len(frame_indices)]` int64.
  """
  if num_rows < 1:
    raise ValueError(f'need at least one feature row, got num_rows={num_rows}')
  indices = np.asarray(frame_indices, dtype=np.int64)
  if indices.ndim != 1 or indices.size == 0 or (indices < 0).any():
    raise ValueError(f'timeline_rows expects a non-empty list of frame indices >= 0, got '
                     f'{indices.tolist()[:5]}')
  last = int(indices.max())
  if last > 0:
    # Python's round(i / last * (n - 1)) in float64: the same operations, half to even.
    indices = np.round(indices / np.float64(last) * np.float64(num_rows - 1)).astype(np.int64)
  return np.minimum(indices, num_rows - 1)


def truncate_tokens(x: np.ndarray, max_len: int = MAX_QUERY_LEN) -> np.ndarray:
  """Keeps the first `max_len` rows of a `[n, D]` token sequence."""
  return np.asarray(x)[:max_len]
