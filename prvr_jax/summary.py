r"""Parameter tables: one function for `prvr-summary` (`prvr_jax.tools.summary`) and the
training log.

  prvr-summary --config=gmmformer_v2:tvr

computes the parameters with `jax.eval_shape` (nothing is allocated) and prints clu's parameter
table (`clu.parameter_overview.make_table`, the table of `log_parameter_overview`: name, shape,
dtype and size of each parameter), their bytes, and ends with `total parameters: <N>`.
"""

import dataclasses
import math
from typing import Any

from clu import parameter_overview
import jax

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


def config_table(config: Any) -> str:
  """`format_table` of the parameters of `config.model` (the run config, validated first),
  computed with `jax.eval_shape`."""
  config_lib.validate(config)
  return format_table(registry.get_spec(config.model).param_shapes(config.model))
