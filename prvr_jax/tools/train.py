r"""Trains a PRVR model; resumes from --workdir; tests the best checkpoint at the end.

  prvr-train --config=gmmformer_v2:tvr --config.data.dir=/data/tvr \
      --workdir=/tmp/gmmformer_v2_tvr

(`python train.py` in a checkout, `python -m prvr_jax.tools.train`.) `--config` takes a config
file[:variant] or a shipped model config's name (`config_lib.resolve_config_flag`).
Multi-host: pass --coordinator_address/--num_processes/--process_id on every process, or
--multihost where JAX detects the cluster (TPU pods, SLURM, ...). See docs/training.md.
"""

import sys

from absl import flags
from absl import logging
from ml_collections import config_flags

from prvr_jax import files
from prvr_jax import runtime


def define_flags() -> None:
  """`--config`, `--workdir`, `--allow_config_change` and `runtime.define_flags`'s."""
  config_flags.DEFINE_config_file(
      'config', None, 'Config file[:variant], e.g. configs/gmmformer_v2.py:tvr, or a model '
      'name[:variant], e.g. gmmformer_v2:tvr.', lock_config=True)
  flags.DEFINE_string('workdir', None, 'Checkpoints, logs and metrics go here; an existing '
                      'workdir is resumed.')
  flags.DEFINE_bool(
      'allow_config_change', False, 'Resume a workdir with changed settings (lr, loss weights, '
      'epochs, ...; recorded in config_history.jsonl). Changes to the model or the data stream '
      'are never accepted.')
  runtime.define_flags()


def _main(argv: list[str]) -> None:
  del argv
  runtime.start()
  # Imported after jax.distributed is up (importing the library touches no backend, but
  # keep the order obvious).
  from prvr_jax import train  # pylint: disable=g-import-not-at-top
  args = flags.FLAGS
  try:
    train.train_and_evaluate(args.config, args.workdir, args.allow_config_change)
  except (train.NonFiniteLossError, ValueError, FileNotFoundError, files.FolderBusyError) as e:
    # A refusal: its message names the file, flag or key at fault, as the last line.
    logging.error('%s', e)
    sys.exit(f'train: {e}')


def main() -> None:
  """The `prvr-train` command."""
  define_flags()
  flags.mark_flags_as_required(['config', 'workdir'])
  runtime.run(_main)


if __name__ == '__main__':
  main()
