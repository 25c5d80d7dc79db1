"""MSC-PRVR's training objective (as coded, `src/Losses/loss.py`):

  clip_nce * NCE_c + Triplet_c + frame_nce * NCE_f + Triplet_f
  + rkd_distance * RKD_d + rkd_angle * RKD_a + cbva * CBVA

The retrieval terms are GMMFormer v2's (`two_branch`; no query diversity, no optimal
matching). Text correlation preservation (TCPL): relational distillation
(`losses.relational`) from the query's CLIP feature at its last token (the EOT token of CLIP
text features; no gradient) to its pooled encoding (the forward's `teacher`). Cross-branch
video alignment: `losses.alignment.cross_branch_alignment` of the projected frames against
the projected clips, merged adaptively (`cbva_targets`, `cbva_thresholds`, the cosine
threshold `sim_threshold`).
"""

from collections.abc import Mapping
from typing import Any

import jax

from prvr_jax.losses import alignment, relational
from prvr_jax.models import two_branch
from prvr_jax.models.spec import Batch


def msc_terms(outputs: Mapping[str, jax.Array], batch: Batch, cfg: Any
              ) -> dict[str, jax.Array]:
  """'rkd_distance', 'rkd_angle' and 'cbva', each times its weight."""
  teacher = outputs['teacher']
  valid = batch['query_valid']
  return {
      'rkd_distance': cfg.rkd_distance * relational.rkd_distance(
          outputs['queries'], teacher, valid),
      'rkd_angle': cfg.rkd_angle * relational.rkd_angle(outputs['queries'], teacher, valid),
      'cbva': cfg.cbva * alignment.cross_branch_alignment(
          outputs['frame_proj'], outputs['clip_proj'], outputs['frame_clip'],
          outputs['clip_inputs'], outputs['clip_sizes'], batch['video_valid'],
          cfg.sim_threshold, tuple(cfg.cbva_targets), tuple(cfg.cbva_thresholds)),
  }


objective = two_branch.make_objective(msc_terms)
