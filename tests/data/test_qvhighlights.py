"""QVHighlights converter: merged videos, shifted windows, the release it writes, bad input,
and the paper's counts on the real annotations (PRVR_QVHIGHLIGHTS_ANNOTATIONS)."""

import json
import os

import h5py
import numpy as np
import pytest

import support
support.require_tensorflow()

from prvr_jax.data import pipeline
from prvr_jax.data import shard_format
from prvr_jax.data import prepare
from prvr_jax.data import qvhighlights as qvh
from prvr_jax.data import release as release_lib
from support import assert_close, f32_rtol

DataError = release_lib.DataError
SEG_A60, SEG_A210 = 'ab_c-1_60.0_210.0', 'ab_c-1_210.0_360.0'  # a YouTube id with '_' and '-'
SEG_X, SEG_V60, SEG_V360 = 'XyZ_60.0_210.0', 'Vv1_60.0_210.0', 'Vv1_360.0_510.0'
# (SlowFast rows, CLIP rows): both cut to the shorter, and to 75 clips.
CLIPS = {SEG_A60: (76, 77), SEG_A210: (66, 65), SEG_X: (72, 72), SEG_V60: (75, 75),
         SEG_V360: (75, 74)}
ROWS = {SEG_A60: 75, SEG_A210: 65, SEG_X: 72, SEG_V60: 75, SEG_V360: 74}


def _row(qid, vid, windows, duration=150, query='a person talks'):
  return {'qid': qid, 'query': query, 'duration': duration, 'vid': vid,
          'relevant_clip_ids': [0], 'saliency_scores': [[1, 2, 3]], 'relevant_windows': windows}


TRAIN = [
    _row(1, SEG_A210, [[10, 20], [40, 50]], duration=130),  # later segment first, two windows
    _row(2, SEG_A60, [[0, 150]]),
    _row(3, SEG_X, [[140, 150]]),  # its features end at 144 s: cut there
    _row(4, SEG_A60, [[30, 32]], query='  spaced\tout  query '),
]
VAL = [_row(10, SEG_V360, [[2, 4]], duration=148), _row(11, SEG_V60, [[100, 148]])]


def _write_jsonl(path, rows):
  with open(path, 'w') as f:
    f.write('\n'.join(r if isinstance(r, str) else json.dumps(r) for r in rows) + '\n')


def _fake_release(root, train=TRAIN, val=VAL, clips=None, seed=0):
  """Annotation and feature folders in Moment-DETR's layout; returns them and the arrays."""
  rng = np.random.default_rng(seed)
  ann, feat = os.path.join(root, 'data'), os.path.join(root, 'features')
  for d in (ann, *(os.path.join(feat, s) for s in (qvh.SLOWFAST_DIR, qvh.CLIP_DIR, qvh.TEXT_DIR))):
    os.makedirs(d)
  _write_jsonl(os.path.join(ann, 'highlight_train_release.jsonl'), train)
  _write_jsonl(os.path.join(ann, 'highlight_val_release.jsonl'), val)
  arrays = {}
  for vid, (n_sf, n_clip) in (clips or CLIPS).items():
    sf_path, clip_path = qvh.feature_paths(feat, vid)
    arrays[vid] = (rng.normal(size=(n_sf, qvh.SLOWFAST_DIM)).astype(np.float32),
                   rng.normal(size=(n_clip, qvh.CLIP_DIM)).astype(np.float16))
    np.savez(sf_path, features=arrays[vid][0])
    np.savez(clip_path, features=arrays[vid][1])
  for r in list(train) + list(val):
    if isinstance(r, dict):
      tokens = rng.normal(size=(int(rng.integers(3, 40)), qvh.QUERY_DIM)).astype(np.float32)
      arrays[r['qid']] = tokens
      np.savez(qvh.text_feature_path(feat, r['qid']), last_hidden_state=tokens,
               pooler_output=tokens[-1])
  return ann, feat, arrays


def _l2(x):
  x = np.asarray(x, np.float32)
  return x / (np.linalg.norm(x, axis=-1, keepdims=True) + np.float32(1e-5))


@pytest.fixture(scope='module')
def built(tmp_path_factory):
  base = str(tmp_path_factory.mktemp('qvh'))
  ann, feat, arrays = _fake_release(base)
  out = os.path.join(base, 'out')
  counts = qvh.build_release(ann, feat, out)
  return out, counts, arrays


def _read(path):
  with open(path) as f:
    return f.read().splitlines()


def test_counts_and_caption_files(built):
  out, counts, _ = built
  assert counts == {
      'train': qvh.SplitCounts(videos=2, queries=4, segments=3, clipped_windows=1),
      'val': qvh.SplitCounts(videos=1, queries=2, segments=2, clipped_windows=0),
      'test': qvh.SplitCounts(videos=1, queries=2, segments=2, clipped_windows=0)}
  text = os.path.join(out, 'qvhighlights', 'TextData')
  # Grouped by video (first appearance), file order within a video; whitespace collapsed.
  assert _read(os.path.join(text, 'qvhighlightstrain.caption.txt')) == [
      'ab_c-1#1 a person talks', 'ab_c-1#2 a person talks', 'ab_c-1#4 spaced out query',
      'XyZ#3 a person talks']
  val = _read(os.path.join(text, 'qvhighlightsval.caption.txt'))
  assert val == ['Vv1#10 a person talks', 'Vv1#11 a person talks']
  assert _read(os.path.join(text, 'qvhighlightstest.caption.txt')) == val


def test_moments_are_shifted_by_the_preceding_segments(built):
  out, _, _ = built
  text = os.path.join(out, 'qvhighlights', 'TextData')
  moments = release_lib.read_moments(os.path.join(text, 'qvhighlightstrain.moments.txt'))
  # ab_c-1: segment 60 (75 clips, 150 s) then segment 210 (65 clips, 130 s) -> 280 s.
  assert moments == {'ab_c-1#1': (160.0, 200.0, 280.0),  # [10, 20], [40, 50] + 150 s
                     'ab_c-1#2': (0.0, 150.0, 280.0),
                     'ab_c-1#4': (30.0, 32.0, 280.0),
                     'XyZ#3': (140.0, 144.0, 144.0)}  # cut at the end of its 72 clips
  # Vv1: the gap 210-360 in the source is closed; segment 360 starts at 150 s.
  val = release_lib.read_moments(os.path.join(text, 'qvhighlightsval.moments.txt'))
  assert val == {'Vv1#10': (152.0, 154.0, 298.0), 'Vv1#11': (100.0, 148.0, 298.0)}
  assert release_lib.read_moments(os.path.join(text, 'qvhighlightstest.moments.txt')) == val


def test_frames_are_the_segments_clips_in_time_order(built):
  out, _, arrays = built
  rel = release_lib.Release(out, 'qvhighlights', 'slowfast_clip', 'clip_text',
                            visual_dim=2816, query_dim=512)
  assert rel.normalize and rel.splits == ('train', 'val', 'test')
  split = rel.split('train')
  assert split.video_ids == ['ab_c-1', 'XyZ'] and (split.visual_dim, split.query_dim) == (2816, 512)
  frames = rel.video2frames['ab_c-1']
  assert frames == [f'{SEG_A60}_{k}' for k in range(75)] + [f'{SEG_A210}_{k}' for k in range(65)]
  expected = np.concatenate([
      np.concatenate([_l2(arrays[vid][0][:ROWS[vid]]), _l2(arrays[vid][1][:ROWS[vid]])], axis=1)
      for vid in (SEG_A60, SEG_A210)])
  raw = split.raw_video_features('ab_c-1')
  assert raw.shape == (140, 2816)
  assert_close(raw, expected, f32_rtol(qvh.SLOWFAST_DIM))
  assert split.num_frames('XyZ') == 72 and rel.split('val').num_frames('Vv1') == 149
  clips, frames = split.video_features('ab_c-1')
  assert clips.shape == (32, 2816) and frames.shape == (128, 2816)
  tokens = split.caption_features('ab_c-1#1')
  raw_tokens = arrays[1]
  assert tokens.shape == (min(len(raw_tokens), 30), 512)
  assert_close(tokens, _l2(raw_tokens[:30]), f32_rtol(qvh.QUERY_DIM))
  with h5py.File(rel.layout.query_feature_path) as f:
    assert rel.layout.query_feature_path.endswith('TextData/clip_text_qvhighlights_query_feat.hdf5')
    assert sorted(f) == sorted(['ab_c-1#1', 'ab_c-1#2', 'ab_c-1#4', 'XyZ#3', 'Vv1#10', 'Vv1#11'])
    np.testing.assert_array_equal(f['XyZ#3'][...], arrays[3])  # stored raw


def test_prepare_builds_shards(built, tmp_path):
  out, _, _ = built
  shards_dir = str(tmp_path / 'shards')
  prepare.prepare_shards(out, shards_dir, collection='qvhighlights',
                         visual_feature='slowfast_clip', text_feature='clip_text',
                         visual_dim=2816, query_dim=512, num_shards=1)
  shards = pipeline.open_shards(shards_dir)
  assert shards.preprocessing['text_feature'] == 'clip_text'
  assert {k: (s.num_videos, s.num_captions) for k, s in shards.splits.items()} == {
      'train': (2, 4), 'val': (1, 2), 'test': (1, 2)}
  index = pipeline.eval_index(shards, 'test')
  np.testing.assert_array_equal(index.spans, [[152, 154], [100, 148]])
  np.testing.assert_array_equal(index.durations, [298, 298])


def test_merge_is_pure_and_a_shared_source_is_one_video():
  """A source in train and val: one video of all its segments, reported as an overlap."""
  train = [qvh.parse_query(_row(1, SEG_A210, [[0, 2]]), 'train:1')]
  val = [qvh.parse_query(_row(2, SEG_A60, [[4, 6]]), 'val:1')]
  tables = qvh.merge_videos({'train': train, 'val': val}, {SEG_A60: 100.0, SEG_A210: 50.0})
  (tv,), (vv,) = tables['train'], tables['val']
  assert [s.vid for s in tv.segments] == [s.vid for s in vv.segments] == [SEG_A60, SEG_A210]
  assert tv.captions[0].windows == ((100.0, 102.0),) and vv.captions[0].windows == ((4.0, 6.0),)
  assert tv.duration == vv.duration == 150.0
  assert qvh.split_overlaps(tables) == {'train&val': ['ab_c-1']}


def test_a_source_in_train_and_val_is_built_and_then_refused_by_prepare(tmp_path, caplog):
  seg_x2 = 'XyZ_210.0_360.0'
  ann, feat, _ = _fake_release(str(tmp_path), val=VAL + [_row(12, seg_x2, [[0, 2]])],
                               clips={**CLIPS, seg_x2: (10, 10)})
  out = str(tmp_path / 'out')
  with caplog.at_level('WARNING'):
    counts = qvh.build_release(ann, feat, out)
  assert "train&val share 1 YouTube source(s) (e.g. ['XyZ'])" in caplog.text
  assert counts['train'].segments == 4 and counts['val'].videos == 2
  rel = release_lib.Release(out, 'qvhighlights', 'slowfast_clip', 'clip_text')
  assert rel.split('train').num_frames('XyZ') == rel.split('val').num_frames('XyZ') == 82
  kwargs = dict(collection='qvhighlights', visual_feature='slowfast_clip',
                text_feature='clip_text', num_shards=1)
  with pytest.raises(shard_format.ShardError, match=r"train&test: 1 videos, e.g. \['XyZ'\]; "
                     r"train&val: 1 videos"):
    prepare.prepare_shards(out, str(tmp_path / 'a'), **kwargs)
  prepare.prepare_shards(out, str(tmp_path / 'b'), allow_split_overlap=True, **kwargs)


@pytest.mark.parametrize('edit, error, pattern', [
    (lambda t: t.__setitem__(1, '{"qid": 2, '), DataError,
     r'highlight_train_release.jsonl:2: not a JSON line'),
    (lambda t: t[0].pop('relevant_windows'), DataError,
     r"highlight_train_release.jsonl:1: qid 1: missing key\(s\) \['relevant_windows'\]"),
    (lambda t: t[0].update(vid='ab_c-1_60.0'), DataError,
     r"jsonl:1: qid 1: vid 'ab_c-1_60.0' is not <youtube_id>_<start>_<end>"),
    (lambda t: t[2].update(relevant_windows=[[140, 152]]), DataError,
     r'jsonl:3: qid 3: window \[140, 152\] is outside its segment XyZ_60.0_210.0'),
    (lambda t: t[3].update(qid=2), DataError,
     r'jsonl:4: duplicate qid 2 \(first on .*highlight_train_release.jsonl:2\)'),
    (lambda t: t[3].update(duration=140), DataError,
     r'jsonl:4: segment ab_c-1_60.0_210.0 has duration 140.0, but 150.0 on .*jsonl:2'),
], ids=['json', 'key', 'vid', 'window', 'qid', 'duration'])
def test_bad_annotations_name_the_line(tmp_path, edit, error, pattern):
  train = [dict(r) for r in TRAIN]
  edit(train)
  ann, feat, _ = _fake_release(str(tmp_path), train=train)
  with pytest.raises(error, match=pattern):
    qvh.build_release(ann, feat, str(tmp_path / 'out'))
  assert not os.path.exists(tmp_path / 'out' / 'qvhighlights')


def _damage_npz(feat, vid, **arrays):
  np.savez(qvh.feature_paths(feat, vid)[0], **arrays)


@pytest.mark.parametrize('damage, error, pattern', [
    (lambda feat: os.remove(qvh.feature_paths(feat, SEG_X)[1]), FileNotFoundError,
     r'(?s)1 of 16 feature files are missing .*clip_features/XyZ_60.0_210.0.npz'),
    (lambda feat: os.remove(qvh.text_feature_path(feat, 11)), FileNotFoundError,
     r'clip_text_features/qid11.npz'),
    (lambda feat: _damage_npz(feat, SEG_X, features=np.ones((72, 100), np.float32)), DataError,
     r'slowfast_features/XyZ_60.0_210.0.npz \(SlowFast features of XyZ_60.0_210.0\): '
     r"'features' has feature dim 100, expected 2304"),
    (lambda feat: _damage_npz(feat, SEG_X, features=np.full((72, 2304), np.nan, np.float32)),
     DataError, r'XyZ_60.0_210.0.npz .*NaN/Inf in row 0 \(72 bad row\(s\)\)'),
    (lambda feat: _damage_npz(feat, SEG_X, feats=np.ones((72, 2304), np.float32)), DataError,
     r"XyZ_60.0_210.0.npz .*no array 'features' \(it has \['feats'\]\)"),
], ids=['visual-file', 'text-file', 'dim', 'nan', 'key'])
def test_bad_features_name_the_file(tmp_path, damage, error, pattern):
  ann, feat, _ = _fake_release(str(tmp_path))
  damage(feat)
  out = tmp_path / 'out'
  with pytest.raises(error, match=pattern):
    qvh.build_release(ann, feat, str(out))
  assert not out.exists() or not os.listdir(out)  # nothing half-written is left


def _npz_declaring(path, shape, payload=b'\0' * 64, key='features', descr='<f4', fortran=False):
  """An .npz whose member `key` has a .npy header declaring `shape` but holds `payload`."""
  import io  # pylint: disable=g-import-not-at-top
  import zipfile  # pylint: disable=g-import-not-at-top
  header = io.BytesIO()
  np.lib.format.write_array_header_1_0(
      header, {'descr': descr, 'fortran_order': fortran, 'shape': shape})
  with zipfile.ZipFile(path, 'w', zipfile.ZIP_DEFLATED) as zf:
    zf.writestr(f'{key}.npy', header.getvalue() + payload)


def test_npz_member_declaring_more_than_the_cap_is_refused_before_reading(tmp_path):
  """A SlowFast member declaring [420000, 2304] (3.9 GB inflated) is refused from its .npy
  header: no allocation, the last line names the file and the key."""
  ann, feat, _ = _fake_release(str(tmp_path))
  path = qvh.feature_paths(feat, SEG_X)[0]
  _npz_declaring(path, (420_000, qvh.SLOWFAST_DIM))
  with pytest.raises(DataError) as e:
    qvh.build_release(ann, feat, str(tmp_path / 'out'))
  last = str(e.value).splitlines()[-1]
  assert "'features' of the SlowFast features of XyZ_60.0_210.0 declares" in last
  assert '(420000, 2304)' in last and last.endswith(path)
  assert not os.path.exists(tmp_path / 'out' / 'qvhighlights')


@pytest.mark.parametrize('make, pattern', [
    (lambda p: _npz_declaring(p, (80, 2304)), r"'features' is truncated"),
    (lambda p: _npz_declaring(p, (3,), descr='|O'), r"'features' holds Python objects"),
    (lambda p: open(p, 'wb').write(b'not a zip'), r'cannot read as .npz'),
], ids=['truncated', 'pickle', 'not-zip'])
def test_bad_npz_members_name_the_file(tmp_path, make, pattern):
  path = str(tmp_path / 'x.npz')
  make(path)
  with pytest.raises(DataError, match=pattern) as e:
    qvh._load_npz(path, 'features', 2304, 'SlowFast features of x', qvh.MAX_SEGMENT_CLIPS)
  assert str(e.value).splitlines()[-1].startswith(f'{path} (SlowFast features of x)')


def test_npz_reads_only_the_rows_used(tmp_path):
  """Of a 200-row member only the 75 used rows are read (a NaN past them is never seen); a
  Fortran-ordered or float16 member reads as np.load reads it."""
  rng = np.random.default_rng(1)
  x = rng.normal(size=(200, 8)).astype(np.float32)
  x[150] = np.nan
  path = str(tmp_path / 'a.npz')
  np.savez_compressed(path, features=x)
  got = qvh._load_npz(path, 'features', 8, 'test', qvh.MAX_SEGMENT_CLIPS)
  np.testing.assert_array_equal(got, x[:75])
  with pytest.raises(DataError, match=r'a.npz \(test\): NaN/Inf in row 150'):
    qvh._load_npz(path, 'features', 8, 'test')
  for y in (np.asfortranarray(x[:100]), x[:40].astype(np.float16)):
    np.savez(path, features=y)
    np.testing.assert_array_equal(qvh._load_npz(path, 'features', 8, 'test', 75),
                                  np.load(path)['features'][:75].astype(np.float32))


def test_non_empty_out_is_refused(tmp_path):
  out = tmp_path / 'out'
  out.mkdir()
  (out / 'notes.txt').write_text('mine')
  with pytest.raises(FileExistsError, match=rf"--out={out}: it is not empty \(\['notes.txt'\]\)"):
    qvh.build_release(str(tmp_path), str(tmp_path), str(out))
  assert os.listdir(out) == ['notes.txt']


def test_real_annotation_counts_match_the_paper():
  """ProtoPRVR: train 2,214 videos / 7,218 queries; test (the release's val) 474 / 1,550."""
  folder = os.environ.get('PRVR_QVHIGHLIGHTS_ANNOTATIONS')
  if not folder:
    pytest.skip('set PRVR_QVHIGHLIGHTS_ANNOTATIONS to the folder of the Moment-DETR annotation '
                'files (jayleicn/moment_detr data/) to check the real counts')
  names = [qvh.ANNOTATION_FILE.format(s) for s in ('train', 'val')]
  if not all(os.path.isfile(os.path.join(folder, n)) for n in names):
    pytest.skip(f'PRVR_QVHIGHLIGHTS_ANNOTATIONS={folder} lacks {" or ".join(names)}')
  tables = qvh.video_tables(folder)
  counts = {name: (c.videos, c.queries) for name, c in
            ((name, qvh.count(videos)) for name, videos in tables.items())}
  assert counts == {'train': (2214, 7218), 'val': (474, 1550), 'test': (474, 1550)}
  assert qvh.split_overlaps(tables) == {}
