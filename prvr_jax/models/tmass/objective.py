"""T-MASS's objective (paper Eq. 9 as coded): L = L_s + support * L_sup (+ text_ce * L_ce).

  L_s   = symmetric CE of exp(logit_scale) * cos(t_s[q], pooled[q, b]), t_s one draw per caption
  L_sup = the same with the support text t + (v - t) / ||v - t|| * R, v = the caption's video
          pooled by every caption of the batch, averaged
  L_ce  = the same with the deterministic t (the paper's ablation; 0 as coded)

Dropout from `rngs['dropout']`, the draw from `rngs['sampling']`.
"""

from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from prvr_jax.layers import stochastic_text
from prvr_jax.losses import stochastic
from prvr_jax.models.spec import Batch, LossContext, Params
from prvr_jax.models.two_branch import batch_masks


def objective(model: nn.Module, params: Params, batch: Batch, rngs: Mapping[str, jax.Array],
              ctx: LossContext) -> tuple[jax.Array, dict[str, jax.Array]]:
  """(total, terms) of one training batch."""
  cfg = ctx.loss
  out = model.apply({'params': params}, batch, deterministic=False, rngs=dict(rngs))
  masks = batch_masks(batch)

  def cross_entropy(texts):
    logits = stochastic.pooled_logits(texts, out['pooled'], out['logit_scale'])
    return stochastic.symmetric_cross_entropy(logits, **masks)

  terms = {'stochastic_ce': cross_entropy(out['stochastic'])}
  if cfg.support:
    target = stochastic.support_targets(out['pooled'], batch['query_video'],
                                        batch['query_valid'])
    support = stochastic_text.support_text(out['texts'], target, out['radius'])
    terms['support_ce'] = cfg.support * cross_entropy(support)
  if cfg.text_ce:
    terms['text_ce'] = cfg.text_ce * cross_entropy(out['texts'])
  return jnp.sum(jnp.stack(list(terms.values()))), terms
