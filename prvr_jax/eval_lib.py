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

from collections.abc import Callable, Iterable, Mapping, Sequence
import dataclasses
import functools
import os
from typing import Any

from absl import logging
import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
import numpy as np

from prvr_jax import files
from prvr_jax import metrics as metrics_lib
from prvr_jax import models
from prvr_jax import parallel
from prvr_jax.data import pipeline

VIDEO_KEYS = ('clip_feats', 'frame_feats', 'frame_mask')
QUERY_KEYS = ('query_feats', 'query_mask')


@dataclasses.dataclass
class EvalResult:
  """metrics: flat dict (see `metrics.retrieval_metrics`); scores: [Nq, Nv] float32."""
  metrics: dict[str, float]
  scores: np.ndarray


@dataclasses.dataclass
class EvalSplit:
  """One evaluation split.

  Attributes:
    video_batches: returns a fresh iterator of global-view video batches, each an
      official chunk (consecutive columns in first-appearance order).
    query_batches: returns a fresh iterator of global-view query batches.
    query_video: [Nq] ground-truth column of each query (caption-file order).
    num_videos: Nv.
    moment_ratio: [Nq] moment length / video length, or None when spans are unknown.
    video_ids, caption_ids: the column and row ids (for the outputs).
  """
  video_batches: Callable[[], Iterable[Mapping[str, np.ndarray]]]
  query_batches: Callable[[], Iterable[Mapping[str, np.ndarray]]]
  query_video: np.ndarray
  num_videos: int
  moment_ratio: np.ndarray | None = None
  video_ids: Sequence[str] = ()
  caption_ids: Sequence[str] = ()


def _split_batch(batch: Mapping[str, np.ndarray], rows: int, feature_keys: Iterable[str],
                 index_key: str, mesh: Mesh) -> tuple[dict[str, jax.Array], np.ndarray]:
  """A global-view evaluation batch -> (device inputs padded to `rows`, the index column
  padded with -1)."""
  index = np.asarray(batch[index_key], np.int64)
  if index.shape[0] > rows:
    raise ValueError(f'An evaluation batch holds {index.shape[0]} items, more than the '
                     f'configured batch size ({rows} rows).')
  inputs = parallel.shard_global_view({k: batch[k] for k in feature_keys}, mesh, rows)
  return inputs, parallel.pad_rows(index, rows, value=-1)


class Evaluator:
  """Jitted video encoding and query scoring for one model on one mesh.

  Build once and reuse (e.g. every epoch): the jitted functions compile once per
  batch shape. Matmuls run at `matmul_precision` (float32 by default: the official
  scores; no TF32 on GPUs); SumR is also reported per moment-to-video group of `mv_groups`.
  """

  def __init__(self, model: nn.Module, mesh: Mesh, video_batch_size: int,
               query_batch_size: int, matmul_precision: str = 'float32',
               mv_groups: Sequence[tuple[float, float]] = metrics_lib.DEFAULT_MV_GROUPS):
    self.model = model
    self.mesh = mesh
    self.mv_groups = tuple(tuple(g) for g in mv_groups)
    self.video_batch_size = video_batch_size
    multiple = jax.device_count()
    self.video_rows = parallel.round_up(video_batch_size, multiple)
    self.query_rows = parallel.round_up(query_batch_size, multiple)
    replicated = parallel.replicated(mesh)
    sharded = parallel.sharded(mesh)

    @functools.partial(jax.jit, out_shardings=sharded)
    def encode_videos(params, clip_feats, frame_feats, frame_mask):
      with jax.default_matmul_precision(matmul_precision):
        return model.apply({'params': params}, clip_feats, frame_feats, frame_mask,
                           method='encode_videos', deterministic=True)

    @functools.partial(jax.jit, out_shardings=sharded)
    def score_queries(params, query_feats, query_mask, videos):
      with jax.default_matmul_precision(matmul_precision):
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
    for i, batch in enumerate(video_batches):
      inputs, column = _split_batch(batch, self.video_rows, VIDEO_KEYS, 'video_index',
                                    self.mesh)
      index = column[column >= 0]
      start = i * self.video_batch_size
      if not np.array_equal(index, np.arange(start, start + index.size)):
        raise ValueError(
            f'Evaluation video batch {i} holds columns {index[:5].tolist()}..; the protocol '
            f'encodes consecutive chunks of {self.video_batch_size} videos in first-appearance '
            'order (GMMFormer\'s frame windows depend on the chunk).')
      chunks.append(self._encode_videos(params, inputs['clip_feats'], inputs['frame_feats'],
                                        inputs['frame_mask']))
      columns.append(column)
    if not chunks:
      raise ValueError('The evaluation split has no videos.')
    return self._gather_videos(chunks), np.concatenate(columns)

  def score_matrix(self, params: Any, videos: Any, columns: np.ndarray, data: EvalSplit
                   ) -> np.ndarray:
    """Scores all queries of `data` against the encoded videos.

    Returns:
      [Nq, Nv] float32 scores, rows in caption-file order, columns in first-appearance order.
    """
    num_queries, num_videos = len(data.query_video), data.num_videos
    valid_cols = columns >= 0
    col_of_row = columns[valid_cols]
    if not np.array_equal(np.sort(col_of_row), np.arange(num_videos)):
      raise ValueError(f'The evaluation video batches cover columns {np.unique(col_of_row)[:5]}.. '
                       f'({col_of_row.size} rows), not each of the {num_videos} videos once.')
    scores = np.full((num_queries, num_videos), np.nan, np.float32)
    seen = np.zeros((num_queries,), bool)
    for batch in data.query_batches():
      inputs, row = _split_batch(batch, self.query_rows, QUERY_KEYS, 'query_index', self.mesh)
      block = parallel.to_host(self._score_queries(params, inputs['query_feats'],
                                                   inputs['query_mask'], videos))
      valid = row >= 0
      targets = row[valid]
      if targets.size and (targets.max() >= num_queries or seen[targets].any()):
        raise ValueError(f'Evaluation query rows {targets[:5].tolist()}.. are out of range '
                         f'[0, {num_queries}) or appear twice.')
      seen[targets] = True
      scores[targets[:, None], col_of_row[None, :]] = np.asarray(block)[valid][:, valid_cols]
    if not seen.all():
      raise ValueError(f'{int((~seen).sum())} of {num_queries} queries were never scored '
                       f'(first missing rows {np.flatnonzero(~seen)[:5].tolist()}).')
    return scores

  @classmethod
  def from_config(cls, config: Any, model: nn.Module, mesh: Mesh) -> 'Evaluator':
    """The evaluator of `config.eval` (batch sizes, matmul precision, M/V groups)."""
    return cls(model, mesh, config.eval.video_batch_size, config.eval.query_batch_size,
               config.eval.matmul_precision, config.eval.mv_groups)

  def evaluate(self, params: Any, data: EvalSplit) -> EvalResult:
    """Encodes, scores and computes the retrieval metrics of one split."""
    videos, columns = self.encode_videos(params, data.video_batches())
    scores = self.score_matrix(params, videos, columns, data)
    return EvalResult(metrics_lib.retrieval_metrics(scores, data.query_video,
                                                    data.moment_ratio, self.mv_groups), scores)


def eval_split(config: Any, shards: pipeline.ShardDataset, split: str) -> EvalSplit:
  """`split` of the shard folder in the official evaluation order.

  `split` is 'val' / 'test' (mapped through `config.data.{val,test}_split`) or a split
  name of the shards. Every host reads every batch (global view) and feeds its block.
  """
  name = config.data.get(f'{split}_split', split)
  index = pipeline.eval_index(shards, name)
  common = dict(process_index=0, process_count=1)
  moment_ratio = None
  if index.has_spans:
    length = np.clip(index.spans[:, 1] - index.spans[:, 0], 0, None)
    moment_ratio = np.minimum(length / index.durations, 1.0)
  return EvalSplit(
      video_batches=lambda: pipeline.eval_videos(
          shards, name, global_batch_size=config.eval.video_batch_size, **common),
      query_batches=lambda: pipeline.eval_queries(
          shards, name, global_batch_size=config.eval.query_batch_size, **common),
      query_video=index.caption_video_index, num_videos=len(index.video_ids),
      moment_ratio=moment_ratio, video_ids=index.video_ids, caption_ids=index.caption_ids)


def write_outputs(output_dir: str, result: EvalResult, info: Mapping[str, Any]) -> None:
  """`<output_dir>/metrics.json` (metrics + `info`) and `<output_dir>/scores.npy`."""
  os.makedirs(output_dir, exist_ok=True)
  np.save(os.path.join(output_dir, 'scores.npy'), result.scores)
  files.write_json(os.path.join(output_dir, 'metrics.json'), {**result.metrics, **info})


def evaluate_checkpoint(config: Any, checkpoint: str, split: str = 'test',
                        output_dir: str | None = None) -> EvalResult:
  """What evaluate.py runs: load, encode, score, write (process 0 writes).

  Args:
    config: the model and data config.
    checkpoint: a train.py workdir / checkpoint folder, or an official PyTorch file.
    split: 'test' or 'val'.
    output_dir: default `<workdir>/eval_<split>` for our checkpoints,
      `<file without suffix>_eval_<split>` for official files.
  """
  from prvr_jax import train_lib  # pylint: disable=g-import-not-at-top  (train_lib imports us)
  mesh = parallel.make_mesh()
  params, info = train_lib.load_params(checkpoint, config, mesh)
  if output_dir is None:
    if info['workdir'] is not None:
      output_dir = os.path.join(info['workdir'], f'eval_{split}')
    else:
      output_dir = f'{os.path.splitext(checkpoint)[0]}_eval_{split}'
  # Synthetic data / prepared shards are found again in the training workdir.
  shards = train_lib.open_data(config, info['workdir'] or output_dir)
  evaluator = Evaluator.from_config(config, models.get_model(config.model), mesh)
  result = evaluator.evaluate(params, eval_split(config, shards, split))
  if jax.process_index() == 0:
    write_outputs(output_dir, result, {'split': split, 'checkpoint': info['path'],
                                       'checkpoint_source': info['source'],
                                       'model': config.model.name})
  logging.info('%s on %s: R@1 %.1f R@5 %.1f R@10 %.1f R@100 %.1f SumR %.1f -> %s', checkpoint,
               split, *(result.metrics[k] for k in ('r1', 'r5', 'r10', 'r100', 'sumr')),
               output_dir)
  return result
