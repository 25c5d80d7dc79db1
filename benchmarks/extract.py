r"""prvr-extract's throughput: videos per minute, with decoding and encoding measured apart.

  nice -n 19 python3 benchmarks/extract.py --root=/tmp/extract_bench \
      [--count=8 --seconds=30 --video_fps=25 --width=640 --height=360 --fps=1 \
       --backbone=ViT-B/32 --batch_size=32]

Writes `--count` synthetic videos (`prvr_jax.data.synthetic_videos`, mpeg4, not timed), runs
one warm-up extraction of one video (compiles the encoder), then extracts all of them with
random-initialised CLIP weights of `--backbone` (the same compute as the released weights) on
whatever devices JAX sees, and prints one markdown row of docs/extract.md's table: the
machine (CPU model from lscpu, or the accelerator), the load average, videos per minute, rows
per second, and the shares of decoding (+ sampling and CLIP preprocessing) and encoding. The
numbers are also written as JSON to `<root>/extract_benchmark.json`.
"""

import json
import os
import shutil
import subprocess
import time

from absl import app
from absl import flags

_ROOT = flags.DEFINE_string('root', None, 'Videos, collections and the JSON go here.')
_COUNT = flags.DEFINE_integer('count', 8, 'Videos extracted (after one warm-up video).')
_SECONDS = flags.DEFINE_float('seconds', 30.0, 'Length of each video.')
_VIDEO_FPS = flags.DEFINE_float('video_fps', 25.0, 'Frame rate of the videos.')
_WIDTH = flags.DEFINE_integer('width', 640, 'Frame width of the videos.')
_HEIGHT = flags.DEFINE_integer('height', 360, 'Frame height of the videos.')
_FPS = flags.DEFINE_float('fps', 1.0, 'Feature rows per second (prvr-extract --fps).')
_BACKBONE = flags.DEFINE_string('backbone', 'ViT-B/32', 'CLIP backbone (random weights).')
_BATCH = flags.DEFINE_integer('batch_size', 32, 'prvr-extract --batch_size.')


def _machine() -> str:
  import jax  # pylint: disable=import-outside-toplevel
  device = jax.devices()[0]
  if device.platform != 'cpu':
    return f'{len(jax.devices())} x {device.device_kind}'
  try:
    out = subprocess.run(['lscpu'], capture_output=True, text=True, check=True).stdout
    model = next(line.split(':', 1)[1].strip() for line in out.splitlines()
                 if line.startswith('Model name'))
  except (OSError, subprocess.CalledProcessError, StopIteration):
    model = 'unknown CPU'
  return f'{model}, {len(os.sched_getaffinity(0))} cores'


def _main(argv: list[str]) -> None:
  del argv
  from prvr_jax import runtime  # pylint: disable=import-outside-toplevel
  runtime.start('')
  from prvr_jax.data import extract  # pylint: disable=import-outside-toplevel
  from prvr_jax.data import frames  # pylint: disable=import-outside-toplevel
  from prvr_jax.data import synthetic_videos  # pylint: disable=import-outside-toplevel
  frames.keep_tf_off_accelerators()
  root = os.path.abspath(_ROOT.value)
  videos = os.path.join(root, 'videos')
  if not os.path.isdir(videos):
    synthetic_videos.write_videos(videos, _COUNT.value + 1, _SECONDS.value, _VIDEO_FPS.value,
                                  (_WIDTH.value, _HEIGHT.value))
  names = sorted(os.listdir(videos))
  lists = {}
  for name, chosen in (('warmup', names[:1]), ('timed', names[1:_COUNT.value + 1])):
    lists[name] = os.path.join(root, f'{name}.txt')
    with open(lists[name], 'w', encoding='utf-8') as f:
      f.writelines(os.path.join(videos, n) + '\n' for n in chosen)
  weights = extract.load_weights(f'random:{_BACKBONE.value}')
  out = os.path.join(root, 'out')
  shutil.rmtree(out, ignore_errors=True)
  kwargs = dict(fps=_FPS.value, batch_size=_BATCH.value, progress=False, weights=weights)
  extract.extract(lists['warmup'], out, 'warmup', '', **kwargs)
  load_before = os.getloadavg()[0]
  start = time.perf_counter()
  result = extract.extract(lists['timed'], out, 'timed', '', **kwargs)
  total = time.perf_counter() - start
  load_after = os.getloadavg()[0]
  count = len(result.manifest['videos'])
  rows = sum(v['rows'] for v in result.manifest['videos'].values())
  numbers = {
      'machine': _machine(), 'backbone': _BACKBONE.value, 'videos': count,
      'video': f'{_WIDTH.value}x{_HEIGHT.value}, {_SECONDS.value:g} s at {_VIDEO_FPS.value:g} '
               'fps, mpeg4',
      'fps': _FPS.value, 'batch_size': _BATCH.value, 'rows': rows, 'seconds': total,
      'videos_per_minute': 60 * count / total, 'rows_per_second': rows / total,
      'decode_seconds': result.timings['decode'], 'encode_seconds': result.timings['encode'],
      'load_average': [load_before, load_after], 'skipped': result.manifest['skipped'],
  }
  with open(os.path.join(root, 'extract_benchmark.json'), 'w', encoding='utf-8') as f:
    json.dump(numbers, f, indent=2)
  print(json.dumps(numbers, indent=2))
  print(f'| {numbers["machine"]} | {numbers["backbone"]} (random) | {numbers["video"]} | '
        f'{_FPS.value:g} | {count} | {numbers["videos_per_minute"]:.1f} | '
        f'{numbers["rows_per_second"]:.1f} | {result.timings["decode"]:.1f} s / '
        f'{result.timings["encode"]:.1f} s | {load_before:.1f} -> {load_after:.1f} |')


if __name__ == '__main__':
  flags.mark_flag_as_required('root')
  app.run(_main)
