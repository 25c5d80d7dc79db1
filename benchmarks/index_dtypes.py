r"""How much bfloat16 and int8 index storage change retrieval, for every registered model.

  python3 benchmarks/index_dtypes.py --root=/tmp/index_dtypes [--models=ms_sl,tmass]

For each model: trains the synthetic main job (`configs/<model>.py`, the README's run) in
`<root>/<model>` unless a checkpoint is already there, builds an index of the test split in
float32, bfloat16 and int8 (`prvr_jax.index.build_from_checkpoint`), evaluates each with the
evaluator on the index's stored videos (as `evaluate.py --index`), and prints per dtype the
test R@1/5/10/100, SumR, the change of SumR against float32, the share of queries whose
ground-truth rank changed and the mean absolute rank change, and the bytes per video.
Writes the numbers as JSON to `<root>/index_dtypes.json` (the figures of docs/index.md:
benchmarks/results/index_dtypes_amd_epyc.json).
"""

import importlib
import json
import os
import platform
import subprocess
import sys

from absl import app
from absl import flags
import numpy as np

from prvr_jax import index as index_lib
from prvr_jax import parallel
from prvr_jax.eval import Evaluator
from prvr_jax.data import run_data
from prvr_jax.models import registry

_ROOT = flags.DEFINE_string('root', None, 'Workdirs, indexes and the JSON go here.')
_MODELS = flags.DEFINE_list('models', None, 'Models (default: every registered model).')

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cpu() -> str:
  try:
    out = subprocess.run(['lscpu'], capture_output=True, text=True, check=True).stdout
    return next(line.split(':', 1)[1].strip() for line in out.splitlines()
                if line.startswith('Model name'))
  except (OSError, subprocess.CalledProcessError, StopIteration):
    return platform.processor() or 'unknown CPU'


def _config(model: str):
  """The synthetic (default) variant of `configs/<model>.py`."""
  sys.path.insert(0, REPO)
  return importlib.import_module(f'configs.{model}').get_config(None)


def measure(model: str, root: str) -> dict:
  """Trains (if needed), indexes in each dtype and evaluates one model."""
  from prvr_jax import train  # pylint: disable=g-import-not-at-top
  config = _config(model)
  workdir = os.path.join(root, model)
  if not os.path.exists(os.path.join(workdir, 'test_metrics.json')):
    train.train_and_evaluate(config, workdir)
  mesh = parallel.make_mesh()
  evaluator = Evaluator.from_config(config, mesh)
  data = run_data.open_run_data(config, workdir).eval_split('test')
  rows = {}
  for dtype in index_lib.STORAGE_DTYPES:
    index = index_lib.build_from_checkpoint(config, workdir, 'test',
                                            os.path.join(root, f'{model}_{dtype}'), dtype,
                                            overwrite=True)
    result = evaluator.evaluate(parallel.replicate(index.params(), mesh), data,
                                gallery=index_lib.evaluation_gallery(index, evaluator, data))
    rows[dtype] = {'metrics': {k: result.metrics[k] for k in ('r1', 'r5', 'r10', 'r100',
                                                                'sumr')},
                   'ranks': result.ranks, 'bytes_per_video': index.manifest['bytes_per_video']}
  base = rows['float32']
  out = {}
  for dtype, row in rows.items():
    changed = row['ranks'] != base['ranks']
    out[dtype] = {**row['metrics'], 'bytes_per_video': row['bytes_per_video'],
                  'sumr_change': row['metrics']['sumr'] - base['metrics']['sumr'],
                  'queries_rank_changed': float(np.mean(changed)),
                  'mean_abs_rank_change': float(np.mean(np.abs(row['ranks'] - base['ranks']))),
                  'num_queries': int(len(row['ranks']))}
  return out


def main(argv):
  del argv
  models = _MODELS.value or registry.names()
  results = {'cpu': _cpu(), 'models': {}}
  for model in models:
    results['models'][model] = measure(model, _ROOT.value)
    print(f'\n{model}')
    print('| dtype | bytes/video | R@1 | R@5 | R@10 | R@100 | SumR | ΔSumR | queries with another '
          'rank | mean abs rank change |')
    print('|---|---|---|---|---|---|---|---|---|---|')
    for dtype, r in results['models'][model].items():
      print(f'| {dtype} | {r["bytes_per_video"]:,} | {r["r1"]:.1f} | {r["r5"]:.1f} | '
            f'{r["r10"]:.1f} | {r["r100"]:.1f} | {r["sumr"]:.1f} | {r["sumr_change"]:+.1f} | '
            f'{100 * r["queries_rank_changed"]:.1f}% | {r["mean_abs_rank_change"]:.3f} |')
  with open(os.path.join(_ROOT.value, 'index_dtypes.json'), 'w', encoding='utf-8') as f:
    json.dump(results, f, indent=2)


if __name__ == '__main__':
  flags.mark_flags_as_required(['root'])
  app.run(main)
