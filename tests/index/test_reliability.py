"""Issue 51 for the index: damaged or stale index files are never used silently, every index
names what produced it, non-finite or malformed queries and videos never reach a ranking, and
`--overwrite` deletes only an index of ours. Each refusal's message names the file, id or key."""

import json
import os
import pathlib
import types

import h5py
import jax
import numpy as np
import pytest

from prvr_jax import checkpoint
from prvr_jax.index import IndexFormatError, IndexWriter, open_index
from prvr_jax.index import build
from prvr_jax.index import queries as queries_lib
from prvr_jax.index import store
import support
from test_index import _writer_index, gmmformer_gallery  # pylint: disable=unused-import


def _index(gallery, path, dtype='int8', info=None, overwrite=False):
  config, params, stored, ids, _ = gallery
  writer = IndexWriter(str(path), config.model, params, dtype=dtype, shard_videos=10, info=info,
                       overwrite=overwrite)
  writer.add(stored, ids)
  return writer.close()


def _flip(path: pathlib.Path, offset: int, keep_mtime: bool) -> None:
  stat = path.stat()
  data = bytearray(path.read_bytes())
  data[offset] ^= 0x01
  path.write_bytes(bytes(data))
  if keep_mtime:  # bit rot: the content changes, the mtime does not
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


# ------------------------------------------------------------------ 1. corrupt or stale data


def test_every_open_checks_the_shards(gmmformer_gallery, tmp_path):
  index = _index(gmmformer_gallery, tmp_path / 'index')
  video = pathlib.Path(index.path) / 'shards' / '00000' / 'video.npy'
  _flip(video, video.stat().st_size - 3, keep_mtime=True)  # the sampled digest sees it
  with pytest.raises(IndexFormatError) as e:
    open_index(index.path)
  assert str(e.value).splitlines()[-1].startswith(f'{video} does not match the checksum')
  _flip(video, video.stat().st_size - 3, keep_mtime=True)  # back
  assert open_index(index.path).verified == 'sampled'
  os.utime(video)  # touched (or copied without its mtime), content unchanged: a full check
  open_index(index.path)
  assert open_index(index.path, verify=True).verified == 'full'
  _flip(video, 200, keep_mtime=False)
  with pytest.raises(IndexFormatError, match=r'00000/video\.npy does not match'):
    open_index(index.path)


def test_sampled_digest_reads_a_bounded_part_of_large_files(tmp_path):
  path = tmp_path / 'big.npy'
  np.save(path, np.arange(1 << 20, dtype=np.float32))  # 4 MiB: 64 blocks of 4 KiB sampled
  before = store.sample_digest(str(path))
  _flip(path, 0, keep_mtime=True)
  assert store.sample_digest(str(path)) != before
  _flip(path, 0, keep_mtime=True)
  _flip(path, path.stat().st_size - 1, keep_mtime=True)
  assert store.sample_digest(str(path)) != before


def test_edited_manifest_is_refused(gmmformer_gallery, tmp_path):
  index = _index(gmmformer_gallery, tmp_path / 'index')
  path = pathlib.Path(index.path) / 'index.json'
  manifest = json.loads(path.read_text())
  manifest['info'] = {'checkpoint': 'elsewhere'}
  path.write_text(json.dumps(manifest))
  with pytest.raises(IndexFormatError) as e:
    open_index(index.path)
  assert str(e.value).splitlines()[-1].startswith(f'{path} was changed after the index')


def test_damaged_candidate_file_is_refused(gmmformer_gallery, tmp_path):
  pytest.importorskip('faiss')
  from prvr_jax.index.candidates import CandidateIndex  # pylint: disable=g-import-not-at-top
  index = _index(gmmformer_gallery, tmp_path / 'index', dtype='float32')
  folder = pathlib.Path(index.path) / 'candidates'
  CandidateIndex.build(index, 'flat').save(str(folder))
  assert CandidateIndex.load(str(folder), index).num_elements > 0
  faiss_path = folder / 'candidates.faiss'
  _flip(faiss_path, faiss_path.stat().st_size // 2, keep_mtime=True)  # bit rot, mtime kept
  for verify in (False, True):
    with pytest.raises(IndexFormatError, match=r'candidates\.faiss does not match'):
      CandidateIndex.load(str(folder), index, verify=verify)
  _flip(faiss_path, faiss_path.stat().st_size // 2, keep_mtime=True)
  data = bytearray(faiss_path.read_bytes())
  data[100:100 + 4096] = bytes(4096)  # 4 KiB zeroed, same size
  faiss_path.write_bytes(bytes(data))
  with pytest.raises(IndexFormatError) as e:
    CandidateIndex.load(str(folder), index)
  assert str(e.value).splitlines()[-1].startswith(f'{faiss_path} does not match the checksum')
  meta_path = folder / 'candidates.json'
  meta = json.loads(meta_path.read_text())
  del meta['faiss']  # a file of an older prvr_jax
  meta_path.write_text(json.dumps(meta))
  with pytest.raises(IndexFormatError, match=r'candidates\.json records no checksum'):
    CandidateIndex.load(str(folder), index)


# ------------------------------------------------------------------ 2. provenance


def _fake_run(workdir: pathlib.Path, steps) -> None:
  """A run folder whose best/ holds finalised (empty) step folders `steps`."""
  for step in steps:
    folder = workdir / 'best' / str(step)
    (folder / 'meta').mkdir(parents=True)
    (folder / 'meta' / 'metadata').write_text('{}')
    (folder / 'params').mkdir()
    (folder / '_CHECKPOINT_METADATA').write_text('{}')


def test_index_records_what_produced_it_and_refuses_a_stale_pairing(gmmformer_gallery,
                                                                    tmp_path):
  config, params, *_ = gmmformer_gallery
  workdir = tmp_path / 'run'
  _fake_run(workdir, [2])
  info = {'checkpoint': str(workdir / 'best' / '2'), 'checkpoint_source': 'prvr_jax',
          'checkpoint_arg': str(workdir), 'step': 2}
  index = _index(gmmformer_gallery, tmp_path / 'index', info=info)
  provenance = index.provenance()
  assert provenance['index_id'] == index.manifest['id'] and len(index.id) == 24
  assert provenance['step'] == 2 and provenance['checkpoint'] == info['checkpoint']
  assert provenance['params_fingerprint'] == checkpoint.tree_digest(params)
  assert checkpoint.tree_digest(index.params()) == provenance['params_fingerprint']
  build.check_pairing(index, config, None, None, allow_stale=False)  # the run is still at 2
  _fake_run(workdir, [5])  # the run moved on (step 2 may be deleted)
  with pytest.raises(ValueError) as e:
    build.check_pairing(index, config, None, None, allow_stale=False)
  last = str(e.value).splitlines()[-1]
  assert f'--index={index.path} is stale' in last and 'step 2 (index) vs 5' in last
  assert '--allow_stale_index' in last
  build.check_pairing(index, config, None, None, allow_stale=True)


def test_output_equal_to_an_input_is_refused(tmp_path):
  run = tmp_path / 'run'
  run.mkdir()
  for out in (run, tmp_path):
    with pytest.raises(ValueError) as e:
      build.check_not_an_input(str(out), {'--checkpoint': str(run), '--config.data.dir': None})
    assert str(e.value).splitlines()[-1].startswith(f'--out={out} is ')
    assert f'--checkpoint={run}' in str(e.value)
  build.check_not_an_input(str(run / 'index'), {'--checkpoint': str(run)})


# ------------------------------------------------------------------ 3. non-finite values


@pytest.mark.parametrize('dtype', ['int8', 'float32', 'bfloat16'])
def test_writer_refuses_non_finite_videos(gmmformer_gallery, tmp_path, dtype):
  config, params, stored, ids, _ = gmmformer_gallery
  for leaf, value in (('clips', np.inf), ('video', np.nan)):
    bad = {k: v.copy() for k, v in stored.items()}
    bad[leaf][3].flat[5] = value
    writer = IndexWriter(str(tmp_path / f'{leaf}_{dtype}'), config.model, params, dtype=dtype)
    with pytest.raises(ValueError) as e:
      writer.add(bad, ids)
    assert "video 'v3' holds NaN or infinite values in leaf " + repr(leaf) in str(e.value)
  if dtype == 'bfloat16':  # finite in float32, infinite in bfloat16
    bad = {k: v.copy() for k, v in stored.items()}
    bad['clips'][4, 0, 0] = 3.4e38
    writer = IndexWriter(str(tmp_path / 'overflow'), config.model, params, dtype=dtype)
    writer.add(bad, ids)
    with pytest.raises(ValueError, match="video 'v4' has values in leaf 'clips'"):
      writer.close()


CONFIG_MODEL = types.SimpleNamespace(name='m', max_query_len=3, query_dim=4)
INPUTS = ('query_feats', 'query_mask')


def _npz(path, feats, mask, ids=None):
  arrays = {'query_feats': feats, 'query_mask': mask}
  if ids is not None:
    arrays['ids'] = np.array(ids)
  np.savez(path, **arrays)
  return str(path)


@pytest.mark.parametrize('case, key, message', [
    ('nan', 'query_feats', "key query_feats, query 'b' holds NaN or infinite values"),
    ('empty', 'query_feats', 'query_feats holds no queries'),
    ('mask_shape', 'query_mask', 'query_mask has shape (3, 2)'),
    ('duplicate', 'ids', "key ids lists query 'a' twice"),
    ('padding', 'query_mask', "key query_mask, query 'c' is all padding"),
    ('mask_values', 'query_mask', "key query_mask, query 'a' has mask values other than 0"),
])
def test_bad_npz_queries_are_refused(tmp_path, case, key, message):
  rng = np.random.default_rng(0)
  feats = rng.normal(size=(3, 3, 4)).astype(np.float32)
  mask = np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0]], np.float32)
  ids = ['a', 'b', 'c']
  feats[1, 2] = np.nan  # a padded token: not read, accepted
  queries, got = queries_lib.read_queries(_npz(tmp_path / 'ok.npz', feats, mask, ids), INPUTS,
                                          CONFIG_MODEL)
  assert got == ids and len(queries['query_feats']) == 3
  if case == 'nan':
    feats[1, 1, 2] = np.nan
  elif case == 'empty':
    feats, mask, ids = feats[:0], mask[:0], []
  elif case == 'mask_shape':
    mask = mask[:, :2]
  elif case == 'duplicate':
    ids = ['a', 'b', 'a']
  elif case == 'padding':
    mask[2] = 0
  else:
    mask[0, 0] = 0.5
  path = _npz(tmp_path / 'bad.npz', feats, mask, ids)
  with pytest.raises(ValueError) as e:
    queries_lib.read_queries(path, INPUTS, CONFIG_MODEL)
  last = str(e.value).splitlines()[-1]
  assert last.startswith(f'--queries={path}') and key in last and message in last, last


def test_empty_hdf5_query_file_is_refused(tmp_path):
  path = tmp_path / 'empty.h5'
  with h5py.File(path, 'w'):
    pass
  with pytest.raises(ValueError, match=f'--queries={path} holds no queries'):
    queries_lib.read_queries(str(path), INPUTS, CONFIG_MODEL)


# ------------------------------------------------------------------ 4. --overwrite


def test_overwrite_deletes_only_our_index(gmmformer_gallery, tmp_path):
  config, params, *_ = gmmformer_gallery
  foreign = tmp_path / 'foreign'
  foreign.mkdir()
  (foreign / 'index.json').write_text('{"name": "my notes"}')
  (foreign / 'thesis.tex').write_text('precious')
  with pytest.raises(ValueError) as e:
    IndexWriter(str(foreign), config.model, params, overwrite=True)
  assert str(e.value).splitlines()[-1].startswith(f'Refusing to overwrite {foreign}')
  assert (foreign / 'thesis.tex').read_text() == 'precious'

  index = _index(gmmformer_gallery, tmp_path / 'index')
  user = pathlib.Path(index.path) / 'shards' / 'notes.txt'
  user.write_text('mine')
  with pytest.raises(ValueError, match=r'holds shards/notes\.txt, which its index\.json does '
                                       'not list'):
    IndexWriter(index.path, config.model, params, overwrite=True)
  assert user.read_text() == 'mine' and open_index(index.path).ids == index.ids
  user.unlink()
  (pathlib.Path(index.path) / 'shards' / '00000' / '.video.npy.x1y2.tmp').write_bytes(b'x')
  (pathlib.Path(index.path) / 'candidates').mkdir()
  (pathlib.Path(index.path) / 'candidates' / 'candidates.json').write_text(
      '{"format": "prvr_jax.candidates"}')
  # Ours, with our temporary file and candidate files: replaced.
  again = _index(gmmformer_gallery, index.path, overwrite=True)
  assert again.id != index.id and sorted(os.listdir(again.path)) == [
      'index.json', 'params.npz', 'shards']

  path = pathlib.Path(again.path) / 'index.json'
  manifest = json.loads(path.read_text())
  del manifest['id']  # an index of an older prvr_jax, or a forged manifest
  path.write_text(json.dumps(manifest))
  with pytest.raises(ValueError, match='records no index id'):
    IndexWriter(again.path, config.model, params, overwrite=True)
  link = tmp_path / 'linked'
  link.mkdir()
  (link / 'shards').symlink_to(tmp_path / 'foreign')
  with pytest.raises(ValueError, match='not a prvr_jax index'):
    IndexWriter(str(link), config.model, params, overwrite=True)
  assert (foreign / 'thesis.tex').exists()


# ------------------------------------------------------------------ the CLI's last line


def test_cli_refusals_name_the_file(gmmformer_gallery, tmp_path, xla_cache):
  config, *_ = gmmformer_gallery
  index = _index(gmmformer_gallery, tmp_path / 'index', dtype='float32')
  feats = np.zeros((2, config.model.max_query_len, config.model.query_dim), np.float32)
  mask = np.zeros((2, config.model.max_query_len), np.float32)
  mask[:, 0] = 1
  feats[1, 0, 0] = np.nan
  queries = _npz(tmp_path / 'q.npz', feats, mask, ['first', 'second'])
  proc = support.run_cli('prvr_jax/tools/index.py', 'search', f'--index={index.path}',
                         f'--queries={queries}', cache_dir=xla_cache, check=False)
  last = proc.stderr.strip().splitlines()[-1]
  assert proc.returncode and f'--queries={queries}' in last and "'second'" in last, last
  video = pathlib.Path(index.path) / 'shards' / '00000' / 'video.npy'
  _flip(video, video.stat().st_size - 1, keep_mtime=False)
  feats[1, 0, 0] = 0
  queries = _npz(tmp_path / 'q.npz', feats, mask, ['first', 'second'])
  proc = support.run_cli('prvr_jax/tools/index.py', 'search', f'--index={index.path}',
                         f'--queries={queries}', cache_dir=xla_cache, check=False)
  last = proc.stderr.strip().splitlines()[-1]
  assert proc.returncode and f'{video} does not match the checksum' in last, last


def test_candidates_do_not_replace_a_foreign_file(gmmformer_gallery, tmp_path):
  pytest.importorskip('faiss')
  from prvr_jax.index.candidates import CandidateIndex  # pylint: disable=g-import-not-at-top
  index = _index(gmmformer_gallery, tmp_path / 'index', dtype='float32')
  folder = tmp_path / 'mine'
  folder.mkdir()
  (folder / 'candidates.json').write_text('{"my": "list"}')
  with pytest.raises(ValueError) as e:
    CandidateIndex.build(index, 'flat').save(str(folder))
  assert str(e.value).splitlines()[-1].startswith(f'{folder / "candidates.json"} exists')
  assert (folder / 'candidates.json').read_text() == '{"my": "list"}'


def test_cli_outputs_equal_to_inputs_are_refused(gmmformer_gallery, tmp_path, xla_cache,
                                                 config_path):
  run = tmp_path / 'run'
  run.mkdir()
  proc = support.run_cli('prvr_jax/tools/index.py', 'build', f'--config={config_path}',
                         f'--checkpoint={run}', f'--out={run}', '--overwrite',
                         cache_dir=xla_cache, check=False)
  last = proc.stderr.strip().splitlines()[-1]
  assert proc.returncode and f'--out={run} is the input --checkpoint={run}' in last, last
  index = _index(gmmformer_gallery, tmp_path / 'index', dtype='float32')
  config = gmmformer_gallery[0]
  feats = np.zeros((1, config.model.max_query_len, config.model.query_dim), np.float32)
  queries = _npz(tmp_path / 'q.npz', feats, np.ones(feats.shape[:2], np.float32))
  proc = support.run_cli('prvr_jax/tools/index.py', 'search', f'--index={index.path}',
                         f'--queries={queries}', f'--output={queries}', cache_dir=xla_cache,
                         check=False)
  assert proc.returncode and f'--output={queries} is the query file' in proc.stderr
  assert np.load(queries)['query_feats'].shape == feats.shape


def test_stale_index_against_a_checkpoint(reference_run, config_path, tiny_data, xla_cache,
                                          gmmformer_gallery, tmp_path):
  """An index of other parameters (and step) than --checkpoint's is refused by
  `evaluate.py --index --checkpoint`, naming what differs and --allow_stale_index."""
  config = support.load_config(config_path)
  _, _, stored, ids, _ = gmmformer_gallery
  loaded, info = checkpoint.load_params(str(reference_run), config, support.data_mesh(1))
  step = info['step']
  own = IndexWriter(str(tmp_path / 'own'), config.model, loaded,
                    info={'step': step, 'checkpoint_source': 'prvr_jax'})
  own.add({k: v[:1] for k, v in stored.items()}, ids[:1])
  own = own.close()
  assert own.manifest['params_fingerprint'] == checkpoint.tree_digest(loaded)
  build.check_pairing(own, config, str(reference_run), support.data_mesh(1), False)
  other = jax.tree.map(lambda x: np.asarray(x) + 1, loaded)
  stale = IndexWriter(str(tmp_path / 'stale'), config.model, other,
                      info={'step': step + 1, 'checkpoint_source': 'prvr_jax'})
  stale.add({k: v[:1] for k, v in stored.items()}, ids[:1])
  stale = stale.close()
  proc = support.run_cli('evaluate.py', f'--config={config_path}',
                         f'--config.data.dir={tiny_data}', f'--index={stale.path}',
                         f'--checkpoint={reference_run}', cache_dir=xla_cache, check=False)
  last = proc.stderr.strip().splitlines()[-1]
  assert proc.returncode and f'--index={stale.path} is stale' in last, last
  assert f'step {step + 1} (index) vs {step}' in last and 'parameter fingerprint' in last
  assert '--allow_stale_index' in last


def test_manifest_cannot_name_files_outside_the_index(gmmformer_gallery, tmp_path):
  index = _index(gmmformer_gallery, tmp_path / 'index')
  path = pathlib.Path(index.path) / 'index.json'
  manifest = json.loads(path.read_text())
  manifest['shards'][0]['name'] = '../../elsewhere'
  manifest['id'] = store.manifest_id(manifest)  # a forged manifest with a matching id
  path.write_text(json.dumps(manifest))
  with pytest.raises(IndexFormatError) as e:
    open_index(index.path)
  assert str(e.value).splitlines()[-1].startswith(f'{path}: a shard entry is not a shard')
  config, params, *_ = gmmformer_gallery
  with pytest.raises(ValueError, match='Refusing to overwrite'):
    IndexWriter(index.path, config.model, params, overwrite=True)


def test_per_pair_noise_cannot_be_indexed(tmp_path):
  """T-MASS's official evaluation noise (per query-video pair) cannot be stored per video: the
  writer refuses it before creating anything, naming the field."""
  config = support.load_config('tmass', 'tiny')
  config.model.noise = 'per_pair'
  with pytest.raises(ValueError, match=r"config.model.noise='per_pair'.*--config.model.noise="
                     r'per_video'):
    IndexWriter(str(tmp_path / 'index'), config.model, params=None)
  assert not (tmp_path / 'index').exists()
