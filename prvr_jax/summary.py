r"""Parameter tables: one function for `python -m prvr_jax.summary` and the training log.

  python -m prvr_jax.summary --config=configs/gmmformer_v2.py:tvr

computes the parameters with `jax.eval_shape` (nothing is allocated) and prints clu's parameter
table (`clu.parameter_overview.make_table`, the table of `log_parameter_overview`: name, shape,
dtype and size of each parameter), their bytes, and ends with `total parameters: <N>`.
"""

import dataclasses
import math
import sys
from typing import Any

from absl import app
from absl import flags
from clu import parameter_overview
import jax
from ml_collections import config_flags

from prvr_jax import config_lib
from prvr_jax.models import registry
from prvr_jax.models.spec import path_of


@dataclasses.dataclass
class ParameterRow:
  """A parameter ('a/b/c' path, shape, dtype, size); a row of several parameters (a path
  prefix) has no shape and lists their dtypes."""
  name: str
  shape: str
  dtype: str
  size: int


def parameter_rows(params: Any, depth: int | None = None) -> list[ParameterRow]:
  """One row per leaf in tree order, or per path prefix of `depth` components."""
  rows: dict[str, ParameterRow] = {}
  for key_path, leaf in jax.tree_util.tree_leaves_with_path(params):
    parts = path_of(key_path).split('/')
    name = '/'.join(parts if depth is None else parts[:depth])
    size, dtype = math.prod(leaf.shape), str(leaf.dtype)
    row = rows.get(name)
    if row is None:
      whole = depth is None or len(parts) <= depth
      rows[name] = ParameterRow(name, str(tuple(leaf.shape)) if whole else '', dtype, size)
    else:
      row.shape, row.size = '', row.size + size
      if dtype not in row.dtype.split(','):
        row.dtype += f',{dtype}'
  return list(rows.values())


def format_table(params: Any, depth: int | None = None) -> str:
  """`parameter_rows` as clu's table, then the bytes and `total parameters: <N>`."""
  rows = parameter_rows(params, depth)
  nbytes = sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(params))
  return (f'{parameter_overview.make_table(rows)}\n{nbytes:,} bytes\n'
          f'total parameters: {sum(row.size for row in rows)}')


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
