"""The generic evaluator: encode a gallery once, sharded over devices; rank queries against it.

* The gallery: every video batch is encoded by the model's `encode_videos` with its rows split
  over the mesh's `data` axis, and the encodings stay there: device d holds its block of
  videos, never the whole gallery.
* Query chunks: encoded by `encode_queries`, scored by the model's `score` against all
  gallery shards (`[Q, G]`, columns sharded on `data`), and each query's text-to-video rank
  is reduced across devices on device.
* Keys, not positions: a query's ground truth is the gallery row whose video key equals the
  query's ground-truth key; ties are broken by video key. Ranks therefore do not depend on
  the chunk sizes, the device count or the order of the gallery.

* Bounded work in flight: every phase dispatches a batch only once the batch `in_flight`
  places before it is done (`pipelined`), so the host holds the inputs of a few batches, not of
  the whole split, and the host's work on one batch overlaps the device's on the next.
* Phases, each with a progress bar on stderr (process 0) and its seconds in
  `EvalResult.timings`: encode videos, encode queries, score (each query batch against the
  gallery, with its text-to-video ranks), rank (video-to-text ranks), metrics.

Protocol (the official validation code): R@1/5/10/100 and SumR from the ranks; video-to-text
ranks and the `[queries, videos]` score matrix (rows by query key, columns by video key)
come from the matrix gathered on the hosts. Models whose video encodings depend on their
batch (`ModelSpec.encoding_depends_on_batch`, GMMFormer's frame windows) are only evaluated
on the official chunks: consecutive videos in first-appearance order. A split with dense
targets (`EvalSplit.dense`) also gets the dense multi-ground-truth metrics `dense_*` from the
same matrix (`dense_results`; docs/dense_eval.md).
"""

import collections
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
import contextlib
import dataclasses
import functools
import operator
import sys
import time
from typing import Any, TypeVar

from absl import logging
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np
import tqdm

from prvr_jax import metrics as metrics_lib
from prvr_jax import parallel
from prvr_jax.files import short
from prvr_jax.eval.splits import DenseTargets, EvalSplit, GROUND_TRUTH_KEY, QUERY_KEY
from prvr_jax.eval.splits import VIDEO_KEY, VIDEO_SEED
from prvr_jax.eval.splits import video_seeds
from prvr_jax.layers import precision
from prvr_jax.models import registry
from prvr_jax.models.spec import ModelSpec


# Batches dispatched to the devices and not yet done, per phase (see `pipelined`): two on
# accelerators (one runs while the host transfers the next), one on CPUs (the host is the
# device: a second batch would only add its inputs to memory).
IN_FLIGHT = 2
IN_FLIGHT_CPU = 1


def default_in_flight(mesh: Mesh) -> int:
  """`IN_FLIGHT_CPU` on a mesh of CPU devices, else `IN_FLIGHT`."""
  cpu = all(d.platform == 'cpu' for d in mesh.devices.flat)
  return IN_FLIGHT_CPU if cpu else IN_FLIGHT


# The phases of an evaluation, the keys of `EvalResult.timings` (`load_gallery` instead of
# `encode_videos` for an evaluation from an index).
PHASES = ('encode_videos', 'encode_queries', 'score', 'rank', 'metrics')

_T = TypeVar('_T')
_R = TypeVar('_R')


@dataclasses.dataclass
class DenseResult:
  """Per-query results of the dense multi-ground-truth protocol (`dense_results`).

  Attributes:
    targets: what was evaluated (`splits.DenseTargets`: queries, positives, files).
    positive_ranks: `[Nd, P]` rank of each positive among the candidates (0 = padding), in
      the order of `targets.positive_ids`.
    single_ranks: `[Nd]` rank of each query's own video among the same candidates.
    ap: `[Nd]` average precision over the positives, in [0, 1].
    ndcg: `[Nd]` binary nDCG@10, in [0, 1].
  """
  targets: DenseTargets
  positive_ranks: np.ndarray
  single_ranks: np.ndarray
  ap: np.ndarray
  ndcg: np.ndarray

  def records(self) -> Iterator[dict[str, Any]]:
    """One JSON-ready dict per dense query, in ground-truth file order (the export)."""
    t = self.targets
    for i, query_id in enumerate(t.query_ids):
      count = len(t.positive_ids[i])
      ranks = [int(r) for r in self.positive_ranks[i, :count]]
      yield {'query_id': query_id, 'positives': list(t.positive_ids[i]),
             'positive_ranks': ranks, 'best_rank': min(ranks),
             'single_rank': int(self.single_ranks[i]), 'ap': float(self.ap[i]),
             'ndcg10': float(self.ndcg[i])}


@dataclasses.dataclass
class EvalResult:
  """metrics: flat dict (see `metrics.summarize`; `dense_*` too for a split with dense
  targets, `dense_results`); scores: `[Nq, Nv]` float32 by keys;
  ranks: `[Nq]` text-to-video rank of each query; timings: seconds of each phase that ran
  (`PHASES`; no `encode_videos` for a gallery given to `evaluate`) and `total`, the whole
  `evaluate` call; dense: the per-query dense results, or None (single protocol)."""
  metrics: dict[str, float]
  scores: np.ndarray
  ranks: np.ndarray
  timings: dict[str, float] = dataclasses.field(default_factory=dict)
  dense: DenseResult | None = None


DENSE_NDCG_K = 10


def dense_results(scores: np.ndarray, targets: DenseTargets
                  ) -> tuple[dict[str, float], DenseResult]:
  """The dense multi-ground-truth metrics of a split's `[Nq, Nv]` score matrix (the one the
  single-ground-truth metrics come from): the dense queries' rows against the candidate
  columns, every positive ranked under `metrics`'s tie rule. Returns the flat metrics,
  prefixed `dense_` (`metrics.multi_positive_metrics`, plus `dense_single_*`: single-ground-
  truth R@K of the same queries against the same candidates, `dense_num_videos` and
  `dense_num_positives`), and the per-query results."""
  block = np.asarray(scores)[np.ix_(targets.rows, targets.columns)]
  positive = metrics_lib.positive_ranks(block, targets.positives)
  single = metrics_lib.positive_ranks(block, targets.own[:, None])[:, 0]
  out = metrics_lib.multi_positive_metrics(positive, ndcg_k=DENSE_NDCG_K, prefix='dense_')
  out.update(metrics_lib.recalls(single, prefix='dense_single_'))
  out['dense_num_videos'] = int(targets.columns.size)
  out['dense_num_positives'] = int((targets.positives >= 0).sum())
  per_query = metrics_lib.multi_positive_per_query(positive, DENSE_NDCG_K)
  return out, DenseResult(targets, positive, single, per_query['ap'], per_query['ndcg'])


def pipelined(items: Iterable[_T], dispatch: Callable[[_T], _R], in_flight: int = IN_FLIGHT,
              wait: Callable[[_R], Any] = jax.block_until_ready) -> Iterator[_R]:
  """`dispatch(item)` of every item, in order, with at most `in_flight` of them dispatched and
  not yet handed on.

  JAX dispatches asynchronously: a loop that dispatches every batch before using any result
  holds every batch's inputs at once. Here item i is taken from `items` and dispatched only
  after the result of item i - `in_flight` was waited for (`wait`) and handed on, so memory
  stays bounded whatever the number of items, while the device works on one batch as the host
  prepares the next.
  """
  if in_flight < 1:
    raise ValueError(f'in_flight={in_flight}: at least one batch must be in flight.')
  pending: collections.deque[_R] = collections.deque()
  for item in items:
    pending.append(dispatch(item))
    if len(pending) >= in_flight:
      result = pending.popleft()
      wait(result)
      yield result
  while pending:
    result = pending.popleft()
    wait(result)
    yield result


class Phases:
  """Times the phases of one evaluation: `with phases('score', total=n) as bar:` shows a
  progress bar (stderr, process 0, when `show`), logs the phase's seconds and records them in
  `timings`."""

  def __init__(self, show: bool = True):
    self.show = show and jax.process_index() == 0
    self.timings: dict[str, float] = {}

  @contextlib.contextmanager
  def __call__(self, name: str, total: int | None = None, unit: str = 'batch'
               ) -> Iterator[tqdm.tqdm]:
    start = time.perf_counter()
    with tqdm.tqdm(total=total, desc=name.replace('_', ' '), unit=unit, file=sys.stderr,
                   disable=not self.show, dynamic_ncols=True) as bar:
      yield bar
    self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start
    logging.info('Evaluation phase %s: %.2f s.', name, self.timings[name])


def len_or_none(items: Iterable[Any]) -> int | None:
  """The number of items of a sized iterable (a split's batch iterators are), else None."""
  length = operator.length_hint(items, -1)
  return length if length >= 0 else None


@dataclasses.dataclass
class Gallery:
  """Encoded videos. `encodings`: the model's stored pytree, leading axis G sharded on `data`;
  `keys`: `[G]` video key of each row (-1 = padding), on the host and (`device_keys`) sharded
  like the encodings."""
  encodings: Any
  keys: np.ndarray
  device_keys: jax.Array


def text_to_video_ranks(scores: jax.Array, gallery_keys: jax.Array, gt_keys: jax.Array
                        ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """Ranks of `metrics.ranks`'s tie rule, over a gallery in any order.

  Args:
    scores: `[Q, G]` scores (columns may be sharded).
    gallery_keys: `[G]` video key of each column, -1 = padding (ignored).
    gt_keys: `[Q]` the key of each query's ground-truth video.

  Returns:
    rank `[Q]` = 1 + #{videos scoring higher} + #{videos scoring equal with a smaller key},
    gt_count `[Q]` (columns holding the ground truth: 1 for a well-formed gallery),
    non_finite `[Q]` (the row has a NaN or infinite score).
  """
  valid = gallery_keys[None, :] >= 0
  is_gt = valid & (gallery_keys[None, :] == gt_keys[:, None])
  gt_score = jnp.max(jnp.where(is_gt, scores, -jnp.inf), axis=1, keepdims=True)
  ahead = valid & ((scores > gt_score)
                   | ((scores == gt_score) & (gallery_keys[None, :] < gt_keys[:, None])))
  return (1 + jnp.sum(ahead, axis=1), jnp.sum(is_gt, axis=1),
          jnp.any(valid & ~jnp.isfinite(scores), axis=1))


def score_keys(spec: ModelSpec, score_seed: int) -> dict[str, jax.Array]:
  """The RNG keys `spec`'s `score` draws from (one per `score_rng_streams` name), the same
  for the evaluator and the index so that both give a pair the same score."""
  base_key = jax.random.key(score_seed)
  return {name: jax.random.fold_in(base_key, i)
          for i, name in enumerate(spec.score_rng_streams)}


def with_video_seeds(video_batches: Iterable[Mapping[str, np.ndarray]],
                     video_ids: Sequence[str]) -> Iterator[dict[str, np.ndarray]]:
  """Video batches with `video_seed` (a hash of each row's video id; padding rows take the
  first video's), for models that draw noise per video."""
  seeds = video_seeds(video_ids)
  for batch in video_batches:
    yield {**batch, VIDEO_SEED: seeds[np.maximum(np.asarray(batch[VIDEO_KEY]), 0)]}


class Evaluator:
  """Jitted gallery encoding and query ranking for one model on one mesh.

  Build once and reuse (e.g. every epoch): the jitted functions compile once per batch
  shape. Matmuls run at `matmul_precision` (float32 by default: the official scores; no TF32
  on GPUs); SumR is also reported per moment-to-video group of `mv_groups`. Models that sample
  at evaluation draw from `score_seed`. `dual_softmax=True` adds the metrics of the DSL
  re-ranked matrix as `dsl_*` (transductive: reported apart, never the headline numbers).
  `progress`: progress bars on stderr (process 0); `in_flight`: batches dispatched and not
  yet done in each phase (`pipelined`; default `default_in_flight`).
  """

  def __init__(self, config_model: Any, mesh: Mesh, video_batch_size: int,
               query_batch_size: int, matmul_precision: str = 'float32',
               mv_groups: Sequence[tuple[float, float]] = metrics_lib.DEFAULT_MV_GROUPS,
               score_seed: int = 0, dual_softmax: bool = False, progress: bool = True,
               in_flight: int | None = None):
    self.spec = registry.get_spec(config_model)
    self.video_inputs, self.query_inputs = self.spec.inputs(config_model)
    self.official_chunks = self.spec.encoding_depends_on_batch(config_model)
    module = self.spec.build(config_model)
    self.mesh = mesh
    self.dual_softmax = dual_softmax
    self.progress = progress
    self.in_flight = in_flight if in_flight is not None else default_in_flight(mesh)
    self.mv_groups = tuple(tuple(g) for g in mv_groups)
    self.video_batch_size = video_batch_size
    self.video_rows = parallel.round_up(video_batch_size, mesh.size)
    self.query_rows = parallel.round_up(query_batch_size, mesh.size)
    sharded = parallel.sharded(mesh)
    replicated = parallel.replicated(mesh)
    columns = NamedSharding(mesh, P(None, parallel.DATA_AXIS))
    score_rngs = score_keys(self.spec, score_seed)

    @functools.partial(jax.jit, out_shardings=sharded)
    def encode_videos(params, videos):
      with precision.matmul_precision(matmul_precision):
        return module.apply({'params': params}, videos, method='encode_videos')

    # Query encodings are replicated: scoring them against the gallery's shards needs no
    # communication.
    @functools.partial(jax.jit, out_shardings=replicated)
    def encode_queries(params, queries):
      with precision.matmul_precision(matmul_precision):
        return module.apply({'params': params}, queries, method='encode_queries')

    @functools.partial(jax.jit, out_shardings=(columns, replicated, replicated, replicated))
    def rank_queries(params, encoded, gallery, gallery_keys, gt_keys):
      with precision.matmul_precision(matmul_precision):
        scores = module.apply({'params': params}, encoded, gallery, method='score',
                              rngs=score_rngs)
      scores = jax.lax.with_sharding_constraint(scores.astype(jnp.float32), columns)
      return (scores, *text_to_video_ranks(scores, gallery_keys, gt_keys))

    self._encode_videos = encode_videos
    self._encode_queries = encode_queries
    self._rank_queries = rank_queries
    self._concat = jax.jit(lambda chunks: jax.tree.map(lambda *xs: jnp.concatenate(xs), *chunks),
                           out_shardings=sharded)

    def place(gallery, chunk, i):  # per device: its rows of batch i at its block i
      return jax.tree.map(lambda g, c: jax.lax.dynamic_update_slice_in_dim(
          g, c, i * c.shape[0], 0), gallery, chunk)

    data = P(parallel.DATA_AXIS)
    # The gallery is filled in place (donated): no second copy of it at the end.
    self._place = jax.jit(jax.shard_map(place, mesh=mesh, in_specs=(data, data, P()),
                                        out_specs=data), donate_argnums=0)
    self._zeros = jax.jit(lambda spec: [jnp.zeros(shape, dtype) for shape, dtype in spec],
                          static_argnums=0, out_shardings=sharded)

  @classmethod
  def from_config(cls, config: Any, mesh: Mesh, progress: bool = True) -> 'Evaluator':
    """The evaluator of `config.model` and `config.eval` (batch sizes, precision, M/V groups)."""
    return cls(config.model, mesh, config.eval.video_batch_size, config.eval.query_batch_size,
               config.eval.matmul_precision, config.eval.mv_groups,
               score_seed=config.eval.get('score_seed', 0),
               dual_softmax=config.eval.get('dual_softmax', False), progress=progress)

  def _device_rows(self, batch: Mapping[str, np.ndarray], inputs: Sequence[str], key: str,
                   rows: int) -> tuple[dict[str, jax.Array], np.ndarray]:
    """A global-view batch -> (its model inputs sharded on `data`, padded to `rows`; its key
    column padded with -1)."""
    keys = np.asarray(batch[key], np.int64)
    if keys.shape[0] > rows:
      raise ValueError(f'An evaluation batch holds {keys.shape[0]} items, more than the '
                       f'configured batch size ({rows} rows).')
    inputs = parallel.shard_global_view({k: batch[k] for k in inputs}, self.mesh, rows)
    return inputs, parallel.pad_rows(keys, rows, value=-1)

  def _dispatch_videos(self, params: Any, i: int, batch: Mapping[str, np.ndarray]
                       ) -> tuple[Any, np.ndarray]:
    """Checks video batch `i` (the official chunks where needed) and dispatches its encoding."""
    inputs, chunk_keys = self._device_rows(batch, self.video_inputs, VIDEO_KEY,
                                           self.video_rows)
    if self.official_chunks:
      real = chunk_keys[chunk_keys >= 0]
      start = i * self.video_batch_size
      if not np.array_equal(real, np.arange(start, start + real.size)):
        raise ValueError(
            f'Evaluation video batch {i} holds videos {real[:5].tolist()}..; '
            f'{self.spec.name} with this config encodes a video differently in another '
            f'batch, so it is evaluated on the official chunks: consecutive chunks of '
            f'{self.video_batch_size} videos in first-appearance order.')
    return self._encode_videos(params, inputs), chunk_keys

  def encode_batches(self, params: Any, video_batches: Iterable[Mapping[str, np.ndarray]],
                     bar: tqdm.tqdm | None = None) -> Iterator[tuple[Any, np.ndarray]]:
    """(encodings sharded on `data`, `[rows]` video keys with -1 for padding) of every video
    batch (global view on every host), each computed when it is yielded; at most `in_flight`
    batches are dispatched ahead (`pipelined`). The one gallery encoder of the evaluation and
    of the index (`prvr_jax.index.build_index`). `bar`: advanced by one per batch."""
    for result in pipelined(enumerate(video_batches),
                            lambda item: self._dispatch_videos(params, *item), self.in_flight,
                            wait=lambda result: jax.block_until_ready(result[0])):
      if bar is not None:
        bar.update()
      yield result

  def encode_gallery(self, params: Any,
                     video_batches: (Iterable[Mapping[str, np.ndarray]]
                                     | Callable[[], Iterable[Mapping[str, np.ndarray]]]),
                     phases: Phases | None = None) -> Gallery:
    """Encodes every video batch (global view on every host) into one sharded gallery
    (phase `encode_videos` of `phases`). `video_batches`: the batches, or a function that
    opens them (e.g. `EvalSplit.video_batches`: opening the split's shards, checksums
    included, is then timed with the phase)."""
    phases = phases if phases is not None else Phases(self.progress)
    chunks, keys, gallery = [], [], None
    with phases('encode_videos') as bar:
      video_batches = video_batches() if callable(video_batches) else video_batches
      count = len_or_none(video_batches)
      bar.reset(total=count)
      for i, (encodings, chunk_keys) in enumerate(self.encode_batches(params, video_batches,
                                                                      bar)):
        keys.append(chunk_keys)
        if count is None:  # an unknown number of batches: concatenated at the end
          chunks.append(encodings)
          continue
        if i >= count:
          raise ValueError(f'The evaluation split announced {count} video batches and gave '
                           'more.')
        if gallery is None:
          gallery = self._zero_gallery(encodings, count)
        gallery = self._place(gallery, encodings, np.int32(i))
      if not keys:
        raise ValueError('The evaluation split has no videos.')
      if count is None:
        encodings = self._concat(chunks)
        del chunks
        keys = np.concatenate(keys)
      else:
        # Batches announced but not given keep zero rows, as padding rows (key -1).
        rows = keys[0].shape[0]
        keys += [np.full((rows,), -1, np.int64)] * (count - len(keys))
        encodings = gallery
        keys = _device_major(np.concatenate(keys), rows, self.mesh.size)
      encodings = jax.block_until_ready(encodings)
      # Closing the split's reader (its threads) is part of the phase.
      del video_batches
    return Gallery(encodings, keys, parallel.shard_global_view(keys, self.mesh, len(keys)))

  def _zero_gallery(self, encodings: Any, count: int) -> Any:
    """Zeros for `count` batches shaped like `encodings`, sharded on `data`."""
    leaves, treedef = jax.tree.flatten(encodings)
    spec = tuple(((count * x.shape[0],) + tuple(x.shape[1:]), np.dtype(x.dtype).name)
                 for x in leaves)
    return jax.tree.unflatten(treedef, self._zeros(spec))

  def video_batches(self, data: EvalSplit) -> Iterable[Mapping[str, np.ndarray]]:
    """The split's video batches with what this model reads (`video_seed` where needed)."""
    batches = data.video_batches()
    if VIDEO_SEED in self.video_inputs:  # models that draw noise per video
      return _Sized(with_video_seeds(batches, data.video_ids), len_or_none(batches))
    return batches

  def _encode_query_batches(self, params: Any, data: EvalSplit, phases: Phases
                            ) -> list[tuple[Any, np.ndarray, np.ndarray]]:
    """(query encodings replicated on the mesh, `[rows]` query keys, `[rows]` ground-truth
    keys; -1 = padding) of every query batch (phase `encode_queries`)."""
    def dispatch(batch):
      inputs, rows = self._device_rows(batch, self.query_inputs, QUERY_KEY, self.query_rows)
      gt = parallel.pad_rows(np.asarray(batch[GROUND_TRUTH_KEY], np.int64), self.query_rows,
                             value=-1)
      return self._encode_queries(params, inputs), rows, gt

    encoded = []
    with phases('encode_queries') as bar:
      batches = data.query_batches()  # opens the shards: in the phase
      bar.reset(total=len_or_none(batches))
      for result in pipelined(batches, dispatch, self.in_flight,
                              wait=lambda result: jax.block_until_ready(result[0])):
        encoded.append(result)
        bar.update()
      del batches  # closing the split's reader is part of the phase
    return encoded

  def evaluate(self, params: Any, data: EvalSplit, gallery: Gallery | None = None,
               phases: Phases | None = None) -> EvalResult:
    """Encodes the gallery (or takes `gallery`, e.g. from an index, keyed like the split's
    videos), ranks every query, computes the metrics of one split; the result's `timings`
    hold the seconds of each phase (and of those `phases` timed before)."""
    start = time.perf_counter()
    phases = phases if phases is not None else Phases(self.progress)
    if gallery is None:
      gallery = self.encode_gallery(params, lambda: self.video_batches(data), phases)
    num_videos, num_queries = len(data.video_ids), len(data.caption_ids)
    columns = gallery.keys >= 0
    video_keys = gallery.keys[columns]
    if (np.unique(video_keys).size != video_keys.size
        or not np.array_equal(np.sort(video_keys), np.arange(num_videos))):
      raise ValueError(f'The evaluation videos hold keys {np.sort(video_keys)[:5].tolist()}.. '
                       f'({video_keys.size} videos), not each of the {num_videos} videos of '
                       'the split once.')
    queries = self._encode_query_batches(params, data, phases)
    scores = np.empty((num_queries, num_videos), np.float32)
    ranks = np.zeros((num_queries,), np.int64)
    ground_truth = np.full((num_queries,), -1, np.int64)

    def dispatch(item):
      encoded, rows, gt = item
      return self._rank_queries(params, encoded, gallery.encodings, gallery.device_keys,
                                parallel.replicate(gt, self.mesh)), rows, gt

    with phases('score', len(queries)) as bar:
      for device, rows, gt in pipelined(queries, dispatch, self.in_flight,
                                        wait=lambda result: jax.block_until_ready(result[0])):
        block, block_ranks, gt_count, non_finite = parallel.to_host(device)
        del device
        real = rows >= 0
        targets = rows[real]
        if targets.size and (targets.max() >= num_queries or ground_truth[targets].max() >= 0
                             or np.unique(targets).size != targets.size):
          raise ValueError(f'Evaluation query keys {targets[:5].tolist()}.. are out of range '
                           f'[0, {num_queries}) or appear twice.')
        _check_rows(data, targets, gt[real], gt_count[real], non_finite[real])
        scores[targets[:, None], video_keys[None, :]] = np.asarray(block)[real][:, columns]
        ranks[targets] = block_ranks[real]
        ground_truth[targets] = gt[real]
        bar.update()
    del queries
    missing = np.flatnonzero(ground_truth < 0)
    if missing.size:
      raise ValueError(f'{missing.size} of {num_queries} queries were never scored (first: '
                       f'{short([data.caption_ids[i] for i in missing[:3]])}).')
    with phases('rank', total=1, unit='step') as bar:
      v2t = metrics_lib.video_to_text_ranks(scores, ground_truth)
      bar.update()
    with phases('metrics', total=1, unit='step') as bar:
      metrics = metrics_lib.summarize(ranks, v2t, num_videos, data.moment_ratio,
                                      self.mv_groups)
      if self.dual_softmax:
        reranked = metrics_lib.dual_softmax(scores)
        metrics.update({f'dsl_{k}': v for k, v in metrics_lib.retrieval_metrics(
            reranked, ground_truth).items() if not k.startswith('num_')})
      dense = None
      if data.dense is not None:  # from the same scores, beside the single-GT metrics
        dense_metrics, dense = dense_results(scores, data.dense)
        metrics.update(dense_metrics)
      bar.update()
    timings = dict(phases.timings)
    timings['total'] = time.perf_counter() - start
    logging.info('Evaluation: %.2f s in all.', timings['total'])
    return EvalResult(metrics, scores, ranks, timings, dense)


def _device_major(keys: np.ndarray, rows: int, devices: int) -> np.ndarray:
  """The keys of batches of `rows` (in batch order) in the order `Evaluator._place` stores
  their rows: each device's rows of every batch in turn, device after device."""
  return keys.reshape(-1, devices, rows // devices).transpose(1, 0, 2).reshape(-1)


class _Sized:
  """An iterable with a known length (for the progress bars)."""

  def __init__(self, items: Iterable[Any], length: int | None):
    self._items, self._length = items, length

  def __iter__(self) -> Iterator[Any]:
    return iter(self._items)

  def __length_hint__(self) -> int:
    return NotImplemented if self._length is None else self._length


def _check_rows(data: EvalSplit, keys: np.ndarray, gt: np.ndarray, gt_count: np.ndarray,
                non_finite: np.ndarray) -> None:
  """Raises naming the first query whose ground truth is not in the gallery exactly once, or
  whose scores are not finite."""
  for bad, what in ((gt_count != 1, 'its ground-truth video {video} is not in the gallery'),
                    (non_finite, 'its scores hold NaN or infinite values')):
    if bad.any():
      i = int(np.flatnonzero(bad)[0])
      video_key = int(gt[i])
      video = f'(key {video_key})'
      if 0 <= video_key < len(data.video_ids):
        video = f'{short(data.video_ids[video_key])} {video}'
      raise ValueError(f'Query {short(data.caption_ids[keys[i]])} (key {keys[i]}): '
                       + what.format(video=video) + f' ({int(bad.sum())} such queries '
                       'in this batch).')
