"""RAL's training objective (as coded): GMMFormer v2's (the two-branch retrieval terms, focal
QDL v2, optimal matching) + proxy_matching * L_PM + distribution_alignment * L_DA of the two
Gaussians of each video (`prvr_jax.losses.ral`; weights `config.loss.proxy_matching`,
`config.loss.distribution_alignment`, official 4e-3 and 2.5e-4).
"""

from collections.abc import Mapping
from typing import Any

import jax

from prvr_jax.losses import ral
from prvr_jax.models import two_branch
from prvr_jax.models.spec import Batch


def ral_terms(outputs: Mapping[str, Any], batch: Batch, cfg: Any) -> dict[str, jax.Array]:
  """GMMFormer v2's query-side terms plus 'proxy_matching' and 'distribution_alignment'
  (each present when its weight is not 0), padding videos left out."""
  terms = two_branch.diversity_and_matching(outputs, batch, cfg)
  video, text = outputs['gaussians']['video'], outputs['gaussians']['text']
  weighted = ral.ral_loss(video['samples'], video['logsigma'], text['samples'],
                          text['logsigma'], batch['video_valid'],
                          proxy_matching_weight=cfg.proxy_matching,
                          distribution_alignment_weight=cfg.distribution_alignment)
  terms.update({k: v for k, v in weighted.items() if cfg[k]})
  return terms


objective = two_branch.make_objective(ral_terms)
