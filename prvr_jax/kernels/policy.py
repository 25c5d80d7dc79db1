"""Where the kernels stand in for the plain layers: one switch, by backend (docs/kernels.md).

The layers are written with `nn.Dropout` and `nn.LayerNorm`. Under `fast_kernels()` their calls
are intercepted (`flax.linen.intercept_methods`) and computed by `kernels.dropout.apply` and
`kernels.layer_norm.apply`: the same parameters, the same `make_rng` key, another program. The
train step traces its objective under `fast_kernels()`, which decides by JAX's default backend:

* CPU (`FAST_BACKENDS`): on, where the kernels were measured faster (dropout) or lighter at the
  same speed (LayerNorm's peak memory), except the LayerNorms of T-MASS's text-conditioned
  pooling, whose `[Q, B, D]` pair LayerNorms were measured slower in the kernel's form.
* GPU: on as well: measured against the plain layers there, the same speed or faster with
  less peak memory for most models (docs/benchmarks.md), and a GPU run keeps the programs (and
  the dropout stream) the GPU benchmarks were measured with.
* Any other backend: the plain layers.

`config.train.kernels` ('auto', 'fast', 'plain'; `CHOICES`) overrides the backend's choice.

Evaluation and everything traced outside the train step run the plain layers; with dropout off
the two LayerNorms have the same forward, operation for operation.
"""

from collections.abc import Iterator
import contextlib
from typing import Any

import flax.linen as nn
import jax

from prvr_jax.kernels import dropout
from prvr_jax.kernels import layer_norm
from prvr_jax.layers.text_pooling import TextConditionedPooling

FAST_BACKENDS = ('cpu', 'gpu')
# `config.train.kernels`: by backend, the kernels, or the plain layers.
CHOICES: dict[str, bool | None] = {'auto': None, 'fast': True, 'plain': False}


def _plain_layer_norm(module: nn.LayerNorm) -> bool:
  """LayerNorms measured faster plain: those of T-MASS's text-conditioned pooling."""
  return isinstance(module.parent, TextConditionedPooling)


def _interceptor(next_fun: Any, args: tuple, kwargs: dict, context: Any) -> Any:
  """Computes the plain modules' `__call__` with their kernels, where those support the call."""
  module, kind = context.module, type(context.module)  # subclasses may change `__call__`
  if context.method_name == '__call__':
    if kind is nn.Dropout and dropout.supports(module):
      return dropout.apply(module, *args, **kwargs)
    if (kind is nn.LayerNorm and len(args) == 1 and not kwargs  # no `mask`
        and layer_norm.supports(module, args[0]) and not _plain_layer_norm(module)):
      return layer_norm.apply(module, args[0])
  return next_fun(*args, **kwargs)


@contextlib.contextmanager
def fast_kernels(enabled: bool | None = None) -> Iterator[None]:
  """Traces the enclosed model code with the kernels in place of `nn.Dropout` and
  `nn.LayerNorm` where `enabled`; None (the default) enables them on `FAST_BACKENDS`."""
  if enabled is None:
    enabled = jax.default_backend() in FAST_BACKENDS
  if not enabled:
    yield
    return
  with nn.intercept_methods(_interceptor):
    yield
