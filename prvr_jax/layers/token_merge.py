"""Order-preserving token merging (MSC-PRVR's OP-ToMe): fewer, size-weighted tokens of a video.

Both functions work on one video (vmap them over a batch) with static shapes: `x [N, D]`
tokens, `sizes [N]` how many frames each token stands for, `labels [L]` the token each frame
belongs to; merging `N - target` pairs gives `target` tokens, their size-weighted means, the
sizes summed and the frame labels following their tokens.

* `merge_adjacent_pairs`: the pairs are the neighbours (2i, 2i+1); the `N - target` pairs of
  largest dot product merge (MSC-PRVR's data loader, 128 frames -> 80 -> 52 -> 32 clips).
* `merge_bipartite`: ToMe's bipartite matching, A = even and B = odd positions, cosine of a
  separate `metric`; pairs are taken greedily in descending cosine, each token at most once
  (MSC-PRVR's adaptive CBVA, 32 -> 20 -> 12 -> 8 -> 5). The merged token takes A's place, so
  the order is kept where B follows A.
"""

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from prvr_jax.ops import l2_normalize


def _merge(x: jax.Array, sizes: jax.Array, dest: jax.Array, merged: jax.Array,
           target: int) -> tuple[jax.Array, jax.Array]:
  """Tokens `x [N, D]` summed into `dest [N]` positions: merged ones (`merged [N]`) as
  `(x_a s_a + x_b s_b) / (s_a + s_b)`, the others unchanged (bit for bit); sizes summed."""
  weight = jnp.where(merged, sizes, 1.0)
  total = jax.ops.segment_sum(x * weight[:, None], dest, target)
  norm = jax.ops.segment_sum(weight, dest, target)
  return total / norm[:, None], jax.ops.segment_sum(sizes, dest, target)


def merge_adjacent_pairs(x: jax.Array, sizes: jax.Array, labels: jax.Array, target: int
                         ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """One round of neighbour merging: `x [N, D]` (N even), `sizes [N]`, `labels [L]` ->
  `[target, D]`, `[target]`, `[L]`; the `N - target` pairs (2i, 2i+1) of largest `x_2i . x_2i+1`
  merge (ties: the lower pair)."""
  num, num_pairs = x.shape[0], x.shape[0] // 2
  if num % 2 or not num_pairs <= target <= num:
    raise ValueError(f'cannot merge {num} tokens into {target} by neighbour pairs (need an even '
                     'count and count / 2 <= target <= count)')
  similarity = jnp.sum(x[0::2] * x[1::2], axis=-1)
  _, chosen = jax.lax.top_k(similarity, num - target)
  pair_merged = jnp.zeros(num_pairs, bool).at[chosen].set(True)
  width = jnp.where(pair_merged, 1, 2)
  start = jnp.cumsum(width) - width
  dest = jnp.stack([start, start + width - 1], axis=1).reshape(num)
  merged = jnp.repeat(pair_merged, 2)
  tokens, new_sizes = _merge(x, sizes, dest, merged, target)
  return tokens, new_sizes, dest[labels]


def merge_frames(frames: jax.Array, targets: Sequence[int]
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """`frames [L, D]` merged by neighbour pairs through `targets` (e.g. 80, 52, 32) -> tokens
  `[targets[-1], D]`, sizes, each frame's token `[L]` (int32)."""
  x = frames
  sizes = jnp.ones(frames.shape[0], frames.dtype)
  labels = jnp.arange(frames.shape[0], dtype=jnp.int32)
  for target in targets:
    x, sizes, labels = merge_adjacent_pairs(x, sizes, labels, target)
  return x, sizes, labels


def merge_bipartite(x: jax.Array, metric: jax.Array, sizes: jax.Array, labels: jax.Array,
                    target: int) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
  """One round of bipartite merging: `x [N, D]` and `metric [N, Dm]` (N even), `sizes [N]`,
  `labels [L]` -> `[target, D]`, `[target, Dm]` (the metric tokens merged alike), `[target]`,
  `[L]`. The `N - target` pairs (A = 2a, B = 2b + 1) are chosen greedily by the cosine of
  `metric`: the best pair left whose two tokens are both unused (ties: the lower a, then b)."""
  num, num_pairs = x.shape[0], x.shape[0] // 2
  if num % 2 or not num_pairs <= target <= num:
    raise ValueError(f'cannot merge {num} tokens into {target} by bipartite pairs (need an '
                     'even count and count / 2 <= target <= count)')
  unit = l2_normalize(metric)
  similarity = unit[0::2] @ unit[1::2].T  # [A, B]

  index = jnp.arange(num_pairs, dtype=jnp.int32)

  def pick(_, state):  # masks, not scatters: cheaper under vmap
    available, partner = state
    flat = jnp.argmax(available).astype(jnp.int32)
    a, b = flat // num_pairs, flat % num_pairs
    used = (index[:, None] == a) | (index[None, :] == b)
    return jnp.where(used, -jnp.inf, available), jnp.where(index == a, b, partner)

  _, partner = jax.lax.fori_loop(0, num - target, pick,
                                 (similarity, jnp.full(num_pairs, -1, jnp.int32)))
  a_merged = partner >= 0
  # owner[b]: the A index merged with B token b (num_pairs: none).
  owner = jnp.full(num_pairs + 1, num_pairs, jnp.int32).at[
      jnp.where(a_merged, partner, num_pairs)].set(jnp.arange(num_pairs, dtype=jnp.int32))
  owner = owner[:num_pairs]
  b_merged = owner < num_pairs
  keep = jnp.stack([jnp.ones(num_pairs, bool), ~b_merged], axis=1).reshape(num)
  position = jnp.cumsum(keep) - 1
  b_position = jnp.where(b_merged, position[2 * jnp.minimum(owner, num_pairs - 1)],
                         position[1::2])
  dest = jnp.stack([position[0::2], b_position], axis=1).reshape(num)
  merged = jnp.stack([a_merged, b_merged], axis=1).reshape(num)
  tokens, new_sizes = _merge(x, sizes, dest, merged, target)
  metric_tokens, _ = _merge(metric, sizes, dest, merged, target)
  return tokens, metric_tokens, new_sizes, dest[labels]


def resample_frames(frames: jax.Array, mask: jax.Array) -> jax.Array:
  """`frames [L, D]` whose first `n = sum(mask)` rows are real (n <= L) -> `[L, D]`: row k is
  frame `min(round(k n / L), n - 1)` (round half to even), the official
  `average_to_fixed_length(frames, L)` of a video of at most L frames (its segments then hold
  one frame or none)."""
  length = frames.shape[0]
  count = jnp.maximum(jnp.sum(mask), 1.0)
  edges = jnp.arange(length, dtype=jnp.float32) / length * count
  index = jnp.minimum(jnp.round(edges), count - 1).astype(jnp.int32)
  return frames[index]
