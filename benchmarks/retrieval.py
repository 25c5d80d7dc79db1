r"""Retrieval efficiency of every model: our index search against the official ranking path and
against the machine's physical floor (docs/efficiency.md).

  python3 benchmarks/retrieval.py [--models=gmmformer,ms_sl] [--sizes=500,2500] [--large]
      [--output=benchmarks/results/retrieval_<device>.json]

Run it with a Python that has torch (e.g. /tmp/torchvenv/bin/python) to time the official
path too; without torch that part is skipped. For every model at its paper-size config (the
'tvr' variant, T-MASS 'msrvtt_features'; random parameters) and gallery size it measures:

* ours: ms per query of `Searcher.search` (exact top-k, the model's `score`) over an index
  written by `IndexWriter`, the queries in one batch: `--queries`, halved while a call's
  matching work exceeds `--search_gflop`; the median of `--repeats` calls (one call where the
  first took over `--long_search_s`) after a warm-up search of a one-chunk prefix of the
  gallery with the same shapes (compilation) and the gallery's transfer to the devices; the
  query encoding inside it is timed on its own;
* the official ranking path (`official_ranking.py`: the authors' scoring structure in torch,
  then a full argsort per query) on the same gallery and the first `--official_queries` of
  the same encoded queries, end to end per query, with the agreement of its top-k lists with
  ours on the queries both ran; only up to `--official_max_videos` and where a run is
  predicted (from the last size) to take at most `--official_time_box` seconds; the speed-up
  compares it with our search without its query encoding (`speedup_search`: with it);
* matching FLOPs per query (XLA's cost analysis of the jitted `score` at 1,000 videos, scaled
  linearly to the gallery size);
* bytes stored per video (the index manifest's, checked against `spec.bytes_per_video`);
* the floor: memory bandwidth and float32 matmul peak measured in the same run; floor per
  query = max(index bytes / bandwidth / queries, FLOPs per query / peak).

Galleries: `--base_videos` random videos of the config's shapes are encoded once with the
model's `encode_videos` (timed: encode time per video); row r of a gallery is base row
r mod N times (1 + eps z), z a standard-normal pattern drawn per block r // N (block 0 is the
base itself), eps = `--perturbation`; masks are copied and T-MASS's noise key is the row
number. MS-SL's rows are its encoded clips and frames (`training_videos`), made into its stored
key-clip attention tables after the perturbation (`stored_form`), so that the official path,
which projects the frames itself, scores the same videos. So every row is distinct, a gallery
of any size costs one multiply per value, and a smaller gallery is a prefix of a larger one: one index is written per model and storage dtype,
at the largest size stored in that dtype, and the smaller sizes search its prefixes.
An index is float32 when it fits in `--memory_fraction` of the available memory (and free
disk), else int8 when that fits, else the point is skipped with the bytes it would need.
Prints a markdown table; writes every number, with the machine, to `--output` (JSON).
"""

from collections.abc import Mapping, Sequence
import dataclasses
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Any

from absl import app
from absl import flags
from flax.traverse_util import unflatten_dict
import jax
import ml_collections
import numpy as np

from prvr_jax import models
from prvr_jax.index import Index, IndexWriter, Searcher
from prvr_jax.index import store
from prvr_jax.layers.multiscale import averaging_matrix
from prvr_jax.models import two_branch
from prvr_jax.models.spec import ModelSpec

from common import (DEFAULT_VARIANT, ROOT, VARIANTS,  # benchmarks/common.py
                    flops_per_query, load_config, machine, matmul_peak_gflops, memory_bandwidth,
                    usable_cores)

DEFAULT_SIZES = (500, 1000, 1500, 2000, 2500, 4000, 10_000, 100_000)
LARGE_SIZE = 1_000_000
FLOPS_VIDEOS = 1000  # gallery size at which XLA counts the matching FLOPs
TIE_TOLERANCE = 1e-5  # official-score gap below which two rows are a float near-tie

_MODELS = flags.DEFINE_list('models', None, 'Models to measure (default: every registered).')
_SIZES = flags.DEFINE_list('sizes', None, 'Gallery sizes (default: the papers\' tables, 10k, '
                           '100k; with --large also 1M).')
_LARGE = flags.DEFINE_bool('large', False, 'Add a 1,000,000-video gallery to the default sizes.')
_QUERIES = flags.DEFINE_integer('queries', 256, 'Queries per search call (one batch).')
_SEARCH_GFLOP = flags.DEFINE_float('search_gflop', 200.0, 'Matching work (GFLOP) of one search '
                                   'call above which its queries are halved.')
_MIN_QUERIES = flags.DEFINE_integer('min_queries', 4, 'The fewest queries of a search call.')
_LONG_SEARCH = flags.DEFINE_float('long_search_s', 1.0, 'A warm-up search longer than this '
                                  'is followed by one timed call instead of --repeats.')
_K = flags.DEFINE_integer('k', 100, 'Top-k of every query.')
_REPEATS = flags.DEFINE_integer('repeats', 3, 'Timed search calls per point (median).')
_BASE_VIDEOS = flags.DEFINE_integer('base_videos', 100, 'Videos encoded by the model.')
_PERTURBATION = flags.DEFINE_float('perturbation', 0.05, 'Relative perturbation eps of tiled '
                                   'gallery rows.')
_CHUNK_MB = flags.DEFINE_integer('chunk_mb', 256, 'Float32 megabytes of gallery rows per '
                                 'scoring call (Searcher chunk_videos).')
_MEMORY_FRACTION = flags.DEFINE_float('memory_fraction', 0.4, 'Largest index, as a fraction of '
                                      'the available memory (and of the free disk).')
_OFFICIAL_QUERIES = flags.DEFINE_integer('official_queries', 50, 'Queries of the official path '
                                         '(the first of ours; 50 is its query batch).')
_OFFICIAL_MAX = flags.DEFINE_integer('official_max_videos', 10_000, 'Largest gallery the '
                                     'official path runs on (0: never).')
_OFFICIAL_BOX = flags.DEFINE_float('official_time_box', 10.0, 'Skip the official path where '
                                   'one run is predicted (from the previous size) to take '
                                   'longer, in seconds.')
_INDEX_DIR = flags.DEFINE_string('index_dir', None, 'Where indexes are written (and deleted '
                                 'after use); default a temporary folder.')
_OUTPUT = flags.DEFINE_string('output', None, 'JSON of every number (default '
                              'benchmarks/results/retrieval_<device>.json).')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of parameters, videos, queries, patterns.')


# ------------------------------------------------------------------------------------ machine

def index_budget(folder: str) -> int:
  """The largest index, in bytes: `--memory_fraction` of the least of the available host
  memory, the free disk under `folder` and the accelerator's memory."""
  limits = [os.sysconf('SC_AVPHYS_PAGES') * os.sysconf('SC_PAGE_SIZE'),
            shutil.disk_usage(folder).free]
  try:
    with open('/proc/meminfo', encoding='utf-8') as f:
      for line in f:
        if line.startswith('MemAvailable:'):
          limits[0] = int(line.split()[1]) * 1024
  except OSError:
    pass
  stats = jax.devices()[0].memory_stats()
  if stats and 'bytes_limit' in stats:
    limits.append(stats['bytes_limit'])
  return int(_MEMORY_FRACTION.value * min(limits))


# -------------------------------------------------------------------------------------- model

def random_queries(config_model: Any, query_keys: Sequence[str], count: int,
                   rng: np.random.Generator) -> dict[str, np.ndarray]:
  """Standard-normal query features, zero past random lengths in [min(8, L), L]."""
  length, dim = config_model.max_query_len, config_model.query_dim
  lengths = rng.integers(min(8, length), length + 1, size=count)
  mask = (np.arange(length)[None] < lengths[:, None]).astype(np.float32)
  feats = rng.standard_normal((count, length, dim), dtype=np.float32) * mask[..., None]
  return {k: v for k, v in {'query_feats': feats, 'query_mask': mask}.items()
          if k in query_keys}


def stored_from_training(module: Any) -> bool:
  """Whether the model's stored form is made from other encodings (`stored_form` of
  `training_videos`: MS-SL's tables from its frames) rather than being `encode_videos`' output
  as it is (the default `TwoBranchModel.stored_form` keeps every encoding; DreamPRVR's
  `training_videos` also takes the queries and returns the training terms' inputs)."""
  stored_form = getattr(type(module), 'stored_form', None)
  return stored_form is not None and stored_form is not two_branch.TwoBranchModel.stored_form


def encode_base(spec: ModelSpec, config: ml_collections.ConfigDict, params: Any, count: int,
                rng: np.random.Generator) -> tuple[dict[str, np.ndarray], float]:
  """(`count` random videos of the config's shapes encoded as the stored form is made from
  (`training_videos`, `stored_form`: MS-SL's encoded frames; the stored form itself for the
  other models), as 'a/b' leaf -> host rows; seconds per video of `encode_videos`,
  compilation excluded)."""
  cfg = config.model
  video_keys = spec.inputs(cfg)[0]
  lengths = rng.integers(cfg.max_frames // 4, cfg.max_frames + 1, size=count)
  videos = models.random_batch(cfg, rng, tuple(lengths), (1,) * count)
  videos = {k: videos[k] for k in video_keys}
  module = spec.build(cfg)
  encode = jax.jit(lambda p, v: module.apply({'params': p}, v, method='encode_videos'))
  batch = min(count, config.eval.video_batch_size)
  batches = [{k: v[i:i + batch] for k, v in videos.items()} for i in range(0, count, batch)]
  jax.block_until_ready(encode(params, batches[0]))  # compiles (and the last, if shorter)
  if len(batches[-1][video_keys[0]]) != batch:
    jax.block_until_ready(encode(params, batches[-1]))
  start = time.perf_counter()
  jax.block_until_ready([encode(params, b) for b in batches])
  seconds = (time.perf_counter() - start) / count
  if stored_from_training(module):
    encode = jax.jit(lambda p, v: module.apply({'params': p}, v, True, method='training_videos'))
  flat = [store.flatten_params(encode(params, b)) for b in batches]
  # MS-SL's multi-scale clips are averages of its clips: `official_rows` forms them again
  # from the perturbed clips.
  return {k: np.concatenate([f[k] for f in flat]) for k in flat[0]
          if k != 'multiscale_clips'}, seconds


def gallery_blocks(base: Mapping[str, np.ndarray], size: int, eps: float, seed: int):
  """Yields (rows, first row) blocks of `len(base)` rows of a `size`-row gallery (see the
  module docstring)."""
  n = len(next(iter(base.values())))
  for block, first in enumerate(range(0, size, n)):
    take = min(n, size - first)
    rng = np.random.default_rng((seed, block))
    rows = {}
    for name, array in base.items():
      array = array[:take]
      if np.issubdtype(array.dtype, np.integer):  # T-MASS's per-video noise key
        rows[name] = np.arange(first, first + take, dtype=array.dtype)
      elif store.exact_leaf(name, array.dtype) or block == 0:
        rows[name] = array
      else:
        pattern = rng.standard_normal(array.shape[1:], dtype=np.float32)
        rows[name] = array * (1 + eps * pattern)
    yield rows, first


def write_index(folder: str, model: 'Model', size: int, dtype: str) -> Index:
  """A `size`-video index of `dtype` from tiled, perturbed base rows (made into the stored
  form by `Model.stored_rows`), in shards of 4 search chunks (the writer holds one shard in
  memory)."""
  writer = IndexWriter(folder, model.config.model, model.params, dtype=dtype, overwrite=True,
                       shard_videos=4 * model.chunk_videos, durable=False)  # deleted after use
  for rows, first in gallery_blocks(model.base, size, _PERTURBATION.value, _SEED.value):
    count = len(next(iter(rows.values())))
    writer.add(model.stored_rows(rows), [f'v{r:07d}' for r in range(first, first + count)])
  return writer.close()


def official_rows(model: 'Model', index: Index) -> dict[str, np.ndarray]:
  """The gallery the official path scores: the index's rows, or for a model whose stored form
  is made from other encodings (MS-SL's tables from its frames) those encodings of the same
  gallery, regenerated from the base."""
  if set(model.base) == set(index.leaves):
    return index_rows(index)
  parts = [rows for rows, _ in gallery_blocks(model.base, len(index), _PERTURBATION.value,
                                                _SEED.value)]
  rows = {k: np.concatenate([p[k] for p in parts]) for k in model.base}
  if model.name == 'ms_sl':  # the official gallery holds the 528 multi-scale clips
    matrix = averaging_matrix(rows['clips'].shape[1])
    rows['clips'] = np.einsum('pl,bld->bpd', matrix, rows['clips'])
  return rows


def index_rows(index: Index) -> dict[str, np.ndarray]:
  """Every stored leaf as float32 host rows (int8 dequantized; integer leaves as stored)."""
  out = {}
  for name in index.leaves:
    parts = []
    for shard in index.shards:
      values = shard.arrays[name]['values']
      if 'scale' in shard.arrays[name]:
        values = np.asarray(values, np.float32) * shard.arrays[name]['scale'][..., None]
      parts.append(np.asarray(values))
    out[name] = parts[0] if len(parts) == 1 else np.concatenate(parts)
  return unflatten_dict(out, sep='/')


# ----------------------------------------------------------------------------------- official

def load_official() -> Any:
  """benchmarks/official_ranking.py, or None where torch is missing."""
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  try:
    import official_ranking  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    print(f'The official path is skipped: {e}')
    return None
  return official_ranking


def agreement(ours_rows: np.ndarray, ours_scores: np.ndarray, official_rows: np.ndarray,
              scores: np.ndarray) -> dict[str, float]:
  """How our top-k lists agree with the official path's (`scores` the official `[Q, G]`)."""
  top10 = min(10, ours_rows.shape[1])
  ours_official = np.take_along_axis(scores, ours_rows, axis=1)
  official_sorted = np.take_along_axis(scores, official_rows, axis=1)
  return {
      'top10_equal': float(np.mean(np.all(ours_rows[:, :top10] == official_rows[:, :top10], 1))),
      'topk_equal': float(np.mean(np.all(ours_rows == official_rows, axis=1))),
      'positions_equal': float(np.mean(ours_rows == official_rows)),
      # Lists that differ only by float near-ties: the official score at each position agrees.
      'equal_up_to_ties': float(np.mean(np.all(
          np.abs(ours_official - official_sorted) <= TIE_TOLERANCE, axis=1))),
      'max_score_difference': float(np.max(np.abs(ours_official - ours_scores))),
  }


# ---------------------------------------------------------------------------------- one point

def time_ours(index: Index, queries: Mapping[str, np.ndarray], k: int, chunk_videos: int,
              max_resident_bytes: int) -> tuple[list[float], list[float], Any, Searcher]:
  """(seconds of the timed `Searcher.search` calls, seconds of their query encoding alone
  (`encode_queries`), the last result, the searcher): `--repeats` calls, one where the first
  took over `--long_search_s`.

  Warm-up (compilation, first-touch allocations) is one search of a prefix of the gallery with
  the same chunk and query shapes (the whole gallery where it is a single chunk), then the
  gallery is put on the devices (`Searcher.load`)."""
  searcher = Searcher(index, query_batch_size=len(next(iter(queries.values()))),
                      chunk_videos=chunk_videos, max_resident_bytes=max_resident_bytes)
  warm_up = searcher if len(index) <= searcher.chunk_rows else Searcher(
      index.prefix(searcher.chunk_rows), query_batch_size=searcher.query_batch_size,
      chunk_videos=chunk_videos, max_resident_bytes=max_resident_bytes)
  warm_up.search(queries, k=min(k, len(warm_up.index)))
  del warm_up
  searcher.load()
  search, encode = [], []
  while len(search) < (1 if search and search[0] > _LONG_SEARCH.value else _REPEATS.value):
    start = time.perf_counter()
    result = searcher.search(queries, k=k)
    search.append(time.perf_counter() - start)
    start = time.perf_counter()
    searcher.encode_queries(queries)
    encode.append(time.perf_counter() - start)
  return search, encode, result, searcher


def choose_dtype(spec: ModelSpec, config_model: Any, size: int, budget: int
                 ) -> tuple[str | None, dict[str, int]]:
  """(float32, else int8 where float32 does not fit `budget` bytes, else None; the index bytes
  of each dtype)."""
  leaves = {name: (tuple(s.shape), np.dtype(s.dtype))
            for name, s in spec.stored_per_video(config_model).items()}
  needed = {dtype: size * store.bytes_per_video(leaves, dtype) for dtype in ('float32', 'int8')}
  for dtype, nbytes in needed.items():
    if nbytes <= budget:
      return dtype, needed
  return None, needed


def query_count(flops: float) -> int:
  """Queries of one search call: `--queries`, halved (not below `--min_queries`) while the
  call's matching work exceeds `--search_gflop`: the compute-heavy scorers get fewer queries at
  large sizes, the memory-bound ones keep their batch."""
  count = _QUERIES.value
  while count // 2 >= _MIN_QUERIES.value and count * flops > _SEARCH_GFLOP.value * 1e9:
    count //= 2
  return count


def run_official(official: Any, model: 'Model', index: Index, encoded: Any,
                 k: int) -> tuple[list[float], np.ndarray, np.ndarray]:
  """(seconds of each run, `[Q, G]` scores, `[Q, k]` rows) of the official path: scores, then
  a full argsort per query. Run `--repeats` times where the first run is shorter than
  `--long_search_s`, as ours."""
  name, params, config_model = model.name, model.params, model.config.model
  stored = official_rows(model, index)
  times = []
  while len(times) < (1 if times and times[0] > _LONG_SEARCH.value else _REPEATS.value):
    start = time.perf_counter()
    scores = official.official_scores(name, params, stored, encoded, config_model,
                                      torch_threads=usable_cores())
    rows = official.official_top_k(scores, k)
    times.append(time.perf_counter() - start)
  return times, scores, rows


def official_skip(official: Any, size: int, count: int, seconds_per_pair: float | None,
                  nbytes: int, budget: int) -> str | None:
  """Why the official path does not run at this point, or None (it runs)."""
  if size > _OFFICIAL_MAX.value:
    return f'above --official_max_videos={_OFFICIAL_MAX.value}'
  if official is None:
    return 'torch missing'
  if nbytes > budget:
    return f'its float32 gallery copies need {nbytes / 1e9:.1f} GB'
  if seconds_per_pair is not None and seconds_per_pair * size * count > _OFFICIAL_BOX.value:
    return (f'predicted {seconds_per_pair * size * count:.0f} s > --official_time_box='
            f'{_OFFICIAL_BOX.value:.0f} s')
  return None


@dataclasses.dataclass
class Model:
  """One model at its paper-size config with random parameters, its encoded base videos and
  its queries."""
  name: str
  config: ml_collections.ConfigDict
  spec: ModelSpec
  params: Any
  base: dict[str, np.ndarray]
  encode_seconds: float
  queries: dict[str, np.ndarray]
  flops_per_query_video: float
  stored_form: Any  # jitted `stored_form` of the model, or None

  def stored_rows(self, rows: Mapping[str, np.ndarray]) -> Any:
    """Base rows ('a/b' leaves) -> the stored pytree."""
    rows = unflatten_dict(dict(rows), sep='/')
    return rows if self.stored_form is None else jax.device_get(self.stored_form(self.params,
                                                                                 rows))

  @classmethod
  def build(cls, name: str) -> 'Model':
    config = load_config(name)
    spec = models.get_spec(config.model)
    rng = np.random.default_rng(_SEED.value)
    params = jax.jit(lambda key: spec.init_params(config.model, key))(
        jax.random.key(_SEED.value))
    base, seconds = encode_base(spec, config, params, _BASE_VIDEOS.value, rng)
    module = spec.build(config.model)
    stored_form = (jax.jit(lambda p, rows: module.apply({'params': p}, rows,
                                                        method='stored_form'))
                   if stored_from_training(module) else None)
    queries = random_queries(config.model, spec.inputs(config.model)[1], _QUERIES.value, rng)
    # Matching FLOPs are linear in the gallery (every size of the first full run: within 0.05%
    # of 1,000-video count scaled): counted once, not compiled again per size.
    flops = flops_per_query(spec, config.model, params, queries, FLOPS_VIDEOS) / FLOPS_VIDEOS
    return cls(name, config, spec, params, base, seconds, queries, flops, stored_form)

  @property
  def bytes_per_video(self) -> int:
    return self.spec.bytes_per_video(self.config.model)

  def summary(self) -> dict[str, Any]:
    return {'model': self.name, 'variant': VARIANTS.get(self.name, DEFAULT_VARIANT),
            'params': models.count_params(self.params),
            'bytes_per_video_float32': self.bytes_per_video,
            'encode_ms_per_video': 1e3 * self.encode_seconds,
            'chunk_videos': self.chunk_videos, 'points': []}

  @property
  def chunk_videos(self) -> int:
    return max(1, (_CHUNK_MB.value << 20) // self.bytes_per_video)


def new_point(model: Model, size: int, needed: Mapping[str, int]) -> dict[str, Any]:
  flops = model.flops_per_query_video * size
  return {'videos': size, 'queries': query_count(flops), 'flops_per_query': flops,
          'index_bytes_needed': dict(needed)}


def measure_point(model: Model, point: dict[str, Any], index: Index, official: Any,
                  floor: Mapping[str, float], budget: int, history: dict[str, Any]) -> None:
  """Every number of one model at one gallery size (`index`), into `point`.
  `history['official']`: the official path's seconds per (video, query) at the last size it
  ran, to predict this one."""
  size, count, dtype = point['videos'], point['queries'], index.dtype
  label = f'{model.name} {size:,}'
  point.update(dtype=dtype, bytes_per_video=index.manifest['bytes_per_video'])
  if dtype == 'float32' and point['bytes_per_video'] != model.bytes_per_video:
    raise AssertionError(f'{model.name}: the index stores {point["bytes_per_video"]} bytes per '
                         f'video, spec.bytes_per_video says {model.bytes_per_video}.')
  queries = {key: value[:count] for key, value in model.queries.items()}
  times, encode, found, searcher = time_ours(index, queries, _K.value, model.chunk_videos,
                                             budget)
  search_ms, encode_ms = (1e3 * float(np.median(t)) / count for t in (times, encode))
  point.update(resident=searcher.resident, ours_s=times, ours_ms_per_query=search_ms,
               query_encode_ms_per_query=encode_ms,
               ours_match_ms_per_query=search_ms - encode_ms)
  point.update(floors(point, floor))
  print(f'{label} ({dtype}, {count} queries): ours {search_ms:.3f} ms/query (query encoding '
        f'{encode_ms:.3f}), floor {point["floor_ms_per_query"]:.3f} '
        f'({point["ours_over_floor"]:.1f}x)', flush=True)
  # The official path always gets its own batch of queries (fewer would inflate its time per
  # query: it re-reads the gallery per batch); the lists are compared on the queries both ran.
  official_count = min(len(next(iter(model.queries.values()))), _OFFICIAL_QUERIES.value)
  both = min(count, official_count)
  encoded = searcher.encode_queries({k: v[:official_count] for k, v in model.queries.items()})
  del searcher  # and its resident gallery
  copies = 1 if dtype == 'float32' else 2  # (dequantized rows and) the torch tensors
  skip = official_skip(official, size, official_count, history.get('official'),
                       copies * size * model.bytes_per_video, budget)
  if skip:
    point['official_skipped'] = skip
    print(f'{label}: official path skipped ({skip})', flush=True)
  else:
    times, scores, rows = run_official(official, model, index, encoded, min(_K.value, size))
    seconds = float(np.median(times))
    history['official'] = seconds / size / official_count
    point.update(official_queries=official_count, official_s=times,
                 official_ms_per_query=1e3 * seconds / official_count)
    # Both sides without query encoding; `speedup_search` charges ours with it (a lower bound).
    point['speedup'] = point['official_ms_per_query'] / point['ours_match_ms_per_query']
    point['speedup_search'] = point['official_ms_per_query'] / point['ours_ms_per_query']
    point.update(agreement(found.rows[:both], found.scores[:both], rows[:both], scores[:both]))
    point['compared_queries'] = both
    print(f'{label}: official {point["official_ms_per_query"]:.3f} ms/query ({official_count} '
          f'queries), ours {point["speedup"]:.1f}x faster; top-10 equal '
          f'{point["top10_equal"]:.3f}, up to ties {point["equal_up_to_ties"]:.3f}', flush=True)


def measure_model(name: str, sizes: Sequence[int], official: Any, floor: Mapping[str, float],
                  index_dir: str, budget: int) -> dict[str, Any]:
  """Every number of one model (see the module docstring) at `sizes` (ascending).

  One index is written per storage dtype, at the largest size stored in it; the smaller
  sizes search prefixes of it (`Index.prefix`): row r of a gallery does not depend on the
  gallery's size, so a prefix is the gallery that size would have written."""
  start = time.perf_counter()
  model = Model.build(name)
  result = model.summary()
  history: dict[str, Any] = {}
  plan = [(size,) + choose_dtype(model.spec, model.config.model, size, budget)
          for size in sizes]
  for dtype, group in itertools.groupby(plan, key=lambda p: p[1]):
    group = list(group)
    points = [new_point(model, size, needed) for size, _, needed in group]
    result['points'] += points
    if dtype is None:
      for point in points:
        needed = point['index_bytes_needed']
        point['skipped'] = (f'needs {needed["float32"] / 1e9:.1f} GB in float32, '
                            f'{needed["int8"] / 1e9:.1f} GB in int8; the budget is '
                            f'{budget / 1e9:.1f} GB')
        print(f'{name} {point["videos"]:,}: skipped, {point["skipped"]}', flush=True)
      continue
    largest = group[-1][0]
    folder = os.path.join(index_dir, f'{name}_{largest}')
    write_start = time.perf_counter()
    index = write_index(folder, model, largest, dtype)
    points[-1]['index_write_s'] = time.perf_counter() - write_start
    for point in points:
      if point['videos'] < largest:
        point['prefix_of'] = largest
      measure_point(model, point, index if point['videos'] == largest else
                    index.prefix(point['videos']), official, floor, budget, history)
    del index
    shutil.rmtree(folder)
  result['wall_s'] = time.perf_counter() - start
  return result


def floors(point: Mapping[str, Any], floor: Mapping[str, float]) -> dict[str, Any]:
  """Floor per query (batched and unbatched) and our time over it."""
  index_bytes = point['videos'] * point['bytes_per_video']
  memory_ms = 1e3 * index_bytes / (floor['bandwidth_gbs'] * 1e9)
  compute_ms = 1e3 * point['flops_per_query'] / (floor['matmul_peak_gflops'] * 1e9)
  batched = max(memory_ms / point['queries'], compute_ms)
  return {'floor_ms_per_query': batched,
          'floor_bound': 'memory' if memory_ms / point['queries'] > compute_ms else 'compute',
          'unbatched_floor_ms_per_query': max(memory_ms, compute_ms),
          'ours_over_floor': point['ours_match_ms_per_query'] / batched}


# -------------------------------------------------------------------------------------- report

def markdown(report: Mapping[str, Any]) -> str:
  """The table of every measured point."""
  lines = ['| model | videos | index | bytes/video | GFLOP/query | queries | ours ms/query '
           '(query encoding) | official ms/query | speed-up | top-10 equal (up to ties) | '
           'floor ms/query | ours / floor |',
           '| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |']
  for model in report['models']:
    for p in model['points']:
      head = (f'| {model["model"]} | {p["videos"]:,} | '
              f'{p.get("dtype", "skipped: " + p.get("skipped", ""))} | '
              f'{p.get("bytes_per_video", 0):,} | {p["flops_per_query"] / 1e9:.3f} | '
              f'{p["queries"]} |')
      if 'skipped' in p:
        lines.append(head + ' | | | | | |')
        continue
      official = (f'{p["official_ms_per_query"]:.3f} | {p["speedup"]:.1f}x | '
                  f'{p["top10_equal"]:.3f} ({p["equal_up_to_ties"]:.3f})'
                  if 'official_ms_per_query' in p else '-- | -- | --')
      lines.append(f'{head} {p["ours_ms_per_query"]:.3f} ({p["query_encode_ms_per_query"]:.3f}) '
                   f'| {official} | {p["floor_ms_per_query"]:.3f} ({p["floor_bound"]}) | '
                   f'{p["ours_over_floor"]:.1f}x |')
  return '\n'.join(lines)


def default_output(info: Mapping[str, Any]) -> str:
  name = info['cpu'] if info['platform'] == 'cpu' else info['device']
  slug = ''.join(c if c.isalnum() else '_' for c in name.lower()).strip('_')
  return os.path.join(ROOT, 'benchmarks', 'results', f'retrieval_{slug}.json')


def main(argv):
  del argv
  start = time.perf_counter()
  names = _MODELS.value or models.names()
  sizes = sorted({int(s) for s in _SIZES.value} if _SIZES.value else (
      set(DEFAULT_SIZES) | ({LARGE_SIZE} if _LARGE.value else set())))
  info = machine()
  official = load_official() if _OFFICIAL_MAX.value > 0 else None
  index_dir = _INDEX_DIR.value or tempfile.mkdtemp(prefix='prvr_retrieval_')
  os.makedirs(index_dir, exist_ok=True)
  # Every Searcher compiles its own functions: a persistent cache lets searchers of equal
  # shapes share them (compilation is outside every timing anyway).
  jax.config.update('jax_compilation_cache_dir', os.path.join(index_dir, 'xla_cache'))
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  budget = index_budget(index_dir)
  floor = memory_bandwidth()
  floor = {'bandwidth_gbs': floor['gbs'], 'read_gbs': floor['read_gbs'],
           'copy_gbs': floor['copy_gbs'],
           'matmul_peak_gflops': matmul_peak_gflops(2048 if info['platform'] == 'cpu' else 8192)}
  print(f'{info["device"]} x{info["device_count"]} ({info["cpu"]}, {info["cpu_count"]} cores), '
        f'jax {info["jax"]}; bandwidth {floor["bandwidth_gbs"]:.1f} GB/s, float32 matmul peak '
        f'{floor["matmul_peak_gflops"]:.0f} GFLOP/s; index budget {budget / 1e9:.1f} GB',
        flush=True)
  report = {'machine': info, 'floor': floor, 'settings': {
      'queries': _QUERIES.value, 'min_queries': _MIN_QUERIES.value,
      'search_gflop': _SEARCH_GFLOP.value, 'long_search_s': _LONG_SEARCH.value,
      'official_queries': _OFFICIAL_QUERIES.value, 'k': _K.value, 'repeats': _REPEATS.value,
      'base_videos': _BASE_VIDEOS.value, 'perturbation': _PERTURBATION.value,
      'chunk_mb': _CHUNK_MB.value, 'index_budget_bytes': budget,
      'official_max_videos': _OFFICIAL_MAX.value, 'official_time_box_s': _OFFICIAL_BOX.value,
      'tie_tolerance': TIE_TOLERANCE}, 'models': []}
  try:
    for name in names:
      report['models'].append(measure_model(name, sizes, official, floor, index_dir, budget))
  finally:
    if not _INDEX_DIR.value:
      shutil.rmtree(index_dir, ignore_errors=True)
  report['wall_s'] = time.perf_counter() - start
  report['machine']['load_average_at_end'] = os.getloadavg()[0]
  print(markdown(report))
  output = _OUTPUT.value or default_output(info)
  os.makedirs(os.path.dirname(output), exist_ok=True)
  with open(output, 'w', encoding='utf-8') as f:
    json.dump(report, f, indent=1)
  print(f'{output} written; {report["wall_s"]:.0f} s in all')


if __name__ == '__main__':
  app.run(main)
