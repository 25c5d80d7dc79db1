"""`random_bits`: Threefry-2x32 written out, the same words as `jax.random.bits`, no loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import support
from prvr_jax.layers import random_bits
from prvr_jax.layers.attention import Dropout


@pytest.mark.parametrize('key,counters,expected', [
    # Random123's known answers for threefry2x32_20 (kat_vectors).
    ((0, 0), (0, 0), (0x6b200159, 0x99ba4efe)),
    ((0xffffffff, 0xffffffff), (0xffffffff, 0xffffffff), (0x1cb996fc, 0xbb002be7)),
    ((0x13198a2e, 0x03707344), (0x243f6a88, 0x85a308d3), (0xc4923a9c, 0x483df7a0)),
])
def test_threefry2x32_known_answers(key, counters, expected):
  words = random_bits.threefry2x32(tuple(jnp.uint32(k) for k in key),
                                   tuple(jnp.uint32(c) for c in counters))
  assert tuple(int(w) for w in words) == expected


@pytest.mark.parametrize('count', [0, 1, 2, 7, 1000, 65537])
@pytest.mark.parametrize('make_key', [jax.random.key, jax.random.PRNGKey],
                         ids=['typed key', 'raw key'])
def test_words_are_jax_random_bits(count, make_key):
  # JAX's own threefry lowering on CPUs is a while loop; the words here are computed without.
  words = jax.jit(random_bits.uint32_words, static_argnums=1)
  assert 'stablehlo.while' not in words.lower(make_key(0), count).as_text()
  for seed in (0, 123456789):
    key = make_key(seed)
    np.testing.assert_array_equal(words(key, count), jax.random.bits(key, (count,), jnp.uint32))


def test_words_under_vmap_match_each_key():
  keys = jax.random.split(jax.random.key(3), 4)
  batched = jax.vmap(lambda k: random_bits.uint32_words(k, 33))(keys)
  for key, words in zip(keys, batched):
    np.testing.assert_array_equal(words, jax.random.bits(key, (33,), jnp.uint32))


def test_other_key_implementations_and_layouts_fall_back_to_jax():
  key = jax.random.key(5, impl='rbg')
  np.testing.assert_array_equal(random_bits.uint32_words(key, 100),
                                jax.random.bits(key, (100,), jnp.uint32))
  with jax.threefry_partitionable(False):  # the other layout gives other words for a count > 1
    key = jax.random.key(5)
    np.testing.assert_array_equal(random_bits.uint32_words(key, 101),
                                  jax.random.bits(key, (101,), jnp.uint32))


def test_dropout_keeps_its_masks():
  """Dropout's masks are those of the words `jax.random.bits` draws (as before `random_bits`),
  two 16-bit halves per word, low half first."""
  x = jnp.arange(1.0, 7 * 9 + 1).reshape(1, 7, 9)  # odd size: half of the last word is unused
  key = jax.random.key(11)
  dropout = Dropout(0.3)
  apply = jax.jit(lambda x, key: dropout.apply({}, x, False, rngs={'dropout': key}))
  words = jax.random.bits(_dropout_key(key), ((x.size + 1) // 2,), jnp.uint32)
  halves = np.stack([np.asarray(words) & 0xffff, np.asarray(words) >> 16], -1).reshape(-1)
  keep = halves[:x.size].reshape(x.shape) >= round(0.3 * 65536)
  y = np.asarray(apply(x, key))
  np.testing.assert_array_equal(y != 0, keep)  # x has no zeros
  np.testing.assert_allclose(y[keep], np.asarray(x)[keep] / 0.7, rtol=1e-6)


def test_dropout_computes_its_rounds_once():
  """A mask read by the forward and the backward (and here a matmul's input) is computed once
  by XLA:CPU: the compiled gradient holds one threefry evaluation, 20 rotations, not one per
  fusion. (XLA:GPU computes the rounds inside each fusion that reads the mask, where they
  cost no memory traffic: 42 rotations on an H200.)"""
  dropout = Dropout(0.1)

  def loss(x, w, key):
    y = dropout.apply({}, jnp.tanh(x), False, rngs={'dropout': key})
    return (y @ w).sum()

  hlo = support.cpu_program(jax.grad(loss, argnums=(0, 1)), jnp.ones((64, 384)),
                            jnp.ones((384, 128)), jax.random.key(0))
  rotations = hlo.count(' shift-left(')
  assert 20 <= rotations < 40, rotations


def _dropout_key(key):
  """The key flax's `make_rng('dropout')` hands a top-level module applied with `key`."""
  return Dropout(0.3).apply({}, key, method=lambda module, _: module.make_rng('dropout'),
                            rngs={'dropout': key})
