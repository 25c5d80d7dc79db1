"""`kernels.dropout` against `flax.linen.Dropout`, the layer it stands in for under
`policy.fast_kernels()`: Threefry-2x32 written out (the same words as `jax.random.bits`, no
loop), the masks those words give, and the same rate, scaling and gradient as the plain layer."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import support
from prvr_jax.kernels import dropout as kernel
from prvr_jax.kernels.policy import fast_kernels


def _apply(module, *args, fast, **kwargs):
  """`module.apply({}, *args, **kwargs)`, with the kernel in place of `nn.Dropout` if `fast`."""
  with fast_kernels(fast):
    return module.apply({}, *args, **kwargs)


@pytest.mark.parametrize('key,counters,expected', [
    # Random123's known answers for threefry2x32_20 (kat_vectors).
    ((0, 0), (0, 0), (0x6b200159, 0x99ba4efe)),
    ((0xffffffff, 0xffffffff), (0xffffffff, 0xffffffff), (0x1cb996fc, 0xbb002be7)),
    ((0x13198a2e, 0x03707344), (0x243f6a88, 0x85a308d3), (0xc4923a9c, 0x483df7a0)),
])
def test_threefry2x32_known_answers(key, counters, expected):
  words = kernel.threefry2x32(tuple(jnp.uint32(k) for k in key),
                                   tuple(jnp.uint32(c) for c in counters))
  assert tuple(int(w) for w in words) == expected


@pytest.mark.parametrize('count', [0, 1, 2, 7, 1000, 65537])
@pytest.mark.parametrize('make_key', [jax.random.key, jax.random.PRNGKey],
                         ids=['typed key', 'raw key'])
def test_words_are_jax_random_bits(count, make_key):
  # JAX's own threefry lowering on CPUs is a while loop; the words here are computed without.
  words = jax.jit(kernel.uint32_words, static_argnums=1)
  assert 'stablehlo.while' not in words.lower(make_key(0), count).as_text()
  for seed in (0, 123456789):
    key = make_key(seed)
    np.testing.assert_array_equal(words(key, count), jax.random.bits(key, (count,), jnp.uint32))


def test_words_under_vmap_match_each_key():
  keys = jax.random.split(jax.random.key(3), 4)
  batched = jax.vmap(lambda k: kernel.uint32_words(k, 33))(keys)
  for key, words in zip(keys, batched):
    np.testing.assert_array_equal(words, jax.random.bits(key, (33,), jnp.uint32))


def test_other_key_implementations_and_layouts_fall_back_to_jax():
  key = jax.random.key(5, impl='rbg')
  np.testing.assert_array_equal(kernel.uint32_words(key, 100),
                                jax.random.bits(key, (100,), jnp.uint32))
  with jax.threefry_partitionable(False):  # the other layout gives other words for a count > 1
    key = jax.random.key(5)
    np.testing.assert_array_equal(kernel.uint32_words(key, 101),
                                  jax.random.bits(key, (101,), jnp.uint32))


def test_dropout_keeps_its_masks_and_their_gradient():
  """`nn.Dropout` under the kernel: its masks are those of the words `jax.random.bits` draws
  from the key of the plain layer's `make_rng`, two 16-bit halves per word, low half first;
  the gradient is the mask, scaled as the values are."""
  x = jnp.arange(1.0, 7 * 9 + 1).reshape(1, 7, 9)  # odd size: half of the last word is unused
  key = jax.random.key(11)
  dropout = nn.Dropout(0.3)
  apply = jax.jit(lambda x, key: _apply(dropout, x, False, rngs={'dropout': key}, fast=True))
  words = jax.random.bits(_dropout_key(key), ((x.size + 1) // 2,), jnp.uint32)
  halves = np.stack([np.asarray(words) & 0xffff, np.asarray(words) >> 16], -1).reshape(-1)
  keep = halves[:x.size].reshape(x.shape) >= round(0.3 * 65536)
  y = np.asarray(apply(x, key))
  np.testing.assert_array_equal(y != 0, keep)  # x has no zeros
  np.testing.assert_allclose(y[keep], np.asarray(x)[keep] / 0.7, rtol=1e-6)
  grad = jax.grad(lambda x: jnp.sum(apply(x, key) * x))(x)  # d/dx (m x / 0.7 * x)
  support.assert_close(grad, np.where(keep, 2 * np.asarray(x) / 0.7, 0.0),
                       rtol=support.f32_rtol(1, ops=2))


@pytest.mark.parametrize('fast', [False, True], ids=['nn.Dropout', 'kernel'])
def test_rate_scaling_and_independence_are_the_plain_layers(fast):
  """The kernel and the plain layer drop at the same rate, scale by the same factor, pass the
  input through when deterministic, and draw independent masks per key and per element."""
  x = jnp.ones((501, 401))
  dropout = nn.Dropout(0.2)
  y = np.asarray(_apply(dropout, x, False, rngs={'dropout': jax.random.key(0)}, fast=fast))
  assert set(np.unique(y)) == {0.0, 1.25}
  # Sampling bounds on counts of threefry bits (identical on every platform), not rounding.
  assert abs((y == 0).mean() - 0.2) < 0.005  # 200k draws: 5 standard deviations is 0.0045
  z = np.asarray(_apply(dropout, x, False, rngs={'dropout': jax.random.key(1)}, fast=fast))
  assert abs(((y == 0) & (z == 0)).mean() - 0.04) < 0.003  # independent masks per key
  assert abs(((y[:, :-1] == 0) & (y[:, 1:] == 0)).mean() - 0.04) < 0.003  # no pairing of halves
  np.testing.assert_array_equal(_apply(dropout, x, True, fast=fast), x)
  np.testing.assert_array_equal(_apply(nn.Dropout(0.0), x, False, fast=fast), x)
  np.testing.assert_array_equal(_apply(nn.Dropout(1.0), x, False, fast=fast), 0 * x)


def test_dropout_computes_its_rounds_once():
  """A mask read by the forward and the backward (and here a matmul's input) is computed once
  by XLA:CPU: the compiled gradient holds one threefry evaluation, 20 rotations, not one per
  fusion. (XLA:GPU computes the rounds inside each fusion that reads the mask, where they
  cost no memory traffic: 42 rotations on an H200.)"""
  dropout = nn.Dropout(0.1)

  def loss(x, w, key):
    y = _apply(dropout, jnp.tanh(x), False, rngs={'dropout': key}, fast=True)
    return (y @ w).sum()

  hlo = support.cpu_program(jax.grad(loss, argnums=(0, 1)), jnp.ones((64, 384)),
                            jnp.ones((384, 128)), jax.random.key(0))
  rotations = hlo.count(' shift-left(')
  assert 20 <= rotations < 40, rotations


def test_broadcast_masks_stay_with_the_plain_layer():
  """A mask shared along `broadcast_dims` is not the kernel's: the plain layer draws it."""
  x, key = jnp.ones((8, 6)), jax.random.key(2)
  dropout = nn.Dropout(0.5, broadcast_dims=(0,))
  np.testing.assert_array_equal(
      _apply(dropout, x, False, rngs={'dropout': key}, fast=True),
      _apply(dropout, x, False, rngs={'dropout': key}, fast=False))


def _dropout_key(key):
  """The key flax's `make_rng('dropout')` hands a top-level module applied with `key`."""
  return nn.Dropout(0.3).apply({}, key, method=lambda module, _: module.make_rng('dropout'),
                               rngs={'dropout': key})
