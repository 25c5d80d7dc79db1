"""prvr-extract (prvr_jax.data.extract): synthetic videos and frame folders -> AMDNet's CLIP
layout with a random-initialised tiny CLIP; read back through the release reader and
`read_manifest`; resuming, refusals, per-file failures, the command line."""

import json
import os
import shutil
import struct
import zlib

import numpy as np
import pytest

import support

support.require_tensorflow()
av = pytest.importorskip('av', reason='video files need PyAV: pip install prvr_jax[video]')

from prvr_jax import clip  # pylint: disable=g-import-not-at-top,wrong-import-position
from prvr_jax.data import extract  # pylint: disable=g-import-not-at-top,wrong-import-position
from prvr_jax.data import frames  # pylint: disable=g-import-not-at-top,wrong-import-position
from prvr_jax.data import release  # pylint: disable=g-import-not-at-top,wrong-import-position
from prvr_jax.data import synthetic_videos  # pylint: disable=wrong-import-position

SECONDS, RATE = 3.0, 10.0  # the synthetic videos: 30 frames each


def _tree(folder) -> dict[str, tuple[int, int]]:
  """Every path under `folder` (links not followed) -> (size, mtime_ns)."""
  out = {}
  for root, dirs, names in os.walk(folder):
    for name in dirs + names:
      path = os.path.join(root, name)
      st = os.lstat(path)
      out[path] = (st.st_size, st.st_mtime_ns)
  return out


def _png_declaring(width: int, height: int) -> bytes:
  """A PNG header declaring `width` x `height` pixels, with no image data after it."""
  ihdr = struct.pack('>IIBBBBB', width, height, 8, 2, 0, 0, 0)
  chunk = b'IHDR' + ihdr
  return (b'\x89PNG\r\n\x1a\n' + struct.pack('>I', len(ihdr)) + chunk
          + struct.pack('>I', zlib.crc32(chunk)))


@pytest.fixture(scope='module')
def weights():
  return extract.load_weights('random:tiny')


@pytest.fixture(scope='module')
def run(tmp_path_factory, weights):
  """One extraction of 3 video files, 1 frame folder and every kind of bad input."""
  base = tmp_path_factory.mktemp('extract')
  videos = base / 'in'
  written = synthetic_videos.write_videos(str(videos), 4, seconds=SECONDS, fps=RATE,
                                          frame_folders=1)
  (videos / 'notes.txt').write_text('not a video')
  (videos / 'empty.mp4').write_bytes(b'')
  (videos / 'junk.mp4').write_bytes(np.random.default_rng(0).bytes(4000))
  (videos / 'huge.y4m').write_bytes(b'YUV4MPEG2 W6000 H6000 F25:1 Ip A1:1 C420jpeg\nFRAME\n')
  (videos / 'bomb').mkdir()
  (videos / 'bomb' / '000001.png').write_bytes(_png_declaring(30000, 30000))
  (videos / 'nothing').mkdir()
  outside = base / 'secret.mp4'
  shutil.copy(written[0].path, outside)
  os.symlink(outside, videos / 'link.mp4')
  os.symlink(written[1].path, videos / 'inside_link.mp4')  # inside the folder: followed
  (videos / 'video01.mkv').write_bytes(b'')  # a second source of the id video01
  before = _tree(base)
  result = extract.extract(str(videos), str(base / 'out'), 'mine', '', fps=1.0,
                           frames_fps=RATE, batch_size=8, progress=False, weights=weights)
  after = _tree(base)
  return {'base': base, 'videos': videos, 'written': written, 'result': result,
          'before': before, 'after': after}


def _expected_rows(weights, images: np.ndarray) -> np.ndarray:
  """CLIP image features of uint8 frames, computed directly (not through extract)."""
  x = frames.clip_preprocess(images, weights.config.image_size).numpy()
  return np.asarray(clip.CLIP(weights.config).apply({'params': weights.params}, x,
                                                    method='encode_image'))


def test_release_and_manifest_read_back(run, weights):
  result = run['result']
  collection_dir = result.collection_dir
  manifest = extract.read_manifest(collection_dir)
  assert manifest == result.manifest
  assert manifest['format'] == extract.FORMAT and manifest['backbone'] == 'tiny'
  assert manifest['weights'] == {'path': 'random:tiny:0', 'sha256': 'random:tiny:0'}
  assert manifest['embed_dim'] == 32 and manifest['fps'] == 1.0 and manifest['image_size'] == 32
  assert sorted(manifest['videos']) == ['inside_link', 'video00', 'video02', 'video03']
  layout = release.Layout(collection_dir, 'mine', None, 'clip')
  assert manifest['feature_file'] == os.path.relpath(layout.clip_video_feature_path,
                                                     collection_dir)
  by_id = {w.video_id: w for w in run['written']}
  with release.ClipVideoFeatures(layout.clip_video_feature_path) as features:
    assert features.keys() == set(manifest['videos'])
    for video_id, video in manifest['videos'].items():
      rows = features.read(video_id)
      assert rows.shape == (3, 32) and rows.dtype == np.float32, video_id
      assert video['rows'] == 3 and video['frames'] == 30
      assert video['duration'] == pytest.approx(SECONDS, abs=1e-3)
      assert extract.row_seconds(manifest, video_id)[-1][1] == pytest.approx(SECONDS, abs=1e-3)
      assert video['kind'] == ('frames' if video_id == 'video03' else 'file')
      thumbnail = os.path.join(collection_dir, video['thumbnail'])
      from PIL import Image  # pylint: disable=g-import-not-at-top
      with Image.open(thumbnail) as image:
        assert image.format == 'JPEG' and image.width == extract.THUMBNAIL_WIDTH
    # Row r is the frame nearest the middle of second r: frame 10 r + 5 (at 10 fps).
    source = by_id['video03'].path
    picked = frames.decode_frames([os.path.join(source, f'{10 * r + 6:06d}.jpg')
                                   for r in range(3)])
    support.assert_close(features.read('video03'), _expected_rows(weights, picked), 1e-5)
    decoded = frames.read_video_file(by_id['video00'].path, num_samples=30)
    support.assert_close(features.read('video00'), _expected_rows(weights, decoded[5::10]), 1e-5)
  assert manifest['videos']['inside_link']['source'] == os.path.join(run['videos'],
                                                                     'inside_link.mp4')


def test_bad_files_are_skipped_and_named(run):
  skipped = run['result'].manifest['skipped']
  videos = run['videos']
  reasons = {os.path.basename(p): r for p, r in skipped.items()}
  assert set(skipped) == {str(videos / n) for n in reasons}
  assert sorted(reasons) == ['bomb', 'empty.mp4', 'huge.y4m', 'junk.mp4', 'link.mp4', 'notes.txt',
                             'nothing', 'video01.mkv', 'video01.mp4']
  assert 'empty file' in reasons['empty.mp4']
  assert 'cannot open the video' in reasons['junk.mp4']
  assert '6000x6000' in reasons['huge.y4m'] and 'refused before decoding' in reasons['huge.y4m']
  assert '30000x30000' in reasons['bomb'] and 'refused before decoding' in reasons['bomb']
  assert 'outside the input folder' in reasons['link.mp4']
  assert 'not a video file' in reasons['notes.txt']
  assert 'no frames' in reasons['nothing']
  assert str(videos / 'video01.mkv') in reasons['video01.mp4']
  assert str(videos / 'video01.mp4') in reasons['video01.mkv']
  text = extract.summary(run['result'])
  assert all(str(videos / name) in text for name in reasons)


def test_nothing_written_outside_out(run):
  out = str(run['base'] / 'out')
  before, after = run['before'], run['after']
  assert {p: s for p, s in after.items() if not p.startswith(out)} == before
  listed = sorted(os.path.relpath(p, out) for p in after if p.startswith(out + os.sep))
  assert '.extract_work' not in ' '.join(listed)  # the work folder is gone
  assert 'mine/extract_manifest.json' in listed


def test_resume_extracts_only_the_rest(run, weights, tmp_path):
  videos = run['videos']
  first = run['result']
  listing = tmp_path / 'list.txt'
  listing.write_text(''.join(f'{videos / n}\n' for n in ('video00.mp4', 'video02.mp4',
                                                         'video03', 'inside_link.mp4')))
  done = []

  class Killed(Exception):
    pass

  def kill_after_two(video_id):
    done.append(video_id)
    if len(done) == 2:
      raise Killed()

  with pytest.raises(Killed):
    extract.extract(str(listing), str(tmp_path / 'out'), 'mine', '', frames_fps=RATE,
                    batch_size=8, progress=False, weights=weights, on_video=kill_after_two)
  collection_dir = tmp_path / 'out' / 'mine'
  parts = collection_dir / extract.WORK / 'parts'
  assert sorted(p.name for p in parts.iterdir()) == sorted(f'{v}.npz' for v in done)
  assert not (collection_dir / extract.MANIFEST).exists()
  (parts / '.video03.npz.half.tmp').write_bytes(b'half-written')  # writes cut short
  (collection_dir / extract.THUMBNAILS / '.video03.jpg.k2x9.tmp').write_bytes(b'half')
  (collection_dir / '.extract_manifest.json.k2x9.tmp').write_bytes(b'half')
  (collection_dir / extract.THUMBNAILS / '.mine.txt.k2x9.tmp').write_bytes(b'not ours')
  # Other settings are refused, naming the flag; nothing is removed.
  with pytest.raises(extract.ExtractError) as error:
    extract.extract(str(listing), str(tmp_path / 'out'), 'mine', '', fps=2.0, frames_fps=RATE,
                    progress=False, weights=weights)
  assert '--fps: 2.0 now, 1.0 before' in str(error.value)
  assert str(error.value).splitlines()[-1].endswith('another --collection')
  result = extract.extract(str(listing), str(tmp_path / 'out'), 'mine', '', frames_fps=RATE,
                           batch_size=8, progress=False, weights=weights)
  assert sorted(result.resumed) == sorted(done)
  assert sorted(result.extracted + result.resumed) == sorted(result.manifest['videos'])
  assert not set(result.extracted) & set(done)
  assert not (collection_dir / extract.WORK).exists()
  assert sorted(p.name for p in collection_dir.rglob('*.tmp')) == ['.mine.txt.k2x9.tmp']
  layout = release.Layout(str(collection_dir), 'mine', None, 'clip')
  with release.ClipVideoFeatures(layout.clip_video_feature_path) as resumed, \
       release.ClipVideoFeatures(os.path.join(first.collection_dir,
                                              first.manifest['feature_file'])) as whole:
    for video_id in result.manifest['videos']:
      support.assert_close(resumed.read(video_id), whole.read(video_id), 1e-6)
  # A finished collection is refused without --restart; --restart starts over.
  with pytest.raises(extract.ExtractError, match='already holds a finished extraction'):
    extract.extract(str(listing), str(tmp_path / 'out'), 'mine', '', frames_fps=RATE,
                    progress=False, weights=weights)
  (collection_dir / 'mine_notes.txt').write_text('the user\'s')
  again = extract.extract(str(listing), str(tmp_path / 'out'), 'mine', '', fps=2.0,
                          frames_fps=RATE, batch_size=8, restart=True, progress=False,
                          weights=weights)
  assert again.manifest['fps'] == 2.0 and not again.resumed
  assert all(v['rows'] == 6 for v in again.manifest['videos'].values())
  assert (collection_dir / 'mine_notes.txt').read_text() == 'the user\'s'


def test_refusals_name_the_flag(run, weights, tmp_path):
  videos = run['videos']
  with pytest.raises(extract.ExtractError, match=r'--out=.*must not be inside the input'):
    extract.extract(str(videos), str(videos / 'features'), 'c', '', weights=weights)
  with pytest.raises(extract.ExtractError, match=r'--clip_weights=.*absent.pt: no such file'):
    extract.load_weights(str(tmp_path / 'absent.pt'))
  bad = tmp_path / 'weights.safetensors'
  bad.write_bytes(b'\x00' * 16)
  with pytest.raises(extract.ExtractError) as error:
    extract.load_weights(str(bad))
  assert str(error.value).splitlines()[-1].startswith(f'(--clip_weights={bad}')
  with pytest.raises(extract.ExtractError, match='--clip_weights=random:huge'):
    extract.load_weights('random:huge')
  with pytest.raises(extract.ExtractError, match='--fps=0'):
    extract.extract(str(videos), str(tmp_path), 'c', '', fps=0, weights=weights)
  (tmp_path / 'taken').mkdir()
  with pytest.raises(extract.ExtractError, match='not created by prvr-extract'):
    extract.extract(str(videos), str(tmp_path), 'taken', '', weights=weights)


def test_read_manifest_names_file_and_key(run, tmp_path):
  manifest = json.loads(json.dumps(run['result'].manifest))
  manifest['videos']['video00']['thumbnail'] = '../../etc/passwd'
  path = tmp_path / extract.MANIFEST
  path.write_text(json.dumps(manifest))
  with pytest.raises(release.DataError, match=r"manifest.json: key 'videos/video00/thumbnail'"):
    extract.read_manifest(str(tmp_path))
  manifest['videos']['video00']['thumbnail'] = None
  manifest['fps'] = -1
  path.write_text(json.dumps(manifest))
  with pytest.raises(release.DataError, match="key 'fps' must be a positive number"):
    extract.read_manifest(str(path))
  with pytest.raises(FileNotFoundError, match='no extraction manifest'):
    extract.read_manifest(str(tmp_path / 'absent'))


def test_command_line(run, tmp_path):
  listing = tmp_path / 'one.txt'
  listing.write_text(f'{run["videos"] / "video02.mp4"}\n')
  proc = support.run_cli('prvr_jax/tools/extract.py', f'--videos={listing}',
                         f'--out={tmp_path / "out"}', '--collection=cli',
                         '--clip_weights=random:tiny', '--progress=false', cache_dir=None)
  assert '1 video(s), 3 rows of 32-d CLIP features' in proc.stdout, proc.stdout
  assert 'skipped: none' in proc.stdout
  manifest = extract.read_manifest(str(tmp_path / 'out' / 'cli'))
  assert list(manifest['videos']) == ['video02']
  proc = support.run_cli('prvr_jax/tools/extract.py', f'--videos={listing}',
                         f'--out={tmp_path / "out"}', '--collection=cli2',
                         f'--clip_weights={tmp_path / "absent.pt"}', cache_dir=None,
                         check=False)
  assert proc.returncode != 0
  last = proc.stderr.strip().splitlines()[-1]
  assert '--clip_weights=' in last and 'absent.pt' in last, proc.stderr[-2000:]


def test_rows_pick_the_frame_nearest_each_middle():
  timed = [(t / 4, t) for t in range(10)]  # 4 frames per second: 0, 0.25, ..., 2.25 s
  assert list(extract.pick_rows(iter(timed), 1.0, 10, 'v')) == [(0, 2), (1, 6), (2, 9)]
  # Out-of-order times are dropped once their row is done; a row with no frame is skipped.
  assert list(extract.pick_rows(iter([(0.0, 'a'), (2.4, 'b'), (1.0, 'c'), (2.6, 'd')]), 1.0,
                                10, 'v')) == [(0, 'a'), (2, 'b')]
  with pytest.raises(release.DataError, match=r'v: longer than 2 rows at --fps=1'):
    list(extract.pick_rows(iter(timed), 1.0, 2, 'v'))


def test_rows_without_a_frame_repeat_the_previous(run, weights, tmp_path):
  # 3 images at --frames_fps=1 read at --fps=2: rows 0, 2, 4 have a frame, 1 and 3 repeat.
  source = run['written'][3].path
  folder = tmp_path / 'in' / 'slow'
  folder.mkdir(parents=True)
  for k in range(3):
    shutil.copy(os.path.join(source, f'{k + 1:06d}.jpg'), folder / f'{k + 1:06d}.jpg')
  result = extract.extract(str(tmp_path / 'in'), str(tmp_path / 'out'), 'slow', '', fps=2.0,
                           frames_fps=1.0, progress=False, weights=weights)
  video = result.manifest['videos']['slow']
  assert video['rows'] == 5 and video['frames'] == 3 and video['duration'] == 3.0
  with release.ClipVideoFeatures(os.path.join(result.collection_dir,
                                              result.manifest['feature_file'])) as features:
    rows = features.read('slow')
  np.testing.assert_array_equal(rows[1], rows[0])
  np.testing.assert_array_equal(rows[3], rows[2])
  assert not np.array_equal(rows[2], rows[0])


def test_captions_make_the_collection_a_release(run, weights, tmp_path):
  """--captions: caption files and the text tower's sentence vectors, read back by the release
  reader as a training release; bad captions and other weights refused by name; stale files of
  an earlier call removed, the user's kept."""
  collection_dir = tmp_path / 'mine'
  shutil.copytree(run['result'].collection_dir, collection_dir)
  vocab = clip.tokenizer.write_vocab(tmp_path / 'vocab.txt.gz')
  texts = {'train': ['video00#0 a red square', 'video02#0 a blue circle',
                     'video03#0 a green line'],
           'val': ['inside_link#0 a small dot'], 'test': ['video00#1 the end']}
  paths = {}
  for split, lines in texts.items():
    paths[split] = tmp_path / f'{split}.txt'
    paths[split].write_text('\n'.join(lines) + '\n')
  counts = extract.add_captions(str(collection_dir), paths, weights=weights, vocab=vocab)
  assert counts == {'train': 3, 'val': 1, 'test': 1}
  data = release.Release(str(tmp_path), 'mine', None, 'clip')
  assert set(data.splits) == {'train', 'val', 'test'}
  captions = [caption for lines in texts.values() for caption in lines]
  tokens = clip.Tokenizer(vocab)([c.split(' ', 1)[1] for c in captions],
                                 weights.config.context_length, truncate=True)
  expected = np.asarray(clip.CLIP(weights.config).apply({'params': weights.params}, tokens,
                                                        method='encode_text'))
  layout = release.Layout(str(collection_dir), 'mine', None, 'clip')
  with release.CaptionFeatures(layout.query_feature_path) as features:
    for row, caption in enumerate(captions):
      support.assert_close(features.read(caption.split()[0]).ravel(), expected[row], 1e-5)
  # A caption of a video the collection lacks, a duplicate id, other weights: refused by name.
  bad = tmp_path / 'bad.txt'
  bad.write_text('nosuch#0 a cat\n')
  with pytest.raises(release.DataError,
                     match=r"bad.txt: caption 'nosuch#0': video 'nosuch' is not"):
    extract.add_captions(str(collection_dir), {'train': bad}, weights=weights, vocab=vocab)
  with pytest.raises(release.DataError, match=r"caption id 'video00#0' is also in .*train.txt"):
    extract.add_captions(str(collection_dir), {'train': paths['train'], 'val': paths['train']},
                         weights=weights, vocab=vocab)
  with pytest.raises(extract.ExtractError, match=r'--clip_weights=random:tiny:1: sha256'):
    extract.add_captions(str(collection_dir), paths, 'random:tiny:1', vocab=vocab)
  # Again with train only: our val / test files go (they would be stale), the user's stay.
  notes = os.path.join(layout.text_dir, 'notes.md')
  with open(notes, 'w', encoding='utf-8') as f:
    f.write('the user\'s')
  extract.add_captions(str(collection_dir), {'train': paths['train']}, weights=weights,
                       vocab=vocab)
  assert sorted(os.listdir(layout.text_dir)) == sorted(
      [extract.CAPTIONS_OWNER, 'minetrain.caption.txt', 'notes.md',
       os.path.basename(layout.query_feature_path)])
  foreign = os.path.join(layout.text_dir, 'minetest.caption.txt')
  shutil.copy(paths['test'], foreign)
  with pytest.raises(extract.ExtractError, match='minetest.caption.txt\\): give their split'):
    extract.add_captions(str(collection_dir), {'train': paths['train']}, weights=weights,
                         vocab=vocab)
  # --restart (other weights may follow) removes the captions' vectors with the videos.
  os.remove(foreign)
  extract.extract(str(run['videos']), str(tmp_path), 'mine', '', frames_fps=RATE, batch_size=8,
                  restart=True, progress=False, weights=weights)
  assert sorted(os.listdir(layout.text_dir)) == ['notes.md']


def test_captions_flag_parsing():
  assert extract.parse_captions_flag(['train:a.txt', 'test:/x/b:c.txt']) == {
      'train': 'a.txt', 'test': '/x/b:c.txt'}
  with pytest.raises(extract.ExtractError, match='--captions=a.txt: expected split:path'):
    extract.parse_captions_flag(['a.txt'])
  with pytest.raises(extract.ExtractError, match='--captions=train:b.txt: split train is given'):
    extract.parse_captions_flag(['train:a.txt', 'train:b.txt'])
