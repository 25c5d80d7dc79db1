"""DreamPRVR's training objective (as coded, `Losses/loss.py`; official `loss_factor`
[f0 .. f5]):

  clip_nce * NCE(clip) + Triplet(clip) + frame_nce * NCE(frame) + Triplet(frame)
  + qdl * QDL v2 + qsp * QSP + kl * KL(mu, logvar) + dre * DRE

QDL (GMMFormer v2's focal form, official `neg_factor`) and QSP (supervised contrastive over
the queries, temperature `qsp_temperature`, official `deterministic_tau`) take the query
encoding made before the videos (`queries_aux`). KL is that of the video latent sampler's
Gaussian, summed over dimensions and averaged over the valid videos; DRE the mean squared
error between the "noise" `mu` (repeated K times) and the denoiser's prediction at every
timestep, over the valid videos (the official batches have no padded video).
"""

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from prvr_jax import losses
from prvr_jax.layers.latent_sampler import kl_divergence
from prvr_jax.models import two_branch
from prvr_jax.models.spec import Batch


def video_kl(mu: jax.Array, logvar: jax.Array, video_valid: jax.Array) -> jax.Array:
  """`kl_divergence` over the valid videos: a padded row gets (mu, logvar) = (0, 0), whose
  term `1 + 0 - 0 - e^0` is 0, and the sum is divided by the valid count instead of B."""
  valid = video_valid[:, None]
  kl = kl_divergence(jnp.where(valid, mu, 0.), jnp.where(valid, logvar, 0.))
  return kl * mu.shape[0] / jnp.maximum(video_valid.sum(), 1)


def noise_mse(target: jax.Array, pred: jax.Array, video_valid: jax.Array) -> jax.Array:
  """`mean((target - pred)^2)` over the valid videos: `target [B, K, D]`, `pred [T, B, K, D]`
  (the official `F.mse_loss(all_original_noise, all_predicted_noise)`)."""
  sq = jnp.square(pred.astype(jnp.float32) - target.astype(jnp.float32)[None])
  per_video = jnp.mean(sq, axis=(0, 2, 3))
  return jnp.sum(jnp.where(video_valid, per_video, 0.)) / jnp.maximum(video_valid.sum(), 1)


def register_terms(outputs: Mapping[str, jax.Array], batch: Batch,
                   cfg: Any) -> dict[str, jax.Array]:
  """'qdl' (`two_branch.diversity_and_matching`), 'qsp', 'kl' and 'dre', each weighted by its
  `config.loss` value and present when that is not 0."""
  terms = two_branch.diversity_and_matching(outputs, batch, cfg)
  if cfg.get('qsp', 0):
    terms['qsp'] = cfg.qsp * losses.query_similarity_preservation_loss(
        outputs['queries_aux'], batch['query_video'], batch['query_valid'],
        temperature=cfg.qsp_temperature)
  if cfg.get('kl', 0):
    terms['kl'] = cfg.kl * video_kl(outputs['mu'], outputs['logvar'], batch['video_valid'])
  if cfg.get('dre', 0):
    terms['dre'] = cfg.dre * noise_mse(outputs['noise_target'], outputs['noise_pred'],
                                       batch['video_valid'])
  return terms


objective = two_branch.make_objective(register_terms)
