"""Text-video retrieval data: annotation readers, frame sampling and decoding, CLIP preprocessing,
the frames pipeline and the frozen-feature release (prvr_jax.data.text_video, .frames)."""

import csv
import json
import os

import h5py
import numpy as np
import pytest

import support
tf = support.require_tensorflow()

from prvr_jax.data import frames as fr
from prvr_jax.data import release as release_lib
from prvr_jax.data import text_video as tv
from prvr_jax.data import text_video_features as tvx
from prvr_jax.data import text_video_frames as tvf

DataError = release_lib.DataError
MEAN, STD = np.array(fr.CLIP_MEAN, np.float32), np.array(fr.CLIP_STD, np.float32)


# ----------------------------------------------------------------------------- helpers


def write_png(path, image: np.ndarray) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, 'wb') as f:
    f.write(tf.io.encode_png(image).numpy())


def write_frames(folder, n: int, shape=(6, 8), start: int = 0, fmt='png') -> None:
  """`n` frames `f1 .. fn` (names not zero-padded) of constant value `start + 10 k`."""
  for k in range(n):
    image = np.full((*shape, 3), start + 10 * k, np.uint8)
    path = os.path.join(folder, f'f{k + 1}.{fmt}')
    if fmt == 'png':
      write_png(path, image)
    else:
      os.makedirs(folder, exist_ok=True)
      with open(path, 'wb') as f:
        f.write(tf.io.encode_jpeg(image, quality=100).numpy())


def fake_tokenize(texts):
  """Deterministic fake tokenizer: [len(texts), 5] int32 (length, first char, word count...)."""
  return np.array([[len(t), ord(t[0]), len(t.split()), 7, 0] for t in texts], np.int32)


def write_csv(path, rows) -> None:
  with open(path, 'w', encoding='utf-8', newline='') as f:
    csv.writer(f).writerows(rows)


def numpy_center_crop_normalize(x: np.ndarray, size: int) -> np.ndarray:
  """Reference: torchvision CenterCrop (offsets round half to even) + CLIP normalisation."""
  h, w = x.shape[1:3]
  top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
  return (x[:, top:top + size, left:left + size] - MEAN) / STD


def keys_cubic(x, a=-0.5):
  x = np.abs(x)
  return np.where(x < 1, (a + 2) * x**3 - (a + 3) * x**2 + 1,
                  np.where(x < 2, a * x**3 - 5 * a * x**2 + 8 * a * x - 4 * a, 0.0))


def resize_weights(n_in: int, n_out: int) -> np.ndarray:
  """PIL's antialiased bicubic filter (Keys a=-0.5, support 2 x the scale when shrinking,
  weights normalised per output pixel), in float64: `[n_out, n_in]`."""
  scale = n_in / n_out
  stretch = max(scale, 1.0)
  out = np.zeros((n_out, n_in))
  for i in range(n_out):
    center = (i + 0.5) * scale
    lo = max(int(center - 2 * stretch + 0.5), 0)
    hi = min(int(center + 2 * stretch + 0.5), n_in)
    xs = np.arange(lo, hi)
    w = keys_cubic((xs - center + 0.5) / stretch)
    out[i, xs] = w / w.sum()
  return out


def numpy_clip_preprocess(frames: np.ndarray, size: int) -> np.ndarray:
  """Reference of `clip_preprocess` in numpy (float64 filter, no uint8 rounding)."""
  x = frames.astype(np.float64) / 255.0
  h, w = x.shape[1:3]
  long_side = int(size * max(h, w) / min(h, w))
  new_h, new_w = (long_side, size) if w <= h else (size, long_side)
  x = np.einsum('oh,thwc->towc', resize_weights(h, new_h), x)
  x = np.einsum('pw,thwc->thpc', resize_weights(w, new_w), x)
  return numpy_center_crop_normalize(x, size)


# ----------------------------------------------------------------------------- sampling


def test_uniform_sampling_matches_the_official_numbers():
  # Recorded by running the official VideoCapture.load_frames_from_video (cv2 stubbed).
  assert fr.sample_frame_indices(100, 12).tolist() == [3, 11, 20, 28, 36, 45, 53, 61, 70, 78,
                                                       86, 95]
  assert fr.sample_frame_indices(30, 12).tolist() == [0, 3, 5, 8, 10, 13, 15, 18, 20, 23, 25, 28]
  assert fr.sample_frame_indices(12, 12).tolist() == list(range(12))
  assert fr.sample_frame_indices(7, 3).tolist() == [0, 2, 5]


def test_short_video_repeats_its_last_frame():
  assert fr.sample_frame_indices(5, 12).tolist() == [0, 1, 2, 3, 4] + [4] * 7
  assert fr.sample_frame_indices(1, 4).tolist() == [0, 0, 0, 0]
  rand = fr.sample_frame_indices(3, 6, 'rand', np.random.default_rng(0))
  assert rand.tolist() == [0, 1, 2, 2, 2, 2]  # one-frame segments: their frame


def test_rand_sampling_stays_in_the_official_ranges_and_is_seeded():
  n, k = 50, 12
  edges = np.linspace(0, n, k + 1).astype(int)
  draws = np.stack([fr.sample_frame_indices(n, k, 'rand', np.random.default_rng(s))
                    for s in range(300)])
  # The official random.choice(range(s, e - 1)): frames s .. e - 2 of segment [s, e).
  assert (draws >= edges[:-1]).all() and (draws <= edges[1:] - 2).all()
  for j in range(k):
    assert set(draws[:, j]) == set(range(edges[j], edges[j + 1] - 1))
  again = fr.sample_frame_indices(n, k, 'rand', np.random.default_rng(7))
  assert (again == draws[7]).all()


def test_sampling_bad_input():
  with pytest.raises(DataError, match="video 'v42' has 0 frames"):
    fr.sample_frame_indices(0, 12, video='v42')
  with pytest.raises(ValueError, match='mode'):
    fr.sample_frame_indices(10, 12, 'middle')
  with pytest.raises(ValueError, match='num_samples'):
    fr.sample_frame_indices(10, 0)


# ----------------------------------------------------------------------------- frame folders


def test_read_frame_folder_png_natural_order(tmp_path):
  folder = tmp_path / 'v'
  write_frames(folder, 15)  # f1 .. f15: f10 must come after f9
  (folder / 'notes.txt').write_text('not a frame')
  assert [os.path.basename(p) for p in fr.list_frame_files(folder)][8:11] == [
      'f9.png', 'f10.png', 'f11.png']
  x = fr.read_frame_folder(folder, 4)
  idx = fr.sample_frame_indices(15, 4)
  assert x.shape == (4, 6, 8, 3) and x.dtype == np.uint8
  np.testing.assert_array_equal(x[:, 0, 0, 0], 10 * idx)
  short = fr.read_frame_folder(folder, 20)  # fewer frames than samples: last repeated
  np.testing.assert_array_equal(short[:, 0, 0, 0], 10 * np.array(list(range(15)) + [14] * 5))


def test_read_frame_folder_jpeg_and_grey_png(tmp_path):
  write_frames(tmp_path / 'j', 3, fmt='jpeg')
  x = fr.read_frame_folder(tmp_path / 'j', 3)
  assert np.abs(x[:, 0, 0, 0].astype(int) - [0, 10, 20]).max() <= 2  # JPEG rounding
  write_png(str(tmp_path / 'g' / 'a.png'), np.full((4, 5, 1), 77, np.uint8))
  grey = fr.read_frame_folder(tmp_path / 'g', 2)
  assert grey.shape == (2, 4, 5, 3) and (grey == 77).all()


def test_read_frame_folder_bad_input(tmp_path):
  with pytest.raises(FileNotFoundError, match='absent'):
    fr.read_frame_folder(tmp_path / 'absent')
  (tmp_path / 'empty').mkdir()
  with pytest.raises(DataError, match='has no frames'):
    fr.read_frame_folder(tmp_path / 'empty')
  write_frames(tmp_path / 'bad', 3)
  (tmp_path / 'bad' / 'f2.png').write_bytes(b'\x89PNG\r\n\x1a\n truncated')
  with pytest.raises(DataError, match=r'bad/f2\.png: cannot read or decode'):
    fr.read_frame_folder(tmp_path / 'bad', 3)
  write_frames(tmp_path / 'mixed', 2)
  write_png(str(tmp_path / 'mixed' / 'f3.png'), np.zeros((7, 8, 3), np.uint8))
  with pytest.raises(DataError, match=r'differ in size: .*f3\.png is 8x7 .*f1\.png is 8x6'):
    fr.read_frame_folder(tmp_path / 'mixed', 3)


def test_read_video_file_without_a_decoder(tmp_path, monkeypatch):
  path = tmp_path / 'v.mp4'
  path.write_bytes(b'')
  import builtins  # pylint: disable=g-import-not-at-top
  real_import = builtins.__import__

  def no_decoders(name, *args, **kwargs):
    if name in ('av', 'cv2'):
      raise ImportError(name)
    return real_import(name, *args, **kwargs)

  monkeypatch.setattr(builtins, '__import__', no_decoders)
  with pytest.raises(ImportError, match='pip install av'):
    fr.read_video_file(path)
  with pytest.raises(FileNotFoundError, match='absent.mp4'):
    fr.read_video_file(tmp_path / 'absent.mp4')


def _has(module: str) -> bool:
  try:
    __import__(module)
    return True
  except ImportError:
    return False


@pytest.mark.skipif(not _has('av'), reason='PyAV (the optional video decoder) is not installed')
def test_read_video_file_with_av(tmp_path):
  import av  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / 'v.mkv')
  with av.open(path, 'w') as container:
    stream = container.add_stream('ffv1', rate=5)
    stream.width, stream.height = 16, 12
    for k in range(20):
      frame = av.VideoFrame.from_ndarray(np.full((12, 16, 3), 10 * k, np.uint8), format='rgb24')
      for packet in stream.encode(frame):
        container.mux(packet)
    for packet in stream.encode():
      container.mux(packet)
  x = fr.read_video_file(path, 12, decoder='av')
  assert x.shape == (12, 12, 16, 3) and x.dtype == np.uint8
  expected = 10 * fr.sample_frame_indices(20, 12)
  assert np.abs(x[:, 6, 8].astype(int).mean(-1) - expected).max() <= 3  # YUV rounding


# ----------------------------------------------------------------------------- CLIP preprocessing


def test_clip_normalisation_exact_on_a_square_image():
  x = np.random.default_rng(0).integers(0, 256, (2, 16, 16, 3), dtype=np.uint8)
  got = fr.clip_preprocess(x, 16).numpy()
  expected = (x.astype(np.float32) / np.float32(255.0) - MEAN) / STD
  assert got.dtype == np.float32
  support.assert_close(got, expected, support.f32_rtol(1))


@pytest.mark.parametrize('shape, offset', [((16, 49), (0, 16)),   # (49-16)/2 = 16.5 -> 16
                                           ((16, 51), (0, 18)),   # 17.5 -> 18 (half to even)
                                           ((30, 16), (7, 0))])
def test_clip_center_crop_geometry_exact(shape, offset):
  h, w = shape
  yy, xx = np.mgrid[0:h, 0:w]
  image = np.stack([yy, xx, (yy + xx) % 256], -1).astype(np.uint8)[None]  # pixel = its place
  got = fr.clip_preprocess(image, 16).numpy()
  pixels = np.rint((got * STD + MEAN) * 255).astype(int)
  top, left = offset
  np.testing.assert_array_equal(pixels[0, ..., 0], yy[top:top + 16, left:left + 16])
  np.testing.assert_array_equal(pixels[0, ..., 1], xx[top:top + 16, left:left + 16])


def test_clip_resize_shape_and_bicubic_against_numpy():
  rng = np.random.default_rng(1)
  # Long side int(size * long / short): 32 * 151 / 100 = 48.32 -> 48.
  resized = fr.resize_shorter_side(tf.zeros([1, 100, 151, 3]), 32)
  assert resized.shape == (1, 32, 48, 3)
  for h, w, size in [(40, 56, 24), (57, 33, 16), (12, 20, 24)]:  # shrink both ways, enlarge
    x = rng.integers(0, 256, (2, h, w, 3), dtype=np.uint8)
    # TF's antialiased bicubic is PIL's filter, computed in float32 here (measured 2.6e-6 of the
    # magnitude; 2.3e-5 of values in [0, 1] on 300x400 noise). PIL itself also rounds to uint8
    # after each pass (1/255 apart on smooth images, more on noise where it clips overshoots).
    support.assert_close(fr.clip_preprocess(x, size).numpy(), numpy_clip_preprocess(x, size),
                         2e-5)


def test_clip_preprocess_in_tf_data_with_varying_sizes():
  images = [np.full((1, 20, 30, 3), 100, np.uint8), np.full((1, 40, 24, 3), 200, np.uint8)]
  ds = tf.data.Dataset.from_generator(lambda: iter(images),
                                      output_signature=tf.TensorSpec([1, None, None, 3], tf.uint8))
  out = list(ds.map(lambda x: fr.clip_preprocess(x, 16)).as_numpy_iterator())
  for image, got in zip(images, out):
    assert got.shape == (1, 16, 16, 3)
    support.assert_close(got, np.broadcast_to((image[0, 0, 0] / 255.0 - MEAN) / STD, got.shape),
                         support.f32_rtol(16))
  with pytest.raises(TypeError, match='uint8'):
    fr.clip_preprocess(np.zeros((1, 4, 4, 3), np.float32), 4)


def test_train_augment_box_flip_and_seeds():
  boxes = np.stack([fr.random_resized_crop_box(tf.constant(60), tf.constant(80),
                                               tf.constant([s, 1])).numpy() for s in range(60)])
  top, left, h, w = boxes.T
  assert (top >= 0).all() and (left >= 0).all() and (top + h <= 60).all() and (left + w <= 80).all()
  area, aspect = h * w / (60 * 80), w / h
  assert (area >= 0.5 - 0.03).all() and (area <= 1.0).all()  # rounding of h, w
  assert (aspect >= 0.75 - 0.05).all() and (aspect <= 4 / 3 + 0.05).all()
  assert len({tuple(b) for b in boxes}) > 50
  # A horizontal ramp: a flipped clip decreases along the width.
  ramp = np.broadcast_to(np.arange(0, 240, 3, dtype=np.uint8)[None, None, :, None],
                         (2, 60, 80, 3)).copy()
  slopes = []
  for s in range(20):
    out = fr.clip_train_augment(ramp, tf.constant([s, 0]), 16).numpy()
    assert out.shape == (2, 16, 16, 3)
    np.testing.assert_array_equal(out[0], out[1])  # one crop and flip for all frames
    slopes.append(np.sign(out[0, 8, -1, 0] - out[0, 8, 0, 0]))
  assert {-1.0, 1.0} <= set(slopes)
  a = fr.clip_train_augment(ramp, tf.constant([3, 4]), 16).numpy()
  np.testing.assert_array_equal(a, fr.clip_train_augment(ramp, tf.constant([3, 4]), 16).numpy())
  flat = fr.clip_train_augment(np.full((1, 30, 40, 3), 50, np.uint8), tf.constant([0, 0]), 8)
  support.assert_close(flat.numpy(), np.broadcast_to((50 / 255.0 - MEAN) / STD, (1, 8, 8, 3)),
                       support.f32_rtol(16))


# ----------------------------------------------------------------------------- annotation readers


def make_msrvtt(folder) -> None:
  os.makedirs(folder, exist_ok=True)
  write_csv(folder / 'MSRVTT_train.9k.csv', [['video_id'], ['video3'], ['video1']])
  write_csv(folder / 'MSRVTT_JSFUSION_test.csv',
            [['key', 'vid_key', 'video_id', 'sentence'],
             ['ret0', 'msr9', 'video9', 'a dog, running'], ['ret1', 'msr8', 'video8', 'a cat']])
  sentences = [{'caption': 'one b', 'video_id': 'video1', 'sen_id': 5},
               {'caption': 'three a', 'video_id': 'video3', 'sen_id': 2},
               {'caption': 'nine', 'video_id': 'video9', 'sen_id': 0},
               {'caption': 'one a', 'video_id': 'video1', 'sen_id': 1},
               {'caption': 'three b', 'video_id': 'video3', 'sen_id': 7}]
  (folder / 'MSRVTT_data.json').write_text(json.dumps({'info': {}, 'videos': [],
                                                       'sentences': sentences}))


def test_read_msrvtt_train_and_test(tmp_path):
  make_msrvtt(tmp_path)
  train = tv.read_msrvtt(tmp_path, 'train')
  # Videos in CSV order, each with all its sentences in JSON order; other videos' ignored.
  assert train.video_ids == ['video3', 'video1']
  assert train.captions == [('2', 'video3', 'three a'), ('7', 'video3', 'three b'),
                            ('5', 'video1', 'one b'), ('1', 'video1', 'one a')]
  assert train.caption_video_index().tolist() == [0, 0, 1, 1]
  assert train.video_files == {'video3': 'video3.mp4', 'video1': 'video1.mp4'}
  test = tv.read_msrvtt(tmp_path, 'test')
  assert test.video_ids == ['video9', 'video8']
  assert test.captions == [('ret0', 'video9', 'a dog, running'), ('ret1', 'video8', 'a cat')]
  splits = tv.read_splits('msrvtt', tmp_path)
  assert splits['val'] is splits['test'] and splits['train'].name == 'train'


def test_read_msrvtt_bad_input(tmp_path):
  make_msrvtt(tmp_path)
  with pytest.raises(FileNotFoundError, match='MSRVTT_train.7k.csv'):
    tv.read_msrvtt(tmp_path, 'train', train_file='7k')
  with pytest.raises(ValueError, match='"train" or "test"'):
    tv.read_msrvtt(tmp_path, 'val')
  data = json.loads((tmp_path / 'MSRVTT_data.json').read_text())
  data['sentences'].append({'caption': 'again', 'video_id': 'video1', 'sen_id': 5})
  (tmp_path / 'MSRVTT_data.json').write_text(json.dumps(data))
  with pytest.raises(DataError, match=r'MSRVTT_data.json: sentences\[5\]: duplicate sen_id'):
    tv.read_msrvtt(tmp_path, 'train')
  data['sentences'] = [s for s in data['sentences'][:-1] if s['video_id'] != 'video1']
  (tmp_path / 'MSRVTT_data.json').write_text(json.dumps(data))
  with pytest.raises(DataError, match=r"have no sentence .* \['video1'\] \(line 3\)"):
    tv.read_msrvtt(tmp_path, 'train')
  with open(tmp_path / 'MSRVTT_JSFUSION_test.csv', 'a', encoding='utf-8') as f:
    f.write('ret0,msr7,video7,again\nret9,msr7\n')
  with pytest.raises(DataError, match=r'JSFUSION_test.csv:4: duplicate key .ret0. \(first on '
                                      r'line 2\)'):
    tv.read_msrvtt(tmp_path, 'test')
  write_csv(tmp_path / 'MSRVTT_JSFUSION_test.csv',
            [['key', 'vid_key', 'video_id', 'sentence'], ['ret0', 'm', 'video9', 'x'],
             ['ret9', 'm']])
  with pytest.raises(DataError, match=r'JSFUSION_test.csv:3: 2 fields, expected 4'):
    tv.read_msrvtt(tmp_path, 'test')
  write_csv(tmp_path / 'MSRVTT_JSFUSION_test.csv', [['key', 'vid_key', 'video_id', 'sentence']])
  with pytest.raises(DataError, match='has no captions'):
    tv.read_msrvtt(tmp_path, 'test')


DIDEMO_HEADER = ['success', 'video_path', 'starts', 'ends', 'text', 'formatted_data']


def didemo_row(name, text, number, split='test', span=('tensor([[0]])', 'tensor([[31]])')):
  return ['True', f'/data/didemo/all_videos/{name}', *span, text,
          f'/data/didemo/formatted_data/{split}_data_id_{number}.pth']


def test_read_didemo(tmp_path):
  write_csv(tmp_path / 'didemo_test_label.csv', [
      DIDEMO_HEADER, didemo_row('1@N00_2_ab.avi', 'a man walks.\nhe sits down.\n', 0),
      didemo_row('7@N01_3_cd.', 'a dog', 12, span=('tensor([0])', 'tensor([31])'))])
  split = tv.read_didemo(tmp_path, 'test')
  assert split.video_ids == ['1@N00_2_ab', '7@N01_3_cd']
  assert split.captions == [('test_data_id_00000', '1@N00_2_ab', 'a man walks.\nhe sits down.\n'),
                            ('test_data_id_00012', '7@N01_3_cd', 'a dog')]
  assert split.video_files == {'1@N00_2_ab': '1@N00_2_ab.avi', '7@N01_3_cd': '7@N01_3_cd.'}


@pytest.mark.parametrize('rows, message', [
    ([didemo_row('a.avi', 'x', 0, span=('tensor([[5]])', 'tensor([[10]])'))],
     r'didemo_test_label.csv:2: span \[5, 10\] s'),
    ([didemo_row('a.avi', 'x', 0), didemo_row('a.mp4', 'y', 1)],
     r"didemo_test_label.csv:3: video 'a' again \(first on line 2\)"),
    ([didemo_row('a.avi', 'x', 0), didemo_row('b.avi', 'y', 0)],
     r"didemo_test_label.csv:3: duplicate data id 'test_data_id_00000'"),
    ([didemo_row('a.avi', ' ', 0)], r"didemo_test_label.csv:2: video 'a' has an empty text"),
    ([didemo_row('a.avi', 'x', 'zero')], r'didemo_test_label.csv:2: formatted_data'),
    ([didemo_row('a.avi', 'x', 0, span=('tensor([[0]])', 'end'))], r':2: ends .end.'),
])
def test_read_didemo_bad_rows(tmp_path, rows, message):
  write_csv(tmp_path / 'didemo_test_label.csv', [DIDEMO_HEADER, *rows])
  with pytest.raises(DataError, match=message):
    tv.read_didemo(tmp_path, 'test')


def test_read_didemo_bad_files(tmp_path):
  with pytest.raises(FileNotFoundError, match='didemo_train_label.csv'):
    tv.read_didemo(tmp_path, 'train')
  write_csv(tmp_path / 'didemo_train_label.csv', [DIDEMO_HEADER[:4]])
  with pytest.raises(DataError, match=r"didemo_train_label.csv:1: header .* lacks column\(s\) "
                                      r"\['text', 'formatted_data'\]"):
    tv.read_didemo(tmp_path, 'train')
  write_csv(tmp_path / 'didemo_train_label.csv', [DIDEMO_HEADER])
  with pytest.raises(DataError, match='no rows'):
    tv.read_didemo(tmp_path, 'train')


LSMDC_LINES = ['1001_Movie_A_00.00.01.000-00.00.02.000\t1\t2\t1\t2\tSomeone "opens" the door.',
               '"1001_Movie_A_00.00.03.000-00.00.04.000\t1\t2\t1\t2\tHe smiles.',
               '1012_Unbreakable_00.05.16.065-00.05.21.941\t1\t2\t1\t2\tSkipped.',
               '',
               '2002_Other_01.00.03.000-01.00.04.000\t1\t2\t1\t2\tShe runs.']


def test_read_lsmdc(tmp_path):
  (tmp_path / 'LSMDC16_annos_training.csv').write_text('\n'.join(LSMDC_LINES) + '\n')
  split = tv.read_lsmdc(tmp_path, 'train')
  ids = ['1001_Movie_A_00.00.01.000-00.00.02.000', '1001_Movie_A_00.00.03.000-00.00.04.000',
         '2002_Other_01.00.03.000-01.00.04.000']
  assert split.video_ids == ids
  assert [c[0] for c in split.captions] == ids and [c[1] for c in split.captions] == ids
  assert [c[2] for c in split.captions] == ['Someone "opens" the door.', 'He smiles.',
                                            'She runs.']
  assert split.video_files[ids[2]] == '2002_Other/2002_Other_01.00.03.000-01.00.04.000.avi'
  assert [s[0] for s in split.skipped] == ['1012_Unbreakable_00.05.16.065-00.05.21.941']
  assert 'LSMDC16_annos_training.csv:3' in split.skipped[0][1]
  with pytest.raises(FileNotFoundError, match='LSMDC16_challenge_1000_publictect.csv'):
    tv.read_lsmdc(tmp_path, 'test')


@pytest.mark.parametrize('line, message', [
    ('x_00.00.01.000-00.00.02.000\t1\t2\tonly four', r'training.csv:2: 4 tab-separated fields'),
    (LSMDC_LINES[0], r'training.csv:2: duplicate clip id .* \(first on line 1\)'),
    ('clip 1\t1\t2\t1\t2\tA.', r"training.csv:2: clip id 'clip 1' is empty or holds whitespace"),
    ('cl"ip\t1\t2\t1\t2\tA.', r'training.csv:2: clip id .* has a quote inside'),
])
def test_read_lsmdc_bad_lines(tmp_path, line, message):
  (tmp_path / 'LSMDC16_annos_training.csv').write_text(LSMDC_LINES[0] + '\n' + line + '\n')
  with pytest.raises(DataError, match=message):
    tv.read_lsmdc(tmp_path, 'train')


def test_split_checks():
  with pytest.raises(DataError, match="caption 'c2' is of video 'v9', which is not in"):
    tv.TextVideoSplit('msrvtt', 'test', ['v1'], [('c1', 'v1', 'a'), ('c2', 'v9', 'b')], {}, 'f')
  with pytest.raises(DataError, match='has no captions'):
    tv.TextVideoSplit('msrvtt', 'test', [], [], {}, 'f')
  with pytest.raises(DataError, match="duplicate caption id 'c1'"):
    tv.TextVideoSplit('msrvtt', 'test', ['v1'], [('c1', 'v1', 'a'), ('c1', 'v1', 'b')], {}, 'f')
  with pytest.raises(DataError, match=r"video id 'v#1' is empty or holds"):
    tv.TextVideoSplit('msrvtt', 'test', ['v#1'], [('c1', 'v#1', 'a')], {}, 'f')
  with pytest.raises(DataError, match=r"have no caption, e.g. \['v2'\]"):
    tv.TextVideoSplit('msrvtt', 'test', ['v1', 'v2'], [('c1', 'v1', 'a')], {}, 'f')
  with pytest.raises(ValueError, match='dataset must be one of'):
    tv.read_split('vatex', '.', 'test')


# ----------------------------------------------------------------------------- frames pipeline


@pytest.fixture
def frame_split(tmp_path):
  """3 videos (5, 2 and 9 frames of 6x8), 5 captions; frames under tmp_path/frames."""
  split = tv.TextVideoSplit(
      'msrvtt', 'test', ['va', 'vb', 'vc'],
      [('c0', 'va', 'a red car'), ('c1', 'vb', 'two dogs play'), ('c2', 'va', 'car'),
       ('c3', 'vc', 'the sea at night'), ('c4', 'vc', 'waves')], {}, 'test')
  for vid, n, start in (('va', 5, 0), ('vb', 2, 100), ('vc', 9, 3)):
    write_frames(tmp_path / 'frames' / vid, n, start=start)
  return split, tmp_path / 'frames'


def test_frame_dataset_eval_order_values_and_padding(frame_split):
  split, root = frame_split
  data = tvf.frame_dataset(split, root, tokenize=fake_tokenize, batch_size=2, num_frames=4,
                          size=8)
  batches = list(data)
  assert len(batches) == len(data) == 3 and data.batches_per_epoch == 3
  cat = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
  assert cat['video_index'].tolist() == [0, 1, 0, 2, 2, -1]
  assert cat['caption_index'].tolist() == [0, 1, 2, 3, 4, -1]
  assert cat['valid'].tolist() == [True] * 5 + [False]
  assert cat['frames'].shape == (6, 4, 8, 8, 3) and cat['frames'].dtype == np.float32
  assert cat['tokens'].dtype == np.int32
  tokens = fake_tokenize([t for _, _, t in split.captions])
  np.testing.assert_array_equal(cat['tokens'][:5], tokens)
  assert not cat['tokens'][5].any() and not cat['frames'][5].any()
  for row in range(5):
    vid = split.video_ids[cat['video_index'][row]]
    expected = fr.clip_preprocess(fr.read_frame_folder(root / vid, 4), 8).numpy()
    support.assert_close(cat['frames'][row], expected, support.f32_rtol(1))


def test_frame_dataset_shuffle_rand_augment_reproducible(frame_split):
  split, root = frame_split
  starts, counts = {'va': 0, 'vb': 100, 'vc': 3}, {'va': 5, 'vb': 2, 'vc': 9}

  def epochs(seed, augment):
    data = tvf.frame_dataset(split, root, tokenize=fake_tokenize, batch_size=2, num_frames=3,
                            size=8, mode='rand', train_augment=augment, shuffle=True, seed=seed,
                            num_epochs=2, drop_remainder=True)
    return list(data)

  a, b, c = epochs(0, True), epochs(0, True), epochs(1, True)
  assert len(a) == 4  # 2 full batches per epoch, the 5th pair dropped
  for x, y in zip(a, b):
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])
  order = lambda batches: [np.concatenate([x['caption_index'] for x in batches[e * 2:e * 2 + 2]])
                           .tolist() for e in (0, 1)]
  first, second = order(a)
  assert len(set(first)) == 4 and set(first) <= set(range(5)) and first != second
  assert order(c) != order(a) and all(x['valid'].all() for x in a)
  # 'rand' frames without augmentation: each frame a random one of its segment (frame k of a
  # video has the value start + 10 k).
  for batch in epochs(0, False):
    for row in range(2):
      vid = split.video_ids[batch['video_index'][row]]
      value = (batch['frames'][row, :, 0, 0, 0] * STD[0] + MEAN[0]) * 255
      idx = np.rint((value - starts[vid]) / 10).astype(int)
      edges = np.linspace(0, counts[vid], min(3, counts[vid]) + 1).astype(int)
      low = edges[:-1]
      high = np.maximum(edges[1:] - 2, low)
      k = len(low)
      assert (idx[:k] >= low).all() and (idx[:k] <= high).all(), (vid, idx)
      assert (idx[k:] == idx[k - 1]).all()


def test_frame_dataset_bad_input(frame_split, tmp_path):
  split, root = frame_split
  missing = tv.TextVideoSplit('msrvtt', 'test', ['va', 'vz'],
                              [('c0', 'va', 'x'), ('c1', 'vz', 'y')], {}, 'test')
  with pytest.raises(FileNotFoundError, match=r'video vz: .*frames/vz'):
    tvf.frame_dataset(missing, root, tokenize=fake_tokenize, batch_size=2)
  (root / 'vb' / 'f2.png').write_bytes(b'corrupt')
  data = tvf.frame_dataset(split, root, tokenize=fake_tokenize, batch_size=2, num_frames=4,
                          size=8)
  with pytest.raises(DataError, match=r'vb/f2\.png: cannot read or decode'):
    list(data)
  with pytest.raises(ValueError, match='tokenize'):
    tvf.frame_dataset(split, root, tokenize=lambda t: np.zeros(len(t)), batch_size=2)


# ----------------------------------------------------------------------------- frozen features


def feature_inputs(tmp_path, n_frames=None, dim=16):
  """A 2-split MSR-VTT-like input: frame features video -> [n, dim], text caption -> [dim]."""
  make_msrvtt(tmp_path / 'ann')
  splits = tv.read_splits('msrvtt', tmp_path / 'ann')
  rng = np.random.default_rng(0)
  n_frames = n_frames or {'video3': 30, 'video1': 12, 'video9': 5, 'video8': 40}
  frames = {v: rng.standard_normal((n, dim)).astype(np.float32) for v, n in n_frames.items()}
  texts = {c: rng.standard_normal(dim).astype(np.float32) for s in splits.values()
           for c in s.caption_ids}
  for path, arrays in ((tmp_path / 'frames.h5', frames), (tmp_path / 'text.h5', texts)):
    with h5py.File(path, 'w') as f:
      for k, x in arrays.items():
        f.create_dataset(k, data=x)
  return splits, frames, texts


def test_feature_release_reads_back_unchanged(tmp_path):
  splits, frames, texts = feature_inputs(tmp_path)
  counts = tvx.write_feature_release(splits, tmp_path / 'frames.h5', tmp_path / 'text.h5',
                                    tmp_path / 'out', 'msrvtt', num_frames=12, dim=16)
  assert counts['train'] == tvx.FeatureCounts(videos=2, captions=4, short_videos=0)
  assert counts['test'] == tvx.FeatureCounts(videos=2, captions=2, short_videos=1)
  with release_lib.Release(tmp_path / 'out', 'msrvtt', tv.VISUAL_FEATURE, tv.TEXT_FEATURE,
                           max_frames=12) as rel:
    assert rel.splits == ('train', 'val', 'test')
    for name, split in splits.items():
      got = rel.split(name)
      assert got.video_ids == split.video_ids
      assert got.caption_ids == [f'{v}#{c}' for c, v, _ in split.captions]
      assert [t for _, t in got.captions] == [t for _, _, t in split.captions]
      for vid in split.video_ids:
        idx = fr.sample_frame_indices(len(frames[vid]), 12, 'uniform')
        np.testing.assert_array_equal(got.raw_video_features(vid), frames[vid][idx])
        np.testing.assert_array_equal(got.video_features(vid)[1], frames[vid][idx])
      for cap_id, vid, _ in split.captions:
        np.testing.assert_array_equal(got.caption_features(f'{vid}#{cap_id}'),
                                      texts[cap_id][None])
  short = release_lib.Release(tmp_path / 'out', 'msrvtt', tv.VISUAL_FEATURE, tv.TEXT_FEATURE)
  np.testing.assert_array_equal(short.split('test').raw_video_features('video9'),
                                frames['video9'][[0, 1, 2, 3, 4] + [4] * 7])


def test_feature_pairs(tmp_path):
  splits, frames, texts = feature_inputs(tmp_path)
  tvx.write_feature_release(splits, tmp_path / 'frames.h5', tmp_path / 'text.h5',
                           tmp_path / 'out', 'msrvtt', dim=16)
  train = splits['train']
  batches = list(tvx.feature_pairs(tmp_path / 'out', 'msrvtt', 'train', batch_size=3))
  cat = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
  assert cat['caption_index'].tolist() == [0, 1, 2, 3, -1, -1]
  assert cat['video_index'].tolist() == [0, 0, 1, 1, -1, -1]
  assert cat['valid'].tolist() == [True] * 4 + [False] * 2
  for row, (cap_id, vid, _) in enumerate(train.captions):
    idx = fr.sample_frame_indices(len(frames[vid]), 12)
    np.testing.assert_array_equal(cat['video_feats'][row], frames[vid][idx])
    np.testing.assert_array_equal(cat['text_feats'][row], texts[cap_id])
  assert not cat['video_feats'][4:].any() and not cat['text_feats'][4:].any()
  shuffled = [b['caption_index'].tolist() for b in tvx.feature_pairs(
      tmp_path / 'out', 'msrvtt', 'train', batch_size=2, shuffle=True, seed=3, num_epochs=2)]
  assert shuffled == [tv.pair_order(4, 2, shuffle=True, seed=3, epoch=e, drop_remainder=False)
                      .tolist()[i:i + 2] for e in (0, 1) for i in (0, 2)]
  assert sorted(shuffled[0] + shuffled[1]) == [0, 1, 2, 3]


def test_feature_release_prepares_shards(tmp_path):
  from prvr_jax.data import pipeline, prepare  # pylint: disable=g-import-not-at-top
  splits, frames, _ = feature_inputs(tmp_path)
  tvx.write_feature_release({'train': splits['train'], 'test': splits['test']},
                           tmp_path / 'frames.h5', tmp_path / 'text.h5', tmp_path / 'out',
                           'msrvtt', dim=16)
  prepare.prepare_shards(str(tmp_path / 'out'), str(tmp_path / 'shards'), collection='msrvtt',
                         visual_feature=tv.VISUAL_FEATURE, text_feature=tv.TEXT_FEATURE,
                         num_shards=1)
  shards = pipeline.open_shards(str(tmp_path / 'shards'))
  index = pipeline.eval_index(shards, 'test')
  assert list(index.video_ids) == splits['test'].video_ids
  videos = list(pipeline.eval_videos(shards, 'test', global_batch_size=2))
  idx = fr.sample_frame_indices(40, 12)
  row = list(videos[0]['video_index']).index(1)  # video8
  np.testing.assert_array_equal(videos[0]['frame_feats'][row, :12], frames['video8'][idx])
  assert not videos[0]['frame_mask'][row, 12:].any()


def test_feature_release_bad_input(tmp_path):
  splits, _, _ = feature_inputs(tmp_path)
  args = (splits, tmp_path / 'frames.h5', tmp_path / 'text.h5', tmp_path / 'out', 'msrvtt')
  with pytest.raises(DataError, match=r"video 'video3' has features of shape \(30, 16\) in "
                                      r'.*frames.h5, expected \[n_frames >= 1, 512\]'):
    tvx.write_feature_release(*args)
  with h5py.File(tmp_path / 'frames.h5', 'a') as f:
    del f['video8']
  with pytest.raises(DataError, match=r'1 of 4 videos have no features in .*frames.h5:\n'
                                      r'  video8'):
    tvx.write_feature_release(*args, dim=16)
  with h5py.File(tmp_path / 'frames.h5', 'a') as f:
    f.create_dataset('video8', data=np.zeros((0, 16), np.float32))
  with pytest.raises(DataError, match=r"video 'video8' has features of shape \(0, 16\)"):
    tvx.write_feature_release(*args, dim=16)
  with h5py.File(tmp_path / 'frames.h5', 'a') as f:
    del f['video8']
    f.create_dataset('video8', data=np.full((3, 16), np.nan, np.float32))
  with h5py.File(tmp_path / 'text.h5', 'a') as f:
    del f['ret1']
  with pytest.raises(DataError, match=r'1 of 6 captions have no features in .*text.h5:\n  ret1'):
    tvx.write_feature_release(*args, dim=16)
  with h5py.File(tmp_path / 'text.h5', 'a') as f:
    f.create_dataset('ret1', data=np.zeros((2, 16), np.float32))
  with pytest.raises(DataError, match=r"caption 'ret1' has features of shape \(2, 16\)"):
    tvx.write_feature_release(*args, dim=16)
  with h5py.File(tmp_path / 'text.h5', 'a') as f:
    del f['ret1']
    f.create_dataset('ret1', data=np.zeros(16, np.float32))
  with pytest.raises(DataError, match=r"video 'video8': NaN/Inf in its features in .*frames.h5"):
    tvx.write_feature_release(*args, dim=16)
  assert os.listdir(tmp_path / 'out') == []  # nothing left behind
  with pytest.raises(FileNotFoundError, match='absent.h5'):
    tvx.write_feature_release(splits, tmp_path / 'absent.h5', *args[2:], dim=16)
  os.makedirs(tmp_path / 'out' / 'msrvtt')
  with pytest.raises(FileExistsError, match='out/msrvtt exists'):
    tvx.write_feature_release(*args, dim=16)


def test_feature_release_cli(tmp_path):
  feature_inputs(tmp_path, dim=512)
  proc = support.run_cli(
      'prvr_jax/tools/write_text_video.py', '--dataset=msrvtt', f'--annotations={tmp_path / "ann"}',
      f'--frame_features={tmp_path / "frames.h5"}', f'--text_features={tmp_path / "text.h5"}',
      f'--out={tmp_path / "out"}', '--splits=train=train,test=test', cache_dir=None)
  assert 'train (train): 2 videos, 4 captions' in proc.stdout
  rel = release_lib.Release(tmp_path / 'out', 'msrvtt', tv.VISUAL_FEATURE, tv.TEXT_FEATURE)
  assert rel.splits == ('train', 'test') and rel.split('test').visual_dim == 512


def test_feature_release_refuses_a_declared_shape_past_the_cap(tmp_path):
  """A small frame HDF5 declaring one video as [5,000,000, 512] is refused from its metadata
  (no numpy allocation error), the error's last line naming the file and the video."""
  splits, _, _ = feature_inputs(tmp_path, dim=512)
  with h5py.File(tmp_path / 'frames.h5', 'a') as f:
    del f['video8']
    f.create_dataset('video8', shape=(5_000_000, 512), dtype=np.float32, chunks=(1024, 512),
                     compression='gzip')
  assert os.path.getsize(tmp_path / 'frames.h5') < 1 << 20
  with pytest.raises(DataError) as e:
    tvx.write_feature_release(splits, tmp_path / 'frames.h5', tmp_path / 'text.h5',
                              tmp_path / 'out', 'msrvtt')
  last = str(e.value).splitlines()[-1]
  assert "video 'video8' declares features of shape (5000000, 512)" in last
  assert last.endswith(str(tmp_path / 'frames.h5'))
  assert not os.path.exists(tmp_path / 'out' / 'msrvtt')


def test_feature_release_reads_only_the_sampled_frames(tmp_path, monkeypatch):
  """The writer reads the `num_frames` rows it keeps, not the whole video (same values)."""
  splits, frames, _ = feature_inputs(tmp_path)
  asked = []
  read = release_lib.H5Features.read

  def spy(self, key, rows=None):
    asked.append((key, None if rows is None else len(rows)))
    return read(self, key, rows)

  monkeypatch.setattr(release_lib.H5Features, 'read', spy)
  tvx.write_feature_release(splits, tmp_path / 'frames.h5', tmp_path / 'text.h5',
                            tmp_path / 'out', 'msrvtt', num_frames=12, dim=16)
  assert {k: n for k, n in asked if k in frames} == {v: 12 for v in frames}
  layout = release_lib.Layout(str(tmp_path / 'out' / 'msrvtt'), 'msrvtt', tv.VISUAL_FEATURE,
                              tv.TEXT_FEATURE)
  with h5py.File(layout.clip_video_feature_path, 'r') as f:
    idx = fr.sample_frame_indices(40, 12)
    np.testing.assert_array_equal(f['video8'][...], frames['video8'][idx])


def test_image_declaring_a_huge_size_is_refused_before_decoding(tmp_path):
  """A PNG header claiming 100000x100000 pixels (a decompression bomb) is refused from the
  header, naming the file."""
  import struct  # pylint: disable=g-import-not-at-top
  import zlib  # pylint: disable=g-import-not-at-top
  ihdr = struct.pack('>IIBBBBB', 100_000, 100_000, 8, 2, 0, 0, 0)
  chunk = lambda kind, data: (struct.pack('>I', len(data)) + kind + data
                              + struct.pack('>I', zlib.crc32(kind + data)))
  path = tmp_path / 'f0001.png'
  path.write_bytes(b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', ihdr)
                   + chunk(b'IDAT', zlib.compress(b'\0' * 1000)) + chunk(b'IEND', b''))
  with pytest.raises(DataError) as e:
    fr.decode_image(str(path))
  last = str(e.value).splitlines()[-1]
  assert last.startswith(f'{path}: the image declares 100000x100000 (WxH) pixels')


def test_video_declaring_huge_frames_is_refused_before_decoding(tmp_path):
  """A container declaring 100000x100000 frames (here a stub of cv2's reader) is refused
  before a frame is decoded, naming the file."""
  path = tmp_path / 'v.mp4'
  path.write_bytes(b'')

  class Capture:
    def __init__(self, _):
      self.reads = 0

    def isOpened(self):  # pylint: disable=invalid-name
      return True

    def get(self, prop):
      return {3: 100_000, 4: 100_000, 7: 10}[prop]

    def read(self):
      raise AssertionError('decoded a frame')

    def release(self):
      pass

  cv2 = type('cv2', (), {'VideoCapture': Capture, 'CAP_PROP_FRAME_WIDTH': 3,
                         'CAP_PROP_FRAME_HEIGHT': 4, 'CAP_PROP_FRAME_COUNT': 7})
  with pytest.raises(DataError) as e:
    fr._read_video_cv2(cv2, str(path), 12, 'uniform', None)
  assert str(e.value).splitlines()[-1].startswith(
      f'{path}: the video declares 100000x100000 (WxH) frames')
