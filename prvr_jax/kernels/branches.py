"""Parallel branches over one shared input: its gradient without a reduction over the branch
axis, which XLA's CPU backend runs far slower than the same sum written as adds or a product.

`GMMBlock` runs its K branches as one `nn.vmap` over stacked parameters, every branch reading
the block's input `x`, and JAX differentiates an unbatched operand of a batched operation with a
sum of the K branches' cotangents over the leading axis. Inside `shared_input()`:

* `residual(x, y)` (the blocks' residual `x + y`; reference: `x + y`) broadcasts a shared `x`
  to the branches with a gradient that sums them as a product (`sum_over_branches`), in every
  precision.
* `matmul(x, kernel)` (reference: `precision.matmul` under `jax.vmap`) in mixed precision
  (`precision.matmul_precision('bfloat16')`), with `x` shared and the kernels stacked
  `[K, D, F]`, is one product against the K kernels side by side (`[D, K*F]`), whose input
  gradient is one product contracted over the K branches together. JAX would batch the dense
  layers' bfloat16 product (a `custom_vjp`) branch by branch: K input-gradient products stacked
  `[K, ...]` and summed over the branch axis. In float32 it is the plain `precision.matmul`:
  JAX's own batching of a float32 product with a shared operand is already one product, and
  the float32 steps gained nothing measurable with this rule (docs/kernels.md).

Outside `shared_input()` both are the plain operations. `shared_input()` is for the body of a
vmap over the branches only (`GMMBlock` enters it around its `nn.vmap`): inside it `residual`
and `matmul` take their own batching rules, and JAX can differentiate them only through those
rules (`jax.custom_batching.custom_vmap`), so each call must have an operand batched over the
branches (the stacked parameters, or a branch's own activations).

These are written into the layers (`AttentionBlockV1`/`V2`, `Projection`, `GMMBlock`) rather
than put in place by `prvr_jax.kernels.policy`: a batching rule belongs to the operation it
batches, and the plain `x + y` has no module to intercept.
"""

from collections.abc import Iterator
import contextlib
import contextvars
import functools

import jax
from jax.custom_batching import custom_vmap
import jax.numpy as jnp

from prvr_jax.layers.precision import matmul as precision_matmul
from prvr_jax.layers.precision import mixed_dense

_SHARED_INPUT = contextvars.ContextVar('prvr_jax_shared_input', default=False)


@contextlib.contextmanager
def shared_input() -> Iterator[None]:
  """Traces the enclosed branches (an `nn.vmap` whose unbatched operand is the shared input)
  with `residual` and `matmul` below."""
  token = _SHARED_INPUT.set(True)
  try:
    yield
  finally:
    _SHARED_INPUT.reset(token)


def sum_over_branches(stacked: jax.Array, weights: jax.Array) -> jax.Array:
  """`sum_k weights[k] * stacked[k]` for `stacked [K, ...]`, as a product, which XLA:CPU runs
  faster than the reduction. HIGHEST keeps it a float32 sum under a bfloat16 default precision
  on accelerators."""
  return jnp.tensordot(weights, stacked, axes=(0, 0), precision=jax.lax.Precision.HIGHEST)


def _broadcast(x: jax.Array, axis_size: int) -> jax.Array:
  return jnp.broadcast_to(x, (axis_size,) + x.shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def _broadcast_to_branches(x: jax.Array, axis_size: int) -> jax.Array:
  """`[...] -> [K, ...]`, differentiated with `sum_over_branches`."""
  return _broadcast(x, axis_size)


def _broadcast_to_branches_fwd(x, axis_size):
  return _broadcast(x, axis_size), None


def _broadcast_to_branches_bwd(axis_size, _, cotangent):
  return (sum_over_branches(cotangent, jnp.ones((axis_size,), cotangent.dtype)),)


_broadcast_to_branches.defvjp(_broadcast_to_branches_fwd, _broadcast_to_branches_bwd)


@custom_vmap
def _branch_add(x: jax.Array, y: jax.Array) -> jax.Array:
  return x + y


@_branch_add.def_vmap
def _branch_add_vmap(axis_size: int, in_batched: list[bool], x: jax.Array,
                     y: jax.Array) -> tuple[jax.Array, bool]:
  x, y = (v if batched else _broadcast_to_branches(v, axis_size)
          for v, batched in zip((x, y), in_batched))
  return x + y, True


@custom_vmap
def _branch_matmul(x: jax.Array, kernel: jax.Array) -> jax.Array:
  return precision_matmul(x, kernel)


@_branch_matmul.def_vmap
def _branch_matmul_vmap(axis_size: int, in_batched: list[bool], x: jax.Array,
                        kernel: jax.Array) -> tuple[jax.Array, bool]:
  x_batched, kernel_batched = in_batched
  if kernel_batched and not x_batched:
    _, width, features = kernel.shape
    side_by_side = jnp.moveaxis(kernel, 0, 1).reshape(width, axis_size * features)
    y = precision_matmul(x, side_by_side).reshape(x.shape[:-1] + (axis_size, features))
    return jnp.moveaxis(y, -2, 0), True
  x = x if x_batched else _broadcast_to_branches(x, axis_size)
  kernel = kernel if kernel_batched else _broadcast_to_branches(kernel, axis_size)
  return jax.vmap(precision_matmul)(x, kernel), True


def residual(x: jax.Array, y: jax.Array) -> jax.Array:
  """`x + y`, a block's residual connection; inside `shared_input()`, under the branches' vmap,
  an operand shared by the branches (the residual input) gets its gradient summed over them by
  `sum_over_branches`."""
  return _branch_add(x, y) if _SHARED_INPUT.get() else x + y


def matmul(x: jax.Array, kernel: jax.Array) -> jax.Array:
  """`x [..., D] @ kernel [D, F]` (`precision.matmul`); inside `shared_input()` in mixed
  precision, under the branches' vmap, one product for a shared `x` against the stacked kernels."""
  if _SHARED_INPUT.get() and mixed_dense():
    return _branch_matmul(x, kernel)
  return precision_matmul(x, kernel)
