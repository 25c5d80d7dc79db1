"""The tests' CLI launcher: one process per test process that has imported what a CLI run
imports (TensorFlow, JAX, Flax, Optax, Orbax, prvr_jax's training, evaluation, index and data
code) without starting a JAX backend or defining a flag, and forks one child per run.

A child is then the process `python <script> args...` would be, less the imports, which are
most of a tiny run's start-up: the run's own environment, argv, `sys.path[0]`, working
directory, absl flags, JAX backend (its `XLA_FLAGS`, so its own device count) and exit status,
stdout and stderr to the files the caller names, and a normal interpreter exit (threads joined,
`atexit` handlers run). `support.run_cli` and `support.run_processes` use it where the run's
environment differs from the launcher's only in what a child can still apply
(`support.PRELOADED_ENV_KEYS`), and start a fresh interpreter otherwise.

Protocol: one JSON object per line on stdin, `{"runs": [{"argv": [script | "-c" code |
"-m" module, args...], "env": {...}, "cwd": path, "stdout": path, "stderr": path}, ...]}`, starts
all its runs at once (the processes of one jax.distributed job); the reply (one JSON line each
on the original stdout) is `{"pids": [...]}`, then `{"returncodes": [...]}` once all have ended.
The first line the launcher writes is `{"ready": true}`.
"""

import gc
import json
import os
import runpy
import sys

import jax  # pylint: disable=unused-import
import flax.linen  # pylint: disable=unused-import
import optax  # pylint: disable=unused-import
import orbax.checkpoint  # pylint: disable=unused-import

from prvr_jax import checkpoint  # pylint: disable=unused-import
from prvr_jax import eval as eval_lib  # pylint: disable=unused-import
from prvr_jax import index  # pylint: disable=unused-import
from prvr_jax import runtime  # pylint: disable=unused-import

try:
  import tensorflow  # pylint: disable=g-import-not-at-top,unused-import
except ImportError:  # a bare JAX image: the runs that need the data layer skip there
  tensorflow = None
if tensorflow is not None:
  from prvr_jax.data import check  # pylint: disable=g-import-not-at-top,unused-import
  from prvr_jax.data import prepare  # pylint: disable=g-import-not-at-top,unused-import
  from prvr_jax.data import run_data  # pylint: disable=g-import-not-at-top,unused-import
  from prvr_jax.train import loop  # pylint: disable=g-import-not-at-top,unused-import

# The options a child sets on the JAX imported here, which read their environment variable
# when JAX is imported (the rest of `support.PRELOADED_ENV_KEYS` is read later, by the run).
_JAX_OPTIONS = {'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS': float,
                'JAX_DEBUG_LOG_MODULES': str}


def _child(run: dict) -> None:
  """Becomes the run: its files, directory, environment, argv; then runs it as `__main__`.
  Raises SystemExit (never returns), so that the child ends as an interpreter ends."""
  for fd, path, mode in ((0, os.devnull, os.O_RDONLY),
                         (1, run['stdout'], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                         (2, run['stderr'], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
    opened = os.open(path, mode, 0o644)
    os.dup2(opened, fd)
    os.close(opened)
  os.chdir(run['cwd'])
  os.environ.clear()
  os.environ.update(run['env'])
  for key, parse in _JAX_OPTIONS.items():
    if key in os.environ:
      jax.config.update(key.lower(), parse(os.environ[key]))
  argv = run['argv']
  if argv[0] == '-c':
    sys.argv, sys.path[0] = ['-c', *argv[2:]], ''
    exec(compile(argv[1], '<string>', 'exec'), {'__name__': '__main__'})  # pylint: disable=exec-used
  elif argv[0] == '-m':
    sys.argv, sys.path[0] = argv[1:], os.getcwd()
    runpy.run_module(argv[1], run_name='__main__', alter_sys=True)
  else:
    script = os.path.abspath(argv[0])
    sys.argv, sys.path[0] = [argv[0], *argv[1:]], os.path.dirname(script)
    runpy.run_path(script, run_name='__main__')
  raise SystemExit(0)


def main() -> None:
  reply_file = os.fdopen(os.dup(1), 'w')
  os.dup2(2, 1)  # what the libraries print goes to stderr, not into the replies

  def reply(message: dict) -> None:
    reply_file.write(json.dumps(message) + '\n')
    reply_file.flush()

  # Objects the children inherit are never collected by them: a collection would touch (and
  # so copy) every page of the launcher's heap in every child.
  gc.freeze()
  reply({'ready': True})
  for line in sys.stdin:
    pids = []
    for run in json.loads(line)['runs']:
      sys.stdout.flush()
      sys.stderr.flush()
      pid = os.fork()
      if pid == 0:
        reply_file.close()
        _child(run)
      pids.append(pid)
    reply({'pids': pids})
    reply({'returncodes': [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]})


if __name__ == '__main__':
  main()
