r"""A config over several seeds, then mean ± std of every metric (`experiments.seeds.run_seeds`).

  prvr-seeds --config=ms_sl --seeds=3 --workdir=/tmp/ms_sl_seeds [--config.x=y ...] \
      [--parallel=N]                                # or python -m prvr_jax.tools.seeds

See docs/seeds.md.
"""

import os
import sys

from absl import flags
from ml_collections import config_flags

from prvr_jax import files
from prvr_jax import runtime
from prvr_jax.experiments import seeds


def _main(argv: list[str]) -> None:
  del argv
  args = flags.FLAGS
  try:
    seeds.run_seeds(config_flags.get_config_filename(args['config']),
                    seeds.override_tokens(sys.argv), args.seeds, args.workdir, args.parallel,
                    args.train_script, allow_mixed_data=args.allow_mixed_data)
  except (seeds.SeedRunError, ValueError, OSError, files.FolderBusyError) as e:
    sys.exit(f'seeds: {e}')
  with open(os.path.join(args.workdir, seeds.MARKDOWN_FILE), encoding='utf-8') as f:
    print(f.read())


def main() -> None:
  """The `prvr-seeds` command."""
  config_flags.DEFINE_config_file('config', None, 'Config file[:variant] (or model '
                                  'name[:variant]), as for prvr-train.', lock_config=True)
  flags.DEFINE_integer('seeds', 3, 'Number of seeds: config.train.seed, +1, ...')
  flags.DEFINE_string('workdir', None, 'seed_<s>/ of every seed, seeds.json and seeds.md go '
                      'here; an existing one is resumed.')
  flags.DEFINE_integer('parallel', 1, 'Training processes at a time.')
  flags.DEFINE_string('train_script', None, 'A train.py to run for each seed (default: '
                      f'python -m {seeds.TRAIN_MODULE}, the prvr-train command).')
  flags.DEFINE_bool('allow_mixed_data', False, 'Aggregate seeds that trained on different '
                    'data (another release in --config.data.dir; refused otherwise); seeds.json '
                    'then records mixed_data: true.')
  flags.mark_flags_as_required(['config', 'workdir'])
  runtime.run(_main, huge_pages=False)


if __name__ == '__main__':
  main()
