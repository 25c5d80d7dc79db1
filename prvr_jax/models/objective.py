"""The GMMFormer-family training objective, composed from the pure terms of `prvr_jax.losses`.

  loss = clip_nce * NCE(clip logits) + Triplet(clip cosines)
       + frame_nce * NCE(frame logits) + Triplet(frame cosines)
       + qdl * QDL(second query encoding) [+ om * OM(second query encoding, clips)]

GMMFormer uses QDL v1 and no OM; GMMFormer v2 the focal QDL v2 and OM (`config.loss.om > 0`).
"""

from typing import Any

import jax
import jax.numpy as jnp

from prvr_jax import losses


def compute_loss(config: Any, outputs: dict[str, jax.Array], batch: dict[str, jax.Array],
                 rng: jax.Array, use_hard_negative: bool | jax.Array,
                 qdl_version: str) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Total loss and its weighted terms.

  Args:
    config: the full config (`config.loss` is read).
    outputs: the model's `__call__` output (score matrices `[Q, B]`, `queries_aux`, `clips`).
    batch: the training batch (`query_video`, `query_valid`, `video_valid` are read).
    rng: key for the random negatives of the triplet losses.
    use_hard_negative: traced or static boolean (the hard-negative epoch switch).
    qdl_version: 'v1' or 'v2' (the model class's `qdl_version`).
  """
  cfg = config.loss
  masks = dict(query_video=batch['query_video'], query_valid=batch['query_valid'],
               video_valid=batch['video_valid'])
  clip_key, frame_key = jax.random.split(rng)
  triplet = dict(margin=cfg.margin, use_hard_negative=use_hard_negative,
                 hard_pool_size=cfg.hard_pool_size)
  terms = {
      'clip_nce': cfg.clip_nce * losses.clip_nce(outputs['clip_logits'], **masks),
      'clip_triplet': losses.triplet_loss(outputs['clip_scores'], **masks, key=clip_key,
                                          **triplet),
      'frame_nce': cfg.frame_nce * losses.clip_nce(outputs['frame_logits'], **masks),
      'frame_triplet': losses.triplet_loss(outputs['frame_scores'], **masks, key=frame_key,
                                           **triplet),
  }
  query_masks = dict(query_video=batch['query_video'], query_valid=batch['query_valid'])
  if qdl_version == 'v1':
    qdl = losses.query_diverse_loss_v1(outputs['queries_aux'], **query_masks,
                                       delta=cfg.qdl_delta, alpha=cfg.qdl_alpha)
  elif qdl_version == 'v2':
    qdl = losses.query_diverse_loss_v2(outputs['queries_aux'], **query_masks,
                                       delta=cfg.qdl_delta, alpha=cfg.qdl_alpha,
                                       gamma=cfg.qdl_gamma)
  else:
    raise ValueError(f'Unknown QDL version {qdl_version!r}')
  terms['qdl'] = cfg.qdl * qdl
  if cfg.get('om', 0.0):
    terms['om'] = cfg.om * losses.optimal_matching_loss(
        outputs['queries_aux'], outputs['clips'], **masks)
  total = jnp.sum(jnp.stack(list(terms.values())))
  return total, terms
