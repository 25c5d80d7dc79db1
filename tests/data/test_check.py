"""The feature-release catalogue and `prvr_jax.data.check` on tiny releases written on disk."""

import csv
import dataclasses
import logging
import os

import h5py
import numpy as np
import pytest

import support
from prvr_jax import config_lib
from prvr_jax.data import catalogue
from prvr_jax.data import check
from prvr_jax.data import shard_format
from prvr_jax.data import release
from prvr_jax.data.catalogue import Count

DV, DQ, FRAMES, CAPTIONS = support.TINY_RELEASE  # widths, frames per video, captions
COUNTS = (('train', Count(2, 3)), ('val', Count(2, 2)), ('test', Count(2, 2)))


def _write(root, collection='tvr', text_feature='roberta', frames=None,
           visual_feature='i3d_resnet'):
  rng = np.random.default_rng(0)
  videos = {v: rng.normal(size=(n, DV)).astype(np.float32) for v, n in (frames or FRAMES).items()}
  shape = (DQ,) if text_feature == 'clip' else (4, DQ)
  feats = {c: rng.normal(size=shape).astype(np.float32)
           for items in CAPTIONS.values() for c, _ in items}
  return release.write_release(str(root), collection, videos, CAPTIONS, feats,
                               visual_feature=visual_feature, text_feature=text_feature)


def _config(root, name='ms_sl', variant='tvr'):
  config = support.load_config(name, variant)
  config.data.dir = str(root)
  config.model.visual_dim, config.model.query_dim = DV, DQ
  return config


def _tiny(name='ms-sl/tvr', **changes):
  """The catalogue entry `name` with the tiny release's dims and counts."""
  return dataclasses.replace(catalogue.by_name(name),
                             **{'visual_dim': DV, 'query_dim': DQ, 'splits': COUNTS, **changes})


@pytest.fixture
def tvr(tmp_path):
  """A clean tiny TVR release (RoBERTa layout); returns its collection folder."""
  return _write(tmp_path)


def _only_problem(report, *parts):
  assert len(report.problems) == 1, report.format()
  for part in parts:
    assert part in report.problems[0], report.format()
  assert report.verdict == 'VERDICT: PROBLEMS (1)'


# ---------------------------------------------------------------- catalogue


def test_catalogue_covers_every_config_release():
  """Every dataset variant of every config finds its entry, with the config's dims."""
  found = set()
  for name in ('gmmformer', 'gmmformer_v2', 'ms_sl', 'amdnet', 'protoprvr', 'tmass'):
    module = support.load_config_module(name)
    for variant in set(module.PER_DATASET) & set(config_lib.DATASETS):
      config = module.get_config(variant)
      entry = catalogue.lookup(config)
      assert entry is not None, (name, variant)
      found.add(entry.name)
      if entry.layout != 'frames':
        assert (entry.visual_dim, entry.query_dim) == (
            config.model.visual_dim, config.model.query_dim), (name, variant)
        assert entry.layout == ('clip' if config.data.text_feature == 'clip' else 'bigfile')
  assert catalogue.lookup(support.load_config('ms_sl')) is None  # synthetic
  assert {'ms-sl/tvr', 'ms-sl/activitynet', 'ms-sl/charades', 'amdnet-clip/tvr',
          'qvhighlights', 'tmass-features/msrvtt', 'tmass-frames/didemo'} <= found
  tvr = catalogue.by_name('ms-sl/tvr')
  assert (tvr.collection, tvr.visual_feature, tvr.visual_dim, tvr.query_dim) == (
      'tvr', 'i3d_resnet', 3072, 768)
  assert tvr.split_counts == {'train': Count(17_435, 87_175), 'test': Count(2_179, 10_895)}
  assert catalogue.by_name('qvhighlights').split_counts['test'] == Count(474, 1_550)
  assert catalogue.by_name('ms-sl/charades').total == Count(6_670, 16_128)


# ---------------------------------------------------------------- the checks


def test_clean_release_passes_and_records_checksums(tvr, tmp_path):
  config = _config(tmp_path)
  cheap = check.cheap_check(config, _tiny())
  assert cheap.ok, cheap.format()
  assert cheap.counts == dict(COUNTS) and cheap.dims == {'visual': DV, 'query': DQ}
  full = check.check_release(config, _tiny(), progress=False)
  assert full.ok and full.full, full.format()
  assert full.format().splitlines()[-1] == 'VERDICT: OK'
  record = os.path.join(tvr, check.CHECKSUMS_FILE)
  assert 'recorded 8 files' in full.checksums and os.path.isfile(record)
  again = check.check_release(config, _tiny(), progress=False)
  assert again.ok and again.checksums.startswith('0 of 8 recorded file(s) changed')


def test_truncated_feature_file(tvr, tmp_path, caplog):
  path = os.path.join(tvr, 'FeatureData', 'i3d_resnet', 'feature.bin')
  with open(path, 'r+b') as f:
    f.truncate(os.path.getsize(path) - 4)
  report = check.cheap_check(_config(tmp_path), _tiny())
  _only_problem(report, path, 'truncated')
  config = _config(tmp_path)
  config.model.visual_dim, config.model.query_dim = 3072, 768  # the catalogue's: no dim problem
  with pytest.raises(release.DataError, match=r'(?s)3 problem.*feature.bin.*truncated'):
    check.check_before_run(config)  # the catalogue's counts are TVR's: 2 more problems
  config.data.skip_bad_items = True
  with caplog.at_level(logging.WARNING, logger=check.__name__):
    assert len(check.check_before_run(config).problems) == 3
  assert 'skip_bad_items=True: going on' in caplog.text


def test_missing_video(tvr, tmp_path):
  v2f = os.path.join(tvr, 'FeatureData', 'i3d_resnet', 'video2frames.txt')
  release.write_video2frames(v2f, {v: [f'{v}_{k}' for k in range(n)]
                                   for v, n in FRAMES.items() if v != 'v1'})
  report = check.cheap_check(_config(tmp_path), _tiny())
  _only_problem(report, "video 'v1' is not in", v2f)
  assert any("frame id(s) no caption file uses, e.g. 'v1_0'" in n for n in report.notes)


def test_wrong_split_count(tvr, tmp_path):
  counts = (('train', Count(2, 4)),) + COUNTS[1:]
  report = check.cheap_check(_config(tmp_path), _tiny(splits=counts))
  _only_problem(report, os.path.join(tvr, 'TextData', 'tvrtrain.caption.txt'),
                "split 'train' has 2 videos and 3 captions", 'has 2 / 4')
  # Charades-STA publishes only totals: distinct ids over all caption files (train + val/test).
  report = check.cheap_check(_config(tmp_path), _tiny(splits=(), total=Count(4, 6)))
  _only_problem(report, os.path.join(tvr, 'TextData'), '4 distinct videos and 5 captions')


def test_moments_file_leaving_captions_out(tvr, tmp_path):
  """The moments check `prepare` runs (`check.split_moments`) is part of the cheap check."""
  path = os.path.join(tvr, 'TextData', 'tvrtrain.moments.txt')
  with open(path, 'w') as f:
    f.write('v0#0 0 1 5\nv0#1 1 2 5\n')
  _only_problem(check.cheap_check(_config(tmp_path), _tiny()), path,
                "moments for 2 of the 3 captions of split 'train' (first without: 'v1#0')")
  with open(path, 'a') as f:
    f.write('v1#0 3 2 5\n')
  _only_problem(check.cheap_check(_config(tmp_path), _tiny()), f'{path}:3')


def test_dims_mismatch(tvr, tmp_path):
  report = check.cheap_check(_config(tmp_path), _tiny(visual_dim=7))
  _only_problem(report, os.path.join(tvr, 'FeatureData', 'i3d_resnet', 'shape.txt'),
                'visual feature dim 6', 'ms-sl/tvr has 7')
  config = _config(tmp_path)
  config.model.query_dim = 768
  report = check.cheap_check(config, _tiny())
  _only_problem(report, os.path.join(tvr, 'TextData', 'roberta_tvr_query_feat.hdf5'),
                'query feature dim 5', 'config.model.query_dim=768')


def test_nan_in_features_found_by_the_full_check(tvr, tmp_path):
  path = os.path.join(tvr, 'FeatureData', 'i3d_resnet', 'feature.bin')
  x = np.fromfile(path, '<f4').reshape(-1, DV)
  x[FRAMES['v0'] + FRAMES['v1'] + 1, 2] = np.nan  # frame v2_1
  x.tofile(path)
  with h5py.File(os.path.join(tvr, 'TextData', 'roberta_tvr_query_feat.hdf5'), 'r+') as f:
    f['v3#0'][0, 0] = np.inf
  config = _config(tmp_path)
  assert check.cheap_check(config, _tiny()).ok  # reads no value
  report = check.check_release(config, _tiny(), progress=False)
  assert len(report.problems) == 2, report.format()
  assert f"{path}: NaN/Inf in 1 frame row(s) of video 'v2', e.g. frame id 'v2_1'" in report.problems
  assert any('roberta_tvr_query_feat.hdf5: NaN/Inf in the features of caption id' in p
             and "'v3#0'" in p for p in report.problems)


def test_checksum_record_detects_a_changed_file(tvr, tmp_path):
  config = _config(tmp_path)
  assert check.check_release(config, _tiny(), progress=False).ok
  captions = os.path.join(tvr, 'TextData', 'tvrval.caption.txt')
  with open(captions, 'r+', encoding='utf-8') as f:
    text = f.read()
    f.seek(0)
    f.write(text.replace('a car', 'a cat'))  # same size: only the checksum sees it
  assert check.cheap_check(config, _tiny()).ok
  report = check.check_release(config, _tiny(), progress=False)
  _only_problem(report, captions, 'content changed since its checksum was recorded')
  assert report.checksums.startswith('1 of 8 recorded file(s) changed')
  assert check.check_release(config, _tiny(), update_record=True, progress=False).ok
  assert check.check_release(config, _tiny(), progress=False).ok
  with open(captions, 'a', encoding='utf-8') as f:
    f.write('\n')  # blank line: still a valid caption file, one byte longer
  _only_problem(check.cheap_check(config, _tiny()), captions, 'bytes', 'when its checksum')


def test_clip_layout_frame_count_and_nan(tmp_path):
  """T-MASS features (AMDNet's CLIP layout): 12 frames a video, values checked per video."""
  frames = {**{v: 12 for v in FRAMES}, 'v1': 11}
  root = _write(tmp_path, 'msrvtt', text_feature='clip', frames=frames)
  path = os.path.join(root, 'FeatureData', 'new_clip_vit_32_msrvtt_vid_features.hdf5')
  with h5py.File(path, 'r+') as f:
    f['v3'][4, 0] = np.nan
  config = _config(tmp_path, 'tmass', 'msrvtt_features')
  report = check.check_release(config, _tiny('tmass-features/msrvtt'), progress=False)
  assert len(report.problems) == 2, report.format()
  assert report.problems[0] == (f"{path}: video 'v1' has 11 frame features, "
                                'tmass-features/msrvtt has 12 per video')
  assert report.problems[1].startswith(f"{path}: NaN/Inf in the features of video id 'v3'")


def test_nothing_to_check_and_missing_files(tmp_path):
  synthetic = check.check_release(support.load_config('ms_sl'), progress=False)
  assert synthetic.ok and synthetic.verdict == 'VERDICT: NOTHING TO CHECK'
  assert 'synthetic benchmark' in synthetic.nothing_to_check
  (tmp_path / 'shards').mkdir()
  (tmp_path / 'shards' / shard_format.MANIFEST).write_text('{}')
  shards = check.cheap_check(_config(tmp_path / 'shards'))
  assert shards.ok and 'prepared shard folder' in shards.nothing_to_check
  # The QVHighlights build's moments files are part of its release.
  root = _write(tmp_path / 'qvh', 'qvhighlights', text_feature='clip_text',
                visual_feature='slowfast_clip')
  config = _config(tmp_path / 'qvh', 'protoprvr', 'qvhighlights')
  report = check.cheap_check(config, _tiny('qvhighlights'))
  assert len(report.problems) == 3, report.format()
  assert report.problems[0] == (f'{root}/TextData/qvhighlightstrain.moments.txt: missing (a '
                                'file of qvhighlights)')
  os.remove(os.path.join(root, 'TextData', 'clip_text_qvhighlights_query_feat.hdf5'))
  report = check.cheap_check(config, _tiny('qvhighlights'))
  assert 'clip_text_qvhighlights_query_feat.hdf5' in report.problems[0], report.format()


def test_annotations_and_frame_folders(tmp_path):
  """T-MASS end to end (config.data.source='frames'): counts from the official readers, one
  frame folder with images per video."""
  support.require_tensorflow()
  videos = {'train': ['a', 'b', 'c'], 'test': ['d', 'e']}
  for split, names in videos.items():
    with open(tmp_path / f'didemo_{split}_label.csv', 'w', encoding='utf-8', newline='') as f:
      csv.writer(f).writerows(
          [['success', 'video_path', 'starts', 'ends', 'text', 'formatted_data']]
          + [['True', f'videos/{v}.mp4', '0', '31', f'text {v}', f'{split}_data_id_{k}.pth']
             for k, v in enumerate(names)])
  for v in 'abcd':  # no folder for 'e'
    (tmp_path / 'frames' / v).mkdir(parents=True)
    (tmp_path / 'frames' / v / '0001.jpg').write_bytes(b'')  # listed, never decoded
  config = support.load_config('tmass', 'didemo')
  config.data.annotations, config.data.frames_dir = str(tmp_path), str(tmp_path / 'frames')
  counts = (('train', Count(3, 3)), ('val', Count(2, 2)), ('test', Count(3, 3)))
  report = check.check_release(config, _tiny('tmass-frames/didemo', splits=counts),
                               progress=False)
  assert report.counts == {'train': Count(3, 3), 'val': Count(2, 2), 'test': Count(2, 2)}
  assert len(report.problems) == 2, report.format()
  assert report.problems[0].startswith(
      f"{tmp_path / 'didemo_test_label.csv'}: split 'test' (didemo test) has 2 videos")
  assert report.problems[1] == (f"video 'e': frame folder {tmp_path / 'frames' / 'e'} does not "
                                'exist')


@pytest.mark.parametrize('unpublished', ['--nocatalogue', '--config.data.check_published=False'])
def test_cli_exits_nonzero_on_a_bad_release(tvr, tmp_path, unpublished):
  path = os.path.join(tvr, 'FeatureData', 'i3d_resnet', 'feature.bin')
  with open(path, 'r+b') as f:
    f.truncate(10)
  # A release of its own: either switch leaves the catalogue's published sizes out, so the
  # truncated file is the one problem.
  proc = support.run_cli('prvr_jax/tools/check.py', '--config=configs/ms_sl.py:tvr',
                         f'--config.data.dir={tmp_path}', f'--config.model.visual_dim={DV}',
                         f'--config.model.query_dim={DQ}', unpublished, '--noprogress',
                         cache_dir=None, check=False, timeout=120)
  assert proc.returncode == 1, proc.stderr[-3000:]
  lines = proc.stdout.splitlines()
  assert lines[0] == f'full check of {tvr}'
  assert 'VERDICT: PROBLEMS (1)' in lines and path in lines[-1] and 'truncated' in lines[-1]
