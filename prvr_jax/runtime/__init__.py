"""The start-up every command-line program shares (`prvr_jax.tools`, the benchmarks).

Four concerns, one module each, started together:

* `xla`: XLA flags set by default unless `XLA_FLAGS` sets them;
* `parallel`'s multi-process flags: `jax.distributed` where they ask for it;
* `compilation_cache`: JAX's persistent compilation cache;
* `host_memory`: the heap trim after every compile, and huge-page malloc (a re-exec).

`run` also sets `IMPORT_ENVIRONMENT` (what TensorFlow imports when it loads) unless set.

Used as::

  def _main(argv):
    runtime.start()                 # before any device is used
    ...

  def main():                       # the program's entry point (a console script)
    ...                             # the program's own flags
    runtime.define_flags()          # the multi-host and compilation-cache flags
    runtime.run(_main)
"""

from collections.abc import Callable
import logging as pylogging
import os
import sys

from absl import app
from absl import flags
from absl import logging
import jax

from prvr_jax import config_lib
from prvr_jax import parallel
from prvr_jax.runtime import compilation_cache
from prvr_jax.runtime import host_memory
from prvr_jax.runtime import xla

# Environment the programs start with, unless already set. TensorFlow, imported for tf.data
# and tf.summary alone, imports Keras 3's optimisers when it loads, and with them Keras,
# IPython and matplotlib; told to use the legacy `tf_keras` for `tf.keras`, which is no
# dependency, it skips that import. Nothing here uses `tf.keras` (`train.logs` writes its event
# files through `tf.summary`, not clu's writer, whose TensorBoard plugin imports Keras).
IMPORT_ENVIRONMENT = {'TF_USE_LEGACY_KERAS': '1'}
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
  it, the persistent compilation cache, the heap trim after every compile (`host_memory`) and
  the absl log without Orbax's INFO chatter, in that order; call before anything touches a
  device.

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
  quiet_library_logs()
  return folder


def seconds_since_process_start() -> float | None:
  """Wall-clock seconds since this process was started (its interpreter's start-up, imports
  and any re-exec of `run` included), from Linux's `/proc`; None where that cannot be read."""
  try:
    with open('/proc/self/stat', encoding='ascii') as f:
      # Field 22, the start time in clock ticks after boot; the name (field 2) may hold spaces.
      start_ticks = int(f.read().rsplit(')', 1)[1].split()[19])
    with open('/proc/uptime', encoding='ascii') as f:
      uptime = float(f.read().split()[0])
    return max(uptime - start_ticks / os.sysconf('SC_CLK_TCK'), 0.0)
  except (OSError, ValueError, IndexError):
    return None


def quiet_library_logs() -> None:
  """Hides the INFO chatter of Orbax from the absl log (warnings and errors stay)."""
  class _Filter(pylogging.Filter):
    def filter(self, record: pylogging.LogRecord) -> bool:
      return record.levelno >= pylogging.WARNING or f'{os.sep}orbax{os.sep}' not in record.pathname
  logging.get_absl_handler().addFilter(_Filter())


def run(main: Callable[[list[str]], None], huge_pages: bool = True,
        positional: bool = False) -> None:
  """`app.run(main)` for a command-line program: first setting `IMPORT_ENVIRONMENT` and
  restarting the process with huge-page malloc where that helps
  (`host_memory.restart_with_huge_page_malloc`; not with `huge_pages=False`, for a program
  that runs no step), resolving `--config=NAME[:variant]` to
  a shipped model config and refusing `--config.x` overrides that name no key
  (`config_lib.resolve_config_flag`). Positional arguments are refused unless `positional`
  (`main` reads a command from them). `--help` shows the flags and docstring of `main`'s module
  whatever started it (`prvr-<name>`, `python -m`, a checkout's train.py). A flag that does not
  parse is reported on the last line of stderr, naming the flag (`_parse_flags`)."""
  for name, value in IMPORT_ENVIRONMENT.items():
    os.environ.setdefault(name, value)
  if huge_pages:
    host_memory.restart_with_huge_page_malloc()
  sys.argv[:] = config_lib.resolve_config_flag(sys.argv)
  _help_from(main.__module__)

  def checked_main(argv: list[str]) -> None:
    if len(argv) > 1 and not positional:
      raise app.UsageError(f'Unexpected arguments: {argv[1:]}')
    main(argv)

  app.run(checked_main, flags_parser=_parse_flags)


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's `parse_flags_with_usage` with its hint first: the last line of stderr is then the
  error, which names the flag."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    sys.stderr.write('Pass --helpshort or --helpfull to see help on flags.\n')
    sys.stderr.write(f'FATAL Flags parsing error: {e}\n')
    sys.exit(1)


def _help_from(module_name: str) -> None:
  """Makes the flags `module_name` defined key flags of the program's main module (what absl's
  `--help` lists), and its docstring the usage text where the main module has none (a console
  script)."""
  program = sys.modules['__main__']
  if module_name == program.__name__:
    return
  for flag in flags.FLAGS.get_key_flags_for_module(module_name):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
  if not program.__doc__:
    program.__doc__ = sys.modules[module_name].__doc__
