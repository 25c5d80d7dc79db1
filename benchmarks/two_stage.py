r"""Two-stage search (faiss candidates, then exact rescoring) against exact search, side by side.

  python benchmarks/two_stage.py --dir=/scratch/two_stage   # 100k videos: 1.5 GB on disk
  python benchmarks/two_stage.py --dir=/scratch/two_stage --videos=1000000 \
      --settings=128:200:8,256:200:0,256:200:8,512:500:8,1024:500:8,256:1000:0
      # 1M: 15 GB on disk

Run from the repository root (the default --config is a path). Results: docs/two_stage.md.

Model: GMMFormer at its paper size (`configs/gmmformer.py:tvr`: 32 clip vectors and 1 video
vector of width 384 per video, score = 0.7 max-clip cosine + 0.3 video cosine) with random
parameters; its `score` reads no parameters, so they do not affect the results.

Gallery (synthesized directly as the stored representation, no video encoder), written with
`IndexWriter` in int8, `--shard_videos` per shard (the writer holds a shard as float32: 1.2 GB
at 25k videos, plus quantization temporaries). `videos / 50` topic centres are random
unit vectors. Each video is cut into 1-4 segments of consecutive clips; a segment's direction
is `unit(w c_a + (1 - w) c_b + n)`, a mix of two random topics (w ~ U(0.5, 1)) plus noise of
norm ~1; each clip is its segment's direction plus noise of norm ~0.6, times a random norm in
[0.5, 2] (cosines ignore it; the int8 scales do not); the video vector is the mean of its
clips plus noise of norm ~0.3. Nearest neighbours are therefore meaningful (videos sharing a
topic), and the topic mixtures spread the neighbourhoods over several k-means lists.

Queries: noisy copies `unit(unit(clip) + n)`, noise of norm ~0.8, of random stored clips of
random videos. They stand for the model's query encodings: `VectorSearcher` is a `Searcher`
whose `_query_batches` takes these `[Q, 384]` vectors instead of running `encode_queries` on
token features; exact search, the candidate index and the rescoring all see the same vectors
and score them with the model's own `score`.

Exact search: `Searcher.search` at `query_batch_size = --queries`, i.e. one pass over the gallery
for all queries (its time per query falls as more queries share a pass); timed after a warm-up
pass when the gallery is kept in device memory (100k: the first pass copies it there; 1M is
read from the shards' memory maps at every pass, and its one timed pass includes compiling the
scorer: seconds of minutes). Two-stage: `Searcher.search_two_stage` with a `CandidateIndex` of
kind 'ivf' built with its defaults, searched at each `--settings` row's nprobe, refine and
number of candidates, top-100; timed after a warm-up call per row. recall@K = |two-stage
top-K & exact top-K| / K, averaged over the queries. The load average is printed: the machine
may be shared.
"""

import os
import shutil
import subprocess
import tempfile
import time
from typing import Any

from absl import app
from absl import flags
import jax
import ml_collections
from ml_collections import config_flags
import numpy as np

from prvr_jax import parallel
from prvr_jax.index import Index, IndexWriter, Searcher
from prvr_jax.index.candidates import CandidateIndex, dequantize_host
from prvr_jax.models import registry

_VIDEOS = flags.DEFINE_integer('videos', 100_000, 'Videos in the synthetic gallery.')
_QUERIES = flags.DEFINE_integer('queries', 256, 'Queries (one exact-search pass).')
_DIR = flags.DEFINE_string('dir', None, 'Folder for the index (default: a new temporary '
                           'folder); removed at the end unless --keep.')
_KEEP = flags.DEFINE_bool('keep', False, 'Keep the index folder.')
_SHARD_VIDEOS = flags.DEFINE_integer('shard_videos', 25_000, 'Videos per index shard.')
_SETTINGS = flags.DEFINE_list(
    'settings', ['64:200:8', '128:200:0', '128:200:8', '256:500:8', '512:500:8',
                 '128:1000:0'],
    'Two-stage settings, one table row each: nprobe:candidates:refine.')
_RESCORE_BATCH = flags.DEFINE_integer(
    'rescore_batch', 1, 'Queries rescored together by search_two_stage (docs/two_stage.md '
    'compares batch sizes).')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the gallery and the queries.')
_CONFIG = config_flags.DEFINE_config_file(
    'config', 'configs/gmmformer.py:tvr', 'The model (GMMFormer at the paper size; the '
    'synthetic gallery fills its `clips` and `video` leaves).')

K = (10, 100)
GENERATE_VIDEOS = 5000  # videos synthesized per IndexWriter.add


class VectorSearcher(Searcher):
  """A `Searcher` whose queries are given encoded: {'vectors': `[Q, D]`} (see the docstring)."""

  def _query_batches(self, queries: dict[str, np.ndarray]) -> list[tuple[Any, int]]:
    vectors = np.asarray(queries['vectors'], np.float32)
    size = self.query_batch_size
    return [(parallel.replicate(parallel.pad_rows(vectors[s:s + size], size), self.mesh),
             min(size, len(vectors) - s)) for s in range(0, len(vectors), size)]


def unit(x: np.ndarray) -> np.ndarray:
  return x / np.sqrt(np.einsum('...d,...d->...', x, x))[..., None]


def uniform_noise(rng: np.random.Generator, shape: tuple[int, ...], norm: float) -> np.ndarray:
  """Zero-mean uniform noise whose vectors (last axis) have about the given norm."""
  x = rng.random(shape, dtype=np.float32) - np.float32(0.5)
  x *= np.float32(norm * np.sqrt(12.0 / shape[-1]))
  return x


def synthetic_videos(centres: np.ndarray, first: int, count: int, num_clips: int,
                     seed: int) -> dict[str, np.ndarray]:
  """Videos `first .. first + count` of the gallery: {'clips' `[B, L, D]`, 'video' `[B, D]`}."""
  rng = np.random.default_rng([seed, first])
  dim = centres.shape[1]
  segments = rng.integers(1, 5, count)
  cuts = np.sort(rng.integers(1, num_clips, (count, 3)), axis=1)
  cuts[np.arange(3)[None] >= segments[:, None] - 1] = num_clips
  segment_of_clip = (np.arange(num_clips)[None, None] >= cuts[:, :, None]).sum(1)
  a, b = rng.integers(0, len(centres), (2, count, 4))
  w = rng.uniform(0.5, 1.0, (count, 4, 1)).astype(np.float32)
  directions = unit(w * centres[a] + (1 - w) * centres[b]
                    + uniform_noise(rng, (count, 4, dim), 1.0))
  clips = directions[np.arange(count)[:, None], segment_of_clip]
  clips += uniform_noise(rng, clips.shape, 0.6)
  video = unit(clips.mean(axis=1)) + uniform_noise(rng, (count, dim), 0.3)
  clips *= rng.uniform(0.5, 2.0, (count, num_clips, 1)).astype(np.float32)
  return {'clips': clips, 'video': video}


def write_gallery(path: str, config_model: ml_collections.ConfigDict, params: Any) -> Index:
  """The synthetic gallery as an int8 index at `path`."""
  num_videos, dim = _VIDEOS.value, config_model.hidden_dim
  centres = unit(np.random.default_rng(_SEED.value).standard_normal(
      (max(num_videos // 50, 1), dim), dtype=np.float32))
  writer = IndexWriter(path, config_model, params, dtype='int8',
                       shard_videos=_SHARD_VIDEOS.value)
  for first in range(0, num_videos, GENERATE_VIDEOS):
    count = min(GENERATE_VIDEOS, num_videos - first)
    writer.add(synthetic_videos(centres, first, count, config_model.num_clips, _SEED.value),
               [f'video{i:07d}' for i in range(first, first + count)])
  return writer.close()


def synthetic_queries(index: Index, count: int) -> tuple[np.ndarray, np.ndarray]:
  """`[Q, D]` noisy copies of random stored clips (dequantized), and their videos `[Q]`."""
  rng = np.random.default_rng([_SEED.value, 1])
  rows = rng.integers(0, len(index), count)
  clip = rng.integers(0, index.config_model.num_clips, count)
  starts = np.array([first for first, _ in index.rows()])
  vectors = []
  for row, c in zip(rows, clip):
    s = np.searchsorted(starts, row, side='right') - 1
    parts = index.shards[s].arrays['clips']
    r = row - starts[s]
    vectors.append(dequantize_host(parts['values'][r, c], parts['scale'][r, c], 'int8'))
  vectors = unit(np.stack(vectors))
  return unit(vectors + uniform_noise(rng, vectors.shape, 0.8)), rows


def recall(found: np.ndarray, exact: np.ndarray, k: int) -> float:
  return float(np.mean([len(np.intersect1d(f[:k], e[:k])) / k for f, e in zip(found, exact)]))


def timed(fn, *args, **kwargs):
  start = time.perf_counter()
  out = fn(*args, **kwargs)
  return out, time.perf_counter() - start


def cpu_model() -> str:
  try:
    lines = subprocess.run(['lscpu'], capture_output=True, text=True, check=True).stdout
  except (OSError, subprocess.CalledProcessError):
    return 'unknown CPU'
  names = [l.split(':', 1)[1].strip() for l in lines.splitlines() if l.startswith('Model name')]
  return f'{names[0] if names else "unknown CPU"}, {os.cpu_count()} CPUs visible'


def check_disk(path: str, needed: int) -> None:
  free = shutil.disk_usage(path).free
  if free < needed:
    raise SystemExit(f'--dir={path}: {free / 2**30:.1f} GiB free, the index needs about '
                     f'{needed / 2**30:.1f} GiB. Choose another --dir or fewer --videos.')


def main(argv):
  del argv
  config = _CONFIG.value
  spec = registry.get_spec(config.model)
  params = spec.init_params(config.model, jax.random.key(0))
  root = _DIR.value or tempfile.mkdtemp(prefix='two_stage_')
  os.makedirs(root, exist_ok=True)
  path = os.path.join(root, f'index_{_VIDEOS.value}')
  # int8 rows + scales, and ~60 bytes per element vector for the candidate index.
  per_video = 33 * (config.model.hidden_dim + 4) + 32 * 60
  check_disk(root, int(1.1 * _VIDEOS.value * per_video))
  print(f'CPU: {cpu_model()}; jax {jax.__version__} on {jax.devices()[0].device_kind}; '
        f'load average {os.getloadavg()[0]:.1f}')
  try:
    index, write_s = timed(write_gallery, path, config.model, params)
    gallery_gb = index.manifest['bytes_per_video'] * len(index) / 1e9
    print(f'gallery: {len(index)} videos, int8, {gallery_gb:.2f} GB, written in {write_s:.0f} s')
    queries, sources = synthetic_queries(index, _QUERIES.value)
    searcher = VectorSearcher(index, query_batch_size=_QUERIES.value)
    inputs = {'vectors': queries}
    warm = ''
    if searcher.resident:  # the first pass also copies the gallery to the device
      warm = f'; warm-up pass {timed(searcher.search, inputs, k=max(K))[1]:.1f} s'
    exact, exact_s = timed(searcher.search, inputs, k=max(K))
    exact_ms = 1000 * exact_s / len(queries)
    top1 = np.mean(exact.rows[:, 0] == sources)
    top10 = np.mean((exact.rows[:, :10] == sources[:, None]).any(1))
    print(f'exact: {exact_ms:.2f} ms/query ({len(queries)} queries in one pass of '
          f'{exact_s:.1f} s{warm}, resident={searcher.resident}); '
          f'source video at rank 1 for {top1:.0%}, in the top 10 for {top10:.0%}')

    candidates = CandidateIndex.build(index, 'ivf')
    candidates.save(os.path.join(path, 'candidates'))
    faiss_mb = os.path.getsize(os.path.join(path, 'candidates', 'candidates.faiss')) / 1e6
    print(f'candidate index: ivf {candidates.options}, {candidates.num_elements} vectors, '
          f'{faiss_mb:.0f} MB, built in {candidates.build_seconds:.0f} s')

    print('\n| nprobe | refine | candidates | recall@10 | recall@100 | first stage ms/q | '
          'two-stage ms/q | exact ms/q | speed-up |\n|---|---|---|---|---|---|---|---|---|')
    rescore = {'k': max(K), 'rescore_batch': _RESCORE_BATCH.value}
    for setting in _SETTINGS.value:
      candidates.nprobe, count, candidates.refine = map(int, setting.split(':'))
      searcher.search_two_stage({'vectors': queries[:8]}, candidates, count, **rescore)
      _, first_s = timed(candidates.search, queries, count)
      two, two_s = timed(searcher.search_two_stage, inputs, candidates, count, **rescore)
      two_ms = 1000 * two_s / len(queries)
      print(f'| {candidates.nprobe} | {candidates.refine} | {count} | '
            f'{recall(two.rows, exact.rows, 10):.3f} | {recall(two.rows, exact.rows, 100):.3f} '
            f'| {1000 * first_s / len(queries):.2f} | {two_ms:.2f} | {exact_ms:.2f} | '
            f'{exact_ms / two_ms:.1f}x |', flush=True)
    print(f'load average {os.getloadavg()[0]:.1f}')
  finally:
    if not _KEEP.value:
      shutil.rmtree(path, ignore_errors=True)
      if not _DIR.value:
        os.rmdir(root)


if __name__ == '__main__':
  app.run(main)
