"""What evaluate.py runs: a checkpoint (ours or official) on a split -> metrics.json, scores.npy."""

from collections.abc import Mapping
import os
from typing import Any

from absl import logging
import jax
import numpy as np

from prvr_jax import checkpoint
from prvr_jax import files
from prvr_jax import parallel
from prvr_jax.data import pipeline
from prvr_jax.eval.evaluator import EvalResult, Evaluator
from prvr_jax.eval.splits import eval_split


def write_outputs(output_dir: str, result: EvalResult, info: Mapping[str, Any]) -> None:
  """`<output_dir>/metrics.json` (metrics + `info`) and `<output_dir>/scores.npy`."""
  os.makedirs(output_dir, exist_ok=True)
  np.save(os.path.join(output_dir, 'scores.npy'), result.scores)
  files.write_json(os.path.join(output_dir, 'metrics.json'), {**result.metrics, **info})


def evaluate_checkpoint(config: Any, checkpoint_path: str, split: str = 'test',
                        output_dir: str | None = None) -> EvalResult:
  """Loads, evaluates and writes the outputs (process 0 writes).

  Args:
    config: the model and data config.
    checkpoint_path: a train.py workdir / checkpoint folder, or an official PyTorch file.
    split: 'test' or 'val'.
    output_dir: default `<workdir>/eval_<split>` for our checkpoints,
      `<file without suffix>_eval_<split>` for official files.
  """
  mesh = parallel.make_mesh()
  params, info = checkpoint.load_params(checkpoint_path, config, mesh)
  if output_dir is None:
    if info['workdir'] is not None:
      output_dir = os.path.join(info['workdir'], f'eval_{split}')
    else:
      output_dir = f'{os.path.splitext(checkpoint_path)[0]}_eval_{split}'
  # Synthetic data / prepared shards are found again in the training workdir.
  shards = pipeline.open_run_data(config, info['workdir'] or output_dir)
  result = Evaluator.from_config(config, mesh).evaluate(params, eval_split(config, shards, split))
  if jax.process_index() == 0:
    write_outputs(output_dir, result, {'split': split, 'checkpoint': info['path'],
                                       'checkpoint_source': info['source'],
                                       'model': config.model.name})
  logging.info('%s on %s: R@1 %.1f R@5 %.1f R@10 %.1f R@100 %.1f SumR %.1f -> %s',
               checkpoint_path, split,
               *(result.metrics[k] for k in ('r1', 'r5', 'r10', 'r100', 'sumr')), output_dir)
  return result
