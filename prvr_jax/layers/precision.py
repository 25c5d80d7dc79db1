"""Matmul precision: float32, or the dense layers in bfloat16 with float32 accumulation.

Every jitted function of the library traces its model under `matmul_precision(name)` (the
train step with `config.train.matmul_precision`, evaluation, index search and plots with
`config.eval.matmul_precision`). It sets JAX's default matmul precision to `name`, and with
'bfloat16' the dense layers (`nn.Dense` through `dense_dot_general`, the attention projections
through `matmul`) and attention's scores and weighted values (`einsum`) multiply bfloat16
copies of their operands with float32 accumulation, in the forward pass and in both products of
the backward pass. Parameters, the activations between layers and the gradients stay float32;
the copies kept for the backward pass are bfloat16.

The other matmuls (similarities, losses) run at JAX's 'bfloat16' precision setting: one
bfloat16 pass on TPUs, TF32 on recent NVIDIA GPUs (GMMBlock's mixtures of its branch outputs
stay float32 sums at HIGHEST); XLA's CPU backend ignores the precision of a float32 matmul, so
on CPUs the explicit casts above are what run on the bfloat16 units (AVX512-BF16, AMX).
Measured effect on speed and accuracy: docs/benchmarks.md ("Mixed precision").
"""

from collections.abc import Iterator
import contextlib
import contextvars
import functools

import jax
from jax import lax
import jax.numpy as jnp

_MIXED_DENSE = contextvars.ContextVar('prvr_jax_mixed_dense', default=False)


@contextlib.contextmanager
def matmul_precision(name: str) -> Iterator[None]:
  """Traces the enclosed code at matmul precision `name` ('float32', 'tensorfloat32',
  'bfloat16': `config_lib.MATMUL_PRECISIONS`)."""
  token = _MIXED_DENSE.set(name == 'bfloat16')
  try:
    with jax.default_matmul_precision(name):
      yield
  finally:
    _MIXED_DENSE.reset(token)


def mixed_dense() -> bool:
  """Whether the dense layers are traced in mixed precision (`matmul_precision('bfloat16')`)."""
  return _MIXED_DENSE.get()


@jax.custom_vjp
def bf16_matmul(x: jax.Array, kernel: jax.Array) -> jax.Array:
  """`x [..., D] @ kernel [D, F]` with bfloat16 operands, accumulated and returned in float32."""
  return jnp.matmul(x.astype(jnp.bfloat16), kernel.astype(jnp.bfloat16),
                    preferred_element_type=jnp.float32)


def _bf16_matmul_fwd(x, kernel):
  x16, kernel16 = x.astype(jnp.bfloat16), kernel.astype(jnp.bfloat16)
  return jnp.matmul(x16, kernel16, preferred_element_type=jnp.float32), (x16, kernel16)


def _kernel_grad(x16: jax.Array, grad16: jax.Array) -> jax.Array:
  """`x16 [..., D]` and `grad16 [..., F]` contracted over their leading axes -> `[D, F]`."""
  leading = tuple(range(x16.ndim - 1))
  return lax.dot_general(x16, grad16, ((leading, leading), ((), ())),
                         preferred_element_type=jnp.float32)


def _kernel_grad_split_rows(x16: jax.Array, grad16: jax.Array) -> jax.Array:
  """`_kernel_grad` of a 2-D `x16` with its rows split in two: `[2, M / 2, D]`.

  XLA:CPU runs bfloat16 x bfloat16 -> float32 products only in YNNPACK, which takes no
  transposed left operand. With one contracted leading axis XLA hands the product `x16`'s
  transpose, and then either fails ('Unsupported element type for DotThunk', earlier jaxlibs)
  or, with jaxlib 0.10, runs it in float32 on bfloat16-rounded copies, slower than the
  bfloat16 product (an optimisation barrier on the transpose does not stop that). With two
  contracted leading axes XLA flattens them with a copy that is already the transpose, as for a 3-D input, and
  the product runs in bfloat16. An odd row count gets a zero row, which adds nothing.
  """
  if x16.shape[0] % 2:
    x16, grad16 = (jnp.pad(a, ((0, 1), (0, 0))) for a in (x16, grad16))
  return _kernel_grad(x16.reshape(2, -1, x16.shape[1]), grad16.reshape(2, -1, grad16.shape[1]))


def _bf16_matmul_bwd(residuals, grad):
  x16, kernel16 = residuals
  grad16 = grad.astype(jnp.bfloat16)
  grad_x = jnp.matmul(grad16, kernel16.T, preferred_element_type=jnp.float32)
  if x16.ndim == 2:
    grad_kernel = lax.platform_dependent(x16, grad16, cpu=_kernel_grad_split_rows,
                                         default=_kernel_grad)
  else:
    grad_kernel = _kernel_grad(x16, grad16)
  return grad_x, grad_kernel


bf16_matmul.defvjp(_bf16_matmul_fwd, _bf16_matmul_bwd)


def _bf16_product(x_term: str, x16: jax.Array, y_term: str, y16: jax.Array,
                  out_term: str) -> jax.Array:
  """`einsum(x_term,y_term->out_term)` of bfloat16 operands in float32, as one `dot_general`.

  XLA:CPU runs bfloat16 x bfloat16 -> float32 products only in YNNPACK, which takes no
  transposed left operand, and its fallback kernel has none ('Unsupported element type for
  DotThunk'). A left operand whose batch indices lead and whose contracted ones are not last
  can reach the product as such (`bhqk` contracted over `q` into `bkhd`: the product does not
  run), so the left operand is one whose contracted indices are last, else one that XLA must
  copy into place anyway (batch indices not leading: `bqhd`).
  """
  batch = [i for i in x_term if i in y_term and i in out_term]
  contracted = [i for i in x_term if i in y_term and i not in out_term]

  def transposed_left(term: str) -> int:  # 0: ready, 1: copied by XLA, 2: may be transposed
    if contracted and term.endswith(''.join(i for i in term if i in contracted)):
      return 0
    return 2 if set(term[:len(batch)]) == set(batch) else 1

  if transposed_left(y_term) < transposed_left(x_term):
    x_term, x16, y_term, y16 = y_term, y16, x_term, x16
  dims = (([x_term.index(i) for i in contracted], [y_term.index(i) for i in contracted]),
          ([x_term.index(i) for i in batch], [y_term.index(i) for i in batch]))
  product = lax.dot_general(x16, y16, dims, preferred_element_type=jnp.float32)
  product_term = ''.join(batch) + ''.join(i for i in x_term + y_term if i not in batch + contracted)
  return jnp.transpose(product, [product_term.index(i) for i in out_term])


def _einsum_terms(spec: str) -> tuple[str, str, str]:
  """(a, b, output) terms of a two-operand `spec` whose every index is in two or three terms."""
  inputs, _, out_term = spec.partition('->')
  terms = (*inputs.split(','), out_term)
  indices = ''.join(terms)
  if (len(terms) != 3 or not indices.isalpha()
      or any(indices.count(i) < 2 or len(set(t)) != len(t) for t in terms for i in t)):
    raise ValueError(f'bf16_einsum takes two operands, each index in two or all three terms '
                     f'and once per term, as in "bqhd,bkhd->bhqk"; got {spec!r}')
  return terms


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def bf16_einsum(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
  """`jnp.einsum(spec, a, b)` of two operands with bfloat16 copies of them, accumulated and
  returned in float32, as are both products of its gradient. Each index of `spec` (no
  ellipsis) must be in two or all three of its terms, once per term."""
  return _bf16_einsum_fwd(spec, a, b)[0]


def _bf16_einsum_fwd(spec, a, b):
  a_term, b_term, out_term = _einsum_terms(spec)
  a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
  return _bf16_product(a_term, a16, b_term, b16, out_term), (a16, b16)


def _bf16_einsum_bwd(spec, residuals, grad):
  a_term, b_term, out_term = _einsum_terms(spec)
  a16, b16 = residuals
  grad16 = grad.astype(jnp.bfloat16)
  return (_bf16_product(out_term, grad16, b_term, b16, a_term),
          _bf16_product(out_term, grad16, a_term, a16, b_term))


bf16_einsum.defvjp(_bf16_einsum_fwd, _bf16_einsum_bwd)


def _mixed(x: jax.Array, kernel: jax.Array) -> bool:
  return mixed_dense() and x.dtype == jnp.float32 and kernel.dtype == jnp.float32


def matmul(x: jax.Array, kernel: jax.Array) -> jax.Array:
  """`x [..., D] @ kernel [D, F]`, in mixed precision under `matmul_precision('bfloat16')`."""
  return bf16_matmul(x, kernel) if _mixed(x, kernel) else x @ kernel


def einsum(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
  """`jnp.einsum(spec, a, b)`, as `bf16_einsum` under `matmul_precision('bfloat16')`."""
  return bf16_einsum(spec, a, b) if _mixed(a, b) else jnp.einsum(spec, a, b)


def dense_dot_general(lhs: jax.Array, rhs: jax.Array, dimension_numbers,
                      precision=None, preferred_element_type=None) -> jax.Array:
  """`lax.dot_general` for `nn.Dense(dot_general=...)`: under `matmul_precision('bfloat16')`
  its `x @ kernel` runs as `bf16_matmul`; otherwise exactly `lax.dot_general`."""
  (lhs_contracting, rhs_contracting), batch = dimension_numbers
  if (_mixed(lhs, rhs) and preferred_element_type is None and not any(batch)
      and tuple(lhs_contracting) == (lhs.ndim - 1,) and tuple(rhs_contracting) == (0,)
      and rhs.ndim == 2):
    return bf16_matmul(lhs, rhs)
  return lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                         preferred_element_type=preferred_element_type)
