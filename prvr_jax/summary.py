r"""Parameter table of a model config, computed with `jax.eval_shape` (nothing is allocated).

  python -m prvr_jax.summary --config=configs/gmmformer_v2.py:tvr

The last line is `total parameters: <N>`.
"""

from typing import Any

from absl import app
from absl import flags
import jax
import numpy as np
from ml_collections import config_flags

from prvr_jax import models

def parameter_table(params: Any) -> list[tuple[str, tuple[int, ...], int]]:
  """(path, shape, size) of every parameter leaf, in tree order."""
  rows = []
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    name = '/'.join(str(getattr(k, 'key', k)) for k in path)
    rows.append((name, tuple(leaf.shape), int(np.prod(leaf.shape))))
  return rows


def format_table(params: Any) -> str:
  """The parameter table as text, ending with `total parameters: <N>`."""
  rows = parameter_table(params)
  name_width = max(len(name) for name, _, _ in rows)
  lines = [f'{"parameter":<{name_width}}  {"shape":<18} {"count":>12}']
  lines += [f'{name:<{name_width}}  {str(shape):<18} {size:>12,}' for name, shape, size in rows]
  lines.append(f'total parameters: {sum(size for _, _, size in rows)}')
  return '\n'.join(lines)


def main(argv: list[str]) -> None:
  del argv
  print(format_table(models.param_shapes(flags.FLAGS.config.model)))


if __name__ == '__main__':
  config_flags.DEFINE_config_file('config', None, 'Model config file[:variant].',
                                  lock_config=True)
  flags.mark_flag_as_required('config')
  app.run(main)
