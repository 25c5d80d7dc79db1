"""RAL's loss terms: proxy matching (L_PM) and distribution alignment (L_DA).

Both act on the per-video Gaussians of `prvr_jax.layers.probabilistic`: video b's frames and
video b's query support set, `K` samples ("proxies") each. The official objective adds
`PROXY_MATCHING_WEIGHT * L_PM + DISTRIBUTION_ALIGNMENT_WEIGHT * L_DA` to GMMFormer v2's terms
(the same weights for every dataset). Formulas as the official code computes them: docs/ral.md.
"""

import jax
import jax.numpy as jnp

from prvr_jax.losses.masking import upcast

# The official loss.py's fixed factors (tvr and activitynet alike; not in its configs).
PROXY_MATCHING_WEIGHT = 4e-3
DISTRIBUTION_ALIGNMENT_WEIGHT = 2.5e-4
# Logit of a padding video's samples: exp() of it is 0, and everything stays finite.
EXCLUDED_LOGIT = -1e30


def _multi_positive_nce(anchors: jax.Array, candidates: jax.Array, valid: jax.Array
                        ) -> jax.Array:
  """Mean over valid anchor samples of `-mean_j log softmax(<a, c>)[own video's sample j]`."""
  num_videos, num_anchor, _ = anchors.shape
  num_candidate = candidates.shape[1]
  logits = upcast(jnp.einsum('akd,bjd->akbj', anchors, candidates))
  logits = logits.reshape(num_videos, num_anchor, num_videos * num_candidate)
  column_valid = jnp.repeat(valid, num_candidate)
  logits = jnp.where(column_valid[None, None, :], logits, EXCLUDED_LOGIT)
  log_probs = jax.nn.log_softmax(logits, axis=-1).reshape(
      num_videos, num_anchor, num_videos, num_candidate)
  own = jnp.diagonal(log_probs, axis1=0, axis2=2)          # [K_a, K_c, B]
  per_anchor = -jnp.mean(own, axis=1)                       # [K_a, B]
  weights = jnp.broadcast_to(valid[None, :], per_anchor.shape).astype(per_anchor.dtype)
  return jnp.sum(jnp.where(weights > 0, per_anchor, 0.0)) / jnp.maximum(jnp.sum(weights), 1.0)


def proxy_matching_loss(video_samples: jax.Array, text_samples: jax.Array,
                        valid: jax.Array | None = None) -> jax.Array:
  """L_PM: the mean of the video->text and text->video multi-positive InfoNCE of the samples.

  Each video sample's logits are raw dot products with all `B * K_t` text samples; its
  positives are the `K_t` samples of its own video's support set (the official
  `MILNCELoss_BoF`: `-mean(log_softmax * positive_mask)`, averaged over rows); likewise from
  the text side. No temperature.

  Args:
    video_samples: `[B, K_v, D]`.
    text_samples: `[B, K_t, D]`, row b the support set of video b.
    valid: `[B]` False on padding videos (left out as anchors and candidates).
  """
  if valid is None:
    valid = jnp.ones(video_samples.shape[0], bool)
  valid = valid.astype(bool)
  from_video = _multi_positive_nce(video_samples, text_samples, valid)
  from_text = _multi_positive_nce(text_samples, video_samples, valid)
  return 0.5 * (from_video + from_text)


def kl_to_standard_normal(mu: jax.Array, logsigma: jax.Array) -> jax.Array:
  """Elementwise `-0.5 * (1 + logsigma - mu^2 - exp(logsigma))` (the official form: the VAE KL
  with `logsigma` read as a log variance; 0 at mu = 0, logsigma = 0; >= 0)."""
  mu, logsigma = upcast(mu), upcast(logsigma)
  return -0.5 * (1.0 + logsigma - mu * mu - jnp.exp(logsigma))


def cross_modal_kl(video_mu: jax.Array, video_logsigma: jax.Array, text_mu: jax.Array,
                   text_logsigma: jax.Array) -> jax.Array:
  """Elementwise `KL(N(mu_t, s_t^2) || N(mu_v, s_v^2))` with `s = exp(logsigma)`:
  `logsigma_v - logsigma_t + (s_t^2 + (mu_t - mu_v)^2) / (2 s_v^2) - 1/2` (the official
  `KL_loss_1`: it names `exp(logsigma)` var and squares it)."""
  video_mu, video_logsigma = upcast(video_mu), upcast(video_logsigma)
  text_mu, text_logsigma = upcast(text_mu), upcast(text_logsigma)
  text_var = jnp.exp(2.0 * text_logsigma)
  return (video_logsigma - text_logsigma
          + (text_var + (text_mu - video_mu) ** 2) * 0.5 * jnp.exp(-2.0 * video_logsigma) - 0.5)


def distribution_alignment_loss(video_mu: jax.Array, video_logsigma: jax.Array,
                                text_mu: jax.Array, text_logsigma: jax.Array,
                                valid: jax.Array | None = None) -> jax.Array:
  """L_DA: each modality's KL to N(0, I) plus the cross-modal KL, each summed over features and
  averaged over valid videos (the official `KLdivergence`).

  The official code passes the mean of the K samples as `mu` (`samples.mean(axis=1)`), not the
  distribution's mean; pass what you mean to match.
  """
  if valid is None:
    valid = jnp.ones(video_mu.shape[0], bool)
  weights = valid.astype(jnp.float32)
  count = jnp.maximum(jnp.sum(weights), 1.0)

  def mean_over_videos(per_feature: jax.Array) -> jax.Array:
    return jnp.sum(jnp.where(weights > 0, jnp.sum(per_feature, axis=-1), 0.0)) / count

  return (mean_over_videos(kl_to_standard_normal(video_mu, video_logsigma))
          + mean_over_videos(kl_to_standard_normal(text_mu, text_logsigma))
          + mean_over_videos(cross_modal_kl(video_mu, video_logsigma, text_mu, text_logsigma)))


def ral_loss(video_samples: jax.Array, video_logsigma: jax.Array, text_samples: jax.Array,
             text_logsigma: jax.Array, valid: jax.Array | None = None,
             proxy_matching_weight: float = PROXY_MATCHING_WEIGHT,
             distribution_alignment_weight: float = DISTRIBUTION_ALIGNMENT_WEIGHT
             ) -> dict[str, jax.Array]:
  """RAL's two weighted terms as the official objective adds them (`mu` = the samples' mean).

  Returns `{'proxy_matching', 'distribution_alignment'}`, weighted.
  """
  pm = proxy_matching_loss(video_samples, text_samples, valid)
  da = distribution_alignment_loss(jnp.mean(video_samples, axis=1), video_logsigma,
                                   jnp.mean(text_samples, axis=1), text_logsigma, valid)
  return {'proxy_matching': proxy_matching_weight * pm,
          'distribution_alignment': distribution_alignment_weight * da}
