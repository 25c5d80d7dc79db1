r"""Paper scale on one machine: a TVR-sized release through prepare, training, evaluation and
the index, one table.

  python benchmarks/scale.py --fraction=0.25 --workdir=/data/scale [--release=PATH] \
      [--config=configs/gmmformer_v2.py:tvr] [--also=configs/ms_sl.py:tvr] \
      [--train_steps=3] [--set=key=value] \
      [--output=benchmarks/results/scale_amd_epyc_0.25.json]

Without `--release` it writes a release of TVR's shapes, scaled by `--fraction`
(`write_tvr_shaped`: 17,435 / 2,179 / 2,179 train / val / test videos of ~51 3072-d clip
features, 5 captions each of ~13 768-d RoBERTa-like tokens, about 18 GB in float32 at 1.0; random
features with a planted signal, the MS-SL file layout, through `release.ReleaseWriter`). Then,
each phase in its own process (its wall time and peak RSS its own): `prvr-prepare` into shards,
`train.py` for `--train_steps` steps, `evaluate.py` on the test split from that checkpoint
(both again for each `--also` config, on the same shards),
`prvr-index build` of the test videos and `prvr-index search` of the test captions. It measures
the disk's write and read rates and the float32 matmul peak in the same run and prints, per
phase, wall time, peak RSS, bytes it wrote and its floor:

* prepare: reading the release's feature bytes once and writing the shards' bytes once;
* evaluate: the model's arithmetic at the matmul peak, plus reading the test split's shards
  once. The arithmetic is XLA's count (cost analysis) of the jitted `encode_videos` for every
  test video, `encode_queries` for every caption and `score` of every caption against every
  video. The matching alone (`2 * Q * V * vectors * width`: every vector the model matches a
  query with, `matching_gflop`) is reported beside it as `matching_floor_s`; for most models the
  video encoder is the larger part. The evaluation's own phase times (`metrics.json`) are
  reported too;
* generate, train, index: no floor is stated ("-").

Peak RSS is the largest process of the phase (prepare's workers included). A generated release
below a fraction of 1 is checked without the catalogue's published sizes
(`--config.data.check_published=False`). The phases use the user's compilation cache as the
command-line programs do by default; `--set` cannot change that, the environment can
(`JAX_COMPILATION_CACHE_DIR=` turns it off).

`--keep` leaves the folders in `--workdir` (by default the benchmark removes what it wrote).

One TVR-sized epoch of GMMFormer v2 at 128 videos end to end (data, steps, the validation),
with the training split in device memory, on an accelerator:

  python benchmarks/scale.py --fraction=1 --workdir=/data/scale --train_steps=0 \
      --set=train.num_epochs=1 --set=data.placement=device

Its train phase against 137 steps (17,435 / 128) of `benchmarks/train_step.py --videos=128` on
the same machine is the epoch's overhead over its steps.
"""

from collections.abc import Sequence
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

from absl import app
from absl import flags
import jax
import numpy as np

from common import (ROOT, compiled_flops, flops_per_query,  # benchmarks/common.py
                    load_config, machine, matmul_peak_gflops)

_FRACTION = flags.DEFINE_float('fraction', 0.01, 'Share of TVR\'s videos and captions.')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Folder for the release, shards, run and index '
                               '(default: a temporary folder).')
_RELEASE = flags.DEFINE_string('release', None, 'A real release folder (MS-SL layout) instead '
                               'of the generated one.')
_CONFIG = flags.DEFINE_string('config', 'configs/gmmformer_v2.py:tvr', 'Config file[:variant].')
_SET = flags.DEFINE_multi_string('set', [], 'Config override key=value, for every phase.')
_ALSO = flags.DEFINE_multi_string('also', [], 'Another config file[:variant] trained and '
                                  'evaluated on the same shards (its own train and evaluate '
                                  'rows).')
_STEPS = flags.DEFINE_integer('train_steps', 3, 'Training steps (0: the config\'s whole run, '
                              'its validation and test included).')
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of the generated release.')
_KEEP = flags.DEFINE_bool('keep', False, 'Keep what the benchmark wrote.')
_OUTPUT = flags.DEFINE_string('output', None, 'JSON of every number.')
_DISK_PROBE = flags.DEFINE_integer('disk_probe_mb', 1024, 'MB written and read back to measure '
                                   'the disk\'s rates.')

# TVR (the MS-SL release): videos per split, captions per video, mean clips and tokens.
TVR_VIDEOS = {'train': 17_435, 'val': 2_179, 'test': 2_179}
CAPTIONS_PER_VIDEO = 5
CLIPS = (20, 83)     # uniform: mean 51
TOKENS = (6, 21)     # uniform: mean 13
VISUAL_DIM, QUERY_DIM = 3072, 768
SECONDS_PER_CLIP = 1.5


def write_tvr_shaped(root: str, fraction: float, seed: int = 0) -> str:
  """A release of TVR's shapes scaled by `fraction` (at least 2 videos a split) in
  `<root>/tvr`; returns the collection folder. Written video by video: memory stays small.

  Each video has a planted moment: a random direction `m` in the query space, added to its
  frames in the moment's span through a fixed random projection; its captions' tokens are `m`
  plus noise. Moments are recorded (`moments.txt`).
  """
  from prvr_jax.data import release  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  projection = rng.standard_normal((QUERY_DIM, VISUAL_DIM), np.float32) / np.sqrt(QUERY_DIM)
  with release.ReleaseWriter(root, 'tvr', 'i3d_resnet', 'roberta') as writer:
    for split, full in TVR_VIDEOS.items():
      captions, moments = [], []
      for i in range(max(2, round(full * fraction))):
        video_id = f'{split}_{i:06d}'
        clips = int(rng.integers(*CLIPS))
        frames = rng.standard_normal((clips, VISUAL_DIM), np.float32)
        for k in range(CAPTIONS_PER_VIDEO):
          start = int(rng.integers(0, clips))
          end = int(rng.integers(start + 1, clips + 1))
          moment = rng.standard_normal(QUERY_DIM).astype(np.float32)
          frames[start:end] += 2.0 * (moment @ projection)
          tokens = rng.standard_normal((int(rng.integers(*TOKENS)), QUERY_DIM), np.float32)
          cap_id = f'{video_id}#enc#{k}'
          writer.add_caption_features(cap_id, tokens + moment)
          captions.append((cap_id, f'caption {k} of {video_id}'))
          moments.append((cap_id, start * SECONDS_PER_CLIP, end * SECONDS_PER_CLIP,
                          clips * SECONDS_PER_CLIP))
        writer.add_video(video_id, frames)
      writer.write_captions(split, captions)
      writer.write_moments(split, moments)
  return os.path.join(root, 'tvr')


def folder_bytes(path: str) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(path) for f in names)


def disk_rates(folder: str, size: int = 1 << 30) -> dict[str, float]:
  """MB/s of writing `size` bytes to `folder` (fsync'ed) and of reading them back with the
  page cache dropped for the file (`posix_fadvise`)."""
  path = os.path.join(folder, 'disk_rate.bin')
  block = np.random.default_rng(0).bytes(min(size, 64 << 20))
  start = time.perf_counter()
  with open(path, 'wb') as f:
    for _ in range(max(1, size // len(block))):
      f.write(block)
    f.flush()
    os.fsync(f.fileno())
  write_s = time.perf_counter() - start
  with open(path, 'rb') as f:
    os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    start = time.perf_counter()
    while f.read(64 << 20):
      pass
  read_s = time.perf_counter() - start
  os.remove(path)
  return {'write_mb_s': size / 2**20 / write_s, 'read_mb_s': size / 2**20 / read_s}


def run_phase(name: str, command: Sequence[str], wrote: str | None = None) -> dict[str, Any]:
  """Runs `command` in its own process: wall seconds, its peak RSS (MB), the bytes of the
  folder `wrote` afterwards; raises with the end of its output if it fails."""
  env = {**os.environ, 'PYTHONPATH': os.pathsep.join(filter(None, [
      ROOT, os.path.join(ROOT, 'benchmarks'), os.environ.get('PYTHONPATH')]))}
  print(f'[{name}] {" ".join(command)}', flush=True)
  start = time.perf_counter()
  with tempfile.TemporaryFile('w+') as log:
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if process.returncode:
      log.seek(0)
      raise RuntimeError(f'phase {name} exited {process.returncode}:\n{log.read()[-4000:]}')
  return {'phase': name, 'wall_s': wall, 'peak_rss_mb': usage.ru_maxrss / 1024,
          'bytes': folder_bytes(wrote) if wrote and os.path.exists(wrote) else None}


def matching_gflop(config: Any, num_queries: int, num_videos: int) -> float:
  """Every query against every vector the model matches it with: 2 * Q * V * vectors * width,
  the vectors being the stored ones of the query encoding's width, with the clip branch's
  set in place of the stored clips where the model forms it from them (MS-SL: its 528
  multi-scale clips, whatever it stores), so that the floor is the model's, not the storage's."""
  from prvr_jax import models  # pylint: disable=g-import-not-at-top
  spec = models.get_spec(config.model)
  module, params = spec.build(config.model), spec.param_shapes(config.model)
  batch = spec.example_batch(config.model, num_videos=1)
  video_keys, query_keys = spec.inputs(config.model)

  def shapes(params):
    v = {'params': params}
    stored = module.apply(v, {k: batch[k] for k in video_keys}, method='encode_videos')
    if 'clips' in stored and hasattr(module, 'clip_set'):
      stored = {**stored, 'clips': module.apply(v, stored, method='clip_set')}
    return stored, module.apply(v, {k: batch[k] for k in query_keys}, method='encode_queries')

  stored, queries = jax.eval_shape(shapes, params)
  width = jax.tree.leaves(queries)[0].shape[-1]
  vectors = sum(math.prod(leaf.shape[1:-1]) for leaf in jax.tree.leaves(stored)
                if leaf.ndim >= 2 and leaf.shape[-1] == width)
  return 2 * num_queries * num_videos * vectors * width / 1e9


def evaluation_gflop(config: Any, num_queries: int, num_videos: int) -> dict[str, float]:
  """GFLOPs of evaluating `num_queries` captions against `num_videos` videos, by phase: XLA's
  cost analysis of the jitted `encode_videos` (counted on 8 videos), `encode_queries` (8
  queries) and `score` (`common.flops_per_query` against the whole gallery)."""
  from prvr_jax import models  # pylint: disable=g-import-not-at-top
  spec = models.get_spec(config.model)
  module, params = spec.build(config.model), spec.param_shapes(config.model)
  count = 8
  batch = spec.example_batch(config.model, num_videos=count)
  video_keys, query_keys = spec.inputs(config.model)

  def flops(method: str, keys: Sequence[str]) -> float:
    inputs = {k: batch[k] for k in keys}
    apply = jax.jit(lambda p, x: module.apply({'params': p}, x, method=method))
    return compiled_flops(apply.lower(params, inputs).compile()) / count

  queries = {k: batch[k] for k in query_keys}
  return {'encode_videos': flops('encode_videos', video_keys) * num_videos / 1e9,
          'encode_queries': flops('encode_queries', query_keys) * num_queries / 1e9,
          'score': flops_per_query(spec, config.model, params, queries, num_videos)
                   * num_queries / 1e9}


def train_and_evaluate(work: str, config_file: str, config_args: Sequence[str],
                       data: Sequence[str], test: Any, peak: float, rates: dict[str, float],
                       phases: list[dict[str, Any]]) -> tuple[Any, str]:
  """The train and evaluate phases of one config file[:variant] on the prepared shards, with
  the evaluation's floors (module docstring) and phase times; returns its config and run
  folder."""
  path, _, variant = config_file.partition(':')
  name = os.path.basename(path).removesuffix('.py')
  tag, suffix = ('', '') if config_file == _CONFIG.value else (f' ({name})', f'_{name}')
  train_dir, eval_dir = os.path.join(work, 'run' + suffix), os.path.join(work, 'eval' + suffix)
  phases.append(run_phase('train' + tag, [
      sys.executable, 'train.py', *config_args, *data, f'--workdir={train_dir}',
      *([f'--config.train.stop_after_steps={_STEPS.value}'] if _STEPS.value else [])],
      train_dir))
  phases.append(run_phase('evaluate' + tag, [
      sys.executable, 'evaluate.py', *config_args, *data, f'--checkpoint={train_dir}',
      '--split=test', f'--output_dir={eval_dir}'], eval_dir))
  config = load_config(name, _SET.value, variant or None)
  arithmetic = evaluation_gflop(config, test.num_captions, test.num_videos)
  read_s = sum(s.bytes for s in test.shards) / 2**20 / rates['read_mb_s']
  matching = matching_gflop(config, test.num_captions, test.num_videos)
  phases[-1]['floor_s'] = sum(arithmetic.values()) / peak + read_s
  phases[-1]['matching_floor_s'] = matching / peak + read_s
  phases[-1]['gflop'] = {**arithmetic, 'matching': matching}
  with open(os.path.join(eval_dir, 'metrics.json'), encoding='utf-8') as f:
    phases[-1]['timings'] = json.load(f).get('timings', {})
  return config, train_dir


def run(work: str) -> dict[str, Any]:
  """The phases in `work`; every number of the table."""
  config_args = [f'--config={_CONFIG.value}', *(f'--config.{item}' for item in _SET.value)]
  python = sys.executable
  info = machine()
  peak = matmul_peak_gflops(2048 if info['platform'] == 'cpu' else 8192)
  rates = disk_rates(work, _DISK_PROBE.value << 20)
  report: dict[str, Any] = {'machine': info, 'matmul_peak_gflops': peak, 'disk': rates,
                            'settings': {'fraction': _FRACTION.value, 'config': _CONFIG.value,
                                         'set': _SET.value, 'also': _ALSO.value,
                                         'train_steps': _STEPS.value,
                                         'release': _RELEASE.value}, 'phases': []}
  phases = report['phases']
  release_dir = _RELEASE.value
  if release_dir is None and _FRACTION.value != 1:  # not the published sizes (prvr-check)
    config_args.append('--config.data.check_published=False')
  if release_dir is None:
    phases.append(run_phase('generate', [python, os.path.abspath(__file__), '--phase=generate',
                                         f'--fraction={_FRACTION.value}', f'--seed={_SEED.value}',
                                         f'--workdir={work}'], os.path.join(work, 'tvr')))
    release_dir = os.path.join(work, 'tvr')
  shards, index_dir = os.path.join(work, 'shards'), os.path.join(work, 'index')
  from prvr_jax.data import pipeline  # pylint: disable=g-import-not-at-top
  data = [f'--config.data.dir={shards}']
  phases.append(run_phase('prepare', [python, '-m', 'prvr_jax.tools.prepare', *config_args,
                                      f'--config.data.dir={release_dir}', f'--out={shards}'],
                          shards))
  release_bytes = folder_bytes(release_dir)
  phases[-1]['floor_s'] = (release_bytes / 2**20 / rates['read_mb_s']
                           + phases[-1]['bytes'] / 2**20 / rates['write_mb_s'])
  test = pipeline.open_shards(shards).split('test')
  config, train_dir = train_and_evaluate(work, _CONFIG.value, config_args, data, test, peak,
                                         rates, phases)
  for other in _ALSO.value:
    other_args = [f'--config={other}', *config_args[1:]]
    train_and_evaluate(work, other, other_args, data, test, peak, rates, phases)
  phases.append(run_phase('index build', [
      python, '-m', 'prvr_jax.tools.index', 'build', *config_args, *data,
      f'--checkpoint={train_dir}', '--split=test', f'--out={index_dir}'], index_dir))
  from prvr_jax.data import release  # pylint: disable=g-import-not-at-top
  queries = release.Layout(release_dir, config.data.collection, config.data.visual_feature,
                           config.data.text_feature).query_feature_path
  phases.append(run_phase('index search', [
      python, '-m', 'prvr_jax.tools.index', 'search', f'--index={index_dir}',
      f'--queries={queries}', '--k=100', f'--output={os.path.join(work, "hits.jsonl")}']))
  report['release_bytes'] = release_bytes
  report['test'] = {'videos': test.num_videos, 'captions': test.num_captions}
  return report


def table(report: dict[str, Any]) -> str:
  rows = ['| phase | wall s | peak RSS MB | bytes written | floor s | wall / floor | '
          'matching floor s | wall / matching |',
          '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |']
  for p in report['phases']:
    size = ('-' if p['bytes'] is None else f'{p["bytes"] / 2**30:.2f} GiB'
            if p['bytes'] >= 2**30 else f'{p["bytes"] / 2**20:.1f} MiB')
    floors = [(f'{p[k]:.1f} | {p["wall_s"] / p[k]:.1f}x' if p.get(k) else '- | -')
              for k in ('floor_s', 'matching_floor_s')]
    rows.append(f'| {p["phase"]} | {p["wall_s"]:.0f} | {p["peak_rss_mb"]:.0f} | {size} | '
                f'{floors[0]} | {floors[1]} |')
  return '\n'.join(rows)


_PHASE = flags.DEFINE_enum('phase', None, ['generate'], 'Internal: run one phase.')


def main(argv):
  del argv
  if _PHASE.value == 'generate':
    write_tvr_shaped(_WORKDIR.value, _FRACTION.value, _SEED.value)
    return
  work = _WORKDIR.value or tempfile.mkdtemp(prefix='prvr_scale_')
  os.makedirs(work, exist_ok=True)
  made = set(os.listdir(work))
  try:
    report = run(work)
  finally:
    if not _KEEP.value:  # only what this run wrote
      for name in set(os.listdir(work)) - made:
        path = os.path.join(work, name)
        shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
      if not _WORKDIR.value:
        os.rmdir(work)
  print(f'{report["machine"]["cpu"]}, {report["machine"]["device"]}; matmul peak '
        f'{report["matmul_peak_gflops"]:.0f} GFLOP/s; disk write '
        f'{report["disk"]["write_mb_s"]:.0f} MB/s, read {report["disk"]["read_mb_s"]:.0f} MB/s; '
        f'release {report["release_bytes"] / 2**30:.2f} GiB, test '
        f'{report["test"]["captions"]} x {report["test"]["videos"]}')
  print(table(report))
  if _OUTPUT.value:
    with open(_OUTPUT.value, 'w', encoding='utf-8') as f:
      json.dump(report, f, indent=1)


if __name__ == '__main__':
  app.run(main)
