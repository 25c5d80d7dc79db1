"""AMDNet's training objective (as coded), each term weighted by `config.loss`:

  clip_nce * NCE(raw max-clip dots)                          (official loss_factor[0])
  + moment_diversity * ||alpha I - M M^T||^2                 (loss_factor[1], alpha 0.15)
  + moment_relevance * [margin + cos(q, v_bar) - max_k cos(q, V^m_k)]_+   (25, 0.02)
  + GMMFormer v2's L_div / L_om plug-ins (`loss.qdl`, `loss.om`; 0 = off, the official model).
"""

from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from prvr_jax import losses
from prvr_jax.models import two_branch
from prvr_jax.models.spec import Batch, LossContext, Params


def objective(model: nn.Module, params: Params, batch: Batch, rngs: Mapping[str, jax.Array],
              ctx: LossContext) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The training forward (dropout from `rngs['dropout']`), then the weighted terms.
  Returns (their sum, the terms)."""
  cfg = ctx.loss
  outputs = model.apply({'params': params}, batch, deterministic=False,
                        rngs={'dropout': rngs['dropout']})
  masks = two_branch.batch_masks(batch)
  terms = {
      'clip_nce': cfg.clip_nce * losses.clip_nce(outputs['clip_logits'], **masks),
      'moment_diversity': cfg.moment_diversity * losses.moment_diversity_loss(
          outputs['masks'], batch['video_valid'], alpha=cfg.moment_diversity_alpha),
      'moment_relevance': cfg.moment_relevance * losses.moment_relevance_loss(
          outputs['queries'], outputs['summaries'], outputs['moments'], batch['query_video'],
          batch['query_valid'], margin=cfg.moment_relevance_margin),
      **two_branch.diversity_and_matching(outputs, batch, cfg),
  }
  return jnp.sum(jnp.stack(list(terms.values()))), terms
