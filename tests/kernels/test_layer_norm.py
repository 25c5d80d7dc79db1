"""`kernels.layer_norm` against `flax.linen.LayerNorm`, the layer it stands in for under
`policy.fast_kernels()`: same parameters, same forward, and its hand-written backward equal to
the gradient of Flax's form."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import support
from prvr_jax.kernels import layer_norm
from prvr_jax.kernels.policy import fast_kernels
from prvr_jax.layers.attention import LAYER_NORM_EPS

WIDTH = 384


def _fast(method):
  """`method(*args)` traced with the kernels in place of the plain layers."""
  def run(*args, **kwargs):
    with fast_kernels(True):
      return method(*args, **kwargs)
  return run


def _uses_kernel(fn, *args):
  return 'custom_vjp_call' in str(jax.make_jaxpr(fn)(*args))


class _Norm(nn.Module):
  """The layers' use: an `nn.LayerNorm` made inside a module."""

  @nn.compact
  def __call__(self, x):
    return nn.LayerNorm(epsilon=LAYER_NORM_EPS)(x)


def _inputs(shape, seed=0):
  x = 3.0 * jax.random.normal(jax.random.key(seed), shape) + 1.5
  x = x.at[..., 0, :].set(0.25)  # a constant row: the clamped variance, xhat == 0
  params = {'params': {
      'scale': 1.0 + 0.2 * jax.random.normal(jax.random.key(seed + 1), (shape[-1],)),
      'bias': 0.3 * jax.random.normal(jax.random.key(seed + 2), (shape[-1],))}}
  cotangent = jax.random.normal(jax.random.key(seed + 3), shape)
  return x, params, cotangent


def test_parameters_are_flax_layer_norms():
  x = jnp.ones((2, 5, WIDTH))
  module = nn.LayerNorm(epsilon=LAYER_NORM_EPS)
  ours = _fast(module.init)(jax.random.key(0), x)
  flax_params = module.init(jax.random.key(0), x)
  assert jax.tree.map(lambda a: (a.shape, a.dtype), ours) == jax.tree.map(
      lambda a: (a.shape, a.dtype), flax_params)
  np.testing.assert_array_equal(ours['params']['scale'], np.ones(WIDTH))
  np.testing.assert_array_equal(ours['params']['bias'], np.zeros(WIDTH))


@pytest.mark.parametrize('shape', [(7, WIDTH), (3, 9, WIDTH), (2, 3, 4, 96)])
def test_forward_and_gradients_equal_flax(shape):
  x, params, cotangent = _inputs(shape)
  module = nn.LayerNorm(epsilon=LAYER_NORM_EPS)

  def loss(p, v):
    return jnp.sum(module.apply(p, v) * cotangent)

  assert _uses_kernel(_fast(loss), params, x) and not _uses_kernel(loss, params, x)
  support.assert_close(_fast(module.apply)(params, x), module.apply(params, x),
                       rtol=support.f32_rtol(shape[-1]))
  grads = jax.grad(_fast(loss), argnums=(0, 1))(params, x)
  expected = jax.grad(loss, argnums=(0, 1))(params, x)
  rows = int(np.prod(shape[:-1]))
  for name in ('scale', 'bias'):  # sums over the rows
    support.assert_close(grads[0]['params'][name], expected[0]['params'][name],
                         rtol=support.f32_rtol(rows * shape[-1], ops=2), err_msg=name)
  support.assert_close(grads[1], expected[1], rtol=support.f32_rtol(shape[-1], ops=3),
                       err_msg='x')
  # The constant row's gradient: rstd * (g - mean(g)), which sums to zero over the features.
  support.assert_close(jnp.sum(grads[1][..., 0, :], axis=-1),
                       np.zeros(shape[:-2]), rtol=support.f32_rtol(shape[-1], ops=3),
                       scale=float(jnp.max(jnp.abs(grads[1][..., 0, :]))) * shape[-1])


def test_forward_is_flax_operation_for_operation():
  """With dropout off, evaluation (which runs the plain layers) computes what training's
  forward computes: the same reductions, so only the elementwise ops' rounding (fused with or
  without FMA) may differ."""
  x, params, _ = _inputs((3, 9, WIDTH))
  module = nn.LayerNorm(epsilon=LAYER_NORM_EPS)
  support.assert_close(jax.jit(_fast(module.apply))(params, x), jax.jit(module.apply)(params, x),
                       rtol=support.f32_rtol(1, ops=3))


def test_stacked_branches_take_their_own_parameters():
  """Under `nn.vmap` (a GMMBlock's K branches) each branch normalises with its own slice."""
  x, _, cotangent = _inputs((4, 6, WIDTH))
  stacked = nn.vmap(_Norm, in_axes=0, out_axes=0,
                    variable_axes={'params': 0}, split_rngs={'params': True})()
  params = _fast(stacked.init)(jax.random.key(0), x)
  params = jax.tree.map(lambda a: a + 0.1 * jax.random.normal(jax.random.key(5), a.shape), params)
  flax_ln = nn.LayerNorm(epsilon=LAYER_NORM_EPS)
  outputs = _fast(stacked.apply)(params, x)
  loss = _fast(lambda p: jnp.sum(stacked.apply(p, x) * cotangent))
  assert _uses_kernel(loss, params)
  grads = jax.grad(loss)(params)
  for k in range(4):
    branch = {'params': jax.tree.map(lambda a, k=k: a[k], params['params']['LayerNorm_0'])}
    support.assert_close(outputs[k], flax_ln.apply(branch, x[k]), rtol=support.f32_rtol(WIDTH))
    expected = jax.grad(lambda p, k=k: jnp.sum(flax_ln.apply(p, x[k]) * cotangent[k]))(branch)
    support.assert_close(grads['params']['LayerNorm_0']['scale'][k], expected['params']['scale'],
                         rtol=support.f32_rtol(6 * WIDTH, ops=2))


def test_backward_keeps_only_the_input_and_row_statistics():
  """Flax's form keeps two `[..., D]` arrays for its backward (`x - mean` and the product
  `rsqrt(var + eps) * scale`); this one keeps `x` and `[..., 1]` statistics."""
  x, params, _ = _inputs((5, 8, WIDTH))
  _, residuals = layer_norm._layer_norm_fwd(  # pylint: disable=protected-access
      x, params['params']['scale'], params['params']['bias'], LAYER_NORM_EPS)
  full_size = [r for r in residuals if r.shape == x.shape]
  assert len(full_size) == 1 and full_size[0] is x
  assert sorted(r.shape for r in residuals if r.shape != x.shape) == sorted(
      [(WIDTH,), (5, 8, 1), (5, 8, 1)])
