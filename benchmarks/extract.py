r"""prvr-extract's throughput: videos per minute, with decoding and encoding measured apart.

  nice -n 19 python3 benchmarks/extract.py --root=/tmp/extract_bench \
      [--count=8 --seconds=30 --video_fps=25 --width=640 --height=360 --fps=1 \
       --backbone=ViT-B/32 --batch_size=32]

Writes `--count` synthetic videos (`prvr_jax.data.synthetic_videos`, mpeg4, not timed), runs
one warm-up extraction of one video (compiles the encoder), then extracts all of them with
random-initialised CLIP weights of `--backbone` (the same compute as the released weights) on
whatever devices JAX sees, and prints one markdown row of docs/extract.md's table: the
machine (CPU model from lscpu, or the accelerator), the load average, videos per minute, rows
per second, and the shares of decoding (+ sampling and CLIP preprocessing) and encoding, and
the encoder's rate (XLA's FLOP count of the image tower times the rows encoded, over the
encoding seconds) as a share of the float32 matmul peak measured in the same run
(`common.matmul_peak_gflops`). The numbers are also written as JSON to
`<root>/extract_benchmark.json`.
"""

import json
import os
import shutil
import time

from absl import app
from absl import flags

import common  # benchmarks/common.py

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
  info = common.machine()
  if info['platform'] != 'cpu':
    return f'{info["device_count"]} x {info["device"]}'
  return f'{info["cpu"]}, {info["cpu_count"]} cores'


def _flops_per_image(weights, batch_size: int) -> float:
  """XLA's FLOP count of CLIP's image tower on one image (a `batch_size` batch / batch_size)."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  from prvr_jax import clip  # pylint: disable=import-outside-toplevel
  size = weights.config.image_size
  params = {k: v for k, v in weights.params.items() if k != 'text'}
  encode = jax.jit(lambda p, x: clip.CLIP(weights.config).apply({'params': p}, x,
                                                                method='encode_image'))
  images = jax.ShapeDtypeStruct((batch_size, size, size, 3), jnp.float32)
  return common.compiled_flops(encode.lower(params, images).compile()) / batch_size


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
  peak = common.matmul_peak_gflops()
  flops = _flops_per_image(weights, _BATCH.value)
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
      'encoder_gflop_per_image': flops / 1e9, 'matmul_peak_gflops': peak,
  }
  numbers['encoder_gflops'] = rows * flops / 1e9 / result.timings['encode']
  numbers['encoder_share_of_peak'] = numbers['encoder_gflops'] / peak
  with open(os.path.join(root, 'extract_benchmark.json'), 'w', encoding='utf-8') as f:
    json.dump(numbers, f, indent=2)
  print(json.dumps(numbers, indent=2))
  print(f'| {numbers["machine"]} | {numbers["backbone"]} (random) | {numbers["video"]} | '
        f'{_FPS.value:g} | {count} | {numbers["videos_per_minute"]:.1f} | '
        f'{numbers["rows_per_second"]:.1f} | {result.timings["decode"]:.1f} s / '
        f'{result.timings["encode"]:.1f} s | {numbers["encoder_gflops"]:.0f} GFLOP/s = '
        f'{100 * numbers["encoder_share_of_peak"]:.0f}% of {peak:.0f} | '
        f'{load_before:.1f} -> {load_after:.1f} |')


if __name__ == '__main__':
  flags.mark_flag_as_required('root')
  app.run(_main)
