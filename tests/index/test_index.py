"""The retrieval index: exact search ranks every video as the evaluator does, whatever the shards,
chunks, query batches and device count; quantized storage stays within its rounding bounds; a
damaged, truncated or mismatching index is refused with a message naming the file."""

import json
import types
import pathlib

import jax
from jax.sharding import Mesh
import numpy as np
import pytest

from prvr_jax.eval import EvalSplit, Evaluator
from prvr_jax.index import IndexFormatError, IndexWriter, Searcher, build_index
from prvr_jax.index import evaluation_gallery, open_index
from prvr_jax.index import queries as queries_lib
from prvr_jax.index import store
from prvr_jax.models import registry
import support

NUM_VIDEOS, NUM_QUERIES = 13, 9


def _random_inputs(spec, config_model, count, inputs, rng):
  """Random values of the model's inputs `inputs` for `count` items (masks: random lengths)."""
  batch = spec.example_batch(config_model, num_videos=count)
  out = {}
  for key in inputs:
    if key == 'video_seed':
      continue
    x = batch[key]
    if key.endswith('mask'):
      lengths = rng.integers(1, x.shape[1] + 1, size=count)
      out[key] = (np.arange(x.shape[1])[None] < lengths[:, None]).astype(x.dtype)
    elif np.issubdtype(x.dtype, np.floating):
      out[key] = rng.normal(size=x.shape).astype(x.dtype)
    else:
      out[key] = x
  return out


def _setup(name, seed=0):
  """(config, params, split, queries, ground truth) of random inputs for model `name`."""
  config = support.load_config(name, 'tiny')
  config.eval.video_batch_size = 5
  config.eval.query_batch_size = 4
  spec = registry.get_spec(config.model)
  params = jax.jit(lambda key: spec.init_params(config.model, key))(jax.random.key(seed))
  rng = np.random.default_rng(seed)
  video_inputs, query_inputs = spec.inputs(config.model)
  videos = _random_inputs(spec, config.model, NUM_VIDEOS, video_inputs, rng)
  queries = _random_inputs(spec, config.model, NUM_QUERIES, query_inputs, rng)
  gt = rng.integers(0, NUM_VIDEOS, size=NUM_QUERIES)

  def video_batches():
    for start in range(0, NUM_VIDEOS, 5):
      keys = np.arange(start, min(start + 5, NUM_VIDEOS))
      yield {**{k: v[keys] for k, v in videos.items()}, 'video_index': keys}

  def query_batches():
    for start in range(0, NUM_QUERIES, 4):
      rows = np.arange(start, min(start + 4, NUM_QUERIES))
      yield {**{k: v[rows] for k, v in queries.items()}, 'query_index': rows,
             'query_video_index': gt[rows]}

  split = EvalSplit(video_batches, query_batches, [f'video {i}' for i in range(NUM_VIDEOS)],
                    [f'query {i}' for i in range(NUM_QUERIES)])
  return config, params, split, queries, gt


def _mesh():
  return Mesh(np.array(jax.devices()), ('data',))  # the 2 CPU devices of conftest, or the GPUs


def _gt_ranks(rows, gt):
  return np.array([list(row).index(g) + 1 for row, g in zip(rows, gt)])


# MS-SL: a mask leaf and a query-chunked scorer; ProtoPRVR: two query encodings; T-MASS: noise
# drawn per video from an integer seed leaf; Holmes: v2's stored form behind the mean-token GMM
# encoders. DreamPRVR (the same stored form, registers from a diffusion loop) compiles too long
# for the default run: with the end-to-end checks.
@pytest.mark.parametrize('name', [
    'ms_sl', 'protoprvr', 'tmass', 'holmes',
    pytest.param('dreamprvr', marks=pytest.mark.end_to_end)])
def test_search_ranks_as_the_evaluator(name, tmp_path):
  config, params, split, queries, gt = _setup(name)
  evaluator = Evaluator.from_config(config, _mesh())
  expected = evaluator.evaluate(params, split)
  # Rounding could reorder a near-tie on another CPU (scores O(1), float32 differences of
  # ~1e-6 between the two paths); these random scores have none.
  assert np.diff(np.sort(expected.scores, axis=1), axis=1).min() > 1e-5
  # 3 shards of 5, 5, 3 videos; chunks of 4 rows; query batches of 4.
  index = build_index(config, params, split, str(tmp_path / 'f32'), shard_videos=5)
  assert [len(s) for s in index.shards] == [5, 5, 3]
  assert index.manifest['bytes_per_video'] == registry.get_spec(config.model).bytes_per_video(
      config.model)
  searcher = Searcher(index, query_batch_size=4, chunk_videos=4, resident=False)
  result = searcher.search(queries, k=NUM_VIDEOS)
  np.testing.assert_array_equal(_gt_ranks(result.rows, gt), expected.ranks)
  support.assert_close(result.scores, np.take_along_axis(expected.scores, result.rows, 1),
                       rtol=1e-5)
  assert result.ids[0][0] == split.video_ids[result.rows[0, 0]]
  # evaluate.py --index: the evaluator on the index's stored videos gives the same metrics.
  from_index = evaluator.evaluate(params, split,
                                  gallery=evaluation_gallery(index, evaluator, split))
  np.testing.assert_array_equal(from_index.ranks, expected.ranks)


def test_quantization_bounds():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(6, 5, 64)).astype(np.float32) * rng.uniform(0.01, 100, size=(6, 5, 1))
  x[0, 0] = 0  # a padded (zero) vector
  parts = store.quantize(x, 'int8')
  back = np.asarray(store.dequantize(parts['values'], parts['scale'], 'int8'))
  # Rounding to the nearest of 255 levels: at most half a step of each vector's own scale.
  assert np.all(np.abs(back - x) <= 0.5 * parts['scale'][..., None] * (1 + 1e-6))
  assert np.all(back[0, 0] == 0)
  bf16 = np.asarray(store.dequantize(store.quantize(x, 'bfloat16')['values'], None, 'bfloat16'))
  support.assert_close(bf16, x, rtol=2.0 ** -8, scale=0)
  assert store.quantize(x, 'float32')['values'] is not None
  # Masks, per-vector norms (MS-SL's) and integers are stored exactly; vectors are quantized.
  assert store.exact_leaf('frame_mask', np.dtype(np.float32))
  assert store.exact_leaf('multiscale_inverse_norms', np.dtype(np.float32))
  assert store.exact_leaf('key', np.dtype(np.int32))
  assert not store.exact_leaf('frame_values', np.dtype(np.float32))


def _writer_index(path, config, params, stored, ids, pieces, shard_videos, dtype, durable=True):
  writer = IndexWriter(str(path), config.model, params, dtype=dtype, shard_videos=shard_videos,
                       durable=durable)
  start = 0
  for size in pieces:
    writer.add({k: v[start:start + size] for k, v in stored.items()}, ids[start:start + size])
    start += size
  return writer.close()


@pytest.fixture(scope='module')
def gmmformer_gallery():
  """GMMFormer (tiny): params, 17 random stored videos, 6 encoded queries."""
  config = support.load_config('gmmformer', 'tiny')
  spec = registry.get_spec(config.model)
  params = jax.jit(lambda key: spec.init_params(config.model, key))(jax.random.key(1))
  rng = np.random.default_rng(1)
  stored = {name: rng.normal(size=(17,) + s.shape).astype(s.dtype)
            for name, s in spec.stored_per_video(config.model).items()}
  queries = _random_inputs(spec, config.model, 6, spec.inputs(config.model)[1], rng)
  return config, params, stored, [f'v{i}' for i in range(17)], queries


@pytest.mark.parametrize('dtype', ['int8'])  # per-vector scales: the format's hardest case
def test_gallery_built_in_shards_equals_one_build(gmmformer_gallery, tmp_path, dtype):
  config, params, stored, ids, queries = gmmformer_gallery
  whole = _writer_index(tmp_path / 'whole', config, params, stored, ids, [17], 100, dtype)
  # A scratch index (no fsync) holds the same bytes and checksums.
  pieces = _writer_index(tmp_path / 'pieces', config, params, stored, ids, [2, 7, 1, 7], 3,
                         dtype, durable=False)
  assert len(pieces.shards) == 6 and whole.ids == pieces.ids
  store.open_index(pieces.path, verify=True)
  for leaf in whole.leaves:
    for part in whole.shards[0].arrays[leaf]:
      np.testing.assert_array_equal(
          whole.shards[0].arrays[leaf][part],
          np.concatenate([s.arrays[leaf][part] for s in pieces.shards]))
  a = Searcher(whole, chunk_videos=3).search(queries, k=17)
  b = Searcher(pieces, chunk_videos=3).search(queries, k=17)
  np.testing.assert_array_equal(a.rows, b.rows)
  np.testing.assert_array_equal(a.scores, b.scores)


def test_prefix_view_searches_as_an_index_of_the_first_rows(gmmformer_gallery, tmp_path):
  config, params, stored, ids, queries = gmmformer_gallery
  whole = _writer_index(tmp_path / 'whole', config, params, stored, ids, [17], 5, 'int8')
  first = _writer_index(tmp_path / 'first', config, params, {k: v[:12] for k, v in
                                                             stored.items()},
                        ids[:12], [12], 5, 'int8')
  view = whole.prefix(12)  # ends inside the third of four shards
  assert view.ids == first.ids and [len(s) for s in view.shards] == [5, 5, 2]
  searcher = Searcher(view, chunk_videos=4)
  searcher.load()
  assert len(searcher._resident_chunks) == 5  # chunks of 4 within shards of 5, 5, 2
  a, b = searcher.search(queries, k=12), Searcher(first, chunk_videos=4).search(queries, k=12)
  np.testing.assert_array_equal(a.rows, b.rows)
  np.testing.assert_array_equal(a.scores, b.scores)
  with pytest.raises(ValueError, match='no prefix of 18'):
    whole.prefix(18)


def test_two_devices_equal_one(gmmformer_gallery, tmp_path):
  config, params, stored, ids, queries = gmmformer_gallery
  index = _writer_index(tmp_path / 'index', config, params, stored, ids, [17], 8, 'float32')
  one, two = (Searcher(index, support.data_mesh(n), query_batch_size=4,
                       chunk_videos=6).search(queries, k=17) for n in (1, 2))
  np.testing.assert_array_equal(two.rows, one.rows)
  support.assert_close(two.scores, one.scores, rtol=1e-5)


def test_damaged_or_mismatching_indexes_are_refused(gmmformer_gallery, tmp_path):
  config, params, stored, ids, _ = gmmformer_gallery
  index = _writer_index(tmp_path / 'index', config, params, stored, ids, [17], 10, 'int8')
  shard = pathlib.Path(index.path) / 'shards' / '00001'
  clips = shard / 'clips.npy'
  data = bytearray(clips.read_bytes())
  # A byte flipped in place: the size still matches, the checksum does not.
  data[-1] ^= 0xFF
  clips.write_bytes(bytes(data))
  with pytest.raises(IndexFormatError, match=r'00001/clips\.npy does not match the checksum'):
    open_index(index.path)  # every open: a changed mtime means a full check
  with pytest.raises(IndexFormatError, match=r'00001/clips\.npy does not match the checksum'):
    open_index(index.path, verify=True)
  clips.write_bytes(bytes(data[:-10]))
  with pytest.raises(IndexFormatError, match=r'00001/clips\.npy holds .* truncated'):
    open_index(index.path)
  other = support.load_config('gmmformer_v2', 'tiny')
  index = _writer_index(tmp_path / 'ok', config, params, stored, ids, [17], 10, 'float32')
  with pytest.raises(IndexFormatError, match=r"built by model 'gmmformer'.*describes model "
                                             r"'gmmformer_v2'"):
    open_index(index.path, other)
  changed = support.load_config('gmmformer', 'tiny')
  changed.model.hidden_dim += 16
  with pytest.raises(IndexFormatError, match='model config hash'):
    index.check_config(changed)
  params_file = pathlib.Path(index.path) / 'params.npz'
  damaged = bytearray(params_file.read_bytes())
  damaged[len(damaged) // 2] ^= 0xFF
  params_file.write_bytes(bytes(damaged))
  with pytest.raises(IndexFormatError, match=r'params\.npz does not match its checksum'):
    index.params()
  manifest = pathlib.Path(index.path) / 'index.json'
  manifest.write_text('{"format": "prvr_jax.index", "format_version": 1')
  with pytest.raises(IndexFormatError, match=r'index\.json is not valid JSON'):
    open_index(index.path)
  manifest.unlink()
  with pytest.raises(IndexFormatError, match='holds no index.json'):
    open_index(index.path)
  with pytest.raises(ValueError, match="'v3' is added to the index twice"):
    writer = IndexWriter(str(tmp_path / 'dup'), config.model, params)
    writer.add({k: v[:4] for k, v in stored.items()}, ['v0', 'v1', 'v2', 'v3'])
    writer.add({k: v[4:5] for k, v in stored.items()}, ['v3'])
  with pytest.raises(ValueError, match='is not empty'):
    IndexWriter(str(tmp_path / 'ok'), config.model, params)


def test_cli_build_search_and_evaluate(reference_run, config_path, tiny_data, xla_cache,
                                       tmp_path):
  """`prvr-index build / search` and `evaluate.py --index` on a trained tiny run:
  the index evaluation equals the run's own test evaluation of the same (best) checkpoint, the
  CLI search the Python API's."""
  config = support.load_config(config_path)
  config.data.dir = tiny_data
  index_dir = tmp_path / 'index'
  support.run_cli('prvr_jax/tools/index.py', 'build', f'--config={config_path}',
                  f'--config.data.dir={tiny_data}', f'--checkpoint={reference_run}',
                  f'--out={index_dir}', cache_dir=xla_cache)
  support.run_cli('evaluate.py', f'--config={config_path}', f'--config.data.dir={tiny_data}',
                  f'--index={index_dir}', f'--output_dir={tmp_path / "from_index"}',
                  cache_dir=xla_cache)
  expected = json.loads((reference_run / 'test_metrics.json').read_text())
  metrics = json.loads((tmp_path / 'from_index' / 'metrics.json').read_text())
  for key in ('r1', 'r5', 'r10', 'r100', 'sumr', 'medr', 'v2t_sumr'):
    assert metrics[key] == expected[key], key
  assert metrics['checkpoint_source'] == 'index'
  # metrics.json names the index and what produced it.
  manifest = json.loads((index_dir / 'index.json').read_text())
  assert metrics['index']['index'] == str(index_dir)
  assert metrics['index']['index_id'] == manifest['id']
  assert metrics['index']['step'] == manifest['info']['step'] is not None
  assert metrics['index']['params_fingerprint'] == manifest['params_fingerprint']
  assert metrics['index']['verified'] == 'full'

  index = open_index(str(index_dir), config, verify=True)
  spec = registry.get_spec(config.model)
  queries = _random_inputs(spec, config.model, 5, spec.inputs(config.model)[1],
                           np.random.default_rng(2))
  import h5py  # pylint: disable=g-import-not-at-top
  with h5py.File(tmp_path / 'queries.h5', 'w') as f:
    for i, (feats, mask) in enumerate(zip(queries['query_feats'], queries['query_mask'])):
      f[f'q{i}'] = feats[:int(mask.sum())]
  support.run_cli('prvr_jax/tools/index.py', 'search', f'--index={index_dir}',
                  f'--queries={tmp_path / "queries.h5"}', '--k=4',
                  f'--output={tmp_path / "out.jsonl"}', cache_dir=xla_cache)
  lines = support.read_jsonl(tmp_path / 'out.jsonl')
  result = Searcher(index).search(queries, k=4)
  assert [line['query'] for line in lines] == [f'q{i}' for i in range(5)]
  assert [line['videos'] for line in lines] == result.ids
  assert {line['index'] for line in lines} == {index.id}
  support.assert_close([line['scores'] for line in lines], result.scores, rtol=1e-5)
  with pytest.raises(ValueError, match='expected an .npz, .h5/.hdf5 or .txt file'):
    queries_lib.read_queries(str(tmp_path / 'out.jsonl'), ('query_feats', 'query_mask'),
                             config.model)


def test_hdf5_queries_are_read_one_range_at_a_time(tmp_path):
  import h5py  # pylint: disable=g-import-not-at-top
  config_model = types.SimpleNamespace(name='m', max_query_len=3, query_dim=4)
  rng = np.random.default_rng(0)
  tokens = {'a': rng.normal(size=(5, 4)), 'b': rng.normal(size=(2, 4)), 'c': rng.normal(size=4)}
  path = tmp_path / 'queries.h5'
  with h5py.File(path, 'w') as f:
    for name, value in tokens.items():
      f[name] = value.astype(np.float32)
    f['d'] = np.full((2, 4), np.nan, np.float32)
  queries, ids = queries_lib.read_queries(str(path), ('query_feats', 'query_mask'),
                                          config_model)
  assert ids == ['a', 'b', 'c', 'd'] and len(queries['query_feats']) == 4
  feats, mask = queries['query_feats'][0:3], queries['query_mask'][0:3]
  assert feats.shape == (3, 3, 4)
  np.testing.assert_array_equal(feats[0], tokens['a'][:3].astype(np.float32))  # truncated
  np.testing.assert_array_equal(feats[1, :2], tokens['b'].astype(np.float32))
  np.testing.assert_array_equal(feats[2, 0], tokens['c'].astype(np.float32))  # one sentence
  assert not feats[1, 2:].any() and not feats[2, 1:].any()
  np.testing.assert_array_equal(mask, [[1, 1, 1], [1, 1, 0], [1, 0, 0]])
  with pytest.raises(ValueError, match=r"query 'd' holds NaN"):
    queries['query_feats'][2:4]  # values are checked when read
  with h5py.File(path, 'a') as f:
    f['e'] = np.zeros((2, 5), np.float32)
  with pytest.raises(ValueError, match=r"query 'e' has shape \(2, 5\); the model reads "
                     r'\[tokens, 4\]'):  # shapes when the file is opened
    queries_lib.read_queries(str(path), ('query_feats', 'query_mask'), config_model)
