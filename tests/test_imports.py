"""The package has no import cycle, and every module imports on its own."""

import ast
import pathlib
import subprocess
import sys

import support

PACKAGE = support.REPO / 'prvr_jax'


def _modules() -> dict[str, pathlib.Path]:
  modules = {}
  for path in sorted(PACKAGE.rglob('*.py')):
    name = '.'.join(path.relative_to(support.REPO).with_suffix('').parts)
    modules[name.removesuffix('.__init__')] = path
  return modules


def import_graph() -> dict[str, set[str]]:
  """Module -> the package modules it imports (lazy imports inside functions included; a
  package's own `__init__` is not counted as a dependency of its submodules)."""
  modules = _modules()
  graph = {}
  for name, path in modules.items():
    deps = set()
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        targets = [node.module] + [f'{node.module}.{a.name}' for a in node.names]
      elif isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      else:
        continue
      deps |= {t for t in targets if t in modules and t != name
               and not name.startswith(t + '.')}
    graph[name] = deps
  return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One cycle of `graph` as a list of modules, or None."""
  state: dict[str, int] = {}  # 1: on the stack, 2: done
  stack: list[str] = []

  def visit(node):
    state[node] = 1
    stack.append(node)
    for dep in sorted(graph[node]):
      if state.get(dep) == 1:
        return stack[stack.index(dep):] + [dep]
      if dep not in state and (cycle := visit(dep)):
        return cycle
    stack.pop()
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state and (cycle := visit(node)):
      return cycle
  return None


def test_find_cycle_finds_one():
  assert find_cycle({'a': {'b'}, 'b': {'c'}, 'c': {'a'}}) == ['a', 'b', 'c', 'a']
  assert find_cycle({'a': {'b'}, 'b': set()}) is None


def test_no_import_cycle():
  graph = import_graph()
  assert 'prvr_jax.eval.evaluator' in graph and 'prvr_jax.train.loop' in graph
  assert find_cycle(graph) is None, ' -> '.join(find_cycle(graph))
  # Evaluation and the checkpoint module sit below training, evaluation below its pictures
  # (`plots`); the command-line tools sit on top, imported by no library module.
  for name, deps in graph.items():
    if name.startswith(('prvr_jax.eval', 'prvr_jax.checkpoint')):
      assert not any(d.startswith('prvr_jax.train') for d in deps), (name, deps)
    if name.startswith('prvr_jax.eval'):
      assert 'prvr_jax.plots' not in deps, (name, deps)
    if not name.startswith('prvr_jax.tools'):
      assert not any(d.startswith('prvr_jax.tools') for d in deps), (name, deps)


# TFDS keeps one process-wide registry of builder classes, which re-importing
# prvr_jax.data.prepare would fill twice: the imports run with registration off.
_IMPORT_EACH = '''
import importlib, sys
from tensorflow_datasets.core import registered
failed = []
for name in sys.argv[1:]:
  for loaded in [m for m in sys.modules if m == 'prvr_jax' or m.startswith('prvr_jax.')]:
    del sys.modules[loaded]
  try:
    with registered.skip_registration():
      importlib.import_module(name)
  except Exception as e:  # pylint: disable=broad-except
    failed.append(f'{name}: {type(e).__name__}: {e}')
print('\\n'.join(failed))
sys.exit(1 if failed else 0)
'''


def test_every_module_imports_alone():
  """In a fresh interpreter, each module is imported with no other prvr_jax module loaded."""
  support.require_tensorflow()
  names = sorted(_modules())
  proc = subprocess.run([sys.executable, '-c', _IMPORT_EACH, *names], cwd=support.REPO,
                        env=support.cli_env(None), capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]


def test_the_step_imports_neither_orbax_nor_scipy_optimize():
  """Building models, the optimiser and the train step loads neither the checkpointer (orbax)
  nor the Hungarian solver (scipy.optimize), 60 MB of every such process's memory, nor
  TensorFlow."""
  code = ('import sys; import prvr_jax.models, prvr_jax.train; '
          "print(sorted(m for m in ('orbax.checkpoint', 'scipy.optimize', 'tensorflow') "
          'if m in sys.modules))')
  proc = subprocess.run([sys.executable, '-c', code], cwd=support.REPO,
                        env=support.cli_env(None), capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.strip().splitlines()[-1] == '[]', proc.stdout
