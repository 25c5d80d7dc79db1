"""GMMFormer's training objective (as coded): the two-branch retrieval terms (the frame branch
is the video vector) plus qdl * QDL v1 of the second query encoding."""

from collections.abc import Mapping
from typing import Any

import jax

from prvr_jax import losses
from prvr_jax.models import two_branch
from prvr_jax.models.spec import Batch


def query_diversity(outputs: Mapping[str, jax.Array], batch: Batch,
                    cfg: Any) -> dict[str, jax.Array]:
  """{'qdl': weighted QDL v1} of `config.loss` (qdl, qdl_delta, qdl_alpha)."""
  return {'qdl': cfg.qdl * losses.query_diverse_loss_v1(
      outputs['queries_aux'], batch['query_video'], batch['query_valid'],
      delta=cfg.qdl_delta, alpha=cfg.qdl_alpha)}


objective = two_branch.make_objective(query_diversity)
