"""The candidate index of two-stage search (prvr_jax.index.candidates) on tiny GMMFormer indexes.

Indexes are written with `IndexWriter` from random stored arrays (no video encoder), so each
test builds its gallery in milliseconds; only the two-stage test compiles the model's scorer.
"""

import jax
import numpy as np
import pytest

from prvr_jax.index import store
from prvr_jax.index.candidates import CandidateIndex
from prvr_jax.index.search import Searcher
from prvr_jax.models import registry
import support

pytest.importorskip('faiss')

VIDEOS = 60


@pytest.fixture(scope='module')
def model():
  """(config, params) of the tiny GMMFormer: clips [32, 32] and video [32] per video."""
  config = support.load_config('gmmformer', 'tiny')
  spec = registry.get_spec(config.model)
  return config, jax.jit(lambda key: spec.init_params(config.model, key))(jax.random.key(0))


def write_index(path, model, seed=0, dtype='float32', same_clips=False, empty_video=None):
  """A random gallery of `VIDEOS` videos in shards of 25, 25 and 10; some clips are zero
  padding. `same_clips`: a video's clips are near-copies of one vector (its 32 element hits
  come together); `empty_video`: a row whose clips are all padding."""
  config, params = model
  rng = np.random.default_rng(seed)
  size, dim = config.model.num_clips, config.model.hidden_dim
  if same_clips:
    clips = rng.normal(size=(VIDEOS, 1, dim)) + 0.01 * rng.normal(size=(VIDEOS, size, dim))
  else:
    clips = rng.normal(size=(VIDEOS, size, dim))
  clips[::3, -7:] = 0.0
  if empty_video is not None:
    clips[empty_video] = 0.0
  stored = {'clips': clips.astype(np.float32),
            'video': rng.normal(size=(VIDEOS, dim)).astype(np.float32)}
  writer = store.IndexWriter(str(path), config.model, params, dtype=dtype, shard_videos=25)
  half = VIDEOS // 2
  writer.add({k: v[:half] for k, v in stored.items()}, [f'v{i}' for i in range(half)])
  writer.add({k: v[half:] for k, v in stored.items()}, [f'v{i}' for i in range(half, VIDEOS)])
  return writer.close()


def exact_max_cosine(index, queries):
  """`[Q, VIDEOS]` max cosine over each video's non-zero clips (-inf without any), from the
  stored arrays dequantized by `store.dequantize`."""
  parts = [shard.arrays['clips'] for shard in index.shards]
  clips = np.concatenate([np.asarray(store.dequantize(
      np.asarray(p['values']), np.asarray(p['scale']) if 'scale' in p else None, index.dtype))
      for p in parts]).astype(np.float64)
  norms = np.linalg.norm(clips, axis=-1)
  unit = clips / np.where(norms > 0, norms, 1.0)[..., None]
  q = queries / np.linalg.norm(queries, axis=-1, keepdims=True)
  cosines = np.einsum('qd,bld->qbl', q, unit)
  return np.max(np.where(norms[None] > 0, cosines, -np.inf), axis=-1)


def queries_of(model, count, seed=1):
  config, _ = model
  return np.random.default_rng(seed).normal(
      size=(count, config.model.hidden_dim)).astype(np.float32)


@pytest.mark.parametrize('dtype', ['float32', 'bfloat16', 'int8'])
def test_flat_candidates_are_the_exact_max_over_set_top(tmp_path, model, dtype):
  index = write_index(tmp_path / 'index', model, dtype=dtype, empty_video=4)
  candidates = CandidateIndex.build(index, 'flat', chunk_videos=7)
  assert candidates.num_elements == np.count_nonzero(
      np.concatenate([np.asarray(s.arrays['clips']['values']) for s in index.shards]).any(-1))
  queries = queries_of(model, 5)
  reference = exact_max_cosine(index, queries)
  for count in (1, 10, VIDEOS - 1):
    rows = candidates.search(queries, count)
    assert rows.shape == (5, count) and rows.dtype == np.int64
    assert (rows >= 0).all() and all(len(set(r)) == count for r in rows)
    best = -np.sort(-reference, axis=1)[:, :count]
    support.assert_close(np.take_along_axis(reference, rows, 1), best,
                         support.f32_rtol(model[0].model.hidden_dim, ops=2))
  # More candidates than videos with vectors: every such video, then -1.
  rows = candidates.search(queries, VIDEOS + 3)
  assert (rows[:, VIDEOS - 1:] == -1).all()
  assert all(set(r[:VIDEOS - 1]) == set(range(VIDEOS)) - {4} for r in rows)


@pytest.mark.parametrize('kind,options', [
    ('flat', {}), ('ivf', {'nlist': 4, 'nprobe': 1, 'm': 8, 'refine': 0}),
    ('ivf', {'nlist': 4, 'nprobe': 1, 'm': 8})])
def test_deeper_search_finds_distinct_videos(tmp_path, model, kind, options):
  # Each video's clips hit together, so the first element hits hold few videos; an IVF
  # scanning 1 of 4 lists sees about a quarter of them.
  index = write_index(tmp_path / 'index', model, same_clips=True)
  candidates = CandidateIndex.build(index, kind, **options)
  if kind == 'ivf':
    assert candidates.options == {'refine': 8, **options, 'train_size': 256, 'seed': 0}
  queries = queries_of(model, 3)
  for count in (20, VIDEOS):
    rows = candidates.search(queries, count)
    assert (rows >= 0).all() and all(len(set(r)) == count for r in rows)
  if kind == 'flat':
    reference = exact_max_cosine(index, queries)
    support.assert_close(np.take_along_axis(reference, rows[:, :20], 1),
                         -np.sort(-reference, axis=1)[:, :20],
                         support.f32_rtol(model[0].model.hidden_dim, ops=2))


def test_ivf_refined_over_every_element_is_exact(tmp_path, model):
  # refine * C hits >= every element: the exact re-ranking from the stored int8 vectors
  # decides alone.
  index = write_index(tmp_path / 'index', model, dtype='int8')
  candidates = CandidateIndex.build(index, 'ivf', nlist=4, nprobe=4, m=8, refine=200)
  queries = queries_of(model, 4)
  rows = candidates.search(queries, 10)
  reference = exact_max_cosine(index, queries)
  support.assert_close(np.take_along_axis(reference, rows, 1),
                       -np.sort(-reference, axis=1)[:, :10],
                       support.f32_rtol(model[0].model.hidden_dim, ops=2))


def test_saved_candidates_load_only_for_their_index(tmp_path, model):
  index = write_index(tmp_path / 'a', model, dtype='int8')
  other = write_index(tmp_path / 'b', model, seed=5, dtype='int8')
  candidates = CandidateIndex.build(index, 'flat')
  candidates.save(str(tmp_path / 'a' / 'candidates'))
  loaded = CandidateIndex.load(str(tmp_path / 'a' / 'candidates'), index)
  queries = queries_of(model, 4)
  np.testing.assert_array_equal(loaded.search(queries, 12), candidates.search(queries, 12))
  assert (loaded.kind, loaded.num_elements) == ('flat', candidates.num_elements)
  with pytest.raises(store.IndexFormatError, match=r'a/candidates/candidates\.json was built '
                     r'for the index .*/a .*not for .*/b .*Rebuild'):
    CandidateIndex.load(str(tmp_path / 'a' / 'candidates'), other)
  with pytest.raises(FileNotFoundError, match=r'b/candidates/candidates\.json does not exist'):
    CandidateIndex.load(str(tmp_path / 'b' / 'candidates'), other)


def test_unknown_kind_or_option_is_refused(tmp_path, model):
  index = write_index(tmp_path / 'index', model)
  with pytest.raises(ValueError, match="kind 'hnsw'"):
    CandidateIndex.build(index, 'hnsw')
  with pytest.raises(ValueError, match=r"'ivf' takes options .*got \['nprobes'\]"):
    CandidateIndex.build(index, 'ivf', nprobes=3)


def test_two_stage_over_the_whole_gallery_is_exact_search(tmp_path, model):
  config, _ = model
  index = write_index(tmp_path / 'index', model, dtype='int8')
  searcher = Searcher(index, query_batch_size=8, chunk_videos=16)
  rng = np.random.default_rng(2)
  lq, dq = config.model.max_query_len, config.model.query_dim
  queries = {'query_feats': rng.normal(size=(6, lq, dq)).astype(np.float32),
             'query_mask': (np.arange(lq)[None] < rng.integers(3, lq, (6, 1))).astype(
                 np.float32)}
  exact = searcher.search(queries, k=15)
  for candidates in (CandidateIndex.build(index, 'flat'),
                     CandidateIndex.build(index, 'ivf', nlist=4, nprobe=1, m=8)):
    two_stage = searcher.search_two_stage(queries, candidates, num_candidates=VIDEOS, k=15)
    # Random scores have no near-ties: the same rows, and the same scores up to rounding.
    np.testing.assert_array_equal(two_stage.rows, exact.rows)
    support.assert_close(two_stage.scores, exact.scores,
                         support.f32_rtol(config.model.hidden_dim, ops=2))
    assert two_stage.ids == exact.ids
