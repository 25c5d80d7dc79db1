"""X-Pool's text-conditioned frame pooling (Gorti et al., CVPR 2022), as T-MASS codes it.

  a   = LN2(out_proj(Attention(q = q_proj(LN1(t)), k = k_proj(LN1(f)), v = v_proj(LN1(f)))))
  out = LN3(a + Dropout(linear_proj(a)))

One LayerNorm (LN1) is shared by the text and the frames; the softmax runs over a video's
frames; every projection starts as the identity with a zero bias. Every video is pooled once
per query: `[Q, D]` texts and `[B, F, D]` frames give `[Q, B, D]`.

Two projections are folded where that takes fewer multiply-adds (`attention.folding_is_cheaper`
decides, counting the heads), computing the same function: k_proj into the texts (`q W_k^T`
per head, `Q D^2`, instead of projecting all `B F` frames) and, with more texts than frames per
video, out_proj into the frames' values before the pooling (`B F D^2` instead of `Q B D^2`
for every pooled pair).
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from prvr_jax.layers import precision
from prvr_jax.layers.attention import LAYER_NORM_EPS, Projection, folding_is_cheaper
from prvr_jax.layers.common import identity_kernel
from prvr_jax.layers.precision import dense_dot_general


def _identity_dense(features: int, name: str) -> nn.Dense:
  return nn.Dense(features, kernel_init=identity_kernel, dot_general=dense_dot_general,
                  name=name)


class TextConditionedPooling(nn.Module):
  """texts `[Q, D]`, frames `[B, F, D]` -> each video pooled by each text `[Q, B, D]`.

  `frame_mask` `[B, F]` (1 = real frame) keeps padded frames out of the softmax.
  """
  features: int
  num_heads: int = 1
  dropout: float = 0.3

  @nn.compact
  def __call__(self, texts: jax.Array, frames: jax.Array, frame_mask: jax.Array | None = None,
               deterministic: bool = True) -> jax.Array:
    d, h = self.features, self.num_heads
    if d % h:
      raise ValueError(f'TextConditionedPooling: features={d} is not a multiple of '
                       f'num_heads={h}')
    shared_norm = nn.LayerNorm(epsilon=LAYER_NORM_EPS, name='layer_norm1')
    texts, frames = shared_norm(texts), shared_norm(frames)
    num_texts, (num_videos, num_frames) = texts.shape[0], frames.shape[:2]
    q = _identity_dense(d, 'q_proj')(texts).reshape(num_texts, h, d // h)
    key_proj = Projection(d, d, kernel_init=identity_kernel, name='k_proj')
    if folding_is_cheaper(num_texts, num_videos * num_frames, d, h):
      # q . (f W_k + b_k) = (q W_k^T) . f + q . b_k: W_k applied to the texts, not every frame.
      q_keys = precision.einsum('qhc,ehc->qhe', q, key_proj.kernel.reshape(d, h, d // h))
      logits = (jnp.einsum('qhe,bfe->qbhf', q_keys, frames)
                + jnp.einsum('qhc,hc->qh', q, key_proj.bias.reshape(h, d // h))[:, None, :, None])
    else:
      k = key_proj(frames).reshape(num_videos, num_frames, h, d // h)
      logits = jnp.einsum('qhc,bfhc->qbhf', q, k)
    logits = logits / math.sqrt(d // h)
    v = _identity_dense(d, 'v_proj')(frames).reshape(num_videos, num_frames, h, d // h)
    if frame_mask is not None:
      logits = jnp.where(frame_mask[None, :, None, :] > 0, logits, jnp.finfo(logits.dtype).min)
    weights = jax.nn.softmax(logits, axis=-1)
    out_proj = Projection(d, d, kernel_init=identity_kernel, name='out_proj')
    if folding_is_cheaper(num_frames, num_texts, d, h):
      # The weights sum to 1 over the frames: out_proj(sum_f w_f v_f) = sum_f w_f out_proj(v_f),
      # with out_proj applied per frame (and head) instead of per (text, video) pair.
      projected = precision.einsum('bfhc,hcd->bfhd', v, out_proj.kernel.reshape(h, d // h, d))
      # One product per video, `[B, Q, D]`, then turned to `[Q, B, D]`: asked for `[Q, B, D]`
      # directly, XLA:CPU computes `[B, D, Q]` and transposes it inside each of its consumers,
      # which made T-MASS's step slower.
      attended = jnp.swapaxes(jnp.einsum('bqhf,bfhd->bqd', jnp.swapaxes(weights, 0, 1),
                                         projected), 0, 1) + out_proj.bias
    else:
      attended = out_proj(jnp.einsum('qbhf,bfhc->qbhc', weights, v).reshape(
          num_texts, num_videos, d))
    attended = nn.LayerNorm(epsilon=LAYER_NORM_EPS, name='layer_norm2')(attended)
    residual = _identity_dense(d, 'linear_proj')(attended)
    residual = nn.Dropout(self.dropout)(residual, deterministic)
    return nn.LayerNorm(epsilon=LAYER_NORM_EPS, name='layer_norm3')(attended + residual)
