r"""Evaluates a checkpoint (ours or an official PyTorch one), or an index, on the val or test
split.

  prvr-evaluate --config=gmmformer_v2:tvr --config.data.dir=/data/tvr \
      --checkpoint=/tmp/gmmformer_v2_tvr --split=test --output_dir=/tmp/eval
  prvr-evaluate --config=gmmformer_v2:tvr --config.data.dir=/data/tvr \
      --checkpoint=/path/to/official/best.ckpt
  prvr-evaluate --config=gmmformer_v2:tvr --config.data.dir=/data/tvr \
      --index=/idx/tvr_test       # a built index of the split (prvr-index build)

(`python evaluate.py` in a checkout, `python -m prvr_jax.tools.evaluate`.) Writes
`<output_dir>/metrics.json` (text-to-video r1/r5/r10/r100/sumr, v2t_*, M/V groups when spans
are known, and what produced them: checkpoint path, step and parameter sha256, model and config
fingerprints, data identities; `eval.outputs.provenance`) and `<output_dir>/scores.npy`
([queries in caption-file order, videos in first-appearance order], float32); with
`--config.eval.protocol=dense` also the dense multi-ground-truth metrics `dense_*` in
metrics.json and `<output_dir>/dense_queries.jsonl` (docs/dense_eval.md); with `--plots`
also the PNG pictures of docs/plots.md. A refusal (bad data pairing, a checkpoint that is not
one) exits non-zero with its message, naming the file or flag at fault, as the last line.
Multi-host flags as prvr-train.
"""

import sys
from typing import Any

from absl import app
from absl import flags
from ml_collections import config_flags

from prvr_jax import config_lib
from prvr_jax import files
from prvr_jax import plots as plots_lib
from prvr_jax import runtime
from prvr_jax.eval import EvalResult, Evaluator, outputs


def evaluate_checkpoint(config: Any, checkpoint_path: str | None, split: str = 'test',
                        output_dir: str | None = None, cross_dataset: bool = False,
                        plots: bool = False) -> EvalResult:
  """Loads, evaluates and writes the outputs (process 0 writes); returns the `EvalResult`.

  Args:
    config: the model and data config.
    checkpoint_path: a train.py workdir / checkpoint folder, or an official PyTorch file;
      None for a model with nothing to train (zero-shot CLIP: `ModelSpec.pretrained`), whose
      data is then prepared in `output_dir` (required).
    split: 'test' or 'val'.
    output_dir: default `<workdir>/eval_<split>` for our checkpoints,
      `<file without suffix>_eval_<split>` for official files.
    cross_dataset: allow evaluating one of our checkpoints on data other than its own split
      (`eval.outputs.check_data`); the outputs record `cross_dataset: true`.
    plots: also draw the evaluation's pictures into `output_dir` (`plots.write_plots`).
  """
  config_lib.validate(config)
  outputs.check_output_dir(output_dir)
  if plots:
    plots_lib.require_matplotlib()  # before the evaluation, not after it
  if checkpoint_path is None and output_dir is None:
    raise ValueError(f'{config.model.name} is evaluated without --checkpoint: pass '
                     '--output_dir (its data is prepared there too).')
  loaded = outputs.load_params_and_data(
      config, checkpoint_path, split,
      output_dir or outputs.default_output_dir({}, checkpoint_path, split), cross_dataset)
  info = loaded['info']
  output_dir = output_dir or outputs.default_output_dir(info, checkpoint_path, split)
  result = Evaluator.from_config(config, loaded['mesh']).evaluate(loaded['params'],
                                                                  loaded['data'])
  if config.eval.get('tmass_official_leak', False):  # T-MASS's released (leaky) metrics too
    from prvr_jax.models.tmass import released  # pylint: disable=g-import-not-at-top
    result.metrics.update(released.evaluate(config, loaded['params'], loaded['data']))
  outputs.finish(config, result, output_dir, split, info, loaded['evaluated_on'],
                 loaded['cross'], checkpoint_path or config.model.name)
  if plots:
    plots_lib.write_plots(config, loaded['params'], loaded['shards'], split, loaded['data'],
                          result, output_dir, info['workdir'])
  return result


def define_flags() -> None:
  """The evaluation's flags and `runtime.define_flags`'s."""
  config_flags.DEFINE_config_file(
      'config', None, 'Config file[:variant] (or model name[:variant]) describing the model and '
      'the data.', lock_config=True)
  flags.DEFINE_string(
      'checkpoint', None, 'A train.py workdir (its best checkpoint), a checkpoint folder in it, '
      'or an official PyTorch .ckpt/.pth file. Not needed for a model with nothing to train '
      '(clip_zero_shot: weights from config.model.clip_weights; then pass --output_dir).')
  flags.DEFINE_string(
      'index', None, 'Evaluate from an index of the split built by `prvr-index build` (its '
      'stored videos and model; nothing is re-encoded). With --checkpoint too, the index must '
      'hold that checkpoint\'s parameters (step and fingerprint); metrics.json names the index '
      'and what produced it.')
  flags.DEFINE_bool(
      'allow_stale_index', False, 'With --index: evaluate an index whose checkpoint step or '
      'parameters differ from --checkpoint\'s (or from what its run gives now) knowingly.')
  flags.DEFINE_enum('split', 'test', ['test', 'val'], 'Split to evaluate.')
  flags.DEFINE_string(
      'output_dir', None, 'Where metrics.json and scores.npy go (default: <workdir>/eval_<split> '
      'for our checkpoints, <file>_eval_<split> beside an official file).')
  flags.DEFINE_bool(
      'cross_dataset', False, 'Evaluate one of our checkpoints on data other than the split it '
      'was trained with (refused otherwise); metrics.json then records cross_dataset: true.')
  flags.DEFINE_bool(
      'plots', False, 'Also draw PNG pictures into the output dir: R@K per moment-to-video '
      'group, a query x video score heatmap, per-clip relevance against the annotated moment '
      '(models with explicit moments), the training curves of a workdir (docs/plots.md; needs '
      "matplotlib: pip install 'prvr_jax[plots]'). With --checkpoint only.")
  runtime.define_flags()


def _main(argv: list[str]) -> None:
  del argv
  runtime.start()
  args = flags.FLAGS
  if args.index:
    if args.plots:
      raise app.UsageError('--plots draws from the model and the split\'s features: use it '
                           'with --checkpoint, not --index.')
    from prvr_jax import index  # pylint: disable=g-import-not-at-top
    index.evaluate_index(args.config, args.index, args.split, args.output_dir,
                         args.cross_dataset, checkpoint_path=args.checkpoint,
                         allow_stale=args.allow_stale_index)
  else:
    from prvr_jax.models import registry  # pylint: disable=g-import-not-at-top
    if args.checkpoint is None and registry.get_spec(args.config.model).trainable:
      raise app.UsageError('--checkpoint or --index is required.')
    try:
      evaluate_checkpoint(args.config, args.checkpoint, args.split, args.output_dir,
                          args.cross_dataset, plots=args.plots)
    except (ValueError, FileNotFoundError, files.FolderBusyError) as e:
      # A refusal: its message names the file, flag or key at fault, as the last line.
      sys.exit(f'evaluate: {e}')


def main() -> None:
  """The `prvr-evaluate` command."""
  define_flags()
  flags.mark_flags_as_required(['config'])
  runtime.run(_main)


if __name__ == '__main__':
  main()
