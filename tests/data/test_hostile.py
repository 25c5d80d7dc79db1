"""Hostile data as a user might bring it: `check` reports what `prepare` refuses (one
validator), readers refuse declared sizes past the cap before allocating, and writers never
remove what they did not create. Every refusal's last line names the file and the id or key."""

import json
import os

import h5py
import numpy as np
import pytest

import support
from prvr_jax.data import check
from prvr_jax.data import release
from prvr_jax.data import shard_format

DV, DQ, FRAMES, CAPTIONS = support.TINY_RELEASE  # widths, frames per video, captions


def _write(root):
  """A tiny RoBERTa-layout release with moments for val; returns its collection folder."""
  rng = np.random.default_rng(0)
  videos = {v: rng.normal(size=(n, DV)).astype(np.float32) for v, n in FRAMES.items()}
  feats = {c: rng.normal(size=(4, DQ)).astype(np.float32)
           for items in CAPTIONS.values() for c, _ in items}
  path = release.write_release(str(root), 'tvr', videos, CAPTIONS, feats)
  _moments(path, 'v2#0 1 3 5\nv3#0 0 1 2\n')
  return path


def _moments(path, text):
  with open(os.path.join(path, 'TextData', 'tvrval.moments.txt'), 'w') as f:
    f.write(text)


def _config(root):
  config = support.load_config('ms_sl', 'tvr')
  config.data.dir = str(root)
  config.model.visual_dim, config.model.query_dim = DV, DQ
  return config


def _edit_h5(path, key, data):
  with h5py.File(path, 'a') as f:
    del f[key]
    f.create_dataset(key, data=data)


def _bin(path):
  return os.path.join(path, 'FeatureData', 'i3d_resnet', 'feature.bin')


def _nan_frame(path):
  """A NaN in the first frame row of v1 (row 3 of feature.bin)."""
  with open(_bin(path), 'r+b') as f:
    f.seek(3 * DV * 4)
    f.write(np.float32(np.nan).tobytes())


def _video2frames(path, text):
  with open(os.path.join(path, 'FeatureData', 'i3d_resnet', 'video2frames.txt'), 'w') as f:
    f.write(text)


def _queries(path):
  return os.path.join(path, 'TextData', 'roberta_tvr_query_feat.hdf5')


def _captions(path, split, text):
  with open(os.path.join(path, 'TextData', f'tvr{split}.caption.txt'), 'w') as f:
    f.write(text)


# (edit, substrings every report / error line must hold). The same line ends up in check's
# report and as the last line of prepare's error.
HOSTILE = {
    'two-spans': (lambda p: _moments(p, 'v2#0 1 3 5\nv3#0 0 1 2\nv2#0 1 4 5\n'),
                  ["tvrval.moments.txt:3: caption 'v2#0' has moment (1.0, 4.0, 5.0) here but "
                   '(1.0, 3.0, 5.0) on line 1']),
    'start-after-end': (lambda p: _moments(p, 'v2#0 3 1 5\nv3#0 0 1 2\n'),
                        ["tvrval.moments.txt:1: caption 'v2#0' needs 0 <= start <= end"]),
    'zero-duration': (lambda p: _moments(p, 'v2#0 0 0 0\nv3#0 0 1 2\n'),
                      ["tvrval.moments.txt:1: caption 'v2#0'", 'duration > 0']),
    'negative': (lambda p: _moments(p, 'v2#0 -1 1 5\nv3#0 0 1 2\n'),
                 ["tvrval.moments.txt:1: caption 'v2#0' needs 0 <= start"]),
    'nan-span': (lambda p: _moments(p, 'v2#0 nan 1 5\nv3#0 0 1 2\n'),
                 ["tvrval.moments.txt:1: caption 'v2#0' needs 0 <= start"]),
    'two-durations': (lambda p: _moments(p, 'v2#0 1 3 5\nv3#0 0 1 2\nv2#1 0 1 6\n'),
                      ["tvrval.moments.txt:3: video 'v2' has duration 6.0 here but 5.0 on "
                       'line 1']),
    'caption-left-out': (lambda p: _moments(p, 'v2#0 1 3 5\n'),
                         ["tvrval.moments.txt gives moments for 1 of the 2 captions of split "
                          "'val' (first without: 'v3#0')"]),
    'empty-caption': (lambda p: _captions(p, 'val', 'v2#0 a car\nv3#0   \n'),
                      ["tvrval.caption.txt:2: caption id 'v3#0' has no caption text"]),
    'duplicate-caption': (lambda p: _captions(p, 'val', 'v2#0 a car\nv3#0 rain\nv2#0 a bus\n'),
                          ["tvrval.caption.txt:3: duplicate caption id 'v2#0'"]),
    'duplicate-video': (lambda p: _video2frames(
        p, "{'v0': ['v0_0', 'v0_1', 'v0_2'], 'v1': ['v1_0'], 'v2': ['v2_0'], 'v3': ['v3_0'], "
           "'v1': ['v1_1']}"), ["video2frames.txt: video id 'v1' is listed twice"]),
    'int-features': (lambda p: _edit_h5(_queries(p), 'v2#0', np.ones((4, DQ), np.int32)),
                     ["caption 'v2#0' has int32 features in", 'roberta_tvr_query_feat.hdf5']),
    'nan-frame': (_nan_frame, ["video 'v1'", 'NaN/Inf', 'feature.bin']),
    'nan-caption': (lambda p: _edit_h5(_queries(p), 'v1#0', np.full((4, DQ), np.nan, np.float32)),
                    ['NaN/Inf', "'v1#0'", 'roberta_tvr_query_feat.hdf5']),
}


@pytest.mark.parametrize('name', list(HOSTILE))
def test_check_reports_what_prepare_refuses(tmp_path, name):
  """One validator: each hostile edit is a problem of `check` (the full one, as prvr-check runs
  it) and the refusal of `prepare`, both naming the file and the id."""
  from prvr_jax.data import prepare  # pylint: disable=g-import-not-at-top
  edit, parts = HOSTILE[name]
  path = _write(tmp_path / 'release')
  edit(path)
  config = _config(tmp_path / 'release')
  report = check.check_release(config, use_catalogue=False, progress=False)
  assert not report.ok, report.format()
  assert any(all(p in problem for p in parts) for problem in report.problems), report.format()
  with pytest.raises((release.DataError, shard_format.ShardError)) as e:
    prepare.prepare_from_config(config, str(tmp_path / 'shards'), num_shards=1)
  last = str(e.value).splitlines()[-1]
  assert all(p in last for p in parts), str(e.value)


def test_check_reports_moments_when_the_split_cannot_be_opened(tmp_path):
  """A bad moments file is reported even when the features cannot be read at all."""
  path = _write(tmp_path / 'release')
  _moments(path, 'v2#0 1 3 5\nv3#0 0 1 2\nv2#0 1 4 5\n')
  with open(_queries(path), 'wb') as f:
    f.write(b'not HDF5')
  report = check.cheap_check(_config(tmp_path / 'release'), use_catalogue=False)
  assert any("tvrval.moments.txt:3: caption 'v2#0' has moment" in p for p in report.problems), (
      report.format())


def test_repeated_identical_moment_line_is_kept_once(tmp_path):
  path = _write(tmp_path / 'release')
  _moments(path, 'v2#0 1 3 5\nv3#0 0 1 2\nv2#0 1 3 5\n')
  moments = release.read_moments(os.path.join(path, 'TextData', 'tvrval.moments.txt'))
  assert moments == {'v2#0': (1.0, 3.0, 5.0), 'v3#0': (0.0, 1.0, 2.0)}
  assert check.cheap_check(_config(tmp_path / 'release'), use_catalogue=False).ok


def test_frame_list_past_the_cap_is_refused_before_reading(tmp_path, monkeypatch):
  """A video2frames list asking for more rows than the cap (ids may repeat: a small file can
  ask for any number) is refused by check and by the reader, naming the video and the file."""
  path = _write(tmp_path / 'release')
  monkeypatch.setattr(release, 'MAX_FEATURE_ELEMENTS', 4 * DV)
  report = check.cheap_check(_config(tmp_path / 'release'), use_catalogue=False)
  assert any("video 'v1' declares features of shape (5, 6)" in p and 'video2frames.txt' in p
             for p in report.problems), report.format()
  bigfile = release.BigFile(os.path.dirname(_bin(path)))
  with pytest.raises(release.DataError) as e:
    bigfile.read(['v1_0'] * 5, "video 'v1'")
  last = str(e.value).splitlines()[-1]
  assert last.startswith("video 'v1' declares features of shape (5, 6)")
  assert last.endswith(_bin(path))


def test_hdf5_read_past_the_cap_is_refused_before_reading(tmp_path):
  """A dataset declaring [5,000,000, 512] in a small (compressed) file: refused from its
  metadata by `H5Features.read`, check and the split (naming the file and the caption)."""
  path = _write(tmp_path / 'release')
  with h5py.File(_queries(path), 'a') as f:
    del f['v1#0']
    f.create_dataset('v1#0', shape=(5_000_000, 512), dtype=np.float32, chunks=(4096, 512),
                     compression='gzip')
  assert os.path.getsize(_queries(path)) < 1 << 20
  queries = release.CaptionFeatures(_queries(path))
  with pytest.raises(release.DataError) as e:
    queries.read('v1#0')
  last = str(e.value).splitlines()[-1]
  assert last.startswith("caption id 'v1#0' declares features of shape (5000000, 512)")
  assert last.endswith(_queries(path))
  np.testing.assert_array_equal(queries.read('v0#0', [3, 0, 3]),
                                queries.read('v0#0')[[3, 0, 3]])
  with pytest.raises(release.DataError, match=r"caption id 'v0#0' has features of shape "
                                              r'\(4, 5\), rows \[4\] asked'):
    queries.read('v0#0', [4])
  queries.close()
  report = check.check_release(_config(tmp_path / 'release'), use_catalogue=False,
                               progress=False)
  assert any("'v1#0'" in p and 'declares features of shape (5000000, 512)' in p
             for p in report.problems), report.format()


# ---------------------------------------------------------------- writers


def test_release_writer_never_removes_a_foreign_partial_folder(tmp_path):
  foreign = tmp_path / 'tvr.partial'
  foreign.mkdir()
  (foreign / 'notes.txt').write_text('mine')
  with pytest.raises(FileExistsError) as e:
    release.write_release(str(tmp_path), 'tvr', {'v0': np.ones((2, DV), np.float32)},
                          {'train': [('v0#0', 'a')]}, {'v0#0': np.ones((1, DQ), np.float32)})
  assert str(e.value).splitlines()[-1].startswith(f'{foreign} exists and was not left by')
  assert os.listdir(foreign) == ['notes.txt']
  # One left by a killed writer (its marker) is replaced; the release holds no marker.
  os.remove(foreign / 'notes.txt')
  (foreign / release.PARTIAL_MARKER).write_text('')
  path = release.write_release(str(tmp_path), 'tvr', {'v0': np.ones((2, DV), np.float32)},
                               {'train': [('v0#0', 'a')]}, {'v0#0': np.ones((1, DQ), np.float32)})
  assert not foreign.exists()
  assert release.PARTIAL_MARKER not in os.listdir(path)


def test_prepare_refuses_its_input_and_a_foreign_manifest(tmp_path):
  from prvr_jax.data import prepare  # pylint: disable=g-import-not-at-top
  path = _write(tmp_path / 'release')
  before = sorted(os.listdir(path))
  for out in (path, str(tmp_path / 'release')):
    with pytest.raises(shard_format.ShardError) as e:
      prepare.prepare_shards(str(tmp_path / 'release'), out, collection='tvr')
    assert 'is (or holds) the release being read' in str(e.value).splitlines()[-1]
  assert sorted(os.listdir(path)) == before
  foreign = tmp_path / 'theirs'
  foreign.mkdir()
  manifest = {'format': 'someone.else', 'splits': {}}
  (foreign / 'manifest.json').write_text(json.dumps(manifest))
  (foreign / 'data.bin').write_bytes(b'x')
  with pytest.raises(shard_format.ShardError) as e:
    prepare.prepare_shards(str(tmp_path / 'release'), str(foreign), collection='tvr')
  last = str(e.value).splitlines()[-1]
  assert 'not a prvr_jax.shards manifest' in last and str(foreign / 'manifest.json') in last
  assert json.loads((foreign / 'manifest.json').read_text()) == manifest
  assert sorted(os.listdir(foreign)) == ['data.bin', 'manifest.json']


def test_synthetic_never_removes_a_foreign_folder(tmp_path):
  from prvr_jax.data import synthetic  # pylint: disable=g-import-not-at-top
  shard_dir = synthetic.shard_dir_of('tiny', str(tmp_path))
  os.makedirs(shard_dir)
  with open(os.path.join(shard_dir, 'notes.txt'), 'w') as f:
    f.write('mine')
  with pytest.raises(FileExistsError) as e:
    synthetic.ensure('tiny', str(tmp_path))
  assert str(e.value).splitlines()[-1].startswith(f'{shard_dir} exists but holds no synthetic')
  assert os.listdir(shard_dir) == ['notes.txt']


def test_clis_end_with_the_line_at_fault(tmp_path):
  """prvr-check and prvr-prepare on a caption with two spans: both fail, the last line of
  their output names the moments file, the line and the caption."""
  path = _write(tmp_path / 'release')
  _moments(path, 'v2#0 1 3 5\nv3#0 0 1 2\nv2#0 1 4 5\n')
  want = f"{path}/TextData/tvrval.moments.txt:3: caption 'v2#0' has moment"
  common = ('--config=configs/ms_sl.py:tvr', f'--config.data.dir={tmp_path / "release"}',
            f'--config.model.visual_dim={DV}', f'--config.model.query_dim={DQ}',
            '--config.data.check_published=False')
  proc = support.run_cli('prvr_jax/tools/check.py', *common, '--noprogress', cache_dir=None,
                         check=False, timeout=120)
  assert proc.returncode == 1, proc.stderr[-3000:]
  assert want in proc.stdout.splitlines()[-1], proc.stdout
  proc = support.run_cli('prvr_jax/tools/prepare.py', *common, f'--out={tmp_path / "shards"}',
                         cache_dir=None, check=False, timeout=120)
  assert proc.returncode != 0
  assert want in proc.stderr.strip().splitlines()[-1], proc.stderr[-3000:]


def test_update_record_never_replaces_a_file_that_is_no_record(tmp_path):
  """--record pointing at one of the release's files (or any other file) with --update_record:
  a problem naming the file, which is left byte for byte."""
  path = _write(tmp_path / 'release')
  target = _bin(path)
  with open(target, 'rb') as f:
    before = f.read()
  report = check.check_release(_config(tmp_path / 'release'), use_catalogue=False,
                               update_record=True, progress=False, record=target)
  assert any(p.startswith(f'{target}: not a checksum record') for p in report.problems), (
      report.format())
  with open(target, 'rb') as f:
    assert f.read() == before


def test_synthetic_replaces_only_its_own_folders(tmp_path):
  """`ensure` regenerates over a killed generation of its own (a synthetic shard manifest) but
  not over another release's shard folder of the same name."""
  from prvr_jax.data import synthetic  # pylint: disable=g-import-not-at-top
  shard_dir = synthetic.shard_dir_of('tiny', str(tmp_path))
  os.makedirs(shard_dir)
  manifest = {'format': shard_format.FORMAT, 'preprocessing': {'collection': 'tvr'}}
  with open(os.path.join(shard_dir, shard_format.MANIFEST), 'w') as f:
    json.dump(manifest, f)
  with pytest.raises(FileExistsError):
    synthetic.ensure('tiny', str(tmp_path))
  manifest['preprocessing']['collection'] = synthetic.COLLECTION
  with open(os.path.join(shard_dir, shard_format.MANIFEST), 'w') as f:
    json.dump(manifest, f)
  assert synthetic.ensure('tiny', str(tmp_path)) == shard_dir
  assert os.path.isfile(os.path.join(shard_dir, 'synthetic.json'))
  assert not [n for n in os.listdir(tmp_path) if '.release-' in n]  # its temporary release
