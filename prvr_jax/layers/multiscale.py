"""MS-SL's exhaustive multi-scale clips and key-clip guided attention (also ProtoPRVR's clips).

* `exhaustive_clips`: every average pool of length k = 1..L at stride 1 over L clip features
  (L (L + 1) / 2 proposals: 528 for 32 clips), as one matmul with a fixed averaging matrix.
  Proposal order is the official one (k, then the start s): index (k-1) (L+1) - (k-1) k / 2 + s.
* `KeyClipGuidedAttention`: attention over a video's frames whose query is a key clip (the
  proposal that best matches the text query), for each (query, video) pair.
"""

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from prvr_jax.layers.attention import dense_init

# `masked_fill(mask == 0, -1e9)` of the official key-clip guided attention.
KCGA_MASKED_LOGIT = -1e9


def num_proposals(num_clips: int) -> int:
  """L (L + 1) / 2 proposals of L clips."""
  return num_clips * (num_clips + 1) // 2


@functools.cache
def averaging_matrix(num_clips: int) -> np.ndarray:
  """`[P, L]` float32: row p averages the clips of proposal p (official order)."""
  rows = []
  for length in range(1, num_clips + 1):
    for start in range(num_clips - length + 1):
      row = np.zeros(num_clips, np.float32)
      row[start:start + length] = 1.0 / length
      rows.append(row)
  return np.stack(rows)


def proposal_span(index: int, num_clips: int) -> tuple[int, int]:
  """(first clip, one past the last clip) of proposal `index`."""
  for length in range(1, num_clips + 1):
    count = num_clips - length + 1
    if index < count:
      return index, index + length
    index -= count
  raise ValueError(f'proposal index out of range for {num_clips} clips')


def exhaustive_clips(clips: jax.Array) -> jax.Array:
  """`[B, L, D] -> [B, L (L + 1) / 2, D]`: all multi-scale average pools (official order)."""
  matrix = jnp.asarray(averaging_matrix(clips.shape[-2]), clips.dtype)
  return jnp.einsum('pl,bld->bpd', matrix, clips)


def key_clip_attention(keys: jax.Array, frames: jax.Array, frame_mask: jax.Array,
                       key_kernel: jax.Array, value_kernel: jax.Array) -> jax.Array:
  """`KeyClipGuidedAttention` as a pure function of its kernels (e.g. inside `lax.map`)."""
  logits = jnp.einsum('qbd,btd->qbt', jnp.einsum('qbe,de->qbd', keys, key_kernel), frames)
  logits = jnp.where(frame_mask[None] > 0, logits, KCGA_MASKED_LOGIT)
  weights = jax.nn.softmax(logits, axis=-1)
  return jnp.einsum('qbt,btd->qbd', weights, frames) @ value_kernel


class KeyClipGuidedAttention(nn.Module):
  """MS-SL's key-clip guided attention for query-video pairs.

  For key clip k and frames F: a = softmax_t((F W_k)_t . k) over real frames (no scaling),
  output sum_t a_t (F W_v)_t; W_k, W_v are bias-free `[D, D]` kernels (parameters `key`,
  `value`). The projections are folded onto the key and the pooled frames,
  (F W_k)_t . k = F_t . (W_k k) and sum_t a_t F_t W_v = (a F) W_v,
  so no projected copy of the frames is built for each pair.

  Attributes:
    width: D.
  """
  width: int

  def setup(self):
    self.key_kernel = self.param('key', dense_init, (self.width, self.width))
    self.value_kernel = self.param('value', dense_init, (self.width, self.width))

  def __call__(self, keys: jax.Array, frames: jax.Array, frame_mask: jax.Array) -> jax.Array:
    """keys `[Q, B, D]` (the key clip of each query for each video), frames `[B, L, D]`,
    frame_mask `[B, L]` -> attended frames `[Q, B, D]`."""
    return key_clip_attention(keys, frames, frame_mask, self.key_kernel, self.value_kernel)
