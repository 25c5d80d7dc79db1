"""Exact top-k search of an index with its model's own scorer, the gallery sharded over the mesh.

* Queries are encoded once by the model's `encode_queries` and replicated on every device.
* The gallery is read chunk by chunk (`chunk_videos` rows, from the shards' memory maps, or
  kept on the devices with `resident`); a chunk's rows are split over the mesh's `data` axis.
  Each device dequantizes its rows, scores them with the model's `score` and keeps its top-k
  (`jax.shard_map`); the per-device lists are merged into the running top-k of every query.
  Every chunk is read once per `search` call, whatever the number of queries.
* Ties are broken by the smaller row, as the evaluator breaks them by the smaller video key:
  built from an evaluation split in key order, the index returns the evaluator's ranking.
* Two-stage (`candidates=`): an approximate-nearest-neighbour index proposes candidate rows per
  query (`prvr_jax.index.candidates`); only those are scored exactly, each query against its own.
"""

from collections.abc import Iterator, Mapping
import dataclasses
import functools
from typing import Any, Protocol

from flax.traverse_util import unflatten_dict
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P
import numpy as np

from prvr_jax import parallel
from prvr_jax.eval.evaluator import score_keys
from prvr_jax.files import short
from prvr_jax.index.store import Index, dequantize
from prvr_jax.layers import precision

DATA = parallel.DATA_AXIS


@dataclasses.dataclass
class SearchResult:
  """rows: `[Q, k]` index rows, best first; scores: `[Q, k]` float32; ids: the rows' video
  ids."""
  rows: np.ndarray
  scores: np.ndarray
  ids: list[list[str]]


class CandidateSource(Protocol):
  """What two-stage search needs of an approximate index (`candidates.CandidateIndex`)."""

  def search(self, queries: np.ndarray, num_candidates: int) -> np.ndarray:
    """`[Q, D]` query vectors -> `[Q, C]` candidate rows (-1 = none)."""


class Searcher:
  """Searches one index; build once and call `search` for any number of query batches.

  Args:
    index: an open index.
    mesh: default `parallel.make_mesh()` (all devices, gallery rows on `data`).
    query_batch_size: queries encoded and scored together.
    chunk_videos: gallery rows per scoring call (bounds the `[Q, rows, set]` intermediates).
    matmul_precision, score_seed: as the evaluator's (`config.eval`).
    resident: keep the dequantizable gallery on the devices between calls (default: when the
      index holds at most `max_resident_bytes`).
    params: the model's parameters (default: the index's own).
  """

  def __init__(self, index: Index, mesh: Mesh | None = None, *, query_batch_size: int = 256,
               chunk_videos: int = 8192, matmul_precision: str = 'float32',
               score_seed: int = 0, resident: bool | None = None,
               max_resident_bytes: int = 1 << 32, params: Any = None):
    self.index = index
    self.mesh = mesh if mesh is not None else parallel.make_mesh()
    spec = index.spec
    self.query_inputs = spec.inputs(index.config_model)[1]
    self.query_batch_size = query_batch_size
    devices = self.mesh.size
    self.chunk_rows = parallel.round_up(min(chunk_videos, len(index)), devices)
    self.params = parallel.replicate(index.params() if params is None else params, self.mesh)
    self.resident = (len(index) * index.manifest['bytes_per_video'] <= max_resident_bytes
                     if resident is None else resident)
    self._resident_chunks: list[tuple[Any, jax.Array]] | None = None
    module = spec.build(index.config_model)
    rngs = score_keys(spec, score_seed)
    leaves = index.leaves
    dtype = index.dtype
    replicated = parallel.replicated(self.mesh)

    def stored_rows(chunk):  # {leaf: {'values', 'scale'?}} -> the model's stored pytree
      return unflatten_dict({name: dequantize(parts['values'], parts.get('scale'),
                                              'float32' if leaves[name]['exact'] else dtype)
                             for name, parts in chunk.items()}, sep='/')

    def scores_of(params, encoded, stored):
      with precision.matmul_precision(matmul_precision):
        return module.apply({'params': params}, encoded, stored, method='score',
                            rngs=rngs).astype(jnp.float32)

    @functools.partial(jax.jit, out_shardings=replicated)
    def encode(params, queries):
      with precision.matmul_precision(matmul_precision):
        return module.apply({'params': params}, queries, method='encode_queries')

    def device_top_k(k, params, encoded, chunk, rows):
      scores = scores_of(params, encoded, stored_rows(chunk))
      valid = rows >= 0
      bad = jnp.any(valid[None] & ~jnp.isfinite(scores), axis=1)
      scores = jnp.where(valid[None], scores, -jnp.inf)
      values, where = jax.lax.top_k(scores, min(k, rows.shape[0]))
      return values, rows[where], bad[:, None]

    @functools.partial(jax.jit, static_argnums=0, donate_argnums=(5, 6, 7),
                       out_shardings=replicated)
    def merge_chunk(k, params, encoded, chunk, rows, best_values, best_rows, bad):
      values, found, chunk_bad = jax.shard_map(
          functools.partial(device_top_k, k), mesh=self.mesh,
          in_specs=(P(), P(), P(DATA), P(DATA)), out_specs=P(None, DATA))(
              params, encoded, chunk, rows)
      # Running list first: on equal scores `top_k` keeps the lower position, i.e. the
      # smaller row (rows grow along the concatenation).
      values, where = jax.lax.top_k(jnp.concatenate([best_values, values], axis=1), k)
      found = jnp.take_along_axis(jnp.concatenate([best_rows, found], axis=1), where, axis=1)
      return values, found, bad | jnp.any(chunk_bad, axis=1)

    @jax.jit
    def rescore(params, encoded, stored):
      """Each query `[q]` against its own candidates `[q, C, ...]` -> `[q, C]`."""
      return jax.vmap(lambda e, s: scores_of(
          params, jax.tree.map(lambda x: x[None], e), stored_rows(s))[0])(encoded, stored)

    self._encode = encode
    self._merge_chunk = merge_chunk
    self._rescore = rescore

  # ----------------------------------------------------------------------------- gallery

  def _host_chunks(self) -> Iterator[tuple[dict[str, dict[str, np.ndarray]], np.ndarray]]:
    """(chunk arrays padded to `chunk_rows`, `[chunk_rows]` int32 rows with -1 padding)."""
    for first, shard in self.index.rows():
      for start in range(0, len(shard), self.chunk_rows):
        stop = min(start + self.chunk_rows, len(shard))
        chunk = {leaf: {part: parallel.pad_rows(np.asarray(array[start:stop]), self.chunk_rows)
                        for part, array in parts.items()}
                 for leaf, parts in shard.arrays.items()}
        rows = parallel.pad_rows(np.arange(first + start, first + stop, dtype=np.int32),
                                 self.chunk_rows, value=-1)
        yield chunk, rows

  def _device_chunks(self) -> Iterator[tuple[Any, jax.Array]]:
    if self._resident_chunks is not None:
      yield from self._resident_chunks
      return
    kept = []
    for chunk, rows in self._host_chunks():
      device = parallel.shard_global_view((chunk, rows), self.mesh, self.chunk_rows)
      if self.resident:
        kept.append(device)
      yield device
    if self.resident:
      self._resident_chunks = kept

  def load(self) -> None:
    """Puts a resident gallery on the devices now, so that the first search does not pay the
    transfer (no-op for a streamed one)."""
    if self.resident and self._resident_chunks is None:
      for _ in self._device_chunks():
        pass

  # ----------------------------------------------------------------------------- queries

  def _query_batches(self, queries: Mapping[str, np.ndarray]) -> list[tuple[Any, int]]:
    missing = [k for k in self.query_inputs if k not in queries]
    if missing:
      raise ValueError(f'The queries lack {missing}; {self.index.spec.name} reads '
                       f'{list(self.query_inputs)}.')
    count = len(next(iter(queries[k] for k in self.query_inputs)))
    batches = []
    for start in range(0, count, self.query_batch_size):
      batch = {k: parallel.pad_rows(np.asarray(queries[k][start:start + self.query_batch_size]),
                                    self.query_batch_size) for k in self.query_inputs}
      batches.append((self._encode(self.params, parallel.replicate(batch, self.mesh)),
                      min(self.query_batch_size, count - start)))
    return batches

  def encode_queries(self, queries: Mapping[str, np.ndarray]) -> Any:
    """The model's query encodings `[Q, ...]` (host arrays) of a query batch dict."""
    parts = [jax.tree.map(lambda x, n=n: np.asarray(x)[:n], encoded)
             for encoded, n in self._query_batches(queries)]
    return jax.tree.map(lambda *xs: np.concatenate(xs), *parts)

  def search(self, queries: Mapping[str, np.ndarray], k: int = 100,
             query_ids: list[str] | None = None) -> SearchResult:
    """Exact top-k of every query: `queries` holds the model's query inputs `[Q, ...]`."""
    k = self._check_k(k)
    batches = self._query_batches(queries)
    # Committed replicated buffers: the donated running lists keep their layout.
    state = [jax.device_put((jnp.full((self.query_batch_size, k), -jnp.inf),
                             jnp.full((self.query_batch_size, k), -1, jnp.int32),
                             jnp.zeros((self.query_batch_size,), bool)),
                            parallel.replicated(self.mesh)) for _ in batches]
    for chunk, rows in self._device_chunks():
      state = [self._merge_chunk(k, self.params, encoded, chunk, rows, *running)
               for (encoded, _), running in zip(batches, state)]
    values, found, bad = (np.concatenate([np.asarray(s[i])[:n] for s, (_, n)
                                          in zip(state, batches)]) for i in range(3))
    self._check_finite(bad, query_ids)
    return self._result(found.astype(np.int64), values)

  def search_two_stage(self, queries: Mapping[str, np.ndarray], candidates: CandidateSource,
                       num_candidates: int, k: int = 100, rescore_batch: int = 1,
                       query_ids: list[str] | None = None) -> SearchResult:
    """Top-k among the `num_candidates` rows `candidates` proposes per query, scored exactly.

    The query vector given to `candidates` is the model's query encoding (its
    `spec.candidate_query` part for models with several)."""
    k = self._check_k(min(k, num_candidates))
    encoded = self.encode_queries(queries)
    vectors = candidate_vectors(self.index.spec, encoded)
    proposed = np.asarray(candidates.search(vectors, num_candidates), np.int64)
    if proposed.shape != (vectors.shape[0], num_candidates):
      raise ValueError(f'The candidate index returned shape {proposed.shape}, expected '
                       f'{(vectors.shape[0], num_candidates)}.')
    starts = np.array([first for first, _ in self.index.rows()] + [len(self.index)])
    all_scores = np.full(proposed.shape, -np.inf, np.float32)
    for start in range(0, len(vectors), rescore_batch):
      rows = proposed[start:start + rescore_batch]
      n = rows.shape[0]
      rows = parallel.pad_rows(rows, rescore_batch, value=-1)
      gathered = self._gather(rows, starts)
      batch = jax.tree.map(lambda x: parallel.pad_rows(x[start:start + n], rescore_batch),
                           encoded)
      scores = np.asarray(self._rescore(self.params, batch, gathered))[:n]
      all_scores[start:start + n] = np.where(rows[:n] >= 0, scores, -np.inf)
    bad = np.any((proposed >= 0) & ~np.isfinite(all_scores), axis=1)
    self._check_finite(bad, query_ids)
    # Stable sort on (-score, row): the exact search's tie rule.
    order = np.lexsort((proposed, -all_scores), axis=1)[:, :k]
    return self._result(np.take_along_axis(proposed, order, 1),
                        np.take_along_axis(all_scores, order, 1))

  # ----------------------------------------------------------------------------- helpers

  def _gather(self, rows: np.ndarray, starts: np.ndarray) -> dict[str, dict[str, np.ndarray]]:
    """Stored arrays of `rows [q, C]` (-1 -> row 0, masked later): `[q, C, ...]` per part."""
    flat = np.maximum(rows.reshape(-1), 0)
    shard_of = np.searchsorted(starts, flat, side='right') - 1
    out: dict[str, dict[str, np.ndarray]] = {}
    for leaf, parts in self.index.shards[0].arrays.items():
      out[leaf] = {}
      for part, first in parts.items():
        gathered = np.empty((flat.size,) + first.shape[1:], first.dtype)
        for s in np.unique(shard_of):
          take = shard_of == s
          gathered[take] = self.index.shards[s].arrays[leaf][part][flat[take] - starts[s]]
        out[leaf][part] = gathered.reshape(rows.shape + first.shape[1:])
    return out

  def _check_k(self, k: int) -> int:
    if k < 1:
      raise ValueError(f'k={k}; expected at least 1.')
    return min(k, len(self.index))

  def _check_finite(self, bad: np.ndarray, query_ids: list[str] | None) -> None:
    if bad.any():
      first = int(np.flatnonzero(bad)[0])
      name = short(query_ids[first]) if query_ids is not None else f'#{first}'
      raise ValueError(f'Query {name}: its scores against {self.index.path} hold NaN or '
                       f'infinite values ({int(bad.sum())} such queries).')

  def _result(self, rows: np.ndarray, scores: np.ndarray) -> SearchResult:
    ids = self.index.ids
    return SearchResult(rows, scores.astype(np.float32),
                        [[ids[r] for r in row if r >= 0] for row in rows])


def candidate_vectors(spec: Any, encoded: Any) -> np.ndarray:
  """`[Q, D]` float32 query vectors for the approximate index (`spec.candidate_query`)."""
  if spec.candidate_query is not None:
    encoded = encoded[spec.candidate_query]
  return np.asarray(encoded, np.float32)
