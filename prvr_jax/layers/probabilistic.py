"""RAL's probabilistic embeddings and confidence-weighted word-frame scores (EMNLP 2025 Findings).

A video (its frames) and the query support set of a video (the tokens of all its queries) each
become a diagonal Gaussian `N(mu, diag(exp(logsigma))^2)`:

* `mu = l2_normalize(LayerNorm(pooled + sigmoid(fc(attn_pool(x)))))` (`GaussianMeanHead`, the
  official `PIENet` with one embedding),
* `logsigma = fc(attn_pool(x)) + fc2(pooled)` (`LogSigmaHead`, the official
  `UncertaintyModuleImage`, used for both modalities),
* `K` samples `mu + eps * exp(logsigma)`, `eps ~ N(0, I)` (`gaussian_samples`): the "proxies".

`pooled` is a normalized masked mean of the frames (`normalized_mean_pool`) or the masked mean
of the support set's tokens (`support_set` + `masked_mean_pool`). The attention pools see every
position: the official code passes no mask (padded frames are zero vectors; they still take
softmax weight), which is the default here; `mask` restricts them to real positions.

`ConfidenceWeightedScores` is RAL's frame-branch score: per query word the best frame
similarity, summed with softmax word weights from a two-layer confidence predictor.

Parameter names map 1:1 to the official ones; see docs/ral.md.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp

from prvr_jax import ops
from prvr_jax.layers.attention import dense, layer_norm

# Logit of an excluded position in the attention pools and word weights: exp() of it is 0 as
# for the official -inf, but a fully excluded row stays finite.
EXCLUDED_LOGIT = -1e30


def gaussian_samples(mean: jax.Array, logsigma: jax.Array, eps: jax.Array) -> jax.Array:
  """`mean[:, None] + eps * exp(logsigma)[:, None]`: `[B, D], [B, D], [B, K, D] -> [B, K, D]`.

  `exp(logsigma)` is the standard deviation (the official `sample_gaussian_tensors`).
  """
  return mean[:, None, :] + eps * jnp.exp(logsigma)[:, None, :]


def normalized_mean_pool(frames: jax.Array, mask: jax.Array) -> jax.Array:
  """`l2_normalize(mean_t l2_normalize(frames[:, t]))` over real frames: `[B, L, D] -> [B, D]`.

  A video with no real frame pools to 0 (the official count clamp to 1).
  """
  weights = mask.astype(frames.dtype)[..., None]
  total = jnp.sum(ops.l2_normalize(frames) * weights, axis=1)
  count = jnp.sum(weights, axis=1)
  return ops.l2_normalize(total / jnp.where(count == 0, 1.0, count))


def masked_mean_pool(tokens: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean of the real tokens: `[B, L, D], [B, L] -> [B, D]`; 0 for a row with none (the
  official code divides by the count unclamped)."""
  weights = mask.astype(tokens.dtype)[..., None]
  count = jnp.sum(weights, axis=1)
  return jnp.sum(tokens * weights, axis=1) / jnp.maximum(count, 1.0)


def support_set(tokens: jax.Array, token_mask: jax.Array, query_video: jax.Array,
                query_valid: jax.Array, num_videos: int, max_queries: int
                ) -> tuple[jax.Array, jax.Array]:
  """Each video's query support set: the token matrices of its queries, concatenated.

  Args:
    tokens: `[Q, L, D]` encoded query tokens.
    token_mask: `[Q, L]`, 1 on real tokens.
    query_video: `[Q]` the video of each query.
    query_valid: `[Q]` False on padding queries (left out).
    num_videos: B.
    max_queries: slots per video (the official code's 26).

  Returns:
    `[B, max_queries * L, D]` tokens and `[B, max_queries * L]` mask: the r-th query of video b
    (in query order) fills rows `r * L .. r * L + L - 1` of row b; unused slots are 0. Row b is
    video b (the official row order, the order of the videos' first queries, is the same when
    queries come grouped by video in video order, as the official loader gives them). A query
    past `max_queries` of its video is dropped (the official code raises).
  """
  num_queries, length = token_mask.shape
  valid = query_valid.astype(bool)
  same = (query_video[:, None] == query_video[None, :]) & valid[None, :]
  earlier = jnp.tril(jnp.ones((num_queries, num_queries), bool), k=-1)
  rank = jnp.sum(same & earlier, axis=1)
  keep = valid & (rank < max_queries)
  video = jnp.where(keep, query_video, num_videos)  # out of range: dropped by the scatter
  rows = rank[:, None] * length + jnp.arange(length)[None, :]
  out = jnp.zeros((num_videos, max_queries * length, tokens.shape[-1]), tokens.dtype)
  out = out.at[video[:, None], rows].set(tokens, mode='drop')
  out_mask = jnp.zeros((num_videos, max_queries * length), token_mask.dtype)
  out_mask = out_mask.at[video[:, None], rows].set(token_mask, mode='drop')
  return out, out_mask


class SelfAttentionPool(nn.Module):
  """`softmax_L(w_2 tanh(w_1 x))`-weighted sum of x: `[B, L, D] -> [B, D]` (one head), with the
  `[B, L, heads]` weights (the official `MultiHeadSelfAttention`)."""
  hidden: int
  num_heads: int = 1

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array | None = None
               ) -> tuple[jax.Array, jax.Array]:
    logits = dense(self.num_heads, 'w_2', use_bias=False)(
        jnp.tanh(dense(self.hidden, 'w_1', use_bias=False)(x)))
    if mask is not None:
      logits = jnp.where(mask.astype(bool)[..., None], logits, EXCLUDED_LOGIT)
    weights = jax.nn.softmax(logits, axis=1)
    out = jnp.einsum('blh,bld->bhd', weights, x)
    if self.num_heads == 1:
      out = out[:, 0]
    return out, weights


class GaussianMeanHead(nn.Module):
  """The mean branch before normalization: `LayerNorm(pooled + sigmoid(fc(attn_pool(x))))`:
  `[B, D], [B, L, D] -> [B, features]` (the official `PIENet` with one embedding)."""
  features: int
  hidden: int
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, pooled: jax.Array, x: jax.Array, mask: jax.Array | None = None,
               deterministic: bool = True) -> jax.Array:
    attended, _ = SelfAttentionPool(self.hidden, name='attention')(x, mask)
    residual = jax.nn.sigmoid(dense(self.features, 'fc')(attended))
    residual = nn.Dropout(self.dropout_rate)(residual, deterministic=deterministic)
    return layer_norm('layer_norm')(pooled + residual)


class LogSigmaHead(nn.Module):
  """`logsigma = fc(attn_pool(x)) + fc2(pooled)`: `[B, D], [B, L, D] -> [B, features]` (the
  official `UncertaintyModuleImage`)."""
  features: int
  hidden: int

  @nn.compact
  def __call__(self, pooled: jax.Array, x: jax.Array, mask: jax.Array | None = None
               ) -> jax.Array:
    attended, _ = SelfAttentionPool(self.hidden, name='attention')(x, mask)
    return dense(self.features, 'fc')(attended) + dense(self.features, 'fc2')(pooled)


class ProbabilisticEmbedding(nn.Module):
  """One modality's Gaussian: `mean [B, D]` (unit norm), `logsigma [B, D]`, `samples [B, K, D]`.

  `eps` `[B, K, D]` is the standard normal noise of the samples; without it, it is drawn from
  the 'sample' rng stream. `hidden` defaults to `features // 2` (the official `d_h`).
  """
  features: int
  num_samples: int = 6
  hidden: int | None = None
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, pooled: jax.Array, x: jax.Array, mask: jax.Array | None = None,
               eps: jax.Array | None = None, deterministic: bool = True
               ) -> dict[str, jax.Array]:
    hidden = self.hidden or self.features // 2
    mean = GaussianMeanHead(self.features, hidden, self.dropout_rate, name='pie_net')(
        pooled, x, mask, deterministic)
    logsigma = LogSigmaHead(self.features, hidden, name='uncertain_net')(pooled, x, mask)
    mean = ops.l2_normalize(mean)
    if eps is None:
      eps = jax.random.normal(self.make_rng('sample'),
                              (mean.shape[0], self.num_samples, mean.shape[-1]), mean.dtype)
    return {'mean': mean, 'logsigma': logsigma,
            'samples': gaussian_samples(mean, logsigma, eps)}


class ConfidenceWeightedScores(nn.Module):
  """Confidence-aware set-to-set scores `[Q, B]` of query tokens against video frames.

  `s[q, b] = sum_t w[q, t] * max_v (m_q[t] m_b[v] <t_qt, f_bv>)`, `w[q] = softmax_t(fc_2(relu(
  fc_0(t_qt))))` over real words. Masked word-frame products are 0 before the max (the official
  product with the masks), so a query whose best real similarity is negative gets 0 from a
  padded frame. `normalize=True` scores unit-norm tokens and frames (the official
  `get_frame_scale_scores`), and the confidence predictor then sees the normalized tokens too.
  """
  normalize: bool = True

  @nn.compact
  def __call__(self, tokens: jax.Array, token_mask: jax.Array, frames: jax.Array,
               frame_mask: jax.Array) -> jax.Array:
    if self.normalize:
      tokens, frames = ops.l2_normalize(tokens), ops.l2_normalize(frames)
    features = tokens.shape[-1]
    logits = dense(1, 'fc_2')(nn.relu(dense(features, 'fc_0')(tokens)))[..., 0]
    logits = jnp.where(token_mask.astype(bool), logits, EXCLUDED_LOGIT)
    weights = jax.nn.softmax(logits, axis=-1)
    sims = jnp.einsum('qtd,bvd->qbtv', tokens, frames)
    sims = sims * token_mask[:, None, :, None] * frame_mask[None, :, None, :]
    return jnp.einsum('qbt,qt->qb', jnp.max(sims, axis=-1), weights)
