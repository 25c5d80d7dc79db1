"""Short synthetic videos for tests, the docs and the notebook: no download.

Each video has its own background hue and a square that moves across it and changes colour
once per second, so that the CLIP rows of one video differ from second to second and videos
differ from each other. Files are encoded with PyAV (`pip install prvr_jax[video]`); frame
folders are JPEG files written with PIL.

  from prvr_jax.data import synthetic_videos
  written = synthetic_videos.write_videos('/tmp/my_videos', count=12, seconds=4.0)
"""

import colorsys
import dataclasses
import os

import numpy as np

DEFAULT_SIZE = (96, 64)  # (width, height); even, as the yuv420p encoders need


@dataclasses.dataclass(frozen=True)
class Written:
  """One synthetic video: its id, path (file or frame folder), kind ('file' | 'frames'),
  frame count, rate and duration in seconds."""
  video_id: str
  path: str
  kind: str
  frames: int
  fps: float
  seconds: float


def video_frames(index: int, seconds: float, fps: float, size: tuple[int, int] = DEFAULT_SIZE,
                 seed: int = 0) -> np.ndarray:
  """uint8 `[T, H, W, 3]` RGB frames of synthetic video `index` (T = round(seconds * fps))."""
  width, height = size
  count = max(1, int(round(seconds * fps)))
  rng = np.random.default_rng([seed, index])
  hue = (index * 0.61803398875 + rng.uniform(0, 0.1)) % 1.0
  background = np.array(colorsys.hsv_to_rgb(hue, 0.55, 0.75)) * 255
  square = max(4, min(width, height) // 3)
  colours = rng.integers(0, 256, size=(int(np.ceil(seconds)) + 1, 3))
  speed = rng.uniform(0.5, 1.5) * (width - square) / max(seconds, 1e-6)
  ys = np.arange(height)[:, None]
  xs = np.arange(width)[None, :]
  out = np.empty((count, height, width, 3), np.uint8)
  for t in range(count):
    time = t / fps
    x0 = int(speed * time) % max(1, width - square)
    y0 = int((height - square) * (0.5 + 0.4 * np.sin(2 * np.pi * time / max(seconds, 1e-6)
                                                      + index)))
    frame = np.empty((height, width, 3), np.float64)
    frame[:] = background
    frame += 20 * np.sin(xs / width * 2 * np.pi * (index % 5 + 1))[..., None]
    inside = (ys >= y0) & (ys < y0 + square) & (xs >= x0) & (xs < x0 + square)
    frame[inside] = colours[int(time)]
    out[t] = np.clip(frame, 0, 255).astype(np.uint8)
  return out


def write_video_file(path: str, frames: np.ndarray, fps: float, codec: str = 'mpeg4') -> None:
  """Encodes uint8 `[T, H, W, 3]` frames (even H and W) as a video file with PyAV."""
  import av  # pylint: disable=import-outside-toplevel
  from fractions import Fraction  # pylint: disable=import-outside-toplevel
  rate = Fraction(fps).limit_denominator(1001)
  with av.open(path, 'w') as container:
    stream = container.add_stream(codec, rate=rate)
    stream.width, stream.height = frames.shape[2], frames.shape[1]
    stream.pix_fmt = 'yuv420p'
    if codec == 'mpeg4':
      stream.options = {'qscale': '3'}
    for image in frames:
      for packet in stream.encode(av.VideoFrame.from_ndarray(image, format='rgb24')):
        container.mux(packet)
    for packet in stream.encode():
      container.mux(packet)


def write_frame_folder(folder: str, frames: np.ndarray) -> None:
  """Writes frames as `000001.jpg`, `000002.jpg`, ... (JPEG, PIL) in a new folder."""
  from PIL import Image  # pylint: disable=import-outside-toplevel
  os.makedirs(folder)
  for k, image in enumerate(frames, 1):
    Image.fromarray(image).save(os.path.join(folder, f'{k:06d}.jpg'), quality=90)


def write_videos(folder: str, count: int, seconds: float = 4.0, fps: float = 10.0,
                 size: tuple[int, int] = DEFAULT_SIZE, seed: int = 0, frame_folders: int = 0,
                 codec: str = 'mpeg4', prefix: str = 'video') -> list[Written]:
  """Writes `count` synthetic videos into `folder` (created): `<prefix>NN.mp4` files, of which
  the last `frame_folders` are written as folders of JPEG frames `<prefix>NN/` instead.
  `seconds` long at `fps`, `size` (width, height) pixels, content fixed by `seed`. Returns
  what was written, in order. An existing file of the same name is refused."""
  if count < 0 or not 0 <= frame_folders <= count:
    raise ValueError(f'need count >= 0 and 0 <= frame_folders <= count, got {count}, '
                     f'{frame_folders}')
  if size[0] % 2 or size[1] % 2:
    raise ValueError(f'size {size}: width and height must be even (yuv420p)')
  os.makedirs(folder, exist_ok=True)
  written = []
  for index in range(count):
    video_id = f'{prefix}{index:02d}'
    frames = video_frames(index, seconds, fps, size, seed)
    as_folder = index >= count - frame_folders
    path = os.path.join(folder, video_id if as_folder else video_id + '.mp4')
    if os.path.lexists(path):
      raise FileExistsError(f'{path} exists; write the synthetic videos into a new folder')
    if as_folder:
      write_frame_folder(path, frames)
    else:
      write_video_file(path, frames, fps, codec)
    written.append(Written(video_id, path, 'frames' if as_folder else 'file', len(frames),
                           float(fps), len(frames) / fps))
  return written
