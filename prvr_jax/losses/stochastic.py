"""T-MASS's loss terms: symmetric cross-entropy of cosine logits and the support-text target."""

import jax
import jax.numpy as jnp

from prvr_jax import ops
from prvr_jax.losses.contrastive import clip_nce
from prvr_jax.losses.masking import upcast


def pooled_logits(texts: jax.Array, pooled: jax.Array, logit_scale: jax.Array) -> jax.Array:
  """`exp(logit_scale) * cos(texts[q], pooled[q, b])`: texts `[Q, D]`, pooled `[Q, B, D]` (each
  video pooled by each text) -> `[Q, B]`."""
  cosines = jnp.einsum('qd,qbd->qb', ops.l2_normalize(texts), ops.l2_normalize(pooled))
  return jnp.exp(logit_scale) * upcast(cosines)


def symmetric_cross_entropy(logits: jax.Array, query_video: jax.Array, query_valid: jax.Array,
                            video_valid: jax.Array) -> jax.Array:
  """CLIP's loss, (text-to-video CE + video-to-text CE) / 2, over the valid entries.

  With one caption per video (the official batches) this is the official `CLIPLoss` of the
  diagonal; a video with several captions in the batch takes them all as its positives
  (`clip_nce`'s multi-positive video-to-text term).
  """
  return 0.5 * clip_nce(logits, query_video, query_valid, video_valid)


def support_targets(pooled: jax.Array, query_video: jax.Array, query_valid: jax.Array
                    ) -> jax.Array:
  """`[Q, D]`: for each caption, its own video pooled by every valid caption of the batch,
  averaged (the official support vector's `v`: the mean over the text axis)."""
  own = pooled[:, query_video]                                   # [J, Q, D]
  weights = query_valid.astype(own.dtype)[:, None, None]
  return jnp.sum(own * weights, axis=0) / jnp.maximum(jnp.sum(weights), 1.0)
