"""Holmes's training objective (as coded, `src/Losses/loss.py`):

  clip_nce * NCE_c + Triplet_c + frame_nce * NCE_f + Triplet_f + qdl * QDL (second encoding)
  + intra_edl * intra-video EDL (from `warmup_epoch` on)
  + edl * (EDL_frame + EDL_clip + EDL_combined) [+ dc * DC]

The retrieval terms and QDL are GMMFormer v2's (`two_branch`, no optimal matching). The EDL
terms are `prvr_jax.losses.evidential`'s on the cosine scores (`edl_tau`), with one-hot labels
before `warmup_epoch` and the calibrated labels (`division_beta`, `smooth_beta`) after. The
intra-video term groups the second query encoding by video, runs `losses.holmes_partial_ot`
against the video's encoded clips every step (`pot_epsilon`, `pot_bucket_quantile`,
`pot_iterations`, `pot_tolerance`) and scores its differentiable similarity against the plan's
labels (`edl_intra_tau`); before `warmup_epoch` it is 0, as officially. DC, the `multisrc/`
degree of conflict of the two branches' Dirichlets (`evidential.degree_of_conflict`), has the
official weight 0 (`loss.dc`) and is computed only when its weight is not 0.
"""

from collections.abc import Mapping
import functools
from typing import Any

import jax
import jax.numpy as jnp

from prvr_jax import losses
from prvr_jax.layers.probabilistic import support_set
from prvr_jax.losses import evidential
from prvr_jax.models import two_branch
from prvr_jax.models.spec import Batch, LossContext, Params


def grouped_queries(queries: jax.Array, query_video: jax.Array, query_valid: jax.Array,
                    num_videos: int) -> tuple[jax.Array, jax.Array]:
  """`[Q, D]` queries -> `[B, Q, D]` each video's queries in batch order, padded with zeros,
  and their mask `[B, Q]` (Q slots: no query is ever dropped)."""
  num_queries = queries.shape[0]
  tokens, mask = support_set(queries[:, None], jnp.ones((num_queries, 1), queries.dtype),
                             query_video, query_valid, num_videos, num_queries)
  return tokens, mask


def partial_ot_outputs(outputs: Mapping[str, jax.Array], batch: Batch, cfg: Any
                       ) -> dict[str, jax.Array]:
  """`losses.holmes_partial_ot` of the encoded clips and the grouped second query encoding
  (the official `BatchPOT` call), with 'query_mask' `[B, Q]`."""
  clips = outputs['clips']
  queries, mask = grouped_queries(outputs['queries_aux'], batch['query_video'],
                                  batch['query_valid'], clips.shape[0])
  result = losses.holmes_partial_ot(
      clips, queries, mask, epsilon=cfg.pot_epsilon, bucket_quantile=cfg.pot_bucket_quantile,
      num_iters=cfg.pot_iterations, tolerance=cfg.pot_tolerance)
  return {**result, 'query_mask': mask}


def holmes_terms(outputs: Mapping[str, jax.Array], batch: Batch, cfg: Any,
                 epoch: jax.Array) -> dict[str, jax.Array]:
  """'qdl' (when its weight is not 0), 'intra_edl', 'edl_frame', 'edl_clip', 'edl_combined',
  'dc' (when its weight is not 0) (each times its weight), the EDL labels and the intra-video
  term switched at `epoch >= cfg.warmup_epoch`."""
  terms = two_branch.diversity_and_matching(outputs, batch, cfg)
  after_warmup = epoch >= cfg.warmup_epoch
  pot = partial_ot_outputs(outputs, batch, cfg)
  intra = evidential.intra_video_edl(pot['similarity'], pot['labels'], pot['query_mask'],
                                     cfg.edl_intra_tau)
  terms['intra_edl'] = jnp.where(after_warmup, cfg.intra_edl * intra, 0.0)
  edl = evidential.inter_video_edl(
      outputs['frame_scores'], outputs['clip_scores'], batch['query_video'],
      batch['query_valid'], batch['video_valid'], cfg.edl_tau, after_warmup,
      cfg.division_beta, cfg.smooth_beta)
  terms.update({f'edl_{name}': cfg.edl * value for name, value in edl.items()})
  if cfg.get('dc', 0):  # official `multisrc/` weight 0: computed only when weighted
    terms['dc'] = cfg.dc * evidential.degree_of_conflict(
        outputs['frame_scores'], outputs['clip_scores'], batch['query_valid'],
        batch['video_valid'], cfg.edl_tau)
  return terms


def objective(model: Any, params: Params, batch: Batch, rngs: Mapping[str, jax.Array],
              ctx: LossContext) -> tuple[jax.Array, dict[str, jax.Array]]:
  """`two_branch.make_objective` with `holmes_terms` at the update's epoch."""
  terms = functools.partial(holmes_terms, epoch=ctx.epoch)
  return two_branch.make_objective(terms)(model, params, batch, rngs, ctx)
