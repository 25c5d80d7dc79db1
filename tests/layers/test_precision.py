"""Mixed precision of the dense layers (prvr_jax.layers.precision)."""

import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import support
from prvr_jax.layers import precision
from prvr_jax.layers.attention import AttentionBlockV2

BF16_EPS = 2.0 ** -8  # bfloat16 keeps 8 significant bits


def _operands(seed=0, shape=(3, 5, 64), features=48):
  rng = np.random.default_rng(seed)
  return (jnp.asarray(rng.normal(size=shape), jnp.float32),
          jnp.asarray(rng.normal(size=(shape[-1], features)) / 8, jnp.float32))


def _rounded(x):
  return np.asarray(x.astype(jnp.bfloat16).astype(jnp.float32), np.float64)


def test_bf16_matmul_is_the_exact_product_of_the_rounded_operands():
  x, kernel = _operands()
  expected = _rounded(x) @ _rounded(kernel)  # float64: the float32 accumulation's reference
  support.assert_close(precision.bf16_matmul(x, kernel), expected, rtol=support.f32_rtol(64))
  assert precision.bf16_matmul(x, kernel).dtype == jnp.float32


def test_bf16_matmul_gradients_are_products_of_rounded_operands():
  x, kernel = _operands(1)
  cotangent = jnp.asarray(np.random.default_rng(2).normal(size=(3, 5, 48)), jnp.float32)
  _, vjp = jax.vjp(precision.bf16_matmul, x, kernel)
  grad_x, grad_kernel = vjp(cotangent)
  assert grad_x.dtype == grad_kernel.dtype == jnp.float32
  g = _rounded(cotangent)
  support.assert_close(grad_x, g @ _rounded(kernel).T, rtol=support.f32_rtol(48))
  support.assert_close(grad_kernel, np.einsum('bld,blf->df', _rounded(x), g),
                       rtol=support.f32_rtol(15))


def test_bf16_matmul_runs_jitted_with_one_input_shared_by_stacked_kernels():
  # GMMBlock's pattern (nn.vmap over branch kernels, the input shared) with a 2-D input: XLA:CPU
  # once left the kernel gradient's transpose to a dot it cannot run in bfloat16.
  rng = np.random.default_rng(4)
  x = jnp.asarray(rng.normal(size=(64, 48)), jnp.float32)
  kernels = jnp.asarray(rng.normal(size=(3, 48, 32)) / 8, jnp.float32)
  cotangent = jnp.asarray(rng.normal(size=(3, 64, 32)), jnp.float32)
  branches = jax.vmap(precision.bf16_matmul, in_axes=(None, 0))
  grad_x, grad_kernels = jax.jit(lambda x, k: jax.vjp(branches, x, k)[1](cotangent))(x, kernels)
  g = _rounded(cotangent)
  support.assert_close(grad_x, np.einsum('kbf,kdf->bd', g, _rounded(kernels)),
                       rtol=support.f32_rtol(3 * 32))
  support.assert_close(grad_kernels, np.einsum('bd,kbf->kdf', _rounded(x), g),
                       rtol=support.f32_rtol(64))


def _dot_operand_types(hlo_text: str) -> list[tuple[str, ...]]:
  """The element types of every `dot`'s operands in a compiled HLO module's text."""
  types = dict(re.findall(r'%([\w.\-]+) = (\w+)\[', hlo_text))
  return [tuple(types[name] for name in re.findall(r'%([\w.\-]+)', operands))
          for operands in re.findall(r' dot\(([^)]*)\)', hlo_text)]


def _kernel_grad_operand_types(x, kernel, cotangent) -> list[tuple[str, ...]]:
  """The operand types of the kernel gradient's products as XLA:CPU compiles them."""
  kernel_grad = lambda x, k, g: jax.vjp(precision.bf16_matmul, x, k)[1](g)[1]
  return _dot_operand_types(support.cpu_program(kernel_grad, x, kernel, cotangent))


@pytest.mark.parametrize('rows', [64, 63])
def test_kernel_gradient_of_a_2d_input_is_a_bfloat16_product_on_cpus(rows):
  """A 2-D input's kernel gradient is a bfloat16 product wherever a 3-D input's is (XLA:CPU
  made it a float32 one unless its rows are split: `precision._kernel_grad_split_rows`; an odd
  count gets a zero row)."""
  rng = np.random.default_rng(5)
  kernel = jnp.asarray(rng.normal(size=(48, 32)) / 8, jnp.float32)
  x3 = jnp.asarray(rng.normal(size=(4, 16, 48)), jnp.float32)
  if _kernel_grad_operand_types(x3, kernel, jnp.ones((4, 16, 32))) != [('bf16', 'bf16')]:
    pytest.skip('this jaxlib runs no bfloat16 product for a 3-D input either')
  x = jnp.asarray(rng.normal(size=(rows, 48)), jnp.float32)
  cotangent = jnp.asarray(rng.normal(size=(rows, 32)), jnp.float32)
  assert _kernel_grad_operand_types(x, kernel, cotangent) == [('bf16', 'bf16')]
  _, vjp = jax.vjp(precision.bf16_matmul, x, kernel)
  support.assert_close(vjp(cotangent)[1], _rounded(x).T @ _rounded(cotangent),
                       rtol=support.f32_rtol(rows))


# Attention's two products, `[B, L, H, Dh]` queries/keys/values and `[B, H, Lq, Lk]` weights.
ATTENTION_EINSUMS = (('bqhd,bkhd->bhqk', (2, 16, 2, 8), (2, 12, 2, 8)),
                     ('bhqk,bkhd->bqhd', (2, 2, 16, 12), (2, 12, 2, 8)))


def test_bf16_einsum_and_its_gradients_are_products_of_rounded_operands():
  # Jitted: on CPUs one of the four gradient products, in the other operand order, is one XLA
  # cannot run in bfloat16 ('Unsupported element type for DotThunk').
  rng = np.random.default_rng(6)
  for spec, a_shape, b_shape in ATTENTION_EINSUMS:
    a, b = (jnp.asarray(rng.normal(size=shape), jnp.float32) for shape in (a_shape, b_shape))
    out, vjp = jax.vjp(jax.jit(lambda a, b, spec=spec: precision.bf16_einsum(spec, a, b)), a, b)
    cotangent = jnp.asarray(rng.normal(size=out.shape), jnp.float32)
    grad_a, grad_b = jax.jit(vjp)(cotangent)
    assert out.dtype == grad_a.dtype == grad_b.dtype == jnp.float32
    inputs, output = spec.split('->')
    a_term, b_term = inputs.split(',')
    g = _rounded(cotangent)
    support.assert_close(out, np.einsum(spec, _rounded(a), _rounded(b)),
                         rtol=support.f32_rtol(a_shape[-1]))
    support.assert_close(grad_a, np.einsum(f'{output},{b_term}->{a_term}', g, _rounded(b)),
                         rtol=support.f32_rtol(16))
    support.assert_close(grad_b, np.einsum(f'{output},{a_term}->{b_term}', g, _rounded(a)),
                         rtol=support.f32_rtol(16))


def test_bf16_einsum_names_a_spec_it_cannot_take():
  x = jnp.ones((2, 3), jnp.float32)
  for spec in ('ij,jk', 'ij,jk->i', 'ij,jk,kl->il', 'ii,ij->j', 'i...,ij->j'):
    with pytest.raises(ValueError, match=re.escape(repr(spec))):
      precision.bf16_einsum(spec, x, x)


def test_attention_scores_and_weighted_values_are_mixed_only_in_bfloat16():
  x, _ = _operands(7, shape=(2, 16, 64))
  block = AttentionBlockV2(num_heads=4)
  params = block.init(jax.random.key(0), x)
  def products(name):
    with precision.matmul_precision(name):
      jaxpr = jax.make_jaxpr(lambda p: block.apply(p, x))(params)
    return [(str(e.invars[0].aval.dtype), str(e.invars[1].aval.dtype))
            for e in support.all_equations(jaxpr) if e.primitive.name == 'dot_general'
            and e.invars[0].aval.ndim == 4]
  assert products('bfloat16') and set(products('bfloat16')) == {('bfloat16', 'bfloat16')}
  assert products('float32') and set(products('float32')) == {('float32', 'float32')}


def test_float32_dense_layers_are_untouched_and_bfloat16_ones_are_mixed():
  x, _ = _operands(3)
  block = AttentionBlockV2(num_heads=4)
  params = block.init(jax.random.key(0), x)
  plain = block.apply(params, x)
  with precision.matmul_precision('float32'):
    assert np.array_equal(block.apply(params, x), plain)
  with precision.matmul_precision('bfloat16'):
    mixed = block.apply(params, x)
    jaxpr = str(jax.make_jaxpr(lambda p: block.apply(p, x))(params))
  assert 'bf16' in jaxpr and 'bf16' not in str(jax.make_jaxpr(lambda p: block.apply(p, x))(params))
  # Close to float32 at bfloat16's precision: LayerNorm-ed outputs of O(1).
  support.assert_close(mixed, plain, rtol=8 * BF16_EPS, scale=1.0)
  assert not np.array_equal(mixed, plain)


def test_dense_dot_general_leaves_other_contractions_to_lax():
  x, kernel = _operands(4)
  dims = (((2,), (0,)), ((), ()))
  batch_dims = (((2,), (2,)), ((0,), (0,)))
  # Compared inside the context: it sets JAX's default matmul precision too, which GPUs obey
  # (bfloat16 passes) and CPUs ignore for float32 operands.
  with precision.matmul_precision('bfloat16'):
    exact = precision.dense_dot_general(x, kernel, dims, preferred_element_type=jnp.float32)
    batched = precision.dense_dot_general(x, x, batch_dims)
    assert np.array_equal(exact, jax.lax.dot_general(x, kernel, dims,
                                                     preferred_element_type=jnp.float32))
    assert np.array_equal(batched, jax.lax.dot_general(x, x, batch_dims))


def test_the_context_is_restored_after_an_error():
  x, kernel = _operands(5)
  try:
    with precision.matmul_precision('bfloat16'):
      raise RuntimeError('inside')
  except RuntimeError:
    pass
  assert np.array_equal(precision.matmul(x, kernel), x @ kernel)
  dense = nn.Dense(48, dot_general=precision.dense_dot_general)
  params = dense.init(jax.random.key(1), x)
  assert np.array_equal(dense.apply(params, x), nn.Dense(48).apply(params, x))
