"""Parallel branches over one shared input in mixed precision: the input's products, one for
all branches, differentiated without K products and a reduction over the branch axis.

`GMMBlock` runs its K branches as one `nn.vmap` over stacked parameters, every branch reading
the block's input. In mixed precision (`precision.matmul_precision('bfloat16')`) JAX batches
the dense layers' bfloat16 product (a `custom_vjp`) branch by branch: the input's gradient is K
products, one per branch, stacked `[K, ...]` and summed over the branch axis, and XLA's CPU
backend runs that reduction slowly (YNNPACK: 28 ms for a `[4, 4096, 384]` float32 sum that
takes 0.6 ms as three adds). Inside `shared_input()`, in mixed precision, `matmul(x, kernel)`
with `x` shared and the kernels stacked `[K, D, F]` is one product against the K kernels side by
side (`[D, K*F]`), whose input gradient is one product contracted over the K branches together.

In float32 it is the plain `precision.matmul`: JAX's own batching of a float32 product with a
shared operand is already one product, and the float32 training steps of GMMFormer and
GMMFormer v2 gained nothing with this rule (2-6% slower, within the run-to-run spread;
docs/benchmarks.md). Outside `shared_input()` it is the plain product too.

`shared_input()` is for the body of a vmap over the branches only (`GMMBlock` enters it around
its `nn.vmap`): `matmul` inside it takes its own batching rule there, and JAX can differentiate
it only through that rule (`jax.custom_batching.custom_vmap`), so each call must have its
kernel batched over the branches, as the stacked parameters are.
"""

from collections.abc import Iterator
import contextlib
import contextvars

import jax
from jax.custom_batching import custom_vmap
import jax.numpy as jnp

from prvr_jax.layers import precision

_SHARED_INPUT = contextvars.ContextVar('prvr_jax_shared_input', default=False)


@contextlib.contextmanager
def shared_input() -> Iterator[None]:
  """Traces the enclosed branches (an `nn.vmap` whose unbatched operand is the shared input)
  with `matmul` below; enter it under the precision the branches are traced in."""
  token = _SHARED_INPUT.set(precision.mixed_dense())
  try:
    yield
  finally:
    _SHARED_INPUT.reset(token)


def _broadcast(x: jax.Array, axis_size: int) -> jax.Array:
  return jnp.broadcast_to(x, (axis_size,) + x.shape)


@custom_vmap
def _branch_matmul(x: jax.Array, kernel: jax.Array) -> jax.Array:
  return precision.matmul(x, kernel)


@_branch_matmul.def_vmap
def _branch_matmul_vmap(axis_size: int, in_batched: list[bool], x: jax.Array,
                        kernel: jax.Array) -> tuple[jax.Array, bool]:
  x_batched, kernel_batched = in_batched
  if kernel_batched and not x_batched:
    _, width, features = kernel.shape
    side_by_side = jnp.moveaxis(kernel, 0, 1).reshape(width, axis_size * features)
    y = precision.matmul(x, side_by_side).reshape(x.shape[:-1] + (axis_size, features))
    return jnp.moveaxis(y, -2, 0), True
  x = x if x_batched else _broadcast(x, axis_size)
  kernel = kernel if kernel_batched else _broadcast(kernel, axis_size)
  return jax.vmap(precision.matmul)(x, kernel), True


def matmul(x: jax.Array, kernel: jax.Array) -> jax.Array:
  """`x [..., D] @ kernel [D, F]` (`precision.matmul`); inside `shared_input()` in mixed
  precision, under the branches' vmap, one product for a shared `x` against the stacked kernels."""
  return _branch_matmul(x, kernel) if _SHARED_INPUT.get() else precision.matmul(x, kernel)

