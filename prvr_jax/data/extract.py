"""Users' own videos -> a CLIP feature release in AMDNet's CLIP layout (docs/extract.md).

A folder (or a list file) of video files and frame folders becomes one collection folder:

  <out>/<collection>/FeatureData/new_clip_vit_32_<collection>_vid_features.hdf5
  <out>/<collection>/extract_manifest.json
  <out>/<collection>/thumbnails/<video_id>.jpg

Every video is sampled at `fps` rows per second (row i covers [i / fps, (i + 1) / fps) s: the
frame nearest the middle of that interval), each sampled frame preprocessed as CLIP's
evaluation transform (`frames.clip_preprocess`) as soon as it is decoded, and encoded by CLIP's
image tower in fixed-size jitted batches sharded over the mesh's `data` axis. Each finished
video is written atomically as a part in `<collection>/.extract_work/` (with its thumbnail), so
a killed run continues where it stopped; the HDF5 (`release.write_clip_videos`) and the
manifest (written last) are assembled atomically at the end. A file that cannot be read is
skipped with its reason, never stopping the others. `read_manifest` is the one reader of the
manifest.
"""

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
import contextlib
import dataclasses
import io
import json
import math
import os
import shutil
import time
from typing import Any

import numpy as np

from prvr_jax import files
from prvr_jax.data import frames as frames_lib
from prvr_jax.data import release
from prvr_jax.data.release import DataError

FORMAT = 'prvr_jax.extract/1'
# Rows per second. The AMDNet CLIP release's rate is stated nowhere we could find (its README
# and loader name only the file; docs/extract.md says where we looked): 1 row per second.
DEFAULT_FPS = 1.0
# The rate a frame folder's images were extracted at (TVQA's frames_hq and the 3 fps frames
# CLIP4Clip / T-MASS / prvr-ea prepare).
DEFAULT_FRAMES_FPS = 3.0
DEFAULT_BATCH_SIZE = 32
THUMBNAIL_WIDTH = 160
MANIFEST = 'extract_manifest.json'
THUMBNAILS = 'thumbnails'
WORK = '.extract_work'
OWNER = '.prvr_extract'  # in a collection folder prvr-extract created
LOCK = '.extract.lock'
VIDEO_EXTENSIONS = ('.mp4', '.m4v', '.mov', '.mkv', '.webm', '.avi', '.mpg', '.mpeg', '.ts',
                    '.flv', '.wmv', '.ogv', '.3gp', '.y4m')
KINDS = ('file', 'frames')


class ExtractError(ValueError):
  """A bad argument of the whole run (the message names the flag); per-file problems are
  recorded in the manifest's "skipped" instead."""


# ----------------------------------------------------------------------------- sources


@dataclasses.dataclass(frozen=True)
class Source:
  """One input video: its id, absolute path, and kind ('file' or 'frames')."""
  video_id: str
  path: str
  kind: str


def _kind_of(path: str) -> str:
  """'frames' for a folder, 'file' for a file with a video suffix; raises DataError else."""
  if os.path.isdir(path):
    return 'frames'
  if not os.path.isfile(path):
    raise DataError(f'{path}: not a regular file or folder')
  suffix = os.path.splitext(path)[1].lower()
  if suffix not in VIDEO_EXTENSIONS:
    raise DataError(f'{path}: not a video file (suffix {suffix or "none"!r} is not one of '
                    f'{", ".join(VIDEO_EXTENSIONS)}) nor a frame folder')
  return 'file'


def _video_id(path: str, kind: str) -> str:
  name = os.path.basename(os.path.normpath(path))
  video_id = name if kind == 'frames' else os.path.splitext(name)[0]
  if not video_id or any(ch.isspace() for ch in video_id) or '#' in video_id:
    raise DataError(f'{path}: video id {files.short(video_id)} (the file name without suffix, '
                    "or the folder name) must be non-empty, without whitespace or '#': rename it")
  return video_id


def list_sources(videos: str) -> tuple[list[Source], dict[str, str]]:
  """(sources, skipped {path: reason}) of `videos`: a folder (its video files and frame
  folders; dot files ignored) or a text file listing one path per line (relative to the list's
  folder; blank lines and '#' comments ignored). A link leading outside the folder, a file of
  another kind, a bad id, and two sources of one id (both) are skipped with their reason."""
  videos = os.path.abspath(os.fspath(videos))
  skipped: dict[str, str] = {}
  candidates = []
  if os.path.isdir(videos):
    for name in sorted(os.listdir(videos)):
      if name.startswith('.'):
        continue
      path = os.path.join(videos, name)
      if os.path.islink(path) and not files.inside(path, videos):
        skipped[path] = (f'a symbolic link to {os.path.realpath(path)}, outside the input folder '
                         f'{videos}: refused')
        continue
      candidates.append(path)
  elif os.path.isfile(videos):
    base = os.path.dirname(videos)
    with open(videos, encoding='utf-8') as f:
      for line in f:
        line = line.strip()
        if line and not line.startswith('#'):
          candidates.append(os.path.normpath(os.path.join(base, line)))
  else:
    raise ExtractError(f'--videos={videos}: no such folder or list file')
  found: dict[str, list[Source]] = {}
  for path in candidates:
    try:
      if not os.path.lexists(path):
        raise DataError(f'{path}: does not exist')
      kind = _kind_of(path)
      source = Source(_video_id(path, kind), path, kind)
    except DataError as e:
      skipped[path] = _reason(e, path)
      continue
    found.setdefault(source.video_id, []).append(source)
  sources = []
  for video_id, group in found.items():
    if len(group) == 1:
      sources.append(group[0])
      continue
    for source in group:
      others = ', '.join(s.path for s in group if s is not source)
      skipped[source.path] = (f'video id {video_id!r} is also given by {others}: rename one '
                              '(ids must be unique)')
  return sources, skipped


def _reason(error: BaseException, path: str) -> str:
  """A per-file error as one line, without the leading path (the manifest's key)."""
  text = str(error).strip() or type(error).__name__
  for prefix in (f'{path}: ', f'video file {path} '):
    if text.startswith(prefix):
      text = text[len(prefix):]
  if not isinstance(error, (DataError, OSError)):
    text = f'{type(error).__name__}: {text}'
  return ' '.join(text.split())


# ----------------------------------------------------------------------------- weights


@dataclasses.dataclass
class Weights:
  """CLIP weights for extraction: config, params, backbone name, and where they came from
  (`path`: the absolute file, or 'random:<backbone>:<seed>'; `sha256`: the file's digest, or
  the same 'random:...' text)."""
  config: Any
  params: Any
  backbone: str
  path: str
  sha256: str


def backbone_name(config: Any) -> str:
  """'ViT-B/32', 'ViT-B/16', 'tiny', or 'custom'."""
  from prvr_jax.clip import model as clip_model  # pylint: disable=import-outside-toplevel
  for name, known in clip_model.CONFIGS.items():
    if config == known:
      return name
  return 'tiny' if config == clip_model.TINY else 'custom'


def load_weights(spec: str) -> Weights:
  """`--clip_weights`: a CLIP file (`prvr_jax.clip.weights.load`: OpenAI / open_clip / Hugging
  Face; OpenAI's released file names verified by their published sha256), or
  'random:<backbone>[:<seed>]' (backbone 'tiny', 'ViT-B/32', 'ViT-B/16'), random-initialised
  weights for tests and throughput measurements. Errors end naming the flag."""
  from prvr_jax.clip import weights as weights_lib  # pylint: disable=import-outside-toplevel
  flag = f'--clip_weights={spec}'
  if not spec:
    raise ExtractError('--clip_weights is required: a CLIP weights file, or random:tiny for a '
                       'test run')
  if spec.startswith(weights_lib.RANDOM_PREFIX):
    try:
      config, params = weights_lib.load_spec(spec)
    except ValueError as e:
      raise ExtractError(str(e)) from None
    backbone, _, seed = spec[len(weights_lib.RANDOM_PREFIX):].partition(':')
    name = f'{weights_lib.RANDOM_PREFIX}{backbone}:{int(seed or 0)}'
    return Weights(config, params, backbone, name, name)
  path = os.path.abspath(spec)
  if not os.path.isfile(path):
    raise ExtractError(f'{flag}: no such file')
  try:
    digest = weights_lib.verify_known_file(path) or files.sha256_file(path)
    config, params = weights_lib.load(path)
  except (ValueError, OSError) as e:
    raise ExtractError(f'{e}\n({flag}: not usable CLIP weights)') from None
  return Weights(config, params, backbone_name(config), path, digest)


class Encoder:
  """CLIP's image tower over fixed-size batches: `[n <= batch_size, S, S, 3]` float32 ->
  `[n, E]` float32, padded to `batch_size` (a multiple of the mesh's devices) and sharded
  over the mesh's `data` axis; one compiled program for every call."""

  def __init__(self, weights: Weights, batch_size: int = DEFAULT_BATCH_SIZE, mesh: Any = None):
    import jax  # pylint: disable=import-outside-toplevel
    from prvr_jax import clip  # pylint: disable=import-outside-toplevel
    from prvr_jax import parallel  # pylint: disable=import-outside-toplevel
    self._parallel = parallel
    self.mesh = mesh if mesh is not None else parallel.make_mesh()
    self.batch_size = parallel.round_up(max(1, int(batch_size)), self.mesh.size)
    self.image_size = weights.config.image_size
    params = {k: v for k, v in weights.params.items() if k != 'text'}  # image tower only
    self._params = parallel.replicate(params, self.mesh)
    model = clip.CLIP(weights.config)
    self._encode = jax.jit(
        lambda p, x: model.apply({'params': p}, x, method='encode_image'),
        out_shardings=parallel.replicated(self.mesh))

  def __call__(self, images: np.ndarray) -> np.ndarray:
    images = np.asarray(images, np.float32)
    n = images.shape[0]
    if not 0 < n <= self.batch_size:
      raise ValueError(f'need 1 to {self.batch_size} images, got {n}')
    batch = self._parallel.shard_global_view(images, self.mesh, self.batch_size)
    return np.asarray(self._parallel.to_host(self._encode(self._params, batch)))[:n]


# ----------------------------------------------------------------------------- sampling


def pick_rows(timed: Iterable[tuple[float, Any]], fps: float, max_rows: int, what: str
              ) -> Iterator[tuple[int, Any]]:
  """(row, item) for every row with a frame: of the `(time, item)` pairs (times in seconds,
  increasing), the one nearest the middle of row `floor(time * fps)`'s interval; one item held
  at a time. A time past `max_rows` rows raises DataError naming `what` and --fps."""
  best = None  # (row, distance, item)
  for t, item in timed:
    t = max(0.0, float(t))
    row = int(math.floor(t * fps + 1e-9))
    if best is not None and row < best[0]:
      continue  # out of order: its row is done
    if row >= max_rows:
      raise DataError(f'{what}: longer than {max_rows} rows at --fps={fps:g} ({max_rows / fps:g} '
                      's; release.MAX_FEATURE_ELEMENTS): refused; extract it at a lower --fps')
    distance = abs(t - (row + 0.5) / fps)
    if best is not None and row == best[0]:
      if distance < best[1]:
        best = (row, distance, item)
      continue
    if best is not None:
      yield best[0], best[2]
    best = (row, distance, item)
  if best is not None:
    yield best[0], best[2]


def _check_rows(expected: int, max_rows: int, fps: float, what: str) -> None:
  if expected > max_rows:
    raise DataError(f'{what}: {expected} rows at --fps={fps:g}, more than {max_rows} '
                    '(release.MAX_FEATURE_ELEMENTS): refused before decoding; extract it at a '
                    'lower --fps')


@dataclasses.dataclass
class _Sampled:
  """A video being sampled: `rows` yields (row, uint8 [H, W, 3]); after it, `duration` and
  `frames` (source frames decoded or listed) are set; `expected_rows` is known up front when
  the container or folder declares it."""
  rows: Iterator[tuple[int, np.ndarray]]
  expected_rows: int | None = None
  duration: float | None = None
  frames: int = 0


def _sample_file(path: str, fps: float, max_rows: int) -> _Sampled:
  """Decodes a video file with PyAV, keeping only the sampled frames (one at a time)."""
  _, av = frames_lib._import_decoder('av')  # pylint: disable=protected-access
  if os.path.getsize(path) == 0:
    raise DataError(f'{path}: empty file (0 bytes)')
  try:
    container = av.open(path)
  except av.error.FFmpegError as e:
    raise DataError(f'{path}: cannot open the video ({getattr(e, "strerror", None) or e})'
                    ) from None
  try:
    if not container.streams.video:
      raise DataError(f'{path}: no video stream')
    stream = container.streams.video[0]
    frames_lib._check_frame_size(  # pylint: disable=protected-access
        path, stream.codec_context.width, stream.codec_context.height)
    base = float(stream.time_base) if stream.time_base else 0.0
    declared = None
    if stream.duration and base:
      declared = stream.duration * base
    elif container.duration:
      declared = container.duration / 1e6
    rate = float(stream.average_rate) if stream.average_rate else None
    expected = None
    if declared:
      expected = max(1, math.ceil(declared * fps - 1e-9))
      _check_rows(expected, max_rows, fps, path)
    stream.thread_type = 'AUTO'
  except BaseException:
    container.close()
    raise
  start = stream.start_time or 0
  sampled = _Sampled(iter(()), expected)

  def timed():
    last = None
    try:
      for count, frame in enumerate(container.decode(stream), 1):
        sampled.frames = count
        if frame.pts is not None and base:
          t = (frame.pts - start) * base
        else:
          t = (count - 1) / (rate or 25.0)
        last = t if last is None else max(last, t)
        yield t, frame
    except av.error.FFmpegError as e:
      raise DataError(f'{path}: cannot decode the video after {sampled.frames} frames '
                      f'({getattr(e, "strerror", None) or e})') from None
    finally:
      container.close()
    if not sampled.frames:
      raise DataError(f'{path}: no frames decoded (a zero-frame video)')
    end = last + (1.0 / rate if rate else 0.0)
    sampled.duration = max(declared or 0.0, end)

  def rows():
    for row, frame in pick_rows(timed(), fps, max_rows, path):
      yield row, frame.to_ndarray(format='rgb24')

  sampled.rows = rows()
  return sampled


def _sample_folder(folder: str, fps: float, frames_fps: float, max_rows: int) -> _Sampled:
  """A frame folder's images at `frames_fps`; only the sampled ones are decoded."""
  paths = frames_lib.list_frame_files(folder)
  expected = int(math.floor((len(paths) - 1) / frames_fps * fps + 1e-9)) + 1
  _check_rows(expected, max_rows, fps, folder)
  sampled = _Sampled(iter(()), expected, len(paths) / frames_fps, len(paths))

  def rows():
    timed = ((k / frames_fps, p) for k, p in enumerate(paths))
    for row, path in pick_rows(timed, fps, max_rows, folder):
      yield row, frames_lib.decode_image(path)

  sampled.rows = rows()
  return sampled


def thumbnail_jpeg(image: np.ndarray, width: int = THUMBNAIL_WIDTH) -> bytes:
  """A uint8 `[H, W, 3]` frame as a small JPEG `width` pixels wide (aspect kept)."""
  from PIL import Image  # pylint: disable=import-outside-toplevel
  picture = Image.fromarray(np.asarray(image, np.uint8))
  height = max(1, round(picture.height * width / max(1, picture.width)))
  picture = picture.resize((width, height), Image.Resampling.BICUBIC)
  out = io.BytesIO()
  picture.save(out, format='JPEG', quality=85)
  return out.getvalue()


# ----------------------------------------------------------------------------- the run


@dataclasses.dataclass
class Settings:
  """What the features depend on: a resumed run must have the same."""
  backbone: str
  config: dict
  weights_sha256: str
  fps: float
  frames_fps: float
  image_size: int

  def differences(self, other: dict) -> list[str]:
    flags = {'backbone': '--clip_weights (backbone)', 'config': '--clip_weights (architecture)',
             'weights_sha256': '--clip_weights (sha256)', 'fps': '--fps',
             'frames_fps': '--frames_fps', 'image_size': '--clip_weights (image size)'}
    ours = dataclasses.asdict(self)
    return [f'{flags[k]}: {ours[k]!r} now, {other.get(k)!r} before' for k in flags
            if ours[k] != other.get(k)]


@dataclasses.dataclass
class Result:
  """What a run did: the collection folder, its manifest, the ids extracted in this run and
  those taken from an earlier run's parts, and the seconds spent decoding + preprocessing and
  encoding."""
  collection_dir: str
  manifest: dict
  extracted: list[str]
  resumed: list[str]
  timings: dict[str, float]


def _layout(collection_dir: str) -> release.Layout:
  """The release layout of a collection folder this module writes (`<out>/<collection>`)."""
  return release.Layout(collection_dir, os.path.basename(collection_dir), None, 'clip')


def _part_path(work: str, video_id: str) -> str:
  return os.path.join(work, 'parts', video_id + '.npz')


def _stat(path: str) -> list[int]:
  st = os.stat(path)
  return [st.st_size, st.st_mtime_ns]


def _read_part(work: str, video_id: str) -> tuple[np.ndarray, dict]:
  with np.load(_part_path(work, video_id), allow_pickle=False) as part:
    return np.asarray(part['features'], np.float32), json.loads(str(part['meta']))


def _write_part(work: str, video_id: str, features: np.ndarray, meta: dict) -> None:
  def write(f):
    np.savez(f, features=features.astype(np.float32), meta=np.array(json.dumps(meta)))
  os.makedirs(os.path.join(work, 'parts'), exist_ok=True)
  files.write_atomic(_part_path(work, video_id), write)


def _claim(collection_dir: str) -> None:
  """Creates the collection folder (marked as ours), or checks that an existing one is ours."""
  owner = os.path.join(collection_dir, OWNER)
  if os.path.lexists(collection_dir):
    if os.path.islink(collection_dir) or not os.path.isfile(owner):
      raise ExtractError(f'{collection_dir} exists and was not created by prvr-extract (no '
                         f'{OWNER}): choose another --collection or --out')
    return
  os.makedirs(collection_dir)
  files.write_json(owner, {'format': FORMAT})


def _open_work(collection_dir: str, settings: Settings, restart: bool) -> str:
  """The work folder of a new, resumed or restarted run (refusing other settings, and a
  finished collection without `restart`)."""
  work = os.path.join(collection_dir, WORK)
  _remove_temporaries(collection_dir)
  if restart:
    _remove_ours(collection_dir)
  elif not os.path.isdir(work) and os.path.isfile(os.path.join(collection_dir, MANIFEST)):
    raise ExtractError(f'{collection_dir} already holds a finished extraction ({MANIFEST}); '
                       'pass --restart to extract again (only the files prvr-extract wrote '
                       'are removed), or choose another --collection')
  settings_path = os.path.join(work, 'settings.json')
  if os.path.isfile(settings_path):
    with open(settings_path, encoding='utf-8') as f:
      before = json.load(f)
    differences = settings.differences(before)
    if differences:
      raise ExtractError(
          f'{collection_dir} holds an unfinished extraction with other settings:\n'
          + files.listing(differences) + '\nrerun with the earlier settings to resume it, pass '
          '--restart to discard it (only the files prvr-extract wrote are removed), or choose '
          'another --collection')
  else:
    os.makedirs(work, exist_ok=True)
    files.write_json(settings_path, dataclasses.asdict(settings))
  return work


def _remove_temporaries(collection_dir: str) -> None:
  """Removes the temporary files of writes an interrupted run left (`files.write_atomic`'s
  `.<name>.<random>.tmp` beside a thumbnail, the HDF5 or the manifest): only names of files
  this module writes."""
  features = _layout(collection_dir).clip_video_feature_path
  for folder, matches in (
      (os.path.join(collection_dir, THUMBNAILS), lambda n: n.endswith('.jpg')),
      (os.path.dirname(features), lambda n: n == os.path.basename(features)),
      (collection_dir, lambda n: n == MANIFEST)):
    if not os.path.isdir(folder):
      continue
    for name in os.listdir(folder):
      path = os.path.join(folder, name)
      if (name.startswith('.') and name.endswith('.tmp') and name.count('.') >= 3
          and matches(name[1:name.rindex('.', 0, len(name) - len('.tmp'))])
          and os.path.isfile(path) and not os.path.islink(path)):
        os.remove(path)


def _remove_ours(collection_dir: str) -> None:
  """Removes what an earlier extraction wrote here: its work folder, HDF5, manifest and the
  thumbnails of the videos it names (nothing else)."""
  work = os.path.join(collection_dir, WORK)
  ids = set()
  parts = os.path.join(work, 'parts')
  if os.path.isdir(parts):
    ids |= {n[:-len('.npz')] for n in os.listdir(parts) if n.endswith('.npz')}
  manifest_path = os.path.join(collection_dir, MANIFEST)
  if os.path.isfile(manifest_path):
    try:
      ids |= set(read_manifest(collection_dir)['videos'])
    except DataError:
      pass
    os.remove(manifest_path)
  for video_id in ids:
    path = os.path.join(collection_dir, THUMBNAILS, video_id + '.jpg')
    if os.path.isfile(path) and not os.path.islink(path):
      os.remove(path)
  layout = _layout(collection_dir)
  feature_dir = os.path.dirname(layout.clip_video_feature_path)
  with contextlib.suppress(FileNotFoundError):
    os.remove(layout.clip_video_feature_path)
  text_dir = layout.text_dir
  owned_path = os.path.join(text_dir, CAPTIONS_OWNER)
  if os.path.isfile(owned_path):  # captions encoded with the earlier weights (add_captions)
    with open(owned_path, encoding='utf-8') as f:
      names = [n for n in json.load(f).get('files', []) if n.endswith('.caption.txt')]
    for path in [os.path.join(text_dir, n) for n in names] + [layout.query_feature_path,
                                                              owned_path]:
      with contextlib.suppress(FileNotFoundError):
        os.remove(path)
  for folder in (os.path.join(collection_dir, THUMBNAILS), feature_dir, text_dir):
    if os.path.isdir(folder) and not os.listdir(folder):
      os.rmdir(folder)
  shutil.rmtree(work, ignore_errors=True)


@dataclasses.dataclass(eq=False)
class _Video:
  """A video in flight: its sampled images' slots, the slot of each row, a thumbnail."""
  source: Source
  sampled: _Sampled | None = None
  slots: list = dataclasses.field(default_factory=list)
  row_slot: list = dataclasses.field(default_factory=list)
  queued: int = 0
  decoded: bool = False
  failed: bool = False
  thumbnail: np.ndarray | None = None
  thumbnail_row: int = -1


def extract(videos: str, out: str, collection: str, clip_weights: str,
            fps: float = DEFAULT_FPS, frames_fps: float = DEFAULT_FRAMES_FPS,
            batch_size: int = DEFAULT_BATCH_SIZE, restart: bool = False, progress: bool = True,
            mesh: Any = None, weights: Weights | None = None,
            on_video: Callable[[str], None] | None = None) -> Result:
  """Extracts every video of `videos` (folder or list file) into `<out>/<collection>`.

  Resumes an unfinished run of the same settings (else refuses, naming the flags, unless
  `restart`); refuses a finished one unless `restart`. `weights` (already loaded) replaces
  `clip_weights`; `on_video(video_id)` is called after each video's part is written. Returns
  the `Result`; per-file failures are in `manifest['skipped']`.
  """
  if not fps > 0 or not math.isfinite(fps):
    raise ExtractError(f'--fps={fps}: must be a positive number of rows per second')
  if not frames_fps > 0 or not math.isfinite(frames_fps):
    raise ExtractError(f'--frames_fps={frames_fps}: must be a positive number of frames per '
                       'second')
  if not collection or collection in ('.', '..') or os.sep in collection:
    raise ExtractError(f'--collection={collection!r}: must be a folder name')
  if batch_size < 1:
    raise ExtractError(f'--batch_size={batch_size}: must be >= 1')
  videos = os.path.abspath(os.fspath(videos))
  if not os.path.exists(videos):
    raise ExtractError(f'--videos={videos}: no such folder or list file')
  out = os.path.abspath(os.fspath(out))
  collection_dir = os.path.join(out, collection)
  sources, skipped = list_sources(videos)
  inputs = [videos] if os.path.isdir(videos) else [s.path for s in sources]
  for path in inputs:
    if files.inside(collection_dir, path) or files.inside(path, collection_dir):
      raise ExtractError(f'--out={out}: the collection folder {collection_dir} must not be '
                         f'inside the input {path}, nor hold it')
  weights = weights or load_weights(clip_weights)
  settings = Settings(weights.backbone, dataclasses.asdict(weights.config), weights.sha256,
                      float(fps), float(frames_fps), int(weights.config.image_size))
  _claim(collection_dir)
  with files.folder_lock(collection_dir, LOCK, 'extraction', '--collection'):
    work = _open_work(collection_dir, settings, restart)
    return _run(sources, skipped, collection_dir, collection, work, weights, settings,
                batch_size, progress, mesh, on_video)


def _decode(video: '_Video', fps: float, frames_fps: float, max_rows: int, size: int,
            queue: list, owners: list, skipped: dict[str, str], batch_size: int,
            timings: dict[str, float]) -> Iterator[bool]:
  """Samples and preprocesses one video into `queue` (its slots owned in `owners`), yielding
  True whenever the queue holds a full batch. A failure marks the video failed and records
  its reason in `skipped`: a per-file failure never stops the batch."""
  source = video.source
  start = time.perf_counter()
  try:
    if source.kind == 'frames':
      video.sampled = _sample_folder(source.path, fps, frames_fps, max_rows)
    else:
      video.sampled = _sample_file(source.path, fps, max_rows)
    expected = video.sampled.expected_rows
    target = expected // 2 if expected else None
    for row, image in video.sampled.rows:
      slot = len(video.slots)
      while len(video.row_slot) < row:  # rows without a frame of their own: the previous one
        video.row_slot.append(max(slot - 1, 0))
      video.row_slot.append(slot)
      # The thumbnail: the row nearest the middle (of the declared length; else a row a
      # quarter to a half of the way, by doubling), one frame held.
      if video.thumbnail is None or (row <= target if target is not None
                                     else row >= 2 * video.thumbnail_row + 1):
        video.thumbnail, video.thumbnail_row = image, row
      video.slots.append(None)
      queue.append(frames_lib.clip_preprocess(image[None], size).numpy()[0])
      owners.append((video, slot))
      video.queued += 1
      del image
      if len(queue) >= batch_size:
        timings['decode'] += time.perf_counter() - start
        yield True
        start = time.perf_counter()
    if not video.slots:
      raise DataError(f'{source.path}: no frames')
    video.decoded = True
  except Exception as e:  # pylint: disable=broad-except
    video.failed = True
    skipped[source.path] = _reason(e, source.path)
  timings['decode'] += time.perf_counter() - start


def _run(sources: Sequence[Source], skipped: dict[str, str], collection_dir: str,
         collection: str, work: str, weights: Weights, settings: Settings, batch_size: int,
         progress: bool, mesh: Any, on_video: Callable[[str], None] | None) -> Result:
  import tqdm  # pylint: disable=import-outside-toplevel
  fps, frames_fps = settings.fps, settings.frames_fps
  size = settings.image_size
  embed_dim = weights.config.embed_dim
  max_rows = release.MAX_FEATURE_ELEMENTS // embed_dim
  timings = {'decode': 0.0, 'encode': 0.0}
  done: dict[str, dict] = {}
  resumed = []
  todo = []
  for source in sources:
    part = _part_path(work, source.video_id)
    if os.path.isfile(part):
      try:
        _, meta = _read_part(work, source.video_id)
        if meta['source'] == source.path and meta.get('stat') == _stat(source.path):
          done[source.video_id] = meta
          resumed.append(source.video_id)
          continue
      except (OSError, ValueError, KeyError):
        pass  # unreadable or for another source: extracted again (the part is replaced)
    todo.append(source)
  encoder = Encoder(weights, batch_size, mesh) if todo else None
  queue: list[np.ndarray] = []
  owners: list[tuple[_Video, int]] = []
  extracted = []

  def finish(video: _Video) -> None:
    source = video.source
    features = np.stack([video.slots[s] for s in video.row_slot]).astype(np.float32)
    meta = {'source': source.path, 'kind': source.kind, 'stat': _stat(source.path),
            'duration': round(float(video.sampled.duration), 6),
            'frames': int(video.sampled.frames), 'rows': int(features.shape[0]),
            'thumbnail': f'{THUMBNAILS}/{source.video_id}.jpg'}
    jpeg = thumbnail_jpeg(video.thumbnail)
    os.makedirs(os.path.join(collection_dir, THUMBNAILS), exist_ok=True)
    files.write_atomic(os.path.join(collection_dir, meta['thumbnail']), lambda f: f.write(jpeg))
    _write_part(work, source.video_id, features, meta)  # the part is the video's commit
    done[source.video_id] = meta
    extracted.append(source.video_id)
    if on_video is not None:
      on_video(source.video_id)

  def flush() -> None:
    if not queue:
      return
    start = time.perf_counter()
    embedded = encoder(np.stack(queue))
    timings['encode'] += time.perf_counter() - start
    batch_owners = list(owners)
    queue.clear()
    owners.clear()
    for (video, slot), row in zip(batch_owners, embedded):
      video.slots[slot] = row
      video.queued -= 1
    for video in dict.fromkeys(v for v, _ in batch_owners):
      if video.decoded and not video.failed and video.queued == 0:
        finish(video)

  with tqdm.tqdm(total=len(sources), initial=len(resumed), unit='video', desc='extract',
                 disable=not progress, dynamic_ncols=True) as bar:
    for source in todo:
      bar.set_postfix_str(source.video_id[-30:], refresh=False)
      video = _Video(source)
      for full in _decode(video, fps, frames_fps, max_rows, size, queue, owners, skipped,
                          encoder.batch_size, timings):
        if full:  # outside the per-file handling: an encoding failure stops the run
          flush()
      if video.decoded and not video.failed and video.queued == 0:
        finish(video)
      bar.update(1)
    flush()
  return _assemble(sources, skipped, collection_dir, collection, work, weights, settings, done,
                   extracted, resumed, timings)


def _assemble(sources, skipped, collection_dir, collection, work, weights, settings, done,
              extracted, resumed, timings) -> Result:
  """Writes the HDF5 and then the manifest (atomically, the manifest last), removes the work
  folder."""
  layout = _layout(collection_dir)
  ids = [s.video_id for s in sources if s.video_id in done]
  release.write_clip_videos(layout.clip_video_feature_path,
                            ((i, _read_part(work, i)[0]) for i in ids))
  parts = os.path.join(work, 'parts')
  for name in os.listdir(parts) if os.path.isdir(parts) else ():
    stale = os.path.join(collection_dir, THUMBNAILS, name[:-len('.npz')] + '.jpg')
    if name.endswith('.npz') and name[:-len('.npz')] not in done and os.path.isfile(stale):
      os.remove(stale)  # ours: a video of an earlier run that is no longer an input
  videos = {}
  for video_id in ids:
    meta = dict(done[video_id])
    meta.pop('stat', None)
    meta['row_seconds'] = None
    videos[video_id] = meta
  manifest = {
      'format': FORMAT, 'collection': collection, 'backbone': weights.backbone,
      'embed_dim': int(weights.config.embed_dim), 'fps': settings.fps,
      'frames_fps': settings.frames_fps, 'image_size': settings.image_size,
      'feature_file': os.path.relpath(layout.clip_video_feature_path, collection_dir),
      'weights': {'path': weights.path, 'sha256': weights.sha256},
      'created': files.utc_now(), 'videos': videos,
      'skipped': dict(sorted(skipped.items())),
  }
  files.write_json(os.path.join(collection_dir, MANIFEST), manifest)
  shutil.rmtree(work, ignore_errors=True)
  return Result(collection_dir, manifest, extracted, resumed, timings)


def summary(result: Result) -> str:
  """The end-of-run report: counts, the files, and every skipped file with its reason."""
  manifest = result.manifest
  rows = sum(v['rows'] for v in manifest['videos'].values())
  lines = [f'{len(manifest["videos"])} video(s), {rows} rows of {manifest["embed_dim"]}-d CLIP '
           f'features at {manifest["fps"]:g} per second ({len(result.extracted)} extracted now, '
           f'{len(result.resumed)} from an earlier run) in {result.collection_dir}',
           f'  features: {os.path.join(result.collection_dir, manifest["feature_file"])}',
           f'  manifest: {os.path.join(result.collection_dir, MANIFEST)}']
  if manifest['skipped']:
    lines.append(f'skipped {len(manifest["skipped"])} file(s):')
    lines += [f'  {path}: {reason}' for path, reason in manifest['skipped'].items()]
  else:
    lines.append('skipped: none')
  return '\n'.join(lines)


# ----------------------------------------------------------------------------- captions

CAPTIONS_OWNER = '.prvr_captions'  # in TextData/: the caption files add_captions wrote
TEXT_BATCH_SIZE = 256


def _caption_paths(captions: Mapping[str, str]) -> dict[str, str]:
  """split -> caption file of `--captions=split:path` values (or a mapping), checked."""
  out = {}
  for split, path in captions.items():
    flag = f'--captions={split}:{path}'
    if not split or not split.isidentifier():
      raise ExtractError(f'{flag}: the split must be a name such as train, val or test')
    if split in out:
      raise ExtractError(f'{flag}: split {split} is given twice')
    if not os.path.isfile(path):
      raise ExtractError(f'{flag}: no such caption file')
    out[split] = os.path.abspath(path)
  if not out:
    raise ExtractError('--captions: give at least one split:path')
  return out


def parse_captions_flag(values: Sequence[str]) -> dict[str, str]:
  """`['train:a.txt', 'test:b.txt']` -> {'train': 'a.txt', 'test': 'b.txt'} (order kept)."""
  out = {}
  for value in values:
    split, sep, path = value.partition(':')
    if not sep or not path:
      raise ExtractError(f'--captions={value}: expected split:path, e.g. train:captions.txt')
    if split in out:
      raise ExtractError(f'--captions={value}: split {split} is given twice')
    out[split] = path
  return out


def encode_texts(weights: Weights, tokens: np.ndarray,
                 batch_size: int = TEXT_BATCH_SIZE) -> np.ndarray:
  """CLIP's text tower over `[N, C]` tokens in fixed-size batches (one compiled program):
  `[N, E]` float32, unnormalised (`encode_text`, the released sentence vectors' form)."""
  import jax  # pylint: disable=import-outside-toplevel
  from prvr_jax import clip  # pylint: disable=import-outside-toplevel
  params = {k: v for k, v in weights.params.items() if k != 'visual'}
  encode = jax.jit(lambda p, t: clip.CLIP(weights.config).apply({'params': p}, t,
                                                               method='encode_text'))
  out = []
  for start in range(0, len(tokens), batch_size):
    batch = tokens[start:start + batch_size]
    padded = np.zeros((batch_size, tokens.shape[1]), tokens.dtype)
    padded[:len(batch)] = batch
    out.append(np.asarray(encode(params, padded), np.float32)[:len(batch)])
  return np.concatenate(out) if out else np.zeros((0, weights.config.embed_dim), np.float32)


def add_captions(collection_dir: str, captions: Mapping[str, str], clip_weights: str = '',
                 weights: Weights | None = None, vocab: str | None = None) -> dict[str, int]:
  """Adds caption splits to an extracted collection, so that it trains and evaluates like a
  release: `TextData/<collection><split>.caption.txt` (the given files' captions, release
  format `<video_id>#<n> <caption>`) and `TextData/clip_ViT_B_32_<collection>_query_feat.hdf5`
  (one CLIP sentence vector per caption: the text tower of the weights the videos were
  extracted with, captions over CLIP's context cut as open_clip cuts them).

  `captions`: split -> caption file. Every caption's video must be in the collection and every
  caption id unique over the splits (else `DataError` naming the file and the id); the weights
  must be the manifest's (else `ExtractError` naming --clip_weights). Caption files written
  by an earlier call are replaced; any other caption file in `TextData/` is refused. Returns
  split -> number of captions.
  """
  from prvr_jax.clip import tokenizer as tokenizer_lib  # pylint: disable=import-outside-toplevel
  collection_dir = os.path.abspath(os.fspath(collection_dir))
  manifest = read_manifest(collection_dir)
  paths = _caption_paths(captions)
  weights = weights or load_weights(clip_weights)
  if weights.sha256 != manifest['weights']['sha256']:
    raise ExtractError(f'--clip_weights={clip_weights or weights.path}: sha256 {weights.sha256} '
                       f'is not that of the weights the videos were extracted with '
                       f'({manifest["weights"]["sha256"]}, {MANIFEST}): captions and videos '
                       'must share one CLIP space')
  layout = _layout(collection_dir)
  items, first_file = {}, {}
  for split, path in paths.items():
    items[split] = release.read_captions(path)
    for cap_id, _ in items[split]:
      if release.video_id_of(cap_id) not in manifest['videos']:
        raise DataError(f'{path}: caption {files.short(cap_id)}: video '
                        f'{files.short(release.video_id_of(cap_id))} is not in the collection '
                        f'({os.path.join(collection_dir, MANIFEST)})')
      if cap_id in first_file:
        raise DataError(f'{path}: caption id {files.short(cap_id)} is also in '
                        f'{first_file[cap_id]}')
      first_file[cap_id] = path
  with files.folder_lock(collection_dir, LOCK, 'extraction', '--collection'):
    owned_path = os.path.join(layout.text_dir, CAPTIONS_OWNER)
    owned = set()
    if os.path.isfile(owned_path):
      with open(owned_path, encoding='utf-8') as f:
        owned = set(json.load(f).get('files', []))
    targets = {os.path.basename(layout.caption_path(split)) for split in paths}
    present = set(os.listdir(layout.text_dir)) if os.path.isdir(layout.text_dir) else set()
    foreign = sorted(n for n in present
                     if n.endswith('.caption.txt') and n not in owned and n not in targets)
    if foreign:
      raise ExtractError(f'{layout.text_dir} holds caption files prvr-extract did not write '
                         f'({", ".join(foreign)}): give their split with --captions or remove '
                         'them')
    texts = [caption for split in paths for _, caption in items[split]]
    tokens = tokenizer_lib.Tokenizer(vocab)(texts, weights.config.context_length, truncate=True)
    vectors = encode_texts(weights, tokens)
    cap_ids = [cap_id for split in paths for cap_id, _ in items[split]]
    os.makedirs(layout.text_dir, exist_ok=True)
    for name in owned - targets:  # ours, of a split not given now: it would be stale
      with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(layout.text_dir, name))
    files.write_json(owned_path, {'files': sorted(targets)})
    for split in paths:
      tmp = layout.caption_path(split) + '.tmp'
      release.write_captions(tmp, items[split])
      os.replace(tmp, layout.caption_path(split))
    tmp = layout.query_feature_path + '.tmp'
    release.write_caption_features(tmp, dict(zip(cap_ids, vectors)))
    os.replace(tmp, layout.query_feature_path)
  return {split: len(items[split]) for split in paths}


# ----------------------------------------------------------------------------- the manifest


def _require(condition: bool, path: str, key: str, expected: str, value: Any) -> None:
  if not condition:
    raise DataError(f'{path}: key {key!r} must be {expected}, got {files.short(value)}')


def _number(value: Any) -> bool:
  return (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value))


def _count(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_manifest(collection_dir: str) -> dict:
  """The validated `extract_manifest.json` of a collection folder (or the file itself).

  Raises FileNotFoundError, or DataError naming the file and the key at fault. Thumbnails are
  relative paths inside the collection's `thumbnails/`; `source` paths are absolute.
  """
  path = os.fspath(collection_dir)
  if os.path.isdir(path):
    path = os.path.join(path, MANIFEST)
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{path}: no extraction manifest (run prvr-extract, or finish the '
                            'interrupted run by running it again)')
  manifest = files.read_json(path, DataError)
  _require(isinstance(manifest, dict), path, '(top level)', 'an object', manifest)
  _require(manifest.get('format') == FORMAT, path, 'format', repr(FORMAT),
           manifest.get('format'))
  for key, check, expected in (
      ('backbone', lambda v: isinstance(v, str) and v, 'a backbone name'),
      ('embed_dim', lambda v: _count(v) and v > 0, 'a positive integer'),
      ('fps', lambda v: _number(v) and v > 0, 'a positive number'),
      ('image_size', lambda v: _count(v) and v > 0, 'a positive integer'),
      ('weights', lambda v: isinstance(v, dict) and isinstance(v.get('path'), str)
       and isinstance(v.get('sha256'), str), 'an object with "path" and "sha256" strings'),
      ('videos', lambda v: isinstance(v, dict), 'an object of video ids'),
      ('skipped', lambda v: isinstance(v, dict) and all(
          isinstance(k, str) and isinstance(r, str) for k, r in v.items()),
       'an object of path: reason strings')):
    _require(key in manifest and bool(check(manifest[key])), path, key, expected,
             manifest.get(key))
  for video_id, video in manifest['videos'].items():
    where = f'videos/{video_id}'
    _require(bool(video_id) and not any(ch.isspace() for ch in video_id) and '/' not in video_id,
             path, where, 'an id without whitespace or "/"', video_id)
    _require(isinstance(video, dict), path, where, 'an object', video)
    for key, check, expected in (
        ('source', lambda v: isinstance(v, str) and os.path.isabs(v), 'an absolute path'),
        ('kind', lambda v: v in KINDS, f'one of {KINDS}'),
        ('duration', lambda v: _number(v) and v >= 0, 'a number of seconds >= 0'),
        ('frames', _count, 'an integer >= 0'),
        ('rows', lambda v: _count(v) and v > 0, 'a positive integer')):
      _require(key in video and bool(check(video[key])), path, f'{where}/{key}', expected,
               video.get(key))
    thumbnail = video.get('thumbnail')
    _require(thumbnail is None or (isinstance(thumbnail, str)
                                   and thumbnail == f'{THUMBNAILS}/{video_id}.jpg'),
             path, f'{where}/thumbnail', f'null or "{THUMBNAILS}/{video_id}.jpg"', thumbnail)
    spans = video.get('row_seconds')
    _require(spans is None or (isinstance(spans, list) and len(spans) == video['rows'] and all(
        isinstance(s, list) and len(s) == 2 and all(_number(x) for x in s) and s[0] <= s[1]
        for s in spans)), path, f'{where}/row_seconds', 'null or one [start, end] per row',
        spans)
  return manifest


def row_seconds(manifest: dict, video_id: str) -> list[tuple[float, float]]:
  """The time range in seconds of each row of a video: its `row_seconds`, else row i covers
  [i / fps, (i + 1) / fps), the last row ending at the video's duration."""
  video = manifest['videos'][video_id]
  if video.get('row_seconds') is not None:
    return [tuple(s) for s in video['row_seconds']]
  fps, rows = manifest['fps'], video['rows']
  spans = [(i / fps, (i + 1) / fps) for i in range(rows)]
  spans[-1] = (spans[-1][0], max(spans[-1][0], float(video['duration'])))
  return spans
