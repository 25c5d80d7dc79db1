"""Random 32-bit words from a threefry key: `jax.random.bits`'s words, computed in one fused pass.

`uint32_words(key, count)` returns exactly `jax.random.bits(key, (count,), jnp.uint32)` for a
threefry key (JAX's default) with `jax_threefry_partitionable` (JAX's default): Threefry-2x32
with 20 rounds of the 64-bit counters 0..count-1, the two output words XORed. What differs is
the program. On CPU backends JAX lowers its threefry hash as a 5-iteration while loop, to keep
programs small; every iteration reads and writes whole arrays of words, and XLA cannot fuse a
loop into the ops that consume it. Written out here, the 20 rounds are elementwise integer
arithmetic on the counters that XLA fuses with the dropout mask that consumes the words, so
the words are never stored. Other key implementations (`rbg`, `unsafe_rbg`) and the
non-partitionable layout go to `jax.random.bits`.
"""

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
  is threefry's and JAX draws partitionable threefry bits."""
  key_words = _threefry_key_words(key)
  # JAX's default layout, and the one to assume should JAX drop the flag.
  partitionable = getattr(jax.config, 'jax_threefry_partitionable', True)
  if key_words is None or count >= 2**32 or not partitionable:
    return jax.random.bits(key, (count,), jnp.uint32)
  index = jax.lax.iota(jnp.uint32, count)
  high, low = threefry2x32(key_words, (jnp.zeros_like(index), index))
  return high ^ low
