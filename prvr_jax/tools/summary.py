r"""Prints a model config's parameter table (`summary.config_table`).

  prvr-summary --config=gmmformer_v2:tvr      # or python -m prvr_jax.tools.summary
"""

from absl import flags
from ml_collections import config_flags

from prvr_jax import runtime
from prvr_jax import summary


def _main(argv: list[str]) -> None:
  del argv
  print(summary.config_table(flags.FLAGS.config))


def main() -> None:
  """The `prvr-summary` command."""
  config_flags.DEFINE_config_file('config', None, 'Model config file[:variant] (or model '
                                  'name[:variant]).', lock_config=True)
  flags.mark_flag_as_required('config')
  runtime.run(_main, huge_pages=False)


if __name__ == '__main__':
  main()
