"""The start-up that the command-line programs share: train.py, evaluate.py and
`python -m prvr_jax.index`. Used as::

  launch.define_flags()            # at import: the multi-host and compilation-cache flags

  def main(argv):
    launch.start_from_flags()      # before any device is used
    ...

  if __name__ == '__main__':
    launch.run(main)
"""

from collections.abc import Callable
import sys

from absl import app

from prvr_jax import compilation_cache
from prvr_jax import config_lib
from prvr_jax import host_memory
from prvr_jax import parallel
from prvr_jax import xla_defaults


def define_flags() -> None:
  """`--multihost`, `--coordinator_address`, `--num_processes`, `--process_id` and
  `--compilation_cache_dir`; once per program."""
  parallel.define_distributed_flags()
  compilation_cache.define_flags()


def start_from_flags() -> None:
  """XLA's default flags (`xla_defaults`), `jax.distributed` where the flags ask for it, the
  persistent compilation cache, and the heap trim after every compile (`host_memory`), in
  that order; call before anything touches a device."""
  xla_defaults.apply()
  parallel.initialize_distributed_from_flags()
  compilation_cache.enable_from_flags()
  host_memory.trim_after_compiles()


def run(main: Callable[[list[str]], None]) -> None:
  """`app.run(main)`, first restarting the process with huge-page malloc where that helps
  (`host_memory.restart_with_huge_page_malloc`) and refusing `--config.x` overrides that name
  no key (`config_lib.check_override_flags`)."""
  host_memory.restart_with_huge_page_malloc()
  config_lib.check_override_flags(sys.argv)
  app.run(main)
