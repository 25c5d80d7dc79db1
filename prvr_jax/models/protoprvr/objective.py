"""ProtoPRVR's objective (Eq. 9): the MS-SL lineage's retrieval loss on both branches

  L_ret = Triplet(clip) + Triplet(frame) + clip_nce * NCE(clip) + frame_nce * NCE(frame)

(`clip_nce = frame_nce` = the paper's lambda_nce), plus the prototype terms, each summed over
the two branches and present when its switch `config.loss.use_<term>` is on:

  crecon * masked-token InfoNCE (cosine / crecon_temperature)        Eq. 4
  urecon * MSE of the input features rebuilt from the prototypes    Eq. 5
  guide  * attention guidance on mixed video pairs (beta = guide_margin)  Eq. 7
  ortho  * orthogonality of the normalised prototypes                Eq. 8

`use_nce=False` leaves out both NCE terms. A term that is off is not computed (XLA drops the
unused parts of the forward).
"""

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from prvr_jax import losses
from prvr_jax.models import two_branch
from prvr_jax.models.protoprvr.model import BRANCHES
from prvr_jax.models.spec import Batch

PROTOTYPE_TERMS = ('crecon', 'urecon', 'guide', 'ortho')


def guide_validity(batch: Batch) -> jax.Array:
  """`[Q, 2]` bool: the query is valid and both videos of its pair (own, next) / (previous,
  own) are valid and distinct."""
  own, video_valid = jnp.asarray(batch['query_video']), jnp.asarray(batch['video_valid'])
  num_videos = video_valid.shape[0]
  partners = jnp.stack([own + 1, own - 1], axis=1) % num_videos
  return (batch['query_valid'][:, None] & video_valid[own][:, None] & video_valid[partners]
          & (num_videos > 1))


def prototype_terms(outputs: Mapping[str, jax.Array], batch: Batch,
                    cfg: Any) -> dict[str, jax.Array]:
  """The switched-on prototype terms of `config.loss`, weighted."""
  terms = {}
  if cfg.use_crecon:
    valid = outputs['masked_real'] & batch['query_valid'][:, None]
    terms['crecon'] = cfg.crecon * sum(
        losses.masked_token_nce(outputs[f'{b}_reconstructed_tokens'], outputs['masked_tokens'],
                                valid, temperature=cfg.crecon_temperature) for b in BRANCHES)
  if cfg.use_urecon:
    frame_mask = batch['frame_mask'] * batch['video_valid'][:, None]
    clip_mask = jnp.broadcast_to(batch['video_valid'][:, None],
                                 outputs['clip_reconstruction_target'].shape[:2])
    terms['urecon'] = cfg.urecon * sum(
        losses.reconstruction_mse(outputs[f'{b}_reconstruction'],
                                  outputs[f'{b}_reconstruction_target'], mask)
        for b, mask in (('clip', clip_mask), ('frame', frame_mask)))
  if cfg.use_guide:
    first_is_own = jnp.broadcast_to(jnp.array([True, False]), batch['query_video'].shape + (2,))
    terms['guide'] = cfg.guide * sum(
        losses.attention_guidance_loss(outputs[f'{b}_first_share'], first_is_own,
                                       guide_validity(batch), margin=cfg.guide_margin)
        for b in BRANCHES)
  if cfg.use_ortho:
    terms['ortho'] = cfg.ortho * sum(
        losses.orthogonality_loss(outputs[f'{b}_prototypes'], batch['video_valid'])
        for b in BRANCHES)
  return terms


objective = two_branch.make_objective(prototype_terms)
