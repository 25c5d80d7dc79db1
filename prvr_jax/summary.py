r"""Parameter tables: one function for `python -m prvr_jax.summary` and the training log.

  python -m prvr_jax.summary --config=configs/gmmformer_v2.py:tvr

computes the parameters with `jax.eval_shape` (nothing is allocated), prints one row per
parameter and ends with `total parameters: <N>`.
"""

import math
import sys
from typing import Any

from absl import app
from absl import flags
import jax
from ml_collections import config_flags

from prvr_jax import config_lib
from prvr_jax.models import registry
from prvr_jax.models.spec import path_of


def parameter_rows(params: Any, depth: int | None = None
                   ) -> list[tuple[str, tuple[int, ...] | None, int]]:
  """(path, shape, count) per leaf in tree order, or per path prefix of `depth` components
  (shape None where leaves were summed)."""
  rows: dict[str, tuple[tuple[int, ...] | None, int]] = {}
  for key_path, leaf in jax.tree_util.tree_leaves_with_path(params):
    parts = path_of(key_path).split('/')
    name = '/'.join(parts if depth is None else parts[:depth])
    size = math.prod(leaf.shape)
    if name in rows:
      rows[name] = (None, rows[name][1] + size)
    else:
      rows[name] = (tuple(leaf.shape) if depth is None or len(parts) <= depth else None, size)
  return [(name, shape, size) for name, (shape, size) in rows.items()]


def format_table(params: Any, depth: int | None = None) -> str:
  """`parameter_rows` as text, ending with `total parameters: <N>`."""
  rows = parameter_rows(params, depth)
  width = max(len(name) for name, _, _ in rows)
  lines = [f'{"parameter":<{width}}  {"shape":<18} {"count":>12}']
  lines += [f'{name:<{width}}  {str(shape or ""):<18} {size:>12,}' for name, shape, size in rows]
  lines.append(f'total parameters: {sum(size for _, _, size in rows)}')
  return '\n'.join(lines)


def main(argv: list[str]) -> None:
  del argv
  config_lib.validate(flags.FLAGS.config)
  config_model = flags.FLAGS.config.model
  print(format_table(registry.get_spec(config_model).param_shapes(config_model)))


if __name__ == '__main__':
  config_flags.DEFINE_config_file('config', None, 'Model config file[:variant].',
                                  lock_config=True)
  flags.mark_flag_as_required('config')
  config_lib.check_override_flags(sys.argv)
  app.run(main)
