"""MS-SL's exhaustive multi-scale clips and key-clip guided attention (also ProtoPRVR's clips).

* `exhaustive_clips`: every average pool of length k = 1..L at stride 1 over L clip features
  (L (L + 1) / 2 proposals: 528 for 32 clips), as one matmul with a fixed averaging matrix.
  Proposal order is the official one (k, then the start s): index (k-1) (L+1) - (k-1) k / 2 + s.
* `KeyClipGuidedAttention`: attention over a video's frames whose query is a key clip (the
  proposal that best matches the text query), for each (query, video) pair; for a gallery from
  tables made once per video (`KeyClipGuidedAttention.tables`, `key_clip_attention`).
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


def _frame_weights(logits: jax.Array, frame_mask: jax.Array) -> jax.Array:
  """KCGA's attention: the softmax of `logits [..., Lf]` over the real frames."""
  return jax.nn.softmax(jnp.where(frame_mask > 0, logits, KCGA_MASKED_LOGIT), axis=-1)


def key_clip_attention(key_weights: jax.Array, logits: jax.Array, values: jax.Array,
                       frame_mask: jax.Array) -> jax.Array:
  """KCGA of C keys per video from the video's tables (`KeyClipGuidedAttention.tables`).

  Args:
    key_weights: `[C, B, Lc]`, each key as a mix of its video's clips (a multi-scale clip's
      row of `averaging_matrix`).
    logits: `[B, Lc, Lf]`, each clip as the key against the frames.
    values: `[B, Lf, D]`, the frames' values.
    frame_mask: `[B, Lf]`, 1 for real frames.

  Returns:
    `[C, B, D]`: sum_t a_t values_t, a = the softmax over the real frames of the key's logits
    (linear in the key: the same mix of its clips' rows).
  """
  pair_logits = jnp.einsum('cbl,blt->cbt', key_weights, logits)
  return jnp.einsum('cbt,btd->cbd', _frame_weights(pair_logits, frame_mask[None]), values)


class KeyClipGuidedAttention(nn.Module):
  """MS-SL's key-clip guided attention (KCGA).

  For key k and frames F: a = softmax_t((F W_k)_t . k) over real frames (no scaling),
  output sum_t a_t (F W_v)_t; W_k, W_v are bias-free `[D, D]` kernels (parameters `key`,
  `value`). Two forms of the same function, neither projecting the frames for each pair:

  * `__call__`, one key per video (training): W_k folded onto the key and W_v applied after
    the pooling, (F W_k)_t . k = F_t . (W_k k) and sum_t a_t F_t W_v = (a F) W_v.
  * `tables`, a video scored against many keys (evaluation, the index): every key is a
    multi-scale clip, an average of the video's clips, and the logits are linear in it, so a
    video needs only its clips' logits and its values F W_v, once; `key_clip_attention`
    attends from them for each pair.

  Attributes:
    width: D.
  """
  width: int

  def setup(self):
    self.key_kernel = self.param('key', dense_init, (self.width, self.width))
    self.value_kernel = self.param('value', dense_init, (self.width, self.width))

  def __call__(self, keys: jax.Array, frames: jax.Array, frame_mask: jax.Array) -> jax.Array:
    """keys `[B, D]` (one per video), frames `[B, Lf, D]`, frame_mask `[B, Lf]` -> `[B, D]`."""
    logits = jnp.einsum('btd,bd->bt', frames, keys @ self.key_kernel.T)
    weights = _frame_weights(logits, frame_mask)
    return jnp.einsum('bt,btd->bd', weights, frames) @ self.value_kernel

  def tables(self, clips: jax.Array, frames: jax.Array) -> tuple[jax.Array, jax.Array]:
    """clips `[B, Lc, D]`, frames `[B, Lf, D]` -> (logits `[B, Lc, Lf]`, values `[B, Lf, D]`)."""
    logits = jnp.einsum('bcd,btd->bct', clips @ self.key_kernel.T, frames)
    return logits, frames @ self.value_kernel
