"""AMDNet's learnable span masks: K (center, width) spans per video and their soft masks.

A span (c, w) in [0, 1]^2 becomes a mask over the L clips with the Gaussian window formula of
the official code: positions `linspace(0, 1, L)`, `sigma = max(w, 0.01) / 9`,
`m_n = exp(-(pos_n - c)^2 / (2 sigma^2))` divided by the row maximum (the paper's Eq. 3 has
positions n / N, the Gaussian's 1 / (sigma sqrt(2 pi)) factor and no normalisation; see
docs/paper_vs_code.md). Masks can be used as per-head attention windows
(`AttentionBlockV1(..., window=masks[:, :, None, :])` with K heads) and as pooling weights.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from prvr_jax.layers.attention import dense, layer_norm

MIN_WIDTH = 0.01
WIDTH_TO_SIGMA = 1.0 / 9.0


def span_masks(centers: jax.Array, widths: jax.Array, length: int) -> jax.Array:
  """centers, widths `[..., K]` in [0, 1] -> masks `[..., K, length]`, each row peaking at 1.

  Computed as `exp(z - max z)`, the official `exp(z) / max exp(z)` without its underflow: a
  span narrower than `MIN_WIDTH` centred between two clip positions makes every `exp(z)` zero
  in float32, and the official mask 0 / 0 = NaN; this one is then 1 at the nearest clip.
  """
  positions = jnp.linspace(0.0, 1.0, length, dtype=jnp.float32)
  sigma = jnp.maximum(widths, MIN_WIDTH)[..., None] * WIDTH_TO_SIGMA
  logits = -jnp.square(positions - centers[..., None]) / (2.0 * jnp.square(sigma))
  return jnp.exp(logits - jnp.max(logits, axis=-1, keepdims=True))


class SpanPredictor(nn.Module):
  """Video summary -> K spans -> masks: `[B, L, D] -> (summary [B, D], spans [B, K, 2],
  masks [B, K, L])`.

  summary = Linear(LayerNorm(mean_t x_t)) (the official `clip2video`, parameters
  `summary_norm`, `summary`); (c, w) = sigmoid(Linear(summary)) per span (`span`, its 2K
  outputs ordered c_0, w_0, c_1, w_1, ...).

  Attributes:
    num_spans: K.
  """
  num_spans: int

  @nn.compact
  def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    batch, length, width = x.shape
    summary = dense(width, 'summary')(layer_norm('summary_norm')(jnp.mean(x, axis=1)))
    spans = jax.nn.sigmoid(dense(2 * self.num_spans, 'span')(summary))
    spans = spans.reshape(batch, self.num_spans, 2)
    return summary, spans, span_masks(spans[..., 0], spans[..., 1], length)
