"""GMMFormer v2's training objective (as coded): the two-branch retrieval terms plus
qdl * focal QDL v2 and om * optimal matching, both of the second query encoding.

`config.loss.om = 0` leaves the optimal matching term (and its host callback) out.
"""

from collections.abc import Mapping
from typing import Any

import jax

from prvr_jax import losses
from prvr_jax.models import two_branch
from prvr_jax.models.spec import Batch


def diversity_and_matching(outputs: Mapping[str, jax.Array], batch: Batch,
                           cfg: Any) -> dict[str, jax.Array]:
  """{'qdl': weighted QDL v2, 'om': weighted OM} of `config.loss`."""
  terms = {'qdl': cfg.qdl * losses.query_diverse_loss_v2(
      outputs['queries_aux'], batch['query_video'], batch['query_valid'],
      delta=cfg.qdl_delta, alpha=cfg.qdl_alpha, gamma=cfg.qdl_gamma)}
  if cfg.om:
    terms['om'] = cfg.om * losses.optimal_matching_loss(
        outputs['queries_aux'], outputs['clips'], **two_branch.batch_masks(batch))
  return terms


objective = two_branch.make_objective(diversity_and_matching)
