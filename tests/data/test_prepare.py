"""Feature shards: bit-exact round trip, determinism, resumption, TFDS builder, bad input."""

import json
import logging
import os
import shutil
import tempfile

import numpy as np
import pytest

import support
tf = support.require_tensorflow()
import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

from prvr_jax import files
from prvr_jax.data import check
from prvr_jax.data import pipeline
from prvr_jax.data import prepare
from prvr_jax.data import release as release_lib
from prvr_jax.data import shard_format
from prvr_jax.data import synthetic

DV, DQ = 12, 8


def _toy_release(root, bad_video=False):
  """Videos shorter than 32 and longer than 128 frames; captions longer than 30 tokens."""
  rng = np.random.default_rng(0)
  lengths = [5, 31, 32, 33, 127, 128, 129, 300, 64, 17, 90, 1]
  videos = {f'v{i}': rng.normal(size=(n, DV)).astype(np.float32) for i, n in enumerate(lengths)}
  train = [(f'v{i}#{j}', 'words here') for j in range(3) for i in range(8) if (i + j) % 3 or j == 0]
  test = [(f'v{i}#{j}', 'more words') for i in (11, 9, 10, 8) for j in range(2)]
  captions = {'train': train, 'test': test}
  feats = {c: rng.normal(size=(rng.integers(1, 45), DQ)).astype(np.float32)
           for items in captions.values() for c, _ in items}
  path = release_lib.write_release(root, 'toy', videos, captions, feats, visual_feature='feat')
  if bad_video:  # a test caption whose video has no frames
    v2f = release_lib.read_video2frames(os.path.join(path, 'FeatureData/feat/video2frames.txt'))
    del v2f['v9']
    release_lib.write_video2frames(os.path.join(path, 'FeatureData/feat/video2frames.txt'), v2f)
  with open(os.path.join(path, 'TextData', 'toytest.moments.txt'), 'w') as f:
    for cap_id, _ in test:
      duration = lengths[int(cap_id[1:].split('#')[0])] * 1.5
      f.write(f'{cap_id} 0 {duration / 2} {duration}\n')
  return path


@pytest.fixture(scope='module')
def toy(tmp_path_factory):
  base = tmp_path_factory.mktemp('toy')
  root = _toy_release(str(base / 'release'))
  out = str(base / 'shards')
  prepare.prepare_shards(root, out, collection='toy', visual_feature='feat', num_shards=3)
  return root, out


def test_round_trip_is_bit_exact(toy):
  root, out = toy
  shards = pipeline.open_shards(out)
  rel = release_lib.Release(root, 'toy', 'feat')
  for name in ('train', 'test'):
    split = rel.split(name)
    index = pipeline.eval_index(shards, name)
    assert index.video_ids == split.video_ids
    assert index.caption_ids == split.caption_ids
    np.testing.assert_array_equal(index.caption_video_index, split.caption_video_index())
    seen = 0
    for b in pipeline.eval_videos(shards, name, global_batch_size=5, process_index=0,
                                  process_count=1):
      for row, col in enumerate(b['video_index']):
        if col < 0:
          continue
        clips, frames = split.video_features(split.video_ids[col])
        n = len(frames)
        assert b['clip_feats'][row].tobytes() == clips.tobytes()
        assert b['frame_feats'][row, :n].tobytes() == frames.tobytes()
        assert not b['frame_feats'][row, n:].any()
        np.testing.assert_array_equal(b['frame_mask'][row], np.arange(128) < n)
        seen += 1
    assert seen == len(split.video_ids)
    rows = set()
    for b in pipeline.eval_queries(shards, name, global_batch_size=7, process_index=0,
                                   process_count=1):
      for slot, row in enumerate(b['query_index']):
        if row < 0:
          continue
        tokens = split.caption_features(split.caption_ids[row])
        n = len(tokens)
        assert b['query_feats'][slot, :n].tobytes() == tokens.tobytes()
        assert not b['query_feats'][slot, n:].any()
        np.testing.assert_array_equal(b['query_mask'][slot], np.arange(30) < n)
        assert b['query_video_index'][slot] == index.caption_video_index[row]
        rows.add(int(row))
    assert rows == set(range(len(split.caption_ids)))


def test_a_clip_config_prepares_its_construction_and_checks_it(tmp_path):
  """A `*_clip` config's reading of the CLIP release (frame timeline, L2 normalisation) is what
  its shards are made with, recorded in the manifest, and checked against the config."""
  rng = np.random.default_rng(1)
  videos = {f'v{i}': rng.normal(size=(n, 512)).astype(np.float32) for i, n in
            enumerate((3, 50, 140))}
  captions = {split: [(f'v{i}#{split}', 'words') for i in range(3)]
              for split in ('train', 'val', 'test')}
  feats = {c: rng.normal(size=(512,)).astype(np.float32)
           for items in captions.values() for c, _ in items}
  root = release_lib.write_release(str(tmp_path / 'release'), 'tvr', videos, captions, feats,
                                   text_feature='clip')
  release_lib.write_video2frames(
      os.path.join(root, 'FeatureData', 'i3d_resnet', 'video2frames.txt'),
      {v: [f'{v}_{i}' for i in range(n)] for v, n in (('v0', 9), ('v1', 20), ('v2', 300))})
  config = support.load_config('gmmformer', 'tvr_clip')
  config.data.dir, config.data.allow_split_overlap = root, True  # every split has every video
  out = str(tmp_path / 'shards')
  prepare.prepare_from_config(config, out)
  shards = pipeline.open_shards(out)
  assert shards.preprocessing['frame_map'] == 'i3d_resnet' and shards.preprocessing['normalize']
  split = release_lib.Release(root, 'tvr', None, 'clip', frame_map='i3d_resnet',
                              normalize=True).split('test')
  for b in pipeline.eval_videos(shards, 'test', global_batch_size=3, process_index=0,
                                process_count=1):
    for row, col in enumerate(b['video_index']):
      clips, frames = split.video_features(split.video_ids[col])
      assert b['clip_feats'][row].tobytes() == clips.tobytes()
      assert b['frame_feats'][row, :len(frames)].tobytes() == frames.tobytes()
  check.check_shards(shards, config)
  config.data.frame_map = ''
  with pytest.raises(ValueError, match=r"config.data.frame_map='' but the shards in .* were "
                     r"prepared with frame_map='i3d_resnet'"):
    check.check_shards(shards, config)
  config.data.frame_map, config.data.normalize = 'i3d_resnet', False
  with pytest.raises(ValueError, match=r'config.data.normalize=False but .* normalize=True'):
    check.check_shards(shards, config)


def test_manifest_and_spans(toy):
  _, out = toy
  with open(os.path.join(out, shard_format.MANIFEST)) as f:
    manifest = json.load(f)
  train, test = manifest['splits']['train'], manifest['splits']['test']
  assert manifest['complete'] and manifest['visual_dim'] == DV and manifest['query_dim'] == DQ
  # No frame timeline: the settings of the folders prepared before `frame_map` existed.
  assert 'frame_map' not in manifest['preprocessing']
  assert train['num_videos'] == 8 and sum(s['num_videos'] for s in train['shards']) == 8
  assert sum(s['num_captions'] for s in train['shards']) == train['num_captions']
  assert train['max_captions_per_video'] == 3 and not train['has_spans']
  for s in train['shards'] + test['shards']:
    assert files.sha256_file(os.path.join(out, s['file'])) == s['sha256']
  assert test['has_spans']
  index = pipeline.eval_index(pipeline.open_shards(out), 'test')
  assert index.has_spans
  np.testing.assert_allclose(index.durations[:2], [1.5, 1.5])  # v11 has one frame
  np.testing.assert_allclose(index.spans[:, 0], 0)
  np.testing.assert_allclose(index.spans[:, 1], index.durations / 2)


def test_records_are_canonical(toy):
  """Feature maps are serialised in key order, so shards are byte-identical across processes."""
  _, out = toy
  shards = pipeline.open_shards(out)
  for record in tf.data.TFRecordDataset([s.path for s in shards.split('train').shards]):
    data = record.numpy()
    assert tf.train.Example.FromString(data).SerializeToString(deterministic=True) == data


def test_resume_rebuilds_only_the_unfinished_split(toy, tmp_path):
  root, out = toy
  out2 = str(tmp_path / 'shards')
  shutil.copytree(out, out2)
  manifest_path = os.path.join(out2, shard_format.MANIFEST)
  with open(manifest_path) as f:
    manifest = json.load(f)
  train_file = os.path.join(out2, manifest['splits']['train']['shards'][0]['file'])
  train_mtime = os.stat(train_file).st_mtime_ns
  # An interruption while writing the test split: no TFDS folder, no manifest entry.
  shutil.rmtree(os.path.join(out2, 'prvr_features', 'toy-feat-test'))
  del manifest['splits']['test']
  manifest['complete'] = False
  with open(manifest_path, 'w') as f:
    json.dump(manifest, f)
  with pytest.raises(shard_format.ShardError, match='did not finish'):
    pipeline.open_shards(out2)
  prepare.prepare_shards(root, out2, collection='toy', visual_feature='feat', num_shards=3)
  assert os.stat(train_file).st_mtime_ns == train_mtime
  with open(manifest_path) as f, open(os.path.join(out, shard_format.MANIFEST)) as g:
    assert json.load(f) == json.load(g)  # the same bytes: identical sha256 everywhere
  with pytest.raises(shard_format.ShardError, match='other settings'):
    prepare.prepare_shards(root, out2, collection='toy', visual_feature='feat', max_frames=64)


def test_skip_bad_items_is_opt_in_and_reported(tmp_path, caplog):
  root = _toy_release(str(tmp_path / 'release'), bad_video=True)
  with pytest.raises(release_lib.DataError, match="'v9'"):
    prepare.prepare_shards(root, str(tmp_path / 'a'), collection='toy', visual_feature='feat')
  out = str(tmp_path / 'b')
  prepare.prepare_shards(root, out, collection='toy', visual_feature='feat', skip_bad_items=True)
  shards = pipeline.open_shards(out)
  test = shards.split('test')
  assert test.num_videos == 3 and test.num_captions == 6
  assert {item[0] for item in test.skipped} == {'v9', 'v9#0', 'v9#1'}
  with caplog.at_level(logging.WARNING):
    list(pipeline.eval_videos(shards, 'test', global_batch_size=4, process_index=0,
                              process_count=1))
  assert '3 bad item(s) were skipped' in caplog.text


def test_changed_release_is_rebuilt_and_counts_are_what_was_written(tmp_path):
  """Preparing again after the release changed rebuilds the changed split (never keeps stale
  shards); the manifest's counts are those of the written shards."""
  root = _toy_release(str(tmp_path / 'release'))
  out = str(tmp_path / 'shards')
  prepare.prepare_shards(root, out, collection='toy', visual_feature='feat', num_shards=2)
  test_file = os.path.join(root, 'TextData', 'toytest.caption.txt')
  captions = release_lib.read_captions(test_file)
  release_lib.write_captions(test_file, captions[:-3])  # the last 3 captions: all of v8
  prepare.prepare_shards(root, out, collection='toy', visual_feature='feat', num_shards=2)
  shards = pipeline.open_shards(out)
  split = shards.split('test')
  assert split.num_captions == len(captions) - 3 == sum(s.num_captions for s in split.shards)
  assert split.num_videos == 3 == len(pipeline.eval_index(shards, 'test').video_ids)
  rows = [r for b in pipeline.eval_queries(shards, 'test', global_batch_size=4,
                                           process_index=0, process_count=1)
          for r in b['query_index'] if r >= 0]
  assert len(rows) == split.num_captions


def test_out_folder_and_num_shards_are_checked(tmp_path):
  root = _toy_release(str(tmp_path / 'release'))
  with pytest.raises(ValueError, match=r'--num_shards=-3'):
    prepare.prepare_shards(root, str(tmp_path / 'a'), collection='toy', visual_feature='feat',
                           num_shards=-3)
  busy = tmp_path / 'home'
  busy.mkdir()
  (busy / 'notes.txt').write_text('mine')
  with pytest.raises(shard_format.ShardError, match='non-empty folder without manifest.json'):
    prepare.prepare_shards(root, str(busy), collection='toy', visual_feature='feat')
  assert os.listdir(busy) == ['notes.txt']


def test_training_videos_in_the_test_split_are_refused_unless_allowed(tmp_path, caplog):
  root = _toy_release(str(tmp_path / 'release'))
  test_file = os.path.join(root, 'TextData', 'toytest.caption.txt')
  release_lib.write_captions(test_file, release_lib.read_captions(test_file)
                             + [('v0#0', 'a training video')])
  with open(os.path.join(root, 'TextData', 'toytest.moments.txt'), 'a') as f:
    f.write('v0#0 0 1 2\n')
  with pytest.raises(shard_format.ShardError, match=r"train&test: 1 videos, e.g. \['v0'\]"):
    prepare.prepare_shards(root, str(tmp_path / 'a'), collection='toy', visual_feature='feat')
  with pytest.raises(shard_format.ShardError, match='did not finish'):
    pipeline.open_shards(str(tmp_path / 'a'))
  out = str(tmp_path / 'b')
  prepare.prepare_shards(root, out, collection='toy', visual_feature='feat',
                         allow_split_overlap=True)
  with caplog.at_level(logging.WARNING):
    shards = pipeline.open_shards(out)
  assert shards.split_overlaps == {'train&test': {'videos': 1, 'first': ['v0']}}
  assert 'shares videos with other splits' in caplog.text


def test_moments_of_some_captions_only_are_refused(tmp_path):
  root = _toy_release(str(tmp_path / 'release'))
  moments = os.path.join(root, 'TextData', 'toytest.moments.txt')
  with open(moments) as f:
    lines = f.readlines()
  with open(moments, 'w') as f:
    f.writelines(lines[1:])
  with pytest.raises(release_lib.DataError, match=r"moments for 7 of the 8 captions of split "
                     r"'test' \(first without: 'v11#0'\)"):
    prepare.prepare_shards(root, str(tmp_path / 'a'), collection='toy', visual_feature='feat')


def test_tfds_builder_with_manual_dir(tmp_path, monkeypatch):
  spec = synthetic.SIZES['tiny']
  data = synthetic.generate(spec, seed=3)
  root = str(tmp_path / 'release')
  synthetic.write_mssl(data, root)
  system_temp = tmp_path / 'system_temp'
  system_temp.mkdir()
  monkeypatch.setattr(tempfile, 'tempdir', str(system_temp))
  builder = tfds.builder('prvr_features/synthetic', data_dir=str(tmp_path / 'tfds'))
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=root))
  assert not list(system_temp.iterdir())  # nothing left in the system's temp folder
  assert set(builder.info.splits) == {'train', 'val', 'test'}
  assert builder.info.splits['test'].num_examples == spec.num_videos[2]
  rel = release_lib.Release(root, synthetic.COLLECTION, synthetic.VISUAL_FEATURE)
  split = rel.split('test')
  examples = list(tfds.as_numpy(builder.as_dataset(split='test')))
  assert [e['video_id'].decode() for e in examples] == split.video_ids
  first = examples[0]
  clips, frames = split.video_features(split.video_ids[0])
  np.testing.assert_array_equal(first['clip_feats'], clips)
  np.testing.assert_array_equal(first['frame_feats'], frames)
  caps = [split.caption_features(c) for c in split.captions_of(split.video_ids[0])]
  np.testing.assert_array_equal(first['caption_feats'], np.concatenate(caps))
  assert (first['spans'] >= 0).all() and first['duration'] > 0


def test_two_preparations_of_one_folder_are_not_run_at_once(tmp_path):
  from prvr_jax import files  # pylint: disable=g-import-not-at-top
  root = _toy_release(str(tmp_path / 'release'))
  out = tmp_path / 'shards'
  out.mkdir()
  with files.folder_lock(str(out), prepare.LOCK_FILE, 'test', '--out'):
    with pytest.raises(files.FolderBusyError, match=r'in use by another preparation of these '
                       r'shards \(.*"pid"'):
      prepare.prepare_shards(root, str(out), collection='toy', visual_feature='feat')
  prepare.prepare_shards(root, str(out), collection='toy', visual_feature='feat')  # then it can


# ---- streaming writer: pinned bytes, resumption, workers, TFDS metadata

_PINNED = json.loads((support.FIXTURES / 'shard_digests.json').read_text())


def _digests(out):
  """sha256 of every shard and index file of a shard folder, by path relative to it."""
  found = {}
  for root, _, names in os.walk(out):
    for name in names:
      if '.tfrecord-' in name or (name.startswith('index-') and name.endswith('.json')):
        path = os.path.join(root, name)
        found[os.path.relpath(path, out)] = files.sha256_file(path)
  return found


def _release_values_sha256(collection_dir):
  """A digest of a release's file names and values (HDF5 datasets by their arrays, so that
  another HDF5 library version writing other container bytes does not count)."""
  import hashlib  # pylint: disable=g-import-not-at-top
  import h5py  # pylint: disable=g-import-not-at-top
  digest = hashlib.sha256()
  for root, _, names in sorted(os.walk(collection_dir)):
    for name in sorted(names):
      path = os.path.join(root, name)
      digest.update(os.path.relpath(path, collection_dir).encode())
      if name.endswith('.hdf5'):
        with h5py.File(path, 'r') as f:
          for key in sorted(f):
            digest.update(key.encode())
            digest.update(np.asarray(f[key]).tobytes())
      else:
        with open(path, 'rb') as f:
          digest.update(f.read())
  return digest.hexdigest()


def test_shard_bounds_are_tfds_boundaries():
  from tensorflow_datasets.core.utils import shard_utils  # pylint: disable=g-import-not-at-top
  for n in (1, 2, 7, 12, 24, 100, 17435):
    for num_shards in {1, 2, 3, 5, 8, min(n, 69)} & set(range(1, n + 1)):
      bounds = prepare.shard_bounds(n, num_shards)
      assert bounds[0] == 0
      assert bounds[1:] == list(shard_utils.get_shard_boundaries(n, num_shards))
  with pytest.raises(ValueError, match='12 videos into 13 shards'):
    prepare.shard_bounds(12, 13)


def test_shards_match_pinned_digests(toy, tmp_path):
  """The shards are byte for byte those TFDS's writer made (tests/fixtures/shard_digests.json)."""
  _, out = toy
  assert _digests(out) == _PINNED['toy_num_shards_3']
  pinned = _PINNED['synthetic_tiny_seed0']
  root = str(tmp_path / 'release')
  collection_dir = synthetic.write_mssl(synthetic.generate(synthetic.SIZES['tiny'], seed=0), root)
  if _release_values_sha256(collection_dir) != pinned['release_values_sha256']:
    pytest.skip('the synthetic generator gives other float bits on this CPU kind (its matrix '
                'products), so its shards cannot match the pinned digests; the toy release did')
  out2 = str(tmp_path / 'shards')
  spec = synthetic.SIZES['tiny']
  prepare.prepare_shards(root, out2, collection=synthetic.COLLECTION,
                         visual_feature=synthetic.VISUAL_FEATURE, splits=('train', 'val', 'test'),
                         visual_dim=spec.visual_dim, query_dim=spec.query_dim)
  assert _digests(out2) == pinned['files']


def test_interrupted_split_resumes_with_only_the_missing_shards(toy, tmp_path, monkeypatch):
  """A killed run keeps its finished shards; the re-run verifies them, removes what it left
  unfinished, writes only what is missing or does not match, and gives the same bytes."""
  root, _ = toy
  out = str(tmp_path / 'shards')
  train_dir = os.path.join(out, 'prvr_features', 'toy-feat-train', '1.0.0')
  write_shard = prepare._write_shard
  written = []

  def killed_at_third_shard(split, moments, video_ids, path, serialize):
    if len(written) == 2:
      raise KeyboardInterrupt('killed')
    written.append(os.path.basename(path))
    return write_shard(split, moments, video_ids, path, serialize)

  monkeypatch.setattr(prepare, '_write_shard', killed_at_third_shard)
  with pytest.raises(KeyboardInterrupt):
    prepare.prepare_shards(root, out, collection='toy', visual_feature='feat', num_shards=3,
                           workers=1)
  with open(os.path.join(train_dir, prepare.PROGRESS_FILE)) as f:
    progress = json.load(f)
  names = [f'prvr_features-train.tfrecord-0000{i}-of-00003' for i in range(3)]
  assert [s['file'] for s in progress['shards'].values()] == names[:2]
  # What a SIGKILL leaves besides: a half-written shard, and a finished one damaged later.
  with open(os.path.join(train_dir, names[2] + prepare.PARTIAL_SUFFIX), 'wb') as f:
    f.write(b'half a record')
  with open(os.path.join(train_dir, names[1]), 'r+b') as f:
    f.truncate(100)
  kept_mtime = os.stat(os.path.join(train_dir, names[0])).st_mtime_ns

  written.clear()
  monkeypatch.setattr(prepare, '_write_shard', lambda *a: (written.append(
      os.path.basename(a[3])), write_shard(*a))[1])
  prepare.prepare_shards(root, out, collection='toy', visual_feature='feat', num_shards=3,
                         workers=1)
  assert written == names[1:] + [f'prvr_features-test.tfrecord-0000{i}-of-00003'
                                 for i in range(3)]
  assert os.stat(os.path.join(train_dir, names[0])).st_mtime_ns == kept_mtime
  assert _digests(out) == _PINNED['toy_num_shards_3']  # no partial file, no progress file left
  assert not os.path.exists(os.path.join(train_dir, prepare.PROGRESS_FILE))
  pipeline.open_shards(out)


def test_two_workers_write_the_same_files_and_tfds_reads_them(toy, tmp_path):
  root, out = toy
  out2 = str(tmp_path / 'shards')
  prepare.prepare_shards(root, out2, collection='toy', visual_feature='feat', num_shards=3,
                         splits=('train',), workers=2)
  pinned = {k: v for k, v in _PINNED['toy_num_shards_3'].items() if 'train' in k}
  assert _digests(out2) == pinned
  with pytest.raises(ValueError, match='--workers=0'):
    prepare.prepare_shards(root, out2, collection='toy', visual_feature='feat', workers=0)

  split_dir = os.path.join(out, 'prvr_features', 'toy-feat-test', '1.0.0')
  builder = tfds.builder_from_directory(split_dir)
  manifest = json.loads(open(os.path.join(out, shard_format.MANIFEST)).read())
  shards = manifest['splits']['test']['shards']
  assert builder.info.splits['test'].shard_lengths == [s['num_videos'] for s in shards]
  assert builder.info.splits['test'].num_bytes == sum(s['bytes'] - 16 * s['num_videos']
                                                      for s in shards)
  examples = list(tfds.as_numpy(builder.as_dataset(split='test')))
  index = pipeline.eval_index(pipeline.open_shards(out), 'test')
  assert [e['video_id'].decode() for e in examples] == index.video_ids
  assert [int(e['video_order']) for e in examples] == list(range(len(index.video_ids)))
  assert tfds.builder('prvr_features', data_dir=out).builder_config.name == 'tvr'


def test_rerun_of_a_finished_folder_starts_no_workers(toy, tmp_path, monkeypatch):
  root, out = toy
  out2 = str(tmp_path / 'shards')
  shutil.copytree(out, out2)

  def refuse(self):
    raise AssertionError('workers started for a finished folder')

  monkeypatch.setattr(prepare._Workers, 'start', refuse)
  prepare.prepare_shards(root, out2, collection='toy', visual_feature='feat', num_shards=3,
                         workers=2)
  assert _digests(out2) == _PINNED['toy_num_shards_3']
