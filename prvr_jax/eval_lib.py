"""Evaluation: encode every video once, score every query against all videos.

Protocol (the official validation code): videos are the unique video ids of the
split's caption file in first-appearance order, encoded in consecutive chunks of
`config.eval.video_batch_size` (100); queries are the caption lines, scored in
batches of `config.eval.query_batch_size` (50) with the model's fused score
(0.7 clip + 0.3 frame/video). Each video chunk is one global batch here, so
GMMFormer v1's frame windows, which the official code sizes by the longest video
of the chunk, see exactly the official chunk (the padding videos we add to fill
the devices have no frames and do not change the chunk maximum).

Sharding: a video chunk is split over all devices (`data` axis); the encodings
are then gathered into one replicated array per output; query batches are split
over devices and scored against all videos; score rows are gathered to every
host, which assembles the full `[queries in caption-file order, videos in
first-appearance order]` matrix and computes the metrics (identical on every
host, so training decisions agree). Every host iterates the same batches and
feeds its own block of rows.
"""

from collections.abc import Iterable, Mapping
import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
import numpy as np

from prvr_jax import metrics as metrics_lib
from prvr_jax import parallel

VIDEO_KEYS = ('clip_feats', 'frame_feats', 'frame_mask')
QUERY_KEYS = ('query_feats', 'query_mask')


@dataclasses.dataclass
class EvalResult:
  """metrics: flat dict (see `metrics.retrieval_metrics`); scores: [Nq, Nv] float32."""
  metrics: dict[str, float]
  scores: np.ndarray


def _round_up(n: int, multiple: int) -> int:
  return -(-n // multiple) * multiple


def _pad_batch(batch: Mapping[str, np.ndarray], size: int, feature_keys: Iterable[str]
               ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
  """Pads a global-view batch to `size` rows; splits off this process's block.

  Returns (this process's rows of `feature_keys`, every other key padded to `size`
  rows on the host, index keys with -1 and other keys with 0 / NaN).
  """
  batch = {k: np.asarray(v) for k, v in batch.items()}
  rows = len(next(iter(batch.values())))
  if rows > size:
    raise ValueError(f'An evaluation batch holds {rows} rows, more than the configured '
                     f'batch size {size}.')
  per_process = size // jax.process_count()
  start = jax.process_index() * per_process
  features, host = {}, {}
  for key, value in batch.items():
    if key in feature_keys:
      features[key] = parallel.pad_rows(value, size)[start:start + per_process]
    else:
      fill = -1 if key.endswith('index') else (np.nan if value.dtype.kind == 'f' else 0)
      host[key] = parallel.pad_rows(value, size, fill)
  return features, host


class Evaluator:
  """Jitted video encoding and query scoring for one model on one mesh.

  Build once and reuse (e.g. every epoch): the jitted functions compile once per
  batch shape.
  """

  def __init__(self, model: nn.Module, mesh: Mesh, video_batch_size: int,
               query_batch_size: int):
    self.model = model
    self.mesh = mesh
    multiple = jax.device_count()
    self.video_rows = _round_up(video_batch_size, multiple)
    self.query_rows = _round_up(query_batch_size, multiple)
    replicated = parallel.replicated(mesh)
    sharded = parallel.sharded(mesh)

    @functools.partial(jax.jit, out_shardings=sharded)
    def encode_videos(params, clip_feats, frame_feats, frame_mask):
      return model.apply({'params': params}, clip_feats, frame_feats, frame_mask,
                         method='encode_videos', deterministic=True)

    @functools.partial(jax.jit, out_shardings=sharded)
    def score_queries(params, query_feats, query_mask, videos):
      queries = model.apply({'params': params}, query_feats, query_mask,
                            method='encode_queries', deterministic=True)
      return model.score(queries, videos).astype(jnp.float32)

    self._encode_videos = encode_videos
    self._score_queries = score_queries
    self._gather_videos = jax.jit(
        lambda chunks: jax.tree.map(lambda *xs: jnp.concatenate(xs), *chunks),
        out_shardings=replicated)

  def encode_videos(self, params: Any, video_batches: Iterable[Mapping[str, np.ndarray]]
                    ) -> tuple[Any, np.ndarray]:
    """Encodes every video batch (each one official chunk, global view on every host).

    Returns:
      (encodings: the model's video dict, replicated, leading axis = padded video rows;
       columns: [rows] int64 video column of each row, -1 for padding).
    """
    chunks, columns = [], []
    for batch in video_batches:
      rows, host = _pad_batch(batch, self.video_rows, VIDEO_KEYS)
      inputs = parallel.shard_local(rows, self.mesh)
      chunks.append(self._encode_videos(params, inputs['clip_feats'], inputs['frame_feats'],
                                        inputs['frame_mask']))
      columns.append(host['video_index'])
    if not chunks:
      raise ValueError('The evaluation split has no videos.')
    return self._gather_videos(chunks), np.concatenate(columns)

  def score_matrix(self, params: Any, videos: Any, columns: np.ndarray,
                   query_batches: Iterable[Mapping[str, np.ndarray]], num_queries: int,
                   num_videos: int) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Scores all queries against the encoded videos.

    Returns:
      scores: [num_queries, num_videos] float32 (rows caption-file order, columns
        first-appearance order);
      query_video: [num_queries] ground-truth column of each query;
      moment_ratio: [num_queries] moment length / video length (NaN where unknown), or
        None when the batches carry no `query_moment_ratio`.
    """
    valid_cols = columns >= 0
    col_of_row = columns[valid_cols]
    if np.unique(col_of_row).size != col_of_row.size or col_of_row.size != num_videos:
      raise ValueError(f'Evaluation video batches cover {np.unique(col_of_row).size} distinct '
                       f'columns for {num_videos} videos.')
    scores = np.full((num_queries, num_videos), np.nan, np.float32)
    query_video = np.full((num_queries,), -1, np.int64)
    moment_ratio = None
    seen = np.zeros((num_queries,), bool)
    for batch in query_batches:
      rows, host = _pad_batch(batch, self.query_rows, QUERY_KEYS)
      inputs = parallel.shard_local(rows, self.mesh)
      block = parallel.to_host(self._score_queries(params, inputs['query_feats'],
                                                   inputs['query_mask'], videos))
      valid = host['query_index'] >= 0
      targets = host['query_index'][valid]
      if seen[targets].any():
        raise ValueError(f'Query rows {targets[seen[targets]][:5].tolist()} appear twice in '
                         'the evaluation batches.')
      seen[targets] = True
      block = np.asarray(block)[valid][:, valid_cols]
      scores[targets[:, None], col_of_row[None, :]] = block
      query_video[targets] = host['query_video_index'][valid]
      if 'query_moment_ratio' in host:
        if moment_ratio is None:
          moment_ratio = np.full((num_queries,), np.nan)
        moment_ratio[targets] = host['query_moment_ratio'][valid]
    if not seen.all():
      raise ValueError(f'{int((~seen).sum())} of {num_queries} queries were never scored '
                       f'(first missing rows {np.flatnonzero(~seen)[:5].tolist()}).')
    return scores, query_video, moment_ratio

  def evaluate(self, params: Any, video_batches: Iterable[Mapping[str, np.ndarray]],
               query_batches: Iterable[Mapping[str, np.ndarray]], num_queries: int,
               num_videos: int, mv_groups=metrics_lib.DEFAULT_MV_GROUPS) -> EvalResult:
    """Encodes, scores and computes the retrieval metrics of one split."""
    videos, columns = self.encode_videos(params, video_batches)
    scores, query_video, moment_ratio = self.score_matrix(
        params, videos, columns, query_batches, num_queries, num_videos)
    del videos
    return EvalResult(metrics_lib.retrieval_metrics(scores, query_video, moment_ratio,
                                                    mv_groups), scores)
