"""The residual and products of parallel branches over a shared input
(prvr_jax.kernels.branches) against the plain operations, and GMMBlock's use of them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import support
from prvr_jax.kernels import branches
from prvr_jax.layers import AttentionBlockV1, AttentionBlockV2, GMMBlock, precision
from prvr_jax.layers.windows import stacked_windows


def _normal(seed, shape, scale=1.0):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape) * scale, jnp.float32)


def _rounded(x):
  return np.asarray(x.astype(jnp.bfloat16).astype(jnp.float32), np.float64)


def _branches_vjp(x, kernels, precision_name='bfloat16'):
  """`branches.matmul` vmapped over the K kernels with `x` shared, inside `shared_input()`."""
  def run(x, kernels):
    with precision.matmul_precision(precision_name), branches.shared_input():
      return jax.vmap(branches.matmul, in_axes=(None, 0))(x, kernels)
  return jax.jit(lambda x, k: jax.vjp(run, x, k))(x, kernels)


def test_shared_input_matmul_multiplies_rounded_operands_and_its_gradients_too():
  x, kernels = _normal(0, (2, 6, 16)), _normal(1, (3, 16, 8), 0.25)
  cotangent = _normal(2, (3, 2, 6, 8))
  out, vjp = _branches_vjp(x, kernels)
  grad_x, grad_kernels = vjp(cotangent)
  x16, k16, g16 = _rounded(x), _rounded(kernels), _rounded(cotangent)
  support.assert_close(out, np.einsum('bld,kdf->kblf', x16, k16), rtol=support.f32_rtol(16))
  support.assert_close(grad_x, np.einsum('kblf,kdf->bld', g16, k16), rtol=support.f32_rtol(24))
  support.assert_close(grad_kernels, np.einsum('bld,kblf->kdf', x16, g16),
                       rtol=support.f32_rtol(12))


def test_in_float32_and_outside_shared_input_it_is_the_plain_product():
  x, kernels = _normal(6, (2, 6, 16)), _normal(7, (3, 16, 8))
  out, _ = _branches_vjp(x, kernels, precision_name='float32')
  np.testing.assert_array_equal(out, jax.jit(jax.vmap(jnp.matmul, in_axes=(None, 0)))(x, kernels))
  with precision.matmul_precision('bfloat16'):
    # Outside `shared_input()` (the encoders' attention uses the same layers): the plain
    # mixed-precision product, differentiable.
    grad = jax.grad(lambda x: jnp.sum(branches.matmul(x, kernels[0])))(x)
    np.testing.assert_array_equal(branches.matmul(x, kernels[0]),
                                  precision.bf16_matmul(x, kernels[0]))
  support.assert_close(grad, jnp.broadcast_to(_rounded(kernels[0]).sum(-1), x.shape),
                       rtol=support.f32_rtol(8))


def _vjp_equations(run, a, b, cotangent):
  """Every equation of `run`'s backward pass at `(a, b)` against `cotangent`."""
  jaxpr = jax.make_jaxpr(lambda a, b, g: jax.vjp(run, a, b)[1](g))(a, b, cotangent).jaxpr
  return list(support.all_equations(jaxpr))


@pytest.mark.parametrize('precision_name', ['float32', 'bfloat16'])
def test_shared_residual_gradient_is_a_product_over_the_branches(precision_name):
  """`residual` with the residual shared by the branches: the plain sum, whose gradient for the
  shared operand is the sum of the branches' cotangents, computed as one float32 product."""
  x, y = _normal(3, (2, 6, 16)), _normal(4, (3, 2, 6, 16))
  cotangent = _normal(5, (3, 2, 6, 16))
  def run(x, y):
    with precision.matmul_precision(precision_name), branches.shared_input():
      return jax.vmap(branches.residual, in_axes=(None, 0))(x, y)
  out, vjp = jax.vjp(run, x, y)
  grad_x, grad_y = vjp(cotangent)
  np.testing.assert_array_equal(out, x[None] + y)
  np.testing.assert_array_equal(grad_y, cotangent)
  support.assert_close(grad_x, np.sum(np.asarray(cotangent, np.float64), 0),
                       rtol=support.f32_rtol(3))
  equations = _vjp_equations(run, x, y, cotangent)
  assert not support.leading_axis_sums(equations, 3)
  sums = [e for e in equations if e.primitive.name == 'dot_general']
  assert [e.params['precision'] for e in sums] == [(jax.lax.Precision.HIGHEST,) * 2]


def test_shared_kernel_gradient_is_a_product_over_the_branches():
  """`matmul` of branch-batched inputs with one kernel shared by the branches, in mixed
  precision: the kernel's gradient sums the branches without a leading-axis reduction."""
  xs, kernel = _normal(8, (3, 2, 6, 16)), _normal(9, (16, 8), 0.25)
  def run(xs, kernel):
    with precision.matmul_precision('bfloat16'), branches.shared_input():
      return jax.vmap(branches.matmul, in_axes=(0, None))(xs, kernel)
  cotangent = _normal(10, (3, 2, 6, 8))
  grad_kernel = jax.vjp(run, xs, kernel)[1](cotangent)[1]
  support.assert_close(grad_kernel, np.einsum('kbld,kblf->df', _rounded(xs), _rounded(cotangent)),
                       rtol=support.f32_rtol(36))
  assert not support.leading_axis_sums(_vjp_equations(run, xs, kernel, cotangent), 3)


def _block_and_inputs(block_name):
  x, mask = _normal(11, (2, 12, 8)), jnp.ones((2, 12)).at[0, 7:].set(0)
  widths = (None, 0.5, 5.0)  # 3 x 8 features: no other axis of the blocks has 24 entries
  block = GMMBlock(widths=widths, num_heads=2, block=block_name, aggregation='average')
  return block, block.init(jax.random.key(0), x, mask), x, mask, widths


@pytest.mark.parametrize('precision_name', ['float32', 'bfloat16'])
@pytest.mark.parametrize('block_name,block_cls', [('v1', AttentionBlockV1),
                                                  ('v2', AttentionBlockV2)])
def test_gmm_block_gradients_equal_separately_applied_branches(block_name, block_cls,
                                                               precision_name):
  """Input and parameter gradients of the vmapped branches (with the shared-input residual
  and, in mixed precision, products) equal those of K blocks applied one by one with the
  sliced weights (the same bfloat16 roundings in mixed precision), averaged."""
  block, params, x, mask, widths = _block_and_inputs(block_name)
  windows = stacked_windows('gaussian', widths, 12)
  single = block_cls(num_heads=2)
  weights = _normal(12, (2, 12, 8))

  def vmapped(params, x):
    return jnp.sum(block.apply(params, x, mask) * weights)

  def one_by_one(params, x):
    stacked = params['params']['branches']
    outputs = [single.apply({'params': jax.tree_util.tree_map(lambda p: p[k], stacked)}, x,
                            key_mask=mask, window=windows[k]) for k in range(len(widths))]
    return jnp.sum(jnp.mean(jnp.stack(outputs), 0) * weights)

  def grads(loss):
    def run(params, x):
      with precision.matmul_precision(precision_name):
        return jax.grad(loss, argnums=(0, 1))(params, x)
    return jax.jit(run)(params, x)

  ours, expected = grads(vmapped), grads(one_by_one)
  # Gradients through ~10 chained ops with reductions over <= 4 * 8 terms.
  for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(ours),
                               jax.tree_util.tree_leaves(expected)):
    support.assert_close(got, want, rtol=support.f32_rtol(32, ops=10),
                         err_msg=jax.tree_util.keystr(path))


def _gradient_equations(block_name, precision_name):
  block, params, x, mask, _ = _block_and_inputs(block_name)
  def grad(params, x):
    with precision.matmul_precision(precision_name):
      return jax.grad(lambda p, x: jnp.sum(block.apply(p, x, mask) ** 2), argnums=(0, 1))(
          params, x)
  return list(support.all_equations(jax.make_jaxpr(grad)(params, x).jaxpr))


@pytest.mark.parametrize('block_name', ['v1', 'v2'])
def test_mixed_precision_input_gradient_is_one_product_per_projection(block_name):
  """The input gradient of each projection of the shared input (query, key, value) is one
  product contracted over the K branches at once, not K products summed over the branches."""
  num_branches, width = 3, 8
  def first_contracted_size(e):
    (lhs_contracting, _), _ = e.params['dimension_numbers']
    return e.invars[0].aval.shape[lhs_contracting[0]] if lhs_contracting else None
  contracted_over_branches = [
      e for e in _gradient_equations(block_name, 'bfloat16')
      if e.primitive.name == 'dot_general' and first_contracted_size(e) == num_branches * width]
  assert len(contracted_over_branches) == 3


@pytest.mark.parametrize('precision_name', ['float32', 'bfloat16'])
@pytest.mark.parametrize('block_name', ['v1', 'v2'])
def test_gmm_block_gradient_sums_nothing_over_the_branch_axis(block_name, precision_name):
  """No gradient of the block reduces over its K branches (XLA:CPU's slow leading-axis sum):
  the residual's and the projections' input gradients are products."""
  assert not support.leading_axis_sums(_gradient_equations(block_name, precision_name), 3)
