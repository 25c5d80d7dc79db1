"""The start-up every command-line program shares (`prvr_jax.tools`, the benchmarks).

Four concerns, one module each, started together:

* `xla`: XLA flags set by default unless `XLA_FLAGS` sets them;
* `parallel`'s multi-process flags: `jax.distributed` where they ask for it;
* `compilation_cache`: JAX's persistent compilation cache;
* `host_memory`: the heap trim after every compile, and huge-page malloc (a re-exec).

Used as::

  runtime.define_flags()            # at import: the multi-host and compilation-cache flags

  def main(argv):
    runtime.start()                 # before any device is used
    ...

  runtime.run(main)                 # in the program's entry point
"""

from collections.abc import Callable
import sys

from absl import app
from absl import flags
import jax

from prvr_jax import config_lib
from prvr_jax import parallel
from prvr_jax.runtime import compilation_cache
from prvr_jax.runtime import host_memory
from prvr_jax.runtime import xla

# A flag of `parallel.define_distributed_flags`: defined means the program takes the
# multi-process flags.
_DISTRIBUTED_FLAG = 'process_id'


def define_flags() -> None:
  """`--multihost`, `--coordinator_address`, `--num_processes`, `--process_id` and
  `--compilation_cache_dir`; once per program."""
  parallel.define_distributed_flags()
  compilation_cache.define_flags()


def start(compilation_cache_dir: str | None = None) -> str | None:
  """XLA's default flags (`xla`), `jax.distributed` where the flags of `define_flags` ask for
  it, the persistent compilation cache, and the heap trim after every compile (`host_memory`),
  in that order; call before anything touches a device.

  `compilation_cache_dir`: the cache's folder ('' turns it off); None: `--compilation_cache_dir`
  where `define_flags` defined it, else the default of `compilation_cache.enable`. A program
  without `define_flags` (a benchmark) runs single-process. Returns the cache's folder, or None
  when it is off.
  """
  xla.apply()
  distributed = (_DISTRIBUTED_FLAG in flags.FLAGS
                 and parallel.initialize_distributed_from_flags())
  if compilation_cache_dir is None and compilation_cache.FLAG in flags.FLAGS:
    compilation_cache_dir = flags.FLAGS[compilation_cache.FLAG].value
  multi_process_cpu = (distributed and jax.process_count() > 1
                       and jax.default_backend() == 'cpu')
  folder = compilation_cache.enable(compilation_cache_dir, multi_process_cpu)
  host_memory.trim_after_compiles()
  return folder


def run(main: Callable[[list[str]], None]) -> None:
  """`app.run(main)`, first restarting the process with huge-page malloc where that helps
  (`host_memory.restart_with_huge_page_malloc`) and refusing `--config.x` overrides that name
  no key (`config_lib.check_override_flags`)."""
  host_memory.restart_with_huge_page_malloc()
  config_lib.check_override_flags(sys.argv)
  app.run(main)
