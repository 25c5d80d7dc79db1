"""Video frames for text-video retrieval (T-MASS / X-Pool): which frames the official loader
samples (`sample_frame_indices`), reading them from frame folders or video files as uint8
`[T, H, W, 3]` RGB, and CLIP preprocessing in TensorFlow ops for `tf.data`. Every choice and
every difference from the official code: docs/text_video_data.md.
"""

from collections.abc import Sequence
import math
import os
import re
import struct

import numpy as np
import tensorflow as tf

from prvr_jax.data.release import MAX_FEATURE_ELEMENTS, DataError
from prvr_jax.files import short

# CLIP's image normalisation (OpenAI CLIP, also T-MASS's transforms), RGB order.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
CLIP_SIZE = 224
NUM_FRAMES = 12  # T-MASS's --num_frames
SAMPLE_MODES = ('uniform', 'rand')
IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png')
# torchvision RandomResizedCrop as in T-MASS's training transform.
TRAIN_CROP_SCALE = (0.5, 1.0)
TRAIN_CROP_RATIO = (3.0 / 4.0, 4.0 / 3.0)
_CROP_ATTEMPTS = 10  # torchvision's tries before its fallback crop
_VIDEO_READ_RETRIES = 5  # T-MASS: frames read past a failed one before giving up


def sample_frame_indices(num_frames_in_video: int, num_samples: int = NUM_FRAMES,
                         mode: str = 'uniform', rng: np.random.Generator | None = None,
                         video: str = '') -> np.ndarray:
  """Indices `[num_samples]` int64 of the frames the official loader reads from a video.

  The video's `n` frames are cut into `k = min(num_samples, n)` segments at
  `floor(linspace(0, n, k + 1))`; segment `[s, e)` gives `(s + e - 1) // 2` ('uniform') or a
  random frame of `[s, e - 2]` ('rand', drawn with `rng`; a one-frame segment gives `s`). A
  video with fewer than `num_samples` frames repeats its last one. `video` names it in errors.
  """
  what = f'video {short(video)}' if video else 'video'
  if mode not in SAMPLE_MODES:
    raise ValueError(f'frame sampling mode must be one of {SAMPLE_MODES}, got {mode!r}')
  if num_samples < 1:
    raise ValueError(f'num_samples must be >= 1, got {num_samples}')
  n = int(num_frames_in_video)
  if n < 1:
    raise DataError(f'{what} has {n} frames: nothing to sample')
  k = min(num_samples, n)
  edges = np.linspace(0, n, k + 1).astype(np.int64)
  starts, last = edges[:-1], edges[1:] - 1  # segment k: frames starts[k] .. last[k]
  if mode == 'uniform':
    idx = (starts + last) // 2
  else:
    rng = np.random.default_rng() if rng is None else rng
    idx = rng.integers(starts, np.maximum(last, starts + 1))  # high exclusive: s .. e - 2
  if k < num_samples:
    idx = np.concatenate([idx, np.full(num_samples - k, idx[-1])])
  return idx.astype(np.int64)


def _natural_key(name: str) -> list:
  """'f2.jpg' < 'f10.jpg': digit runs compare as numbers (zero-padded names sort as text)."""
  return [(0, int(part), part) if part.isdigit() else (1, 0, part)
          for part in re.split(r'(\d+)', name)]


def list_frame_files(folder: str, video: str = '') -> list[str]:
  """The frame images of a folder (.jpg / .jpeg / .png, any case; other files are ignored), in
  natural name order; errors name the folder (and `video`)."""
  what = f'video {short(video)}: ' if video else ''
  folder = os.fspath(folder)
  if not os.path.isdir(folder):
    raise FileNotFoundError(f'{what}frame folder {folder} does not exist')
  names = [n for n in os.listdir(folder)
           if n.lower().endswith(IMAGE_EXTENSIONS) and os.path.isfile(os.path.join(folder, n))]
  if not names:
    raise DataError(f'{what}frame folder {folder} has no frames ({"/".join(IMAGE_EXTENSIONS)} '
                    'files): 0 frames')
  return [os.path.join(folder, n) for n in sorted(names, key=_natural_key)]


def _declared_size(data: bytes) -> tuple[int, int] | None:
  """(width, height) an image file's header declares (PNG, JPEG, GIF, BMP), without decoding;
  None for another format (the decoder then refuses it)."""
  if data[:8] == b'\x89PNG\r\n\x1a\n' and len(data) >= 24:
    return struct.unpack('>II', data[16:24])
  if data[:2] == b'\xff\xd8':
    try:
      height, width, _ = (int(n) for n in tf.io.extract_jpeg_shape(data).numpy())
    except tf.errors.OpError:
      return None  # not a readable JPEG header: the decoder names the problem
    return width, height
  if data[:6] in (b'GIF87a', b'GIF89a') and len(data) >= 10:
    return struct.unpack('<HH', data[6:10])
  if data[:2] == b'BM' and len(data) >= 26:
    width, height = struct.unpack('<ii', data[18:26])
    return abs(width), abs(height)
  return None


def decode_image(path: str) -> np.ndarray:
  """One image file as uint8 `[H, W, 3]` RGB (grey is repeated, alpha dropped).

  The size its header declares is checked against `release.MAX_FEATURE_ELEMENTS` values before
  decoding: a small file may declare a huge image (a decompression bomb).
  """
  try:
    with open(path, 'rb') as f:
      data = f.read()
    size = _declared_size(data)
    if size is not None and size[0] * size[1] * 3 > MAX_FEATURE_ELEMENTS:
      raise DataError(f'{path}: the image declares {size[0]}x{size[1]} (WxH) pixels, more than '
                      f'{MAX_FEATURE_ELEMENTS} values (release.MAX_FEATURE_ELEMENTS): not a '
                      'video frame, refused before decoding')
    image = tf.io.decode_image(data, channels=3, dtype=tf.uint8, expand_animations=False)
  except (OSError, tf.errors.OpError) as e:
    reason = getattr(e, 'message', None) or str(e)
    raise DataError(f'{path}: cannot read or decode the image '
                    f'({short(reason.splitlines()[0] if reason else "", 200, quote=False)})'
                    ) from None
  image = image.numpy()
  if image.ndim != 3 or image.shape[0] == 0 or image.shape[1] == 0:
    raise DataError(f'{path}: decoded to an empty image of shape {image.shape}')
  return image


def decode_frames(paths: Sequence[str]) -> np.ndarray:
  """Decodes frame images (a path may repeat; it is decoded once) to uint8 `[T, H, W, 3]`;
  they must have one size (a frame of another size raises naming both files and sizes)."""
  if not len(paths):
    raise ValueError('no frame paths to decode')
  decoded: dict[str, np.ndarray] = {}
  for p in paths:
    if p not in decoded:
      decoded[p] = decode_image(p)
  first = paths[0]
  for p, image in decoded.items():
    if image.shape != decoded[first].shape:
      raise DataError(f'frames of one video differ in size: {p} is {image.shape[1]}x'
                      f'{image.shape[0]} (WxH) but {first} is {decoded[first].shape[1]}x'
                      f'{decoded[first].shape[0]}; re-extract the frames at one size')
  return np.stack([decoded[p] for p in paths])


def read_frame_folder(folder: str, num_samples: int = NUM_FRAMES, mode: str = 'uniform',
                      rng: np.random.Generator | None = None, video: str = '') -> np.ndarray:
  """The sampled frames of a frame folder (`list_frame_files`, the video's frames in order):
  uint8 `[num_samples, H, W, 3]` RGB; only the sampled ones are decoded."""
  paths = list_frame_files(folder, video)
  idx = sample_frame_indices(len(paths), num_samples, mode, rng, video=video or folder)
  return decode_frames([paths[i] for i in idx])


def _import_decoder(decoder: str | None):
  """('av' | 'cv2', module): the requested decoder, else the first importable one."""
  names = ('av', 'cv2') if decoder is None else (decoder,)
  for name in names:
    if name not in ('av', 'cv2'):
      raise ValueError(f'decoder must be None, "av" or "cv2", got {decoder!r}')
    try:
      return name, __import__(name)
    except ImportError:
      continue
  raise ImportError(
      f'reading video files needs a video decoder: {" or ".join(names)} is not installed. '
      'Install the optional extra with `pip install prvr_jax[video]` (PyAV: pip install av) or '
      '`pip install opencv-python`, or extract frames to folders of images and use '
      'read_frame_folder.')


def _check_frame_size(path: str, width: int, height: int) -> None:
  """Refuses a video whose container declares frames past `release.MAX_FEATURE_ELEMENTS` values,
  before any is decoded (as `decode_image` for images)."""
  if int(width) * int(height) * 3 > MAX_FEATURE_ELEMENTS:
    raise DataError(f'{path}: the video declares {int(width)}x{int(height)} (WxH) frames, more '
                    f'than {MAX_FEATURE_ELEMENTS} values (release.MAX_FEATURE_ELEMENTS): refused '
                    'before decoding')


def _read_video_cv2(cv2, path: str, num_samples: int, mode: str, rng) -> np.ndarray:
  cap = cv2.VideoCapture(path)
  try:
    if not cap.isOpened():
      raise DataError(f'{path}: cv2 cannot open the video')
    _check_frame_size(path, cap.get(cv2.CAP_PROP_FRAME_WIDTH), cap.get(cv2.CAP_PROP_FRAME_HEIGHT))
    n = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
    idx = sample_frame_indices(n, num_samples, mode, rng, video=path)
    frames: dict[int, np.ndarray] = {}
    for i in dict.fromkeys(int(i) for i in idx):
      cap.set(cv2.CAP_PROP_POS_FRAMES, i)
      ok, frame = cap.read()
      for _ in range(_VIDEO_READ_RETRIES):
        if ok:
          break
        ok, frame = cap.read()
      if not ok:
        raise DataError(f'{path}: cannot read frame {i} (or the {_VIDEO_READ_RETRIES} after it) '
                        f'of the {n} frames the container declares')
      frames[i] = cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
  finally:
    cap.release()
  return np.stack([frames[int(i)] for i in idx])


def _read_video_av(av, path: str, num_samples: int, mode: str, rng) -> np.ndarray:
  def decode(keep):
    kept, count = {}, 0
    with av.open(path) as container:
      for count, frame in enumerate(container.decode(video=0), 1):
        if count - 1 in keep:
          kept[count - 1] = frame.to_ndarray(format='rgb24')
    return kept, count

  try:
    with av.open(path) as container:
      if not container.streams.video:
        raise DataError(f'{path}: no video stream')
      stream = container.streams.video[0]
      _check_frame_size(path, stream.codec_context.width, stream.codec_context.height)
      n = stream.frames  # from the container; 0 when unknown
    if n > 0:
      idx = sample_frame_indices(n, num_samples, mode, rng, video=path)
      kept, count = decode(set(idx.tolist()))
    if n <= 0 or len(kept) < len(set(idx.tolist())):  # unknown or wrong count: count frames
      _, n = decode(set())
      idx = sample_frame_indices(n, num_samples, mode, rng, video=path)
      kept, count = decode(set(idx.tolist()))
  except av.error.FFmpegError as e:
    raise DataError(f'{path}: cannot decode the video ({e})') from None
  return np.stack([kept[int(i)] for i in idx])


def read_video_file(path: str, num_samples: int = NUM_FRAMES, mode: str = 'uniform',
                    rng: np.random.Generator | None = None, decoder: str | None = None
                    ) -> np.ndarray:
  """The sampled frames of a video file: uint8 `[num_samples, H, W, 3]` RGB, decoded with the
  optional `av` (PyAV, tried first) or `cv2` (frames read by seeking, as the official loader)."""
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f'video file {path} does not exist')
  name, module = _import_decoder(decoder)
  read = _read_video_av if name == 'av' else _read_video_cv2
  return read(module, path, num_samples, mode, rng)


def _normalize(x: tf.Tensor) -> tf.Tensor:
  return (x - tf.constant(CLIP_MEAN, tf.float32)) / tf.constant(CLIP_STD, tf.float32)


def resize_shorter_side(x: tf.Tensor, size: int) -> tf.Tensor:
  """float `[T, H, W, C]` with its shorter side resized to `size` (bicubic, antialiased) and
  the longer to `int(size * long / short)`, as torchvision's `Resize(size)`; an image already
  of that size is returned unchanged."""
  shape = tf.shape(x)
  h, w = shape[1], shape[2]
  short_side, long_side = tf.minimum(h, w), tf.maximum(h, w)
  new_long = tf.cast(tf.floor(tf.cast(size * long_side, tf.float64)
                              / tf.cast(short_side, tf.float64)), tf.int32)
  new_h, new_w = tf.cond(w <= h, lambda: (new_long, size), lambda: (size, new_long))
  return tf.cond(
      tf.logical_and(tf.equal(new_h, h), tf.equal(new_w, w)), lambda: x,
      lambda: tf.image.resize(x, tf.stack([new_h, new_w]), method='bicubic', antialias=True))


def center_crop(x: tf.Tensor, size: int) -> tf.Tensor:
  """The central `size` x `size` window of `[T, H, W, C]` (H, W >= size); offsets
  `round((H - size) / 2)` with halves to even, as torchvision's `CenterCrop`."""
  shape = tf.shape(x)
  top = tf.cast(tf.round(tf.cast(shape[1] - size, tf.float64) / 2.0), tf.int32)
  left = tf.cast(tf.round(tf.cast(shape[2] - size, tf.float64) / 2.0), tf.int32)
  return x[:, top:top + size, left:left + size, :]


def clip_preprocess(frames: tf.Tensor, size: int = CLIP_SIZE) -> tf.Tensor:
  """CLIP's evaluation transform on uint8 frames `[T, H, W, 3]` -> float32 `[T, size, size, 3]`:
  scale to [0, 1], resize the shorter side to `size`, centre crop, normalise."""
  frames = tf.convert_to_tensor(frames)
  if frames.dtype != tf.uint8:
    raise TypeError(f'clip_preprocess expects uint8 frames, got {frames.dtype.name}')
  x = tf.cast(frames, tf.float32) / 255.0
  x = center_crop(resize_shorter_side(x, size), size)
  x = tf.ensure_shape(x, [frames.shape[0], size, size, 3])
  return _normalize(x)


def random_resized_crop_box(height: tf.Tensor, width: tf.Tensor, seed: tf.Tensor,
                            scale: tuple[float, float] = TRAIN_CROP_SCALE,
                            ratio: tuple[float, float] = TRAIN_CROP_RATIO) -> tf.Tensor:
  """`[4]` int32 (top, left, h, w) of torchvision's `RandomResizedCrop.get_params`, drawn with
  stateless random ops from `seed` `[2]`: 10 tries of an area fraction in `scale` and a
  log-uniform aspect ratio in `ratio`, the first that fits; else a central crop."""
  seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 4)
  area = tf.cast(height * width, tf.float64)
  target = area * tf.random.stateless_uniform([_CROP_ATTEMPTS], seeds[0], scale[0], scale[1],
                                              tf.float64)
  log_ratio = tf.random.stateless_uniform([_CROP_ATTEMPTS], seeds[1], math.log(ratio[0]),
                                          math.log(ratio[1]), tf.float64)
  aspect = tf.exp(log_ratio)
  ws = tf.cast(tf.round(tf.sqrt(target * aspect)), tf.int32)
  hs = tf.cast(tf.round(tf.sqrt(target / aspect)), tf.int32)
  fits = (ws > 0) & (ws <= width) & (hs > 0) & (hs <= height)
  first = tf.argmax(tf.cast(fits, tf.int32), output_type=tf.int32)
  unit = tf.random.stateless_uniform([2], seeds[2], 0.0, 1.0, tf.float64)

  def tried():
    h, w = hs[first], ws[first]
    top = tf.cast(tf.floor(unit[0] * tf.cast(height - h + 1, tf.float64)), tf.int32)
    left = tf.cast(tf.floor(unit[1] * tf.cast(width - w + 1, tf.float64)), tf.int32)
    return tf.stack([top, left, h, w])

  def fallback():
    in_ratio = tf.cast(width, tf.float64) / tf.cast(height, tf.float64)
    h_f, w_f = tf.cast(height, tf.float64), tf.cast(width, tf.float64)
    h = tf.where(in_ratio < ratio[0], tf.round(w_f / ratio[0]), h_f)
    w = tf.where(in_ratio > ratio[1], tf.round(h_f * ratio[1]), w_f)
    h, w = tf.cast(h, tf.int32), tf.cast(w, tf.int32)
    return tf.stack([(height - h) // 2, (width - w) // 2, h, w])

  return tf.cond(tf.reduce_any(fits), tried, fallback)


def clip_train_augment(frames: tf.Tensor, seed: tf.Tensor, size: int = CLIP_SIZE) -> tf.Tensor:
  """T-MASS's training transform on uint8 frames `[T, H, W, 3]` -> float32 `[T, size, size, 3]`:
  one random resized crop and one horizontal flip (p = 1/2) for all frames of the video, then
  CLIP's normalisation; deterministic given `seed` `[2]` int (stateless random ops)."""
  frames = tf.convert_to_tensor(frames)
  if frames.dtype != tf.uint8:
    raise TypeError(f'clip_train_augment expects uint8 frames, got {frames.dtype.name}')
  seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
  crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
  x = tf.cast(frames, tf.float32) / 255.0
  shape = tf.shape(x)
  box = random_resized_crop_box(shape[1], shape[2], crop_seed)
  x = x[:, box[0]:box[0] + box[2], box[1]:box[1] + box[3], :]
  x = tf.image.resize(x, [size, size], method='bilinear', antialias=False)
  flip = tf.random.stateless_uniform([], flip_seed, 0.0, 1.0) < 0.5
  x = tf.cond(flip, lambda: tf.reverse(x, axis=[2]), lambda: x)
  x = tf.ensure_shape(x, [frames.shape[0], size, size, 3])
  return _normalize(x)


def keep_tf_off_accelerators() -> None:
  """TensorFlow (decoding, preprocessing) stays on the CPU; accelerators are JAX's."""
  try:
    tf.config.set_visible_devices([], 'GPU')
  except RuntimeError:  # devices already initialised
    pass

