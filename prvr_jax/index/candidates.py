"""The first stage of two-stage search: an approximate max-over-set index of a gallery (faiss).

Every element vector of the model's `spec.candidate_set` leaf (a set `[L, D]` per video) is
read shard by shard, chunk by chunk, dequantized as `store.dequantize` does, L2-normalized and
added to a faiss inner-product index (all-zero padding vectors are skipped). Its faiss id is
the element's position in the gallery, `row * L + j`, so `id // L` maps it to its video row.
A query's element hits come best first, so a video's first hit carries its max-over-set
cosine (among the hits): `search` keeps the first hit of each video and searches deeper until
it has C distinct videos or the index is exhausted.

    candidates = CandidateIndex.build(open_index('/idx'), 'ivf')
    candidates.save('/idx/candidates')      # later: CandidateIndex.load('/idx/candidates', index)
    Searcher(index).search_two_stage(queries, candidates, num_candidates=200, k=100)

Kinds (docs/two_stage.md has the measurements behind the defaults):
  'flat': exact (`IndexFlatIP`): tests, and galleries small enough to scan per query.
  'ivf':  `nlist` k-means lists (trained on `train_size` element vectors sampled with `seed`),
          each vector stored as 4-bit fast-scan product-quantization codes of `m` sub-vectors
          (`m // 2` bytes, 48 at D=384, plus its 8-byte id); a query scans `nprobe` lists
          (default `nlist // 8`) for `refine * C` element hits, re-ranks them by their exact
          cosine with the gallery's own stored vectors (`refine=0`: keeps the codes'
          approximate order), then keeps C videos.

Files: `<folder>/candidates.faiss` (faiss's own format) and `<folder>/candidates.json` (kind,
options, the index's identity: the sha256 of its index.json, the vector count, the faiss
file's size, mtime, sha256 and sampled digest, checked on every load as an index's files are),
written last.
"""

from collections.abc import Iterator
import contextlib
import dataclasses
import json
import math
import os
import time
from typing import Any

import numpy as np

from prvr_jax import files
from prvr_jax.index.store import MANIFEST, Index, IndexFormatError, check_file
from prvr_jax.index.store import file_entry, sha256_of

FORMAT = 'prvr_jax.candidates'
FORMAT_VERSION = 1
FAISS_FILE = 'candidates.faiss'
META_FILE = 'candidates.json'
KINDS = ('flat', 'ivf')
IVF_DEFAULTS = {'nlist': None, 'm': None, 'nprobe': None, 'refine': 8, 'train_size': None,
                'seed': 0}
CHUNK_VIDEOS = 4096  # videos read per step of a build
# Element hits asked per wanted candidate in a first search without refinement (deeper
# searches double it).
HITS_PER_CANDIDATE = 4
REFINE_QUERIES = 16  # queries whose hits are re-ranked together (bounds `[q, hits, D]`)


def import_faiss() -> Any:
  """The faiss module, or an ImportError saying how to install it."""
  try:
    import faiss  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError('Two-stage search (prvr_jax.index.candidates) needs faiss: '
                      'pip install "prvr_jax[ann]" (or pip install faiss-cpu).') from e
  return faiss


def dequantize_host(values: np.ndarray, scale: np.ndarray | None, dtype: str) -> np.ndarray:
  """`store.dequantize` on the host: stored rows -> float32 (bfloat16 as uint16 bits)."""
  if dtype == 'float32':
    return np.asarray(values, np.float32)
  if dtype == 'bfloat16':
    return (np.asarray(values).astype(np.uint32) << 16).view(np.float32)
  return values.astype(np.float32) * scale[..., None]


def normalized(vectors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """`[N, D]` -> (the non-zero vectors L2-normalized `[M, D]`, their positions `[M]`)."""
  norms = np.sqrt(np.einsum('nd,nd->n', vectors, vectors))
  keep = np.flatnonzero(norms > 0)
  return np.ascontiguousarray(vectors[keep] / norms[keep, None], np.float32), keep


def first_distinct(hits: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
  """Rows `[Q, K]` best first (-1: none) -> (the first `count` distinct rows of each query in
  order of first hit, -1 padded `[Q, count]`; how many distinct rows each query has `[Q]`)."""
  order = np.argsort(hits, axis=1, kind='stable')
  ranked = np.take_along_axis(hits, order, 1)
  first = np.ones(hits.shape, bool)
  first[:, 1:] = ranked[:, 1:] != ranked[:, :-1]
  keep = np.empty_like(first)
  np.put_along_axis(keep, order, first, 1)
  keep &= hits >= 0
  where = np.argsort(~keep, axis=1, kind='stable')[:, :count]
  rows = np.where(np.take_along_axis(keep, where, 1), np.take_along_axis(hits, where, 1), -1)
  if rows.shape[1] < count:
    rows = np.pad(rows, ((0, 0), (0, count - rows.shape[1])), constant_values=-1)
  return rows.astype(np.int64), keep.sum(axis=1)


def _candidate_leaf(index: Index) -> tuple[str, int, int, str]:
  """(leaf, set size L, width D, dequantization dtype) of the index's candidate set."""
  leaf = index.spec.candidate_set
  desc = index.leaves.get(leaf)
  if desc is None or len(desc['shape']) != 2:
    raise ValueError(f'{index.path}: model {index.spec.name} names {leaf!r} as its candidate '
                     f'set, but the index stores {sorted(index.leaves)} (expected a leaf of '
                     'shape [L, D] per video).')
  size, dim = desc['shape']
  return leaf, size, dim, 'float32' if desc['exact'] else index.dtype


def _element_chunks(index: Index, chunk_videos: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """(normalized non-zero element vectors `[M, D]`, their ids `[M]` int64) of the candidate
  set, `chunk_videos` videos at a time."""
  leaf, size, dim, dtype = _candidate_leaf(index)
  for first, shard in index.rows():
    parts = shard.arrays[leaf]
    for start in range(0, len(shard), chunk_videos):
      stop = min(start + chunk_videos, len(shard))
      scale = parts['scale'][start:stop] if 'scale' in parts else None
      vectors = dequantize_host(parts['values'][start:stop], scale, dtype).reshape(-1, dim)
      vectors, keep = normalized(vectors)
      yield vectors, (first + start) * size + keep


def _elements(index: Index, ids: np.ndarray) -> np.ndarray:
  """The stored element vectors `[N, D]` float32 of element ids `[N]` (`row * L + j`)."""
  leaf, size, dim, dtype = _candidate_leaf(index)
  firsts = np.array([first for first, _ in index.rows()])
  shard_of = np.searchsorted(firsts, ids // size, side='right') - 1
  out = np.empty((len(ids), dim), np.float32)
  for s in np.unique(shard_of):
    take = np.flatnonzero(shard_of == s)
    local = ids[take] - firsts[s] * size
    parts = index.shards[s].arrays[leaf]
    scale = parts['scale'].reshape(-1)[local] if 'scale' in parts else None
    out[take] = dequantize_host(parts['values'].reshape(-1, dim)[local], scale, dtype)
  return out


def _training_sample(index: Index, count: int, seed: int) -> np.ndarray:
  """`count` element vectors drawn uniformly without replacement (with `seed`), normalized;
  padding vectors among them dropped."""
  total = len(index) * _candidate_leaf(index)[1]
  picks = np.sort(np.random.default_rng(seed).choice(total, min(count, total), replace=False))
  return normalized(_elements(index, picks))[0]


def _resolve(kind: str, options: dict[str, Any], num_elements: int, dim: int
             ) -> dict[str, Any]:
  """The options of `kind` with their defaults filled in (ValueError names unknown ones)."""
  if kind not in KINDS:
    raise ValueError(f'Candidate index kind {kind!r}; expected one of {KINDS}.')
  known = IVF_DEFAULTS if kind == 'ivf' else {}
  unknown = sorted(set(options) - set(known))
  if unknown:
    raise ValueError(f'Candidate index kind {kind!r} takes options {sorted(known)}; got '
                     f'{unknown}.')
  resolved = {**known, **options}
  if kind == 'ivf':
    if resolved['nlist'] is None:  # ~sqrt(N) / 2 lists, a power of two, at least 16
      resolved['nlist'] = 2 ** max(4, round(math.log2(max(num_elements, 1)) / 2 - 1))
    if resolved['nprobe'] is None:
      resolved['nprobe'] = max(1, resolved['nlist'] // 8)
    if resolved['m'] is None:
      resolved['m'] = dim // 4
    if resolved['train_size'] is None:  # faiss asks for 39 points per list at least
      resolved['train_size'] = 64 * resolved['nlist']
    if dim % resolved['m'] or resolved['m'] % 2:
      raise ValueError(f'Candidate index option m={resolved["m"]}: must be even and divide '
                       f'the vector width {dim}.')
  return resolved


@dataclasses.dataclass
class CandidateIndex:
  """An approximate max-over-set index of one `Index`'s candidate sets.

  Attributes:
    index: the gallery it covers.
    kind, options: how it was built (`options` with defaults filled in).
    faiss_index: the faiss index; ids are element ids `row * L + j`.
    nprobe, refine: 'ivf' search settings (from `options`; may be changed between calls):
      lists scanned per query in a first search, element hits re-ranked exactly per candidate.
    build_seconds: time to build (None when loaded).
  """
  index: Index
  kind: str
  options: dict[str, Any]
  faiss_index: Any
  build_seconds: float | None = None
  nprobe: int | None = dataclasses.field(init=False)
  refine: int = dataclasses.field(init=False)
  set_size: int = dataclasses.field(init=False)

  def __post_init__(self):
    self.nprobe = self.options.get('nprobe')
    self.refine = self.options.get('refine', 0)
    self.set_size = _candidate_leaf(self.index)[1]

  @property
  def num_elements(self) -> int:
    return int(self.faiss_index.ntotal)

  @classmethod
  def build(cls, index: Index, kind: str = 'ivf', **options: Any) -> 'CandidateIndex':
    """Indexes every non-zero element vector of `index`'s candidate sets (see the module
    docstring); `options`: 'ivf' takes nlist, m, nprobe, refine, train_size, seed; both kinds
    take chunk_videos (videos read per step, default 4096)."""
    faiss = import_faiss()
    start = time.perf_counter()
    chunk_videos = options.pop('chunk_videos', CHUNK_VIDEOS)
    _, size, dim, _ = _candidate_leaf(index)
    options = _resolve(kind, options, len(index) * size, dim)
    if kind == 'flat':
      faiss_index = faiss.IndexIDMap(faiss.IndexFlatIP(dim))
    else:
      faiss_index = faiss.index_factory(dim, f'IVF{options["nlist"]},PQ{options["m"]}x4fs',
                                        faiss.METRIC_INNER_PRODUCT)
      faiss_index.train(_training_sample(index, options['train_size'], options['seed']))
    for vectors, ids in _element_chunks(index, chunk_videos):
      faiss_index.add_with_ids(vectors, ids)
    return cls(index, kind, options, faiss_index, time.perf_counter() - start)

  def search(self, queries: np.ndarray, num_candidates: int) -> np.ndarray:
    """Query vectors `[Q, D]` -> `[Q, C]` int64 rows of the C distinct videos with the highest
    max element cosine among the element hits found, best first; -1 padded when the index holds
    fewer videos."""
    faiss = import_faiss()
    queries = np.asarray(queries, np.float32)
    dim = self.faiss_index.d
    if queries.ndim != 2 or queries.shape[1] != dim:
      raise ValueError(f'Candidate queries have shape {queries.shape}; expected [Q, {dim}].')
    if num_candidates < 1:
      raise ValueError(f'num_candidates={num_candidates}; expected at least 1.')
    norms = np.linalg.norm(queries, axis=1, keepdims=True)
    queries = np.ascontiguousarray(queries / np.where(norms > 0, norms, 1.0), np.float32)
    nlist = self.options.get('nlist')
    nprobe = self.nprobe
    hits = min(num_candidates * (self.refine or HITS_PER_CANDIDATE), self.num_elements)
    result = np.full((len(queries), num_candidates), -1, np.int64)
    pending = np.arange(len(queries)) if self.num_elements else np.arange(0)
    while pending.size:
      params = None if nlist is None else faiss.SearchParametersIVF(nprobe=nprobe)
      _, found = self.faiss_index.search(queries[pending], hits, params=params)
      if self.refine:
        found = self._refined(queries[pending], found)
      rows = np.where(found >= 0, found // self.set_size, -1)
      result[pending], distinct = first_distinct(rows, num_candidates)
      short = distinct < num_candidates
      if hits == self.num_elements and (nlist is None or nprobe >= nlist):
        break  # every vector was ranked: the index is exhausted
      pending = pending[short]
      if nlist is not None and (found[short] < 0).any():  # their lists ran out: scan more
        nprobe = min(2 * nprobe, nlist)
      hits = min(2 * hits, self.num_elements)
    return result

  def _refined(self, queries: np.ndarray, found: np.ndarray) -> np.ndarray:
    """Element ids `[Q, K]` (-1: none) re-ordered by their exact cosine with the normalized
    `queries [Q, D]`, computed from the gallery's stored vectors."""
    out = np.empty_like(found)
    for start in range(0, len(found), REFINE_QUERIES):
      ids = found[start:start + REFINE_QUERIES]
      vectors = _elements(self.index, np.maximum(ids, 0).reshape(-1)).reshape(
          ids.shape + (-1,))
      norms = np.sqrt(np.einsum('qkd,qkd->qk', vectors, vectors))
      cosines = (np.einsum('qkd,qd->qk', vectors, queries[start:start + REFINE_QUERIES])
                 / np.where(norms > 0, norms, 1.0))
      order = np.argsort(np.where(ids >= 0, -cosines, np.inf), axis=1, kind='stable')
      out[start:start + REFINE_QUERIES] = np.take_along_axis(ids, order, 1)
    return out

  # ----------------------------------------------------------------------------- files

  def save(self, path: str) -> None:
    """Writes `path/candidates.faiss`, then `path/candidates.json` (the folder is created;
    e.g. `os.path.join(index.path, 'candidates')`); an earlier json goes first, so an
    interrupted save leaves no json."""
    faiss = import_faiss()
    os.makedirs(path, exist_ok=True)
    meta_path = os.path.join(path, META_FILE)
    if os.path.lexists(meta_path):
      try:
        with open(meta_path, encoding='utf-8') as f:
          ours = json.load(f).get('format') == FORMAT
      except (OSError, ValueError, AttributeError):
        ours = False
      if not ours or os.path.islink(meta_path):
        raise ValueError(f'{meta_path} exists and is not a {FORMAT} file; refusing to replace '
                         'it (choose another folder).')
    with contextlib.suppress(FileNotFoundError):
      os.unlink(meta_path)
    faiss_path = os.path.join(path, FAISS_FILE)
    files.write_atomic(faiss_path, lambda f: faiss.write_index(
        self.faiss_index, faiss.PyCallbackIOWriter(f.write)))
    files.write_json(os.path.join(path, META_FILE), {
        'format': FORMAT, 'format_version': FORMAT_VERSION, 'kind': self.kind,
        'options': self.options, 'leaf': self.index.spec.candidate_set,
        'dim': int(self.faiss_index.d), 'num_elements': self.num_elements,
        'index_path': self.index.path,
        'index_manifest_sha256': sha256_of(os.path.join(self.index.path, MANIFEST)),
        'faiss_bytes': os.path.getsize(faiss_path), 'faiss': file_entry(faiss_path),
        'faiss_version': faiss.__version__,
        'created': files.utc_now()})

  @classmethod
  def load(cls, path: str, index: Index, verify: bool = False) -> 'CandidateIndex':
    """The candidate index saved in folder `path`, checked to be built for `index`, its faiss
    file checked against candidates.json as an index's files are (`store.check_file`: size and
    sampled digest, the full sha256 when its mtime changed or with `verify`)."""
    faiss = import_faiss()
    meta_path = os.path.join(path, META_FILE)
    faiss_path = os.path.join(path, FAISS_FILE)
    if not os.path.isfile(meta_path):
      raise FileNotFoundError(f'{meta_path} does not exist: no candidate index was saved in '
                              f'{path}, or its save did not finish.')
    meta = files.read_json(meta_path, IndexFormatError)
    if (not isinstance(meta, dict) or meta.get('format') != FORMAT
        or meta.get('format_version') != FORMAT_VERSION or meta.get('kind') not in KINDS):
      raise IndexFormatError(f'{meta_path} is not a {FORMAT} file of version '
                             f'{FORMAT_VERSION}.')
    identity = sha256_of(os.path.join(index.path, MANIFEST))
    if meta.get('index_manifest_sha256') != identity:
      raise IndexFormatError(
          f'{meta_path} was built for the index {meta.get("index_path")} (its {MANIFEST} has '
          f'sha256 {meta.get("index_manifest_sha256")}), not for {index.path} (sha256 '
          f'{identity}). Rebuild it with CandidateIndex.build for this index.')
    if not os.path.isfile(faiss_path) or os.path.getsize(faiss_path) != meta['faiss_bytes']:
      raise IndexFormatError(f'{faiss_path} is missing or does not hold the '
                             f'{meta["faiss_bytes"]} bytes {meta_path} records. Rebuild it.')
    if not isinstance(meta.get('faiss'), dict) or 'sha256' not in meta['faiss']:
      raise IndexFormatError(f'{meta_path} records no checksum of {FAISS_FILE} (written by an '
                             'older prvr_jax): rebuild it (prvr-index candidates).')
    check_file(faiss_path, meta['faiss'], verify, meta_path)
    faiss_index = faiss.read_index(faiss_path)
    if faiss_index.ntotal != meta['num_elements'] or faiss_index.d != meta['dim']:
      raise IndexFormatError(f'{faiss_path} holds {faiss_index.ntotal} vectors of width '
                             f'{faiss_index.d}; {meta_path} records {meta["num_elements"]} of '
                             f'width {meta["dim"]}.')
    return cls(index, meta['kind'], meta['options'], faiss_index)
