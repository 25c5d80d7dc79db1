"""MSC-PRVR's own HDF5 files (layouts 'msc_clip_l14', 'msc_slowfast_clip'), written here in
the official layout: the reader gives the stored arrays, ActivityNet's `v_` rule, the
validator, and bad files' errors naming the file and the id."""

import os

import h5py
import numpy as np
import pytest

from prvr_jax.data import check
from prvr_jax.data import preprocess
from prvr_jax.data import release
from prvr_jax.data.release import DataError

DV, DQ = 6, 5
FRAMES = {'v_a1': 3, 'v_b2': 150, 'v_c3': 40, 'v_d4': 9}
CAPTIONS = {
    'train': [('v_a1#0', 'a person walks'), ('v_b2#0', 'b'), ('v_b2#1', 'c d')],
    'val': [('v_c3#0', 'e'), ('v_d4#0', 'a person walks'), ('v_c3#1', 'f')],
}


def write_msc(root, collection, videos, captions, tokens, text_feature='msc_clip_l14'):
  """The official folder: `<root>/<collection>/{FeatureData,TextData}/`, a video HDF5 keyed
  by video id (ActivityNet: without `v_`), a query HDF5 keyed by cap_id, caption files."""
  video_name, text_name = release.MSC_FEATURE_FILES[text_feature]
  folder = os.path.join(root, collection)
  for sub in ('FeatureData', 'TextData'):
    os.makedirs(os.path.join(folder, sub), exist_ok=True)
  with h5py.File(os.path.join(folder, 'FeatureData', video_name % collection), 'w') as f:
    for v, x in videos.items():
      f[v[2:] if collection == 'activitynet' else v] = x
  with h5py.File(os.path.join(folder, 'TextData', text_name % collection), 'w') as f:
    for c, x in tokens.items():
      f[c] = x
  for split, items in captions.items():
    with open(os.path.join(folder, 'TextData', f'{collection}{split}.caption.txt'), 'w') as f:
      f.writelines(f'{c} {t}\n' for c, t in items)
  return folder


def _data(seed=0):
  rng = np.random.default_rng(seed)
  videos = {v: rng.normal(size=(n, DV)).astype(np.float32) for v, n in FRAMES.items()}
  caps = sorted({c for items in CAPTIONS.values() for c, _ in items})
  tokens = {c: rng.normal(size=(int(rng.integers(2, 90)), DQ)).astype(np.float32)
            for c in caps}
  return videos, tokens


@pytest.fixture
def anet(tmp_path):
  videos, tokens = _data()
  folder = write_msc(str(tmp_path), 'activitynet', videos, CAPTIONS, tokens)
  return str(tmp_path), folder, videos, tokens


def _open(root, **kw):
  return release.Release(root, 'activitynet', None, 'msc_clip_l14', **kw)


def test_reads_the_stored_arrays_with_the_v_rule(anet):
  """Videos by their id without `v_`, query tokens by cap_id, as stored (normalize=False) or
  L2-normalised (the default, as the official loader); the 77 CLIP positions kept."""
  root, folder, videos, tokens = anet
  with _open(root, normalize=False, max_query_len=77, visual_dim=DV, query_dim=DQ) as rel:
    assert rel.layout.clip_video_feature_path == os.path.join(
        folder, 'FeatureData', 'activitynet_clip_L14.h5')
    assert rel.layout.query_feature_path == os.path.join(
        folder, 'TextData', 'activitynet_clip_L14.h5')
    val = rel.split('val')
    assert val.video_ids == ['v_c3', 'v_d4'] and val.visual_dim == DV and val.query_dim == DQ
    for v in val.video_ids:
      np.testing.assert_array_equal(val.raw_video_features(v), videos[v])
      assert val.num_frames(v) == FRAMES[v]
    clips, _ = val.video_features('v_c3')
    np.testing.assert_array_equal(clips, preprocess.average_to_fixed_length(videos['v_c3']))
    for c in val.caption_ids:
      np.testing.assert_array_equal(val.caption_features(c), tokens[c][:77])
  with _open(root) as rel:
    x = rel.split('train').caption_features('v_b2#1')
    np.testing.assert_allclose(np.linalg.norm(x, axis=-1), 1.0, rtol=1e-5)


def test_qvhighlights_files(tmp_path):
  """QVHighlights: `qvhighlight_slowfast_clip.h5` / `..._slowfast_clip_text.h5`, ids as
  stored (no `v_` rule outside ActivityNet)."""
  videos, tokens = _data(1)
  write_msc(str(tmp_path), 'qvhighlight', videos, CAPTIONS, tokens, 'msc_slowfast_clip')
  with release.Release(str(tmp_path), 'qvhighlight', None, 'msc_slowfast_clip',
                       normalize=False) as rel:
    assert rel.layout.clip_video_feature_path.endswith('FeatureData/qvhighlight_slowfast_clip.h5')
    assert rel.layout.query_feature_path.endswith('TextData/qvhighlight_slowfast_clip_text.h5')
    split = rel.split('train')
    np.testing.assert_array_equal(split.raw_video_features('v_b2'), videos['v_b2'])
    np.testing.assert_array_equal(split.caption_features('v_b2#0'), tokens['v_b2#0'][:30])


def test_bad_files_name_the_file_and_the_id(anet):
  root, folder, _, _ = anet
  video_file = os.path.join(folder, 'FeatureData', 'activitynet_clip_L14.h5')
  query_file = os.path.join(folder, 'TextData', 'activitynet_clip_L14.h5')
  with h5py.File(video_file, 'a') as f:
    del f['c3']
  with pytest.raises(DataError, match=rf"video 'v_c3' \(as key 'c3'\) is not in {video_file}"):
    _open(root).split('val')
  with h5py.File(video_file, 'a') as f:
    f['c3'] = np.ones((4, DV + 1), np.float32)
  with pytest.raises(DataError, match=rf"config.model.visual_dim={DV} but {video_file} "
                     rf"\(video id 'v_c3', key 'c3'\) has feature dim {DV + 1}"):
    _open(root, visual_dim=DV).split('val')
  with h5py.File(video_file, 'a') as f:
    del f['c3']
    f['c3'] = np.ones((4, DV), np.float32)
    f['d4'][1, 2] = np.nan
  with h5py.File(query_file, 'a') as f:
    del f['v_c3#1']
    f['v_c3#1'] = np.ones((DQ,), np.float32)  # a sentence vector: not this layout's tokens
  with pytest.raises(DataError, match=rf"caption 'v_c3#1' has no token features .*{query_file}"):
    _open(root).split('val')
  with h5py.File(query_file, 'a') as f:
    del f['v_c3#1']
    f.create_dataset('v_c3#1', shape=(1 << 20, 1 << 7), dtype=np.float32)  # declares 512 MiB
  with pytest.raises(DataError, match=rf"caption 'v_c3#1' declares .* in {query_file}, .*refused"):
    _open(root).split('val')
  with h5py.File(query_file, 'a') as f:
    del f['v_c3#1']
    f['v_c3#1'] = np.ones((3, DQ), np.float32)
  with _open(root) as rel:
    with pytest.raises(DataError, match=rf"video 'v_d4': NaN/Inf in frame 1 .*{video_file} "
                       r"\(key 'd4'\)"):
      rel.split('val').video_features('v_d4')
  os.remove(query_file)
  with pytest.raises(FileNotFoundError, match=r'activitynet_clip_L14\.h5'):
    _open(root)


def test_the_layouts_are_read_only(tmp_path):
  with pytest.raises(ValueError, match="text_feature='msc_clip_l14'"):
    release.ReleaseWriter(str(tmp_path), 'tvr', None, 'msc_clip_l14')


def test_validator_checks_the_files(anet):
  """`prvr_jax.data.check` on an MSC-PRVR config: a good release passes, a missing video is
  named with its file."""
  from configs import msc_prvr  # pylint: disable=g-import-not-at-top
  root, folder, _, _ = anet
  config = msc_prvr.get_config('activitynet_l14')
  config.data.dir = root
  config.model.update(visual_dim=DV, query_dim=DQ)
  report = check.check_release(config, progress=False)
  assert report.ok, report.problems
  with h5py.File(os.path.join(folder, 'FeatureData', 'activitynet_clip_L14.h5'), 'a') as f:
    del f['b2']
  report = check.check_release(config, progress=False)
  assert any("'v_b2'" in p and 'activitynet_clip_L14.h5' in p for p in report.problems), (
      report.problems)
