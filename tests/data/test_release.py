"""Release layout readers: round trips, official parity, and every bad-input error."""

import logging
import os
import pickle

import h5py
import numpy as np
import pytest

import support
from prvr_jax.data import preprocess
from prvr_jax.data import release
from prvr_jax.data.release import DataError

FIXTURE = str(support.FIXTURES / 'preprocess_official.npz')
DV, DQ = 6, 5
FRAMES = {'v0': 1, 'v1': 7, 'v2': 40, 'v3': 200}
CAPTIONS = {
    'train': [('v0#enc#0', 'a person walks'), ('v1#enc#0', 'b'), ('v1#enc#1', 'c d'),
              ('v2#enc#0', 'e'), ('v3#enc#0', 'f'), ('v3#enc#1', 'g')],
    'val': [('v3#enc#0', 'f'), ('v2#enc#0', 'e'), ('v3#enc#1', 'g')],
}


def _data(seed=0, text_feature='roberta'):
  rng = np.random.default_rng(seed)
  videos = {v: rng.normal(size=(n, DV)).astype(np.float32) for v, n in FRAMES.items()}
  caps = {c for items in CAPTIONS.values() for c, _ in items}
  shape = (lambda: (DQ,)) if text_feature == 'clip' else (lambda: (int(rng.integers(1, 45)), DQ))
  return videos, {c: rng.normal(size=shape()).astype(np.float32) for c in sorted(caps)}


@pytest.fixture
def tvr(tmp_path):
  """A small RoBERTa-layout collection 'tvr'; returns (root, videos, caption features)."""
  videos, cap_feats = _data()
  release.write_release(str(tmp_path), 'tvr', videos, CAPTIONS, cap_feats, visual_feature='i3d_resnet')
  return str(tmp_path), videos, cap_feats


def _open(root, **kw):
  return release.Release(root, 'tvr', 'i3d_resnet', **kw)


def _feature_dir(root):
  return os.path.join(root, 'tvr', 'FeatureData', 'i3d_resnet')


def _query_file(root):
  return os.path.join(root, 'tvr', 'TextData', 'roberta_tvr_query_feat.hdf5')


# ---------------------------------------------------------------- round trips


def test_bigfile_round_trip_and_memmap(tmp_path):
  ids = [f'f{i}' for i in range(10)]
  x = np.random.default_rng(1).normal(size=(10, 4)).astype(np.float32)
  writer = release.BigFileWriter(str(tmp_path))
  writer.add(ids, x)
  writer.close()
  bf = release.BigFile(str(tmp_path))
  assert isinstance(bf._data, np.memmap)
  assert bf.shape == (10, 4) and bf.dim == 4 and len(bf) == 10 and 'f3' in bf
  np.testing.assert_array_equal(bf.read(['f7', 'f2', 'f7']), x[[7, 2, 7]])
  # Pickling reopens the mapping instead of copying the data.
  again = pickle.loads(pickle.dumps(bf))
  assert isinstance(again._data, np.memmap)
  np.testing.assert_array_equal(again.read(ids), x)
  with pytest.raises(DataError, match=rf"frame id 'nope' is not in BigFile {tmp_path}"):
    bf.read(['f1', 'nope'])


def test_video2frames_round_trip_and_parsers(tmp_path):
  mapping = {'a': ['a_0', 'a_1'], 'b': [], "it's": ['x"y']}
  path = str(tmp_path / 'video2frames.txt')
  release.write_video2frames(path, mapping)  # quotes force the ast path
  assert release.read_video2frames(path) == mapping
  release.write_video2frames(path, {'a': ['a_0']})  # plain ids take the JSON path
  assert release.read_video2frames(path) == {'a': ['a_0']}
  with open(path, 'w') as f:
    f.write("# a comment\n{'a': ('a_0', 'a_1'),\n 'b': ['b_0'],}\n")
  assert release.read_video2frames(path) == {'a': ['a_0', 'a_1'], 'b': ['b_0']}


@pytest.mark.parametrize('text, match', [
    ("__import__('os').system('touch PWNED')", 'not a Python dict literal'),
    ("{'a': ['x'],\n 'b': ['y'", r'video2frames.txt:2: not a Python dict literal \(SyntaxError'),
    ("{'a': ['x'],\n 'b': [f()]}", r'not a Python dict literal .*on line 2'),
    ("['a', 'b']", 'expected a dict literal'),
    ("{'a': 'a_0'}", "frames of video 'a' are not a list of strings"),
    ("{'a': [1, 2]}", "frames of video 'a' are not a list of strings"),
    ("{3: ['x']}", 'video id 3 is not a string'),
])
def test_video2frames_rejects_bad_files_without_eval(tmp_path, monkeypatch, text, match):
  monkeypatch.chdir(tmp_path)
  path = tmp_path / 'video2frames.txt'
  path.write_text(text)
  with pytest.raises(DataError, match=match) as e:
    release.read_video2frames(str(path))
  assert str(path) in str(e.value)
  assert not (tmp_path / 'PWNED').exists()


def test_captions_round_trip_order_and_video_ids(tmp_path):
  path = str(tmp_path / 'c.caption.txt')
  items = [('b#1', 'x  y'), ('a#0', 'z'), ('b#0', 'w'), ('c', 'no hash')]
  release.write_captions(path, items)
  with open(path, 'a') as f:
    f.write('\n')  # a trailing blank line is ignored
  got = release.read_captions(path)
  assert got == [('b#1', 'x y'), ('a#0', 'z'), ('b#0', 'w'), ('c', 'no hash')]
  assert release.video_ids_in_order(got) == ['b', 'a', 'c']


@pytest.mark.parametrize('newline', ['\n', '\r\n', '\r'])
def test_caption_line_endings_never_merge_lines(tmp_path, newline):
  """Unix, Windows and old-Mac (lone CR) files give the same captions, line numbers too."""
  path = tmp_path / 'c.caption.txt'
  path.write_bytes(newline.join(['a#0 one', 'a#1 two', '', 'b#0 three']).encode())
  assert release.read_captions(str(path)) == [('a#0', 'one'), ('a#1', 'two'), ('b#0', 'three')]
  path.write_bytes(newline.join(['a#0 one', 'a#0 again']).encode())
  with pytest.raises(DataError, match=r":2: duplicate caption id 'a#0'"):
    release.read_captions(str(path))


def test_errors_cut_long_ids(tmp_path):
  """A 1 MB caption id gives a short message (the id cut, its length stated)."""
  path = tmp_path / 'c.caption.txt'
  long_id = 'v' * 1_000_000 + '#0'
  path.write_text(f'a#0 ok\n{long_id}\n')
  with pytest.raises(DataError, match=r':2: caption id .* \(1000004 characters\) has no caption') as e:
    release.read_captions(str(path))
  assert len(str(e.value)) < 400


@pytest.mark.parametrize('lines, match', [
    ('a#0 ok\n   no id here\n', r':2: line has no caption id'),
    ('a#0 ok\nb#0\n', r":2: caption id 'b#0' has no caption text"),
    ('a#0 ok\nb#0 \t \n', r":2: caption id 'b#0' has no caption text"),
    ('a#0 ok\nb#0 x\na#0 again\n', r":3: duplicate caption id 'a#0' \(first on line 1\)"),
    ('#0 x\n', r":1: caption id '#0' has an empty video id"),
    ('\n\n', 'no captions'),
    (b'a#0 ok\nb#0 caf\xe9\n', r':2: not UTF-8 text'),
])
def test_caption_errors_name_file_and_line(tmp_path, lines, match):
  path = tmp_path / 'tvrtrain.caption.txt'
  path.write_bytes(lines if isinstance(lines, bytes) else lines.encode())
  with pytest.raises(DataError, match=match) as e:
    release.read_captions(str(path))
  assert str(path) in str(e.value)


def test_hdf5_readers(tmp_path):
  path = str(tmp_path / 'q.hdf5')
  release.write_caption_features(path, {'a#0': np.ones((3, 2)), 'b#0': np.zeros(2)})
  feats = release.CaptionFeatures(path)
  assert feats.keys() == {'a#0', 'b#0'} and 'a#0' in feats and feats.shape('a#0') == (3, 2)
  assert feats.read('a#0').dtype == np.float32 and feats.shape_or_none('zz') is None
  with pytest.raises(DataError, match=rf"caption id 'zz' is not in {path}"):
    feats.read('zz')
  with pytest.raises(DataError, match=rf"video id 'zz' is not in {path}"):
    release.ClipVideoFeatures(path).read('zz')
  assert pickle.loads(pickle.dumps(feats)).read('b#0').shape == (2,)
  bad = tmp_path / 'bad.hdf5'
  bad.write_text('not hdf5')
  with pytest.raises(DataError, match=rf'{bad}: cannot open as HDF5'):
    release.CaptionFeatures(str(bad)).keys()


# ---------------------------------------------------------------- Release


def test_release_reads_splits_in_official_order(tvr):
  root, videos, cap_feats = tvr
  rel = _open(root, visual_dim=DV, query_dim=DQ)
  assert rel.collection == 'tvr' and rel.splits == ('train', 'val')
  val = rel.split('val')
  assert val is rel.split('val')
  assert val.caption_ids == ['v3#enc#0', 'v2#enc#0', 'v3#enc#1']
  assert val.video_ids == ['v3', 'v2']
  assert val.captions_of('v3') == ['v3#enc#0', 'v3#enc#1']
  np.testing.assert_array_equal(val.caption_video_index(), [0, 1, 0])
  assert val.visual_dim == DV and val.query_dim == DQ and val.skipped == []
  assert val.num_frames('v3') == 200
  clips, frames = val.video_features('v3')
  assert clips.shape == (32, DV) and frames.shape == (128, DV)
  assert clips.dtype == frames.dtype == np.float32
  # L2-normalized rows: |x| / (|x| + 1e-5) is 1 within 1e-5 / |x| (eps added to the norm).
  norms = np.linalg.norm(frames, axis=-1)
  support.assert_close(norms, np.ones_like(norms), rtol=1e-4, scale=0)
  np.testing.assert_array_equal(val.raw_video_features('v3'), videos['v3'])
  q = val.caption_features('v2#enc#0')
  assert q.shape == (min(30, len(cap_feats['v2#enc#0'])), DQ) and q.dtype == np.float32
  with pytest.raises(KeyError, match='v0'):
    val.captions_of('v0')
  # A pickled split (as sent to worker processes) reopens its files and reads the same.
  copy = pickle.loads(pickle.dumps(val))
  np.testing.assert_array_equal(copy.video_features('v3')[0], clips)
  np.testing.assert_array_equal(copy.caption_features('v2#enc#0'), q)
  assert len(pickle.dumps(val)) < 20_000


def test_release_matches_official_pipeline(tmp_path):
  """Frames/tokens through the release layout give the official loader's arrays."""
  official = np.load(FIXTURE)
  videos = {f'v{n}': official[f'x_{n}'] for n in official['ns']}
  caps = {f'v1#tok{n}': official[f't_{n}'] for n in official['ntok']}
  items = [(f'v{n}#enc#0', 'x') for n in official['ns']] + [(c, 'y') for c in caps]
  feats = {**caps, **{f'v{n}#enc#0': np.ones((2, 6)) for n in official['ns']}}
  release.write_release(str(tmp_path), 'charades', videos, {'test': items}, feats, 'i3d_rgb_lgi')
  split = release.Release(str(tmp_path / 'charades'), visual_feature='i3d_rgb_lgi').split('test')
  # float64 pipelines cast to float32 (L2-normalized, O(1)): an ulp apart at most; tokens
  # are normalized in float32 (norms over 6 features).
  for n in official['ns']:
    clips, frames = split.video_features(f'v{n}')
    support.assert_close(clips, official[f'clips_{n}'], rtol=support.f32_rtol(1), err_msg=f'n={n}')
    support.assert_close(frames, official[f'frames_{n}'], rtol=support.f32_rtol(1),
                         err_msg=f'n={n}')
  for n in official['ntok']:
    support.assert_close(split.caption_features(f'v1#tok{n}'), official[f'tok_{n}'],
                         rtol=support.f32_rtol(6), err_msg=f'n={n}')


def test_collection_resolution(tvr, tmp_path):
  root, _, _ = tvr
  for args in [(root, None), (root, 'tvr'), (os.path.join(root, 'tvr'), None),
               (os.path.join(root, 'tvr'), 'tvr')]:
    assert release.Release(*args, 'i3d_resnet').layout.collection_dir == os.path.join(root, 'tvr')
  videos, cap_feats = _data()
  release.write_release(root, 'charades', videos, CAPTIONS, cap_feats, 'i3d_resnet')
  with pytest.raises(DataError, match=r"\['charades', 'tvr'\].*pass collection="):
    release.Release(root, None, 'i3d_resnet')
  with pytest.raises(FileNotFoundError, match='activitynet'):
    release.Release(root, 'activitynet', 'i3d')
  with pytest.raises(FileNotFoundError, match=r"split 'test': missing caption file .*tvrtest.caption.txt"):
    _open(root).split('test')
  release.write_captions(os.path.join(root, 'tvr', 'TextData', 'tvrval_1.caption.txt'), CAPTIONS['val'][:1])
  rel = _open(root)
  assert rel.splits == ('train', 'val') and rel.split('val_1').video_ids == ['v3']


@pytest.mark.parametrize('victim', ['feature.bin', 'id.txt', 'video2frames.txt', 'query'])
def test_missing_file_lists_expected_paths(tvr, victim):
  root, _, _ = tvr
  path = _query_file(root) if victim == 'query' else os.path.join(_feature_dir(root), victim)
  os.remove(path)
  with pytest.raises(FileNotFoundError, match='missing file') as e:
    _open(root)
  assert path in str(e.value) and 'expected' in str(e.value)


def test_truncated_feature_bin(tvr):
  root, _, _ = tvr
  path = os.path.join(_feature_dir(root), 'feature.bin')
  size = os.path.getsize(path)
  with open(path, 'r+b') as f:
    f.truncate(size - 8)
  with pytest.raises(DataError, match=rf'{path}: expected {size} bytes .* has {size - 8} bytes'):
    _open(root).split('train')


def test_bad_shape_and_ids(tvr):
  root, _, _ = tvr
  fd = _feature_dir(root)
  with open(os.path.join(fd, 'shape.txt'), 'w') as f:
    f.write('248 six')
  with pytest.raises(DataError, match='shape.txt: expected "N D"'):
    release.BigFile(fd)
  with open(os.path.join(fd, 'shape.txt'), 'w') as f:
    f.write(f'249 {DV}')
  with pytest.raises(DataError, match=r'id.txt has 248 ids but .*shape.txt says N=249'):
    release.BigFile(fd)
  with open(os.path.join(fd, 'shape.txt'), 'w') as f:
    f.write(f'248 {DV}')
  with open(os.path.join(fd, 'id.txt'), 'r+') as f:
    ids = f.read().split()
    f.seek(0)
    f.write(' '.join(ids[:-1] + ['v2_5']))
    f.truncate()
  with pytest.raises(DataError, match=r"id.txt: duplicate frame id 'v2_5'"):
    release.BigFile(fd)


def _rewrite_video2frames(root, edit):
  path = os.path.join(_feature_dir(root), 'video2frames.txt')
  mapping = release.read_video2frames(path)
  edit(mapping)
  release.write_video2frames(path, mapping)
  return path


@pytest.mark.parametrize('edit, match', [
    (lambda m: m['v1'].append('ghost_frame'),
     r"video 'v1': frame id 'ghost_frame' \(1 of 8 frames\) is not in BigFile .*i3d_resnet"),
    (lambda m: m.__setitem__('v2', []), r"video 'v2' has an empty frame list in .*video2frames.txt"),
    (lambda m: m.pop('v0'), r"video 'v0' is not in .*video2frames.txt \(zero frames\)"),
])
def test_bad_videos_raise(tvr, edit, match):
  root, _, _ = tvr
  _rewrite_video2frames(root, edit)
  with pytest.raises(DataError, match=match) as e:
    _open(root).split('train')
  assert 'skip_bad_items=True' in str(e.value)


def test_caption_missing_from_hdf5(tvr):
  root, _, _ = tvr
  with h5py.File(_query_file(root), 'a') as f:
    del f['v2#enc#0']
  with pytest.raises(DataError, match=rf"caption id 'v2#enc#0' is not in {_query_file(root)}"):
    _open(root).split('val')


def test_a_caption_declaring_huge_features_is_refused_before_reading(tvr):
  """A small HDF5 file declaring a 100M x 768 dataset (never written: no chunk stored) would
  make any reader allocate 300 GB."""
  root, _, _ = tvr
  with h5py.File(_query_file(root), 'a') as f:
    del f['v2#enc#0']
    f.create_dataset('v2#enc#0', shape=(100_000_000, 768), dtype='f4', chunks=(1, 768))
  with pytest.raises(DataError, match=r"caption 'v2#enc#0' declares features of shape "
                     r'\(100000000, 768\) .*\(refused before reading'):
    _open(root).split('val')


def test_nan_in_features(tvr):
  root, videos, _ = tvr
  bin_path = os.path.join(_feature_dir(root), 'feature.bin')
  data = np.fromfile(bin_path, np.float32).reshape(-1, DV)
  data[FRAMES['v0'] + 3, 2] = np.nan  # v1_3
  data.tofile(bin_path)
  with h5py.File(_query_file(root), 'a') as f:
    f['v3#enc#1'][0, 0] = np.inf
  split = _open(root).split('train')  # metadata checks pass; values are checked on read
  with pytest.raises(DataError, match=rf"video 'v1': NaN/Inf in frame id 'v1_3' .* in {bin_path}"):
    split.video_features('v1')
  with pytest.raises(DataError, match=rf"caption 'v3#enc#1': NaN/Inf .* in {_query_file(root)}"):
    split.caption_features('v3#enc#1')
  with pytest.raises(DataError, match="(?s)2 bad item.*'v1'.*'v3#enc#1'"):
    _open(root, check_values=True).split('train')
  split = _open(root, check_values=True, skip_bad_items=True).split('train')
  assert [i for i, _ in split.skipped] == ['v1', 'v3#enc#1', 'v1#enc#0', 'v1#enc#1']
  assert split.video_ids == ['v0', 'v2', 'v3'] and 'v3#enc#1' not in split.caption_ids


@pytest.mark.parametrize('kw, flag', [({'visual_dim': 99}, 'config.model.visual_dim=99'),
                                      ({'query_dim': 768}, 'config.model.query_dim=768')])
def test_dim_mismatch_names_config_flag(tvr, kw, flag):
  root, _, _ = tvr
  with pytest.raises(DataError, match=flag) as e:
    _open(root, **kw).split('train')
  assert ('shape.txt' if 'visual' in flag else _query_file(root)) in str(e.value)


def test_skip_mode_records_and_warns(tvr, caplog):
  root, _, _ = tvr
  _rewrite_video2frames(root, lambda m: (m.pop('v0'), m['v1'].append('ghost')))
  with h5py.File(_query_file(root), 'a') as f:
    del f['v3#enc#1']
    del f['v2#enc#0']
  with caplog.at_level(logging.WARNING, logger='prvr_jax.data.release'):
    split = _open(root, skip_bad_items=True).split('train')
  skipped = dict(split.skipped)
  assert set(skipped) == {'v0', 'v1', 'v3#enc#1', 'v2#enc#0', 'v0#enc#0', 'v1#enc#0', 'v1#enc#1', 'v2'}
  assert 'ghost' in skipped['v1'] and skipped['v2'] == 'all of its captions were skipped'
  assert split.video_ids == ['v3'] and split.caption_ids == ['v3#enc#0']
  assert 'skipped 3 video(s) and 5 caption(s)' in caplog.text
  # Without the flag the same data raises, listing every problem.
  with pytest.raises(DataError, match='4 bad item'):
    _open(root).split('train')


def test_clip_layout(tmp_path):
  videos, cap_feats = _data(text_feature='clip')
  root = release.write_release(str(tmp_path), 'act', videos, CAPTIONS, cap_feats, text_feature='clip')
  assert os.path.isfile(os.path.join(root, 'FeatureData', 'new_clip_vit_32_act_vid_features.hdf5'))
  with release.Release(str(tmp_path), None, None, 'clip', visual_dim=DV, query_dim=DQ) as rel:
    assert not rel.normalize
    split = rel.split('train')
    clips, frames = split.video_features('v3')
    np.testing.assert_array_equal(clips, preprocess.average_to_fixed_length(videos['v3']))
    np.testing.assert_array_equal(frames, preprocess.uniform_feature_sampling(videos['v3']))
    np.testing.assert_array_equal(split.caption_features('v1#enc#1'), cap_feats['v1#enc#1'][None])
  with release.Release(root, None, None, 'clip', normalize=True) as rel:
    q = rel.split('val').caption_features('v2#enc#0')
    norms = np.linalg.norm(q, axis=-1)  # 1 within 1e-5 / |x| (eps added to the norm)
    support.assert_close(norms, np.ones_like(norms), rtol=1e-4, scale=0)
  rel = release.Release(root, None, None, 'clip', visual_dim=512)
  with pytest.raises(DataError, match=r'config.model.visual_dim=512 .*new_clip_vit_32_act_vid_features'):
    rel.split('train')
  rel.close()
  with h5py.File(os.path.join(root, 'FeatureData', 'new_clip_vit_32_act_vid_features.hdf5'), 'a') as f:
    del f['v2']
  with pytest.raises(DataError, match=r"video 'v2' is not in .*new_clip_vit_32_act_vid_features.hdf5"):
    release.Release(root, None, None, 'clip').split('val')


@pytest.fixture
def clip_release(tmp_path):
  """A small CLIP-layout (AMDNet) collection 'act'; returns (root, video file, query file)."""
  videos, cap_feats = _data(text_feature='clip')
  root = release.write_release(str(tmp_path), 'act', videos, CAPTIONS, cap_feats,
                               text_feature='clip')
  return (str(tmp_path), os.path.join(root, 'FeatureData', 'new_clip_vit_32_act_vid_features.hdf5'),
          os.path.join(root, 'TextData', 'clip_ViT_B_32_act_query_feat.hdf5'))


def _split_clip(root, name, **kw):
  """Opens the CLIP release, reads split `name` and closes the files (they are edited next)."""
  with release.Release(root, 'act', None, 'clip', **kw) as rel:
    return rel.split(name)


def test_clip_layout_bad_input_names_file_and_id(clip_release):
  """The CLIP reader has the MS-SL reader's guarantees: a missing video, a query id without a
  feature, wrong dims (frames or sentence vectors) and NaN rows each name the file and id."""
  root, video_file, query_file = clip_release
  with h5py.File(query_file, 'a') as f:
    del f['v1#enc#0']
  with pytest.raises(DataError, match=rf"caption id 'v1#enc#0' is not in {query_file}"):
    _split_clip(root, 'train')
  with h5py.File(query_file, 'a') as f:
    f['v1#enc#0'] = np.ones((DQ + 1,), np.float32)  # a sentence vector of the wrong width
  with pytest.raises(DataError, match=rf"caption 'v1#enc#0' has feature dim {DQ + 1} in "
                     rf'{query_file} but config.model.query_dim is {DQ}'):
    _split_clip(root, 'train', query_dim=DQ)
  with h5py.File(query_file, 'a') as f:
    del f['v1#enc#0']
    f['v1#enc#0'] = np.ones((3, DQ), np.float32)  # a token sequence, not a sentence vector
  with pytest.raises(DataError, match=rf"caption 'v1#enc#0' has features of shape \(3, {DQ}\) "
                     rf'in {query_file}: the CLIP layout holds one sentence vector'):
    _split_clip(root, 'train', query_dim=DQ)
  with h5py.File(query_file, 'a') as f:
    del f['v1#enc#0']
    f['v1#enc#0'] = np.ones((DQ,), np.float32)
    f['v3#enc#1'][2] = np.nan
  with h5py.File(video_file, 'a') as f:
    f['v2'][5, 1] = np.inf
  with release.Release(root, 'act', None, 'clip') as rel:
    split = rel.split('train')  # metadata checks pass; values are checked on read
    with pytest.raises(DataError, match=rf"video 'v2': NaN/Inf .*{video_file}"):
      split.video_features('v2')
    with pytest.raises(DataError, match=rf"caption 'v3#enc#1': NaN/Inf .*{query_file}"):
      split.caption_features('v3#enc#1')
  with pytest.raises(DataError, match="(?s)2 bad item.*'v2'.*'v3#enc#1'"):
    _split_clip(root, 'train', check_values=True)
  with h5py.File(video_file, 'a') as f:
    del f['v3']
  with pytest.raises(DataError, match=rf"video 'v3' is not in {video_file}"):
    _split_clip(root, 'val')


# Frames of each video on the MS-SL release's timeline (video2frames.txt), against the CLIP
# rows of `FRAMES`: longer, shorter, equal, one frame; v1's 5 frames onto 7 rows, v2's onto 40.
TIMELINE = {'v0': 1, 'v1': 5, 'v2': 13, 'v3': 200}


def _timeline_release(tmp_path):
  """A CLIP-layout collection 'act' with a `FeatureData/i3d/video2frames.txt` timeline."""
  videos, cap_feats = _data(text_feature='clip')
  root = release.write_release(str(tmp_path), 'act', videos, CAPTIONS, cap_feats,
                               text_feature='clip')
  timeline = {v: [f'{v}_{i}' for i in range(n)] for v, n in TIMELINE.items()}
  release.write_video2frames(os.path.join(root, 'FeatureData', 'i3d', 'video2frames.txt'),
                             timeline)
  return root, videos, cap_feats


def test_timeline_rows_round_half_to_even():
  """Row round(i / last * (n - 1)) of frame i of 0..last, as Python's round: 5 frames onto 3
  rows put frames 1 and 3 (0.5, 1.5) on rows 0 and 2."""
  np.testing.assert_array_equal(preprocess.timeline_rows([0, 1, 2, 3, 4], 3), [0, 0, 1, 2, 2])
  np.testing.assert_array_equal(preprocess.timeline_rows([0], 9), [0])  # last = 0: unchanged
  np.testing.assert_array_equal(preprocess.timeline_rows([0, 5, 9], 4), [0, 2, 3])
  with pytest.raises(ValueError, match='frame indices >= 0'):
    preprocess.timeline_rows([], 3)


def test_clip_layout_along_a_frame_timeline(tmp_path):
  """prvr-ea's CLIP reading for the GMMFormer / MS-SL lineage: each frame of the BigFile's
  timeline takes the CLIP row at its relative position (Python's round), the video keeps the
  timeline's frame count, and pooling runs in float64 (the rows reach it as Python floats)."""
  root, videos, cap_feats = _timeline_release(tmp_path)
  with release.Release(root, 'act', None, 'clip', frame_map='i3d', normalize=True) as rel:
    assert rel.layout.frame_map_path in rel.layout.feature_files()
    split = rel.split('train')
    for video_id, count in TIMELINE.items():
      rows = videos[video_id]
      last, n = count - 1, len(rows)
      picked = [min(round(i / last * (n - 1)) if last else i, n - 1) for i in range(count)]
      expected = np.array([rows[r].tolist() for r in picked])  # float64, as prvr-ea's reader
      assert split.num_frames(video_id) == count
      clips, frames = split.video_features(video_id)
      np.testing.assert_array_equal(clips, preprocess.l2_normalize(
          preprocess.average_to_fixed_length(expected)).astype(np.float32))
      np.testing.assert_array_equal(frames, preprocess.l2_normalize(
          preprocess.uniform_feature_sampling(expected)).astype(np.float32))
    query = split.caption_features('v1#enc#0')
    np.testing.assert_array_equal(query, preprocess.l2_normalize(cap_feats['v1#enc#0'][None]))


def test_frame_timeline_errors_name_the_file_and_the_id(tmp_path):
  root, _, _ = _timeline_release(tmp_path)
  timeline_file = os.path.join(root, 'FeatureData', 'i3d', 'video2frames.txt')
  with pytest.raises(ValueError, match="frame_map='i3d' reads the CLIP layout"):
    release.Release(root, 'act', 'i3d', 'roberta', frame_map='i3d')
  with pytest.raises(FileNotFoundError, match='FeatureData/i3d_rgb_lgi/video2frames.txt'):
    release.Release(root, 'act', None, 'clip', frame_map='i3d_rgb_lgi')
  timeline = release.read_video2frames(timeline_file)
  del timeline['v2']
  timeline['v1'][3] = 'v1_x'
  release.write_video2frames(timeline_file, timeline)
  with pytest.raises(DataError, match=rf"(?s)2 bad item.*video 'v1': frame id 'v1_x' in "
                     rf"{timeline_file} is not <video id>_<frame index>.*video 'v2' has no "
                     rf'frame list in {timeline_file}'):
    release.Release(root, 'act', None, 'clip', frame_map='i3d').split('train')
  with release.Release(root, 'act', None, 'clip', frame_map='i3d', skip_bad_items=True) as rel:
    split = rel.split('train')
    assert 'v1' not in split.video_ids and 'v2' not in split.video_ids
    with pytest.raises(DataError, match=rf"video 'v2' has no frame list in {timeline_file}"):
      split.video_features('v2')


def test_constructor_argument_errors(tvr):
  root, _, _ = tvr
  with pytest.raises(ValueError, match='text_feature'):
    release.Release(root, 'tvr', 'i3d_resnet', 'bert')
  with pytest.raises(ValueError, match='needs visual_feature'):
    release.Release(root, 'tvr')


def test_bad_moments_file_names_the_line(tmp_path):
  path = tmp_path / 'x.moments.txt'
  path.write_text('a#0 0 1 5\na#1 3 2 5\n')
  with pytest.raises(DataError, match=r'x\.moments\.txt:2'):
    release.read_moments(str(path))
