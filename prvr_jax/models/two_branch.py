"""What the clip-and-frame models of the MS-SL lineage share (MS-SL, GMMFormer, GMMFormer v2).

* `TwoBranchModel`: a query vector scored against a clip branch (max over clips) and a frame
  branch, fused `clip_score_weight * S_c + frame_score_weight * S_f`; the query branch; the
  training forward with the in-batch matrices the losses use.
* `make_objective`: InfoNCE (raw dot products) + triplet (cosines) on both branches, plus the
  model's own terms; `diversity_and_matching`, GMMFormer v2's L_div and L_om, which any model
  with a second query encoding and clip features can add.
* `spec`: their registry entry, with the official BertAdam weight-decay groups as
  parameter-path rules and the GMM blocks' stacked branches.
"""

from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from prvr_jax import losses
from prvr_jax.layers.gmm_block import BRANCHES
from prvr_jax.models.spec import Batch, LossContext, ModelSpec, Objective, OfficialCheckpoint
from prvr_jax.models.spec import Params
from prvr_jax.ops import max_similarity

# The official groups exempt torch names containing 'bias', 'LayerNorm.weight' or
# 'LayerNorm.bias'. Our modules named `norm` are exactly the official `LayerNorm`s (v2's
# `norm1`/`norm2` keep their official names and are decayed, as officially).
OFFICIAL_NO_DECAY = (r'(^|/)bias$', r'(^|/)norm/scale$')


class TwoBranchModel(nn.Module):
  """Base of the two-branch models: the fields they share (the official defaults; the
  config's `model` section sets them). Subclasses define `setup` (setting `self.query`, a
  `QueryEncoder`), `encode_videos` and `frame_similarity`."""
  hidden_dim: int = 384
  num_heads: int = 4
  max_query_len: int = 30
  max_frames: int = 128
  num_clips: int = 32
  dropout: float = 0.2
  input_dropout: float = 0.2
  clip_score_weight: float = 0.7
  frame_score_weight: float = 0.3

  def encode_videos(self, videos: Batch, deterministic: bool = True) -> dict[str, jax.Array]:
    """A video batch (`clip_feats`, `frame_feats`, `frame_mask`) -> the stored sets of
    vectors, leading axis B; `clips` `[B, Lc, D]` among them."""
    raise NotImplementedError

  def frame_similarity(self, queries: jax.Array, videos: Mapping[str, jax.Array],
                       cosine: bool) -> jax.Array:
    """Frame-branch similarity `[Q, B]` (cosine, or raw dot product for InfoNCE)."""
    raise NotImplementedError

  def encode_queries(self, queries: Batch, deterministic: bool = True) -> jax.Array:
    """A query batch (`query_feats [Q, Lq, Dq]`, `query_mask [Q, Lq]`) -> `[Q, D]`."""
    return self.query(queries['query_feats'], queries['query_mask'], deterministic)

  def score(self, queries: jax.Array, videos: Mapping[str, jax.Array]) -> jax.Array:
    """`[Q, B]` = clip_score_weight * max-clip cosine + frame_score_weight * frame cosine."""
    return self._fuse(max_similarity(queries, videos['clips'], cosine=True),
                      self.frame_similarity(queries, videos, cosine=True))

  def _fuse(self, clip_scores: jax.Array, frame_scores: jax.Array) -> jax.Array:
    return self.clip_score_weight * clip_scores + self.frame_score_weight * frame_scores

  def __call__(self, batch: Batch, deterministic: bool = True) -> dict[str, jax.Array]:
    """The training forward: in-batch matrices `[Q, B]` (cosines for the triplet terms and the
    fused `scores`, raw dots for InfoNCE) and the embeddings the other terms need."""
    videos = self.encode_videos(batch, deterministic)
    queries = self.encode_queries(batch, deterministic)
    # A second encoding with its own dropout mask feeds QDL and OM, as in the official code.
    queries_aux = self.encode_queries(batch, deterministic)
    clip_scores = max_similarity(queries, videos['clips'], cosine=True)
    frame_scores = self.frame_similarity(queries, videos, cosine=True)
    return {
        'scores': self._fuse(clip_scores, frame_scores),
        'clip_scores': clip_scores,
        'clip_logits': max_similarity(queries, videos['clips'], cosine=False),
        'frame_scores': frame_scores,
        'frame_logits': self.frame_similarity(queries, videos, cosine=False),
        'queries': queries,
        'queries_aux': queries_aux,
        'clips': videos['clips'],
    }


def batch_masks(batch: Batch) -> dict[str, jax.Array]:
  """The padding masks every loss term takes."""
  return {k: batch[k] for k in ('query_video', 'query_valid', 'video_valid')}


ExtraTerms = Callable[[Mapping[str, jax.Array], Batch, Any], dict[str, jax.Array]]


def diversity_and_matching(outputs: Mapping[str, jax.Array], batch: Batch,
                           cfg: Any) -> dict[str, jax.Array]:
  """GMMFormer v2's query-side terms of `config.loss`, each present when its weight is not 0:
  'qdl' = qdl * focal QDL v2 (qdl_delta, qdl_alpha, qdl_gamma) and 'om' = om * optimal
  matching, both of the second query encoding `outputs['queries_aux']` (OM against
  `outputs['clips']`)."""
  terms = {}
  if cfg.get('qdl', 0):
    terms['qdl'] = cfg.qdl * losses.query_diverse_loss_v2(
        outputs['queries_aux'], batch['query_video'], batch['query_valid'],
        delta=cfg.qdl_delta, alpha=cfg.qdl_alpha, gamma=cfg.qdl_gamma)
  if cfg.get('om', 0):
    terms['om'] = cfg.om * losses.optimal_matching_loss(
        outputs['queries_aux'], outputs['clips'], **batch_masks(batch))
  return terms


def make_objective(extra_terms: ExtraTerms, paired_frames: bool = False) -> Objective:
  """The objective: the training forward (dropout from `rngs['dropout']`), then

    clip_nce * NCE(clip logits) + Triplet(clip cosines)
    + frame_nce * NCE(frame logits) + Triplet(frame cosines) + extra_terms(...)

  with the triplet negatives from `rngs['negatives']` and hard negatives from
  `config.loss.hard_negative_start_epoch` on (compared with the traced `ctx.epoch`); the
  other streams of `rngs` go to the forward. `config.loss.use_nce=False` (where the model
  offers it) leaves out both NCE terms.
  `extra_terms(outputs, batch, config.loss)` returns the model's other weighted terms.
  `paired_frames`: the frame matrices are `[Q, Q]` (query i against the frame feature built
  for query j, MS-SL) and use `paired_nce` / `paired_triplet_loss`.
  Returns (sum of the terms, the terms).
  """
  def objective(model: nn.Module, params: Params, batch: Batch, rngs: Mapping[str, jax.Array],
                ctx: LossContext) -> tuple[jax.Array, dict[str, jax.Array]]:
    cfg = ctx.config.loss
    outputs = model.apply({'params': params}, batch, deterministic=False,
                          rngs={k: v for k, v in rngs.items() if k != 'negatives'})
    masks = batch_masks(batch)
    clip_key, frame_key = jax.random.split(rngs['negatives'])
    triplet = dict(margin=cfg.margin, hard_pool_size=cfg.hard_pool_size,
                   use_hard_negative=ctx.epoch >= cfg.hard_negative_start_epoch)
    terms = {
        'clip_nce': cfg.clip_nce * losses.clip_nce(outputs['clip_logits'], **masks),
        'clip_triplet': losses.triplet_loss(outputs['clip_scores'], **masks, key=clip_key,
                                            **triplet),
        **extra_terms(outputs, batch, cfg),
    }
    if paired_frames:
      valid = batch['query_valid']
      terms['frame_nce'] = cfg.frame_nce * losses.paired_nce(outputs['frame_logits'], valid)
      terms['frame_triplet'] = losses.paired_triplet_loss(
          outputs['frame_scores'], valid, margin=cfg.margin, key=frame_key,
          use_hard_negative=triplet['use_hard_negative'], hard_pool_size=cfg.hard_pool_size)
    else:
      terms['frame_nce'] = cfg.frame_nce * losses.clip_nce(outputs['frame_logits'], **masks)
      terms['frame_triplet'] = losses.triplet_loss(outputs['frame_scores'], **masks,
                                                   key=frame_key, **triplet)
    if not cfg.get('use_nce', True):
      del terms['clip_nce'], terms['frame_nce']
    return jnp.sum(jnp.stack(list(terms.values()))), terms
  return objective


def spec(name: str, module: type[nn.Module], objective: Objective, official: Any,
         **fields: Any) -> ModelSpec:
  """The registry entry of a two-branch model whose package `official` defines `names` and
  `infer_config`: RNG streams 'dropout' and 'negatives', the official BertAdam groups, GMM
  branches clipped one by one; `fields` are the model's other `ModelSpec` fields."""
  return ModelSpec(
      name=name, module=module, objective=objective, rng_streams=('dropout', 'negatives'),
      no_decay=OFFICIAL_NO_DECAY, stacked=(rf'(^|/){BRANCHES}/',),
      official=OfficialCheckpoint(names=official.names, infer_config=official.infer_config),
      **fields)
