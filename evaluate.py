r"""Evaluates a checkpoint (ours or an official PyTorch one) on the val or test split.

  python evaluate.py --config=configs/gmmformer_v2.py:tvr --config.data.dir=/data/tvr \
      --checkpoint=/tmp/gmmformer_v2_tvr --split=test --output_dir=/tmp/eval
  python evaluate.py --config=configs/gmmformer_v2.py:tvr --config.data.dir=/data/tvr \
      --checkpoint=/path/to/official/best.ckpt
  python evaluate.py --config=configs/gmmformer_v2.py:tvr --config.data.dir=/data/tvr \
      --index=/idx/tvr_test       # a built index of the split (python -m prvr_jax.index build)

Writes `<output_dir>/metrics.json` (text-to-video r1/r5/r10/r100/sumr, v2t_*, M/V
groups when spans are known) and `<output_dir>/scores.npy` ([queries in caption-file
order, videos in first-appearance order], float32); with `--plots` also the PNG pictures of
docs/plots.md. Multi-host flags as train.py.
"""

from absl import app
from absl import flags
from ml_collections import config_flags

from prvr_jax import runtime

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Config file[:variant] describing the model and the data.', lock_config=True)
_CHECKPOINT = flags.DEFINE_string(
    'checkpoint', None, 'A train.py workdir (its best checkpoint), a checkpoint folder in it, '
    'or an official PyTorch .ckpt/.pth file.')
_INDEX = flags.DEFINE_string(
    'index', None, 'Evaluate from an index of the split built by `python -m prvr_jax.index '
    'build` (its stored videos and model; nothing is re-encoded) instead of --checkpoint.')
_SPLIT = flags.DEFINE_enum('split', 'test', ['test', 'val'], 'Split to evaluate.')
_OUTPUT_DIR = flags.DEFINE_string(
    'output_dir', None, 'Where metrics.json and scores.npy go (default: <workdir>/eval_<split> '
    'for our checkpoints, <file>_eval_<split> beside an official file).')
_CROSS_DATASET = flags.DEFINE_bool(
    'cross_dataset', False, 'Evaluate one of our checkpoints on data other than the split it '
    'was trained with (refused otherwise); metrics.json then records cross_dataset: true.')
_PLOTS = flags.DEFINE_bool(
    'plots', False, 'Also draw PNG pictures into the output dir: R@K per moment-to-video '
    'group, a query x video score heatmap, per-clip relevance against the annotated moment '
    '(models with explicit moments), the training curves of a workdir (docs/plots.md; needs '
    "matplotlib: pip install 'prvr_jax[plots]'). With --checkpoint only.")
runtime.define_flags()


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  runtime.start()
  from prvr_jax import checkpoint  # pylint: disable=g-import-not-at-top
  from prvr_jax import eval as eval_lib  # pylint: disable=g-import-not-at-top
  checkpoint.quiet_library_logs()
  if _INDEX.value:
    if _PLOTS.value:
      raise app.UsageError('--plots draws from the model and the split\'s features: use it '
                           'with --checkpoint, not --index.')
    from prvr_jax import index  # pylint: disable=g-import-not-at-top
    index.evaluate_index(_CONFIG.value, _INDEX.value, _SPLIT.value, _OUTPUT_DIR.value,
                         _CROSS_DATASET.value)
  else:
    eval_lib.evaluate_checkpoint(_CONFIG.value, _CHECKPOINT.value, _SPLIT.value,
                                 _OUTPUT_DIR.value, _CROSS_DATASET.value, plots=_PLOTS.value)


if __name__ == '__main__':
  flags.mark_flags_as_required(['config'])
  flags.mark_flags_as_mutual_exclusive(['checkpoint', 'index'], required=True)
  runtime.run(main)
