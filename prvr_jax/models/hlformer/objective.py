"""HLFormer's training objective (as coded): the two-branch retrieval terms, qdl * the query
diverse loss (GMMFormer v2's focal form, official `neg_factor`) of the second query encoding,
and partial_order * the Lorentzian entailment-cone loss.

The partial-order term: `mean_q max(oxy_angle(v_q, t_q) - half_aperture(v_q), 0)` over the
valid queries, `v_q` the hyperbolic point of query q's video, `t_q` the query's (both from
`HLFormer.hyperbolic_points`, curvature c).
"""

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from prvr_jax.layers import lorentz
from prvr_jax.models import two_branch
from prvr_jax.models.spec import Batch


def partial_order_loss(video_points: jax.Array, query_points: jax.Array, curvature: jax.Array,
                       query_video: jax.Array, query_valid: jax.Array) -> jax.Array:
  """Mean over valid queries of `max(oxy_angle(video, query) - half_aperture(video), 0)`:
  `video_points [B, D]`, `query_points [Q, D]` (space parts), `query_video [Q]`."""
  videos = video_points[query_video]
  angle = lorentz.oxy_angle(videos, query_points, curvature)
  aperture = lorentz.half_aperture(videos, curvature)
  excess = jnp.maximum(angle - aperture, 0.0).astype(jnp.float32)
  valid = query_valid.astype(jnp.float32)
  return jnp.sum(excess * valid) / jnp.maximum(valid.sum(), 1.0)


def hyperbolic_terms(outputs: Mapping[str, jax.Array], batch: Batch,
                     cfg: Any) -> dict[str, jax.Array]:
  """'qdl' (`two_branch.diversity_and_matching`, no optimal matching) and 'partial_order' =
  partial_order * `partial_order_loss`, each present when its weight is not 0."""
  terms = two_branch.diversity_and_matching(outputs, batch, cfg)
  if cfg.get('partial_order', 0):
    terms['partial_order'] = cfg.partial_order * partial_order_loss(
        outputs['video_points'], outputs['query_points'], outputs['curvature'],
        batch['query_video'], batch['query_valid'])
  return terms


objective = two_branch.make_objective(hyperbolic_terms)
