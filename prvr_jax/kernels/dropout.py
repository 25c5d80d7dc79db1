"""Dropout's CPU kernel: 16 random bits per element, drawn in one fused pass.

Reference: `flax.linen.Dropout` (one 32-bit word per element, from `jax.random.bernoulli`), which
the layers use. `dropout` keeps the same elements in distribution (probability `1 - rate`,
rounded to a multiple of 2^-16) and scales them the same way (`1 / (1 - rate)`), from another
stream of bits:

* Each 32-bit word gives two elements their 16 bits, which halves the words drawn; random-bit
  generation dominates dropout on CPUs.
* The words are those of `jax.random.bits`, computed by `uint32_words` without JAX's CPU loop:
  on CPU backends JAX lowers its threefry hash as a 5-iteration while loop, to keep programs
  small, and every iteration reads and writes whole arrays of words that XLA cannot fuse into
  their consumers. Written out here, the 20 rounds are elementwise integer arithmetic on the
  counters that XLA fuses with the mask, so the words are never stored.
* The mask is packed into 32-bit words by a reduction (`_keep_mask`), so that the rounds are
  computed once and not again in every fusion that reads the mask.

`apply` is `nn.Dropout.__call__` with this mask; `prvr_jax.kernels.policy` puts it in place of
the plain one.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

# Threefry-2x32's rotation constants (Salmon et al. 2011, "Parallel random numbers: as easy as
# 1, 2, 3"), four rounds each, alternating between the two sets; and its key-schedule parity.
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_KEY_PARITY = np.uint32(0x1BD11BDA)


def _rotate_left(x: jax.Array, distance: int) -> jax.Array:
  return (x << np.uint32(distance)) | (x >> np.uint32(32 - distance))


def threefry2x32(key: tuple[jax.Array, jax.Array], counters: tuple[jax.Array, jax.Array]
                 ) -> tuple[jax.Array, jax.Array]:
  """Threefry-2x32 (20 rounds) of the counter pairs `counters` under the key pair `key`, all
  uint32 arrays that broadcast together -> the two output words, each of the broadcast shape."""
  schedule = (key[0], key[1], key[0] ^ key[1] ^ _KEY_PARITY)
  x0, x1 = counters[0] + schedule[0], counters[1] + schedule[1]
  for block in range(5):
    for distance in _ROTATIONS[block % 2]:
      x0 = x0 + x1
      x1 = x0 ^ _rotate_left(x1, distance)
    x0 = x0 + schedule[(block + 1) % 3]
    x1 = x1 + schedule[(block + 2) % 3] + np.uint32(block + 1)
  return x0, x1


def _threefry_key_words(key: jax.Array) -> tuple[jax.Array, jax.Array] | None:
  """The two uint32 words of a threefry key, typed (`jax.random.key`) or raw
  (`jax.random.PRNGKey`); None for a key of another implementation."""
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    impl, data = str(jax.random.key_impl(key)), jax.random.key_data(key)
  else:
    impl, data = getattr(jax.config, 'jax_default_prng_impl', 'threefry2x32'), key
  return (data[0], data[1]) if impl == 'threefry2x32' else None


def uint32_words(key: jax.Array, count: int) -> jax.Array:
  """`jax.random.bits(key, (count,), jnp.uint32)` -> `[count]` uint32, unrolled where the key
  is threefry's (JAX's default) and JAX draws partitionable threefry bits (JAX's default):
  Threefry-2x32 of the 64-bit counters 0..count-1, the two output words XORed. Other key
  implementations (`rbg`, `unsafe_rbg`) and the other layout go to `jax.random.bits`."""
  key_words = _threefry_key_words(key)
  # JAX's default layout, and the one to assume should JAX drop the flag.
  partitionable = getattr(jax.config, 'jax_threefry_partitionable', True)
  if key_words is None or count >= 2**32 or not partitionable:
    return jax.random.bits(key, (count,), jnp.uint32)
  index = jax.lax.iota(jnp.uint32, count)
  high, low = threefry2x32(key_words, (jnp.zeros_like(index), index))
  return high ^ low


def _keep_mask(words: jax.Array, threshold: int) -> jax.Array:
  """`[16, W]` uint32 random words -> `[32 W]` bool: element `2k + h` kept where half `h` (low
  half first) of the `k`-th word (row-major) is at least `threshold`.

  XLA fuses a cheap elementwise producer into every consumer, so a mask built from random words
  would have its 20 threefry rounds recomputed in each fusion that reads it: dropout's forward,
  its backward, and each consumer of the dropped activations. XLA:CPU drops optimisation
  barriers, but it does not duplicate a reduction: the mask is packed into 32-bit words by one,
  over the leading axis so that each word is hashed once for both its halves, and every
  consumer reads 1 stored bit per element instead.
  """
  lanes = 2 * jax.lax.iota(jnp.uint32, 16)[:, None]
  low_kept = ((words & 0xFFFF) >= threshold).astype(jnp.uint32)
  high_kept = ((words >> 16) >= threshold).astype(jnp.uint32)
  packed = jnp.sum((low_kept << lanes) | (high_kept << (lanes + 1)), axis=0, dtype=jnp.uint32)
  shifts = lanes[:, :, None] + jax.lax.iota(jnp.uint32, 2)
  return ((packed[:, None] >> shifts) & 1).astype(bool).reshape(-1)


def dropout(x: jax.Array, rate: float, key: jax.Array) -> jax.Array:
  """Inverted dropout of `x` (any shape) at `0 < rate < 1` with the random words of `key`:
  element `i` (row-major) is kept where the `i % 2`-th 16-bit half (low half first) of word
  `i // 2` of `jax.random.bits(key)` is at least `round(rate * 2^16)`."""
  packed_words = -(-x.size // 32)
  words = uint32_words(key, 16 * packed_words)
  keep = _keep_mask(words.reshape(16, packed_words), round(rate * 65536))
  keep = keep[:x.size].reshape(x.shape)
  return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


def supports(module: nn.Dropout) -> bool:
  """Whether `apply` can stand in for `module`: no axes with a shared mask."""
  return not module.broadcast_dims


def apply(module: nn.Dropout, inputs: jax.Array, deterministic: bool | None = None,
          rng: jax.Array | None = None) -> jax.Array:
  """`module(inputs, deterministic, rng)` (`nn.Dropout.__call__`, same key from the same
  `make_rng`), with `dropout`'s mask."""
  deterministic = nn.merge_param('deterministic', module.deterministic, deterministic)
  if module.rate == 0.0 or deterministic:
    return inputs
  if module.rate == 1.0:
    return jnp.zeros_like(inputs)
  if rng is None:
    rng = module.make_rng(module.rng_collection)
  return dropout(inputs, module.rate, rng)
