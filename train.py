r"""Trains a PRVR model; resumes from --workdir; tests the best checkpoint at the end.

  python train.py --config=configs/gmmformer_v2.py:tvr --config.data.dir=/data/tvr \
      --workdir=/tmp/gmmformer_v2_tvr

Multi-host: pass --coordinator_address/--num_processes/--process_id on every
process, or --multihost where JAX detects the cluster (TPU pods, SLURM, ...).
See docs/training.md.
"""

import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from prvr_jax import runtime

_CONFIG = config_flags.DEFINE_config_file(
    'config', None, 'Config file[:variant], e.g. configs/gmmformer_v2.py:tvr.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Checkpoints, logs and metrics go here; '
                               'an existing workdir is resumed.')
_ALLOW_CONFIG_CHANGE = flags.DEFINE_bool(
    'allow_config_change', False, 'Resume a workdir with changed settings (lr, loss weights, '
    'epochs, ...; recorded in config_history.jsonl). Changes to the model or the data stream '
    'are never accepted.')
runtime.define_flags()


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
  runtime.start()
  # Imported after jax.distributed is up (importing the library touches no backend, but
  # keep the order obvious).
  from prvr_jax import checkpoint, train  # pylint: disable=g-import-not-at-top
  checkpoint.quiet_library_logs()
  try:
    train.train_and_evaluate(_CONFIG.value, _WORKDIR.value, _ALLOW_CONFIG_CHANGE.value)
  except train.NonFiniteLossError as e:
    logging.error('%s', e)
    sys.exit(f'train.py: {e}')


if __name__ == '__main__':
  flags.mark_flags_as_required(['config', 'workdir'])
  runtime.run(main)
