"""What the clip-and-frame models of the MS-SL lineage share (MS-SL, GMMFormer, GMMFormer v2,
ProtoPRVR).

* `TwoBranchModel`: a query vector scored against a clip branch (max over clips) and a frame
  branch, fused `clip_score_weight * S_c + frame_score_weight * S_f`; the query branch; the
  training forward with the in-batch matrices the losses use. It lists T-MASS's "text mass"
  plug-in (`prvr_jax.models.text_mass.TextMass`, docs/text_mass_plugin.md) and RAL's
  probabilistic plug-in (`prvr_jax.models.probabilistic.ProbabilisticPlugin`, docs/ral.md).
* `make_objective`: InfoNCE (raw dot products) + triplet (cosines) on both branches, plus the
  model's own terms and, with the probabilistic plug-in, L_PM and L_DA;
  `diversity_and_matching`, GMMFormer v2's L_div and L_om, which any model with a second
  query encoding and clip features can add.
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
from prvr_jax.models.fields import SharedFields
from prvr_jax.models.probabilistic import SAMPLE_STREAM, ProbabilisticPlugin
from prvr_jax.models.probabilistic import probabilistic_terms
from prvr_jax.models.spec import Batch, LossContext, ModelSpec, Objective, OfficialCheckpoint
from prvr_jax.models.spec import Params, position_scores, real_positions
from prvr_jax.models.text_mass import TEXT_MASS_SPEC, TextMass
from prvr_jax.ops import max_similarities, max_similarity

# The official groups exempt torch names containing 'bias', 'LayerNorm.weight' or
# 'LayerNorm.bias'. Our modules named `norm` are exactly the official `LayerNorm`s (v2's
# `norm1`/`norm2` keep their official names and are decayed, as officially).
OFFICIAL_NO_DECAY = (r'(^|/)bias$', r'(^|/)norm/scale$')


class TwoBranchModel(TextMass, ProbabilisticPlugin, SharedFields):
  """Base of the two-branch models: the shared fields (`SharedFields`) and the score fusion
  weights; lists the text-mass plug-in (`TextMass`) and the probabilistic plug-in
  (`ProbabilisticPlugin`), both off by default. Subclasses define `setup` (setting
  `self.query`, a `QueryEncoder`, `self.radius = self.text_mass_radius()` and `self.prob =
  self.probabilistic_heads()`), `encode_videos` (returning `self.with_key(stored, videos)`),
  `frame_similarity` and `text_mass_sets`; with the probabilistic plug-in the training
  encodings hold the encoded frames (`probabilistic_frames`).

  Attributes:
    clip_score_weight: the clip branch's weight in the fused score.
    frame_score_weight: the frame branch's weight in the fused score.
  """
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

  def frame_similarities(self, queries: jax.Array, videos: Mapping[str, jax.Array]
                         ) -> tuple[jax.Array, jax.Array]:
    """(cosine, raw dot) frame-branch similarities `[Q, B]`; a subclass whose frame score is a
    max over a set overrides this to take both from one product (`ops.max_similarities`)."""
    return (self.frame_similarity(queries, videos, cosine=True),
            self.frame_similarity(queries, videos, cosine=False))

  def training_videos(self, videos: Batch, deterministic: bool) -> dict[str, jax.Array]:
    """The video encodings the training forward scores: `encode_videos`'s (MS-SL trains on the
    encodings its stored tables are made from)."""
    return self.encode_videos(videos, deterministic)

  def stored_form(self, encoded: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """What `encode_videos` keeps of `training_videos`' encodings: all of them by default
    (MS-SL replaces its frames by the key-clip attention's tables)."""
    return dict(encoded)

  def clip_set(self, videos: Mapping[str, jax.Array]) -> jax.Array:
    """`[B, L, D]`: the clips the clip branch takes its max over (the stored `clips`; MS-SL
    stores its 32 clips and forms its multi-scale clips from them here)."""
    return videos['clips']

  def branch_weights(self) -> dict[str, float]:
    """The fusion weights: {'clip': clip_score_weight, 'frame': frame_score_weight}."""
    return {'clip': self.clip_score_weight, 'frame': self.frame_score_weight}

  def encode_queries(self, queries: Batch, deterministic: bool = True) -> jax.Array:
    """A query batch (`query_feats [Q, Lq, Dq]`, `query_mask [Q, Lq]`) -> `[Q, D]`."""
    return self.query(queries['query_feats'], queries['query_mask'], deterministic)

  def training_queries(self, batch: Batch, deterministic: bool
                       ) -> tuple[jax.Array, jax.Array | None]:
    """(`encode_queries`' encoding, the query encoder's token encodings `[Q, Lq, D]` before
    its pooling), the tokens only when the probabilistic plug-in reads them (else None)."""
    if not self.wants_gaussians(deterministic):
      return self.encode_queries(batch, deterministic), None
    return self.query(batch['query_feats'], batch['query_mask'], deterministic, tokens=True)

  def score(self, queries: jax.Array, videos: Mapping[str, jax.Array]) -> jax.Array:
    """`[Q, B]` = clip_score_weight * max-clip cosine + frame_score_weight * frame cosine
    (with text mass: `text_mass_score`)."""
    if self.stochastic_text:
      return self.text_mass_score(queries, videos)
    return self._fuse(max_similarity(queries, self.clip_set(videos), cosine=True),
                      self.frame_similarity(queries, videos, cosine=True))

  def _fuse(self, clip_scores: jax.Array, frame_scores: jax.Array) -> jax.Array:
    return self.clip_score_weight * clip_scores + self.frame_score_weight * frame_scores

  def training_similarities(self, branch: str, queries: jax.Array,
                            videos: Mapping[str, jax.Array], own: jax.Array
                            ) -> tuple[jax.Array, jax.Array]:
    """(cosine, raw dot) training matrices of a branch for `queries [Q, D]`: `[Q, B]` by
    default; `own [Q]` is each query's video in the batch (for a subclass whose matrices
    depend on it, MS-SL's `[Q, Q]` frame matrices)."""
    del own
    if branch == 'clip':
      return max_similarities(queries, self.clip_set(videos))
    return self.frame_similarities(queries, videos)

  def training_scores(self, queries: jax.Array, videos: Mapping[str, jax.Array],
                      out: Mapping[str, jax.Array], deterministic: bool) -> jax.Array:
    """The training forward's fused `scores [Q, B]`, given its branch matrices `out`:
    deterministic with text mass `score`'s, otherwise the fused `<branch>_scores`."""
    if self.stochastic_text and deterministic:
      return self.score(queries, videos)
    return self._fuse(out['clip_scores'], out['frame_scores'])

  def __call__(self, batch: Batch, deterministic: bool = True) -> dict[str, jax.Array]:
    """The training forward: each branch's in-batch matrices (`training_similarities`: cosines
    for the triplet terms, raw dots for InfoNCE), the fused `scores` (`training_scores`) and
    the embeddings the other terms need. With text mass the training matrices score the
    stochastic queries, `<branch>_support_{scores,logits}` the support queries. With the
    probabilistic plug-in, in training, `gaussians` (`probabilistic_outputs`)."""
    videos = self.training_videos(batch, deterministic)
    queries, tokens = self.training_queries(batch, deterministic)
    queries_aux = self.auxiliary_queries(batch, videos, deterministic)
    own = batch['query_video']
    scored, support = self.text_mass_training(queries, videos, own, deterministic)
    out = {'queries': queries, 'queries_aux': queries_aux, 'clips': self.clip_set(videos)}
    for branch in ('clip', 'frame'):
      out[f'{branch}_scores'], out[f'{branch}_logits'] = self.training_similarities(
          branch, scored[branch], videos, own)
    for branch, point in support.items():
      out[f'{branch}_support_scores'], out[f'{branch}_support_logits'] = (
          self.training_similarities(branch, point, videos, own))
    out['scores'] = self.training_scores(queries, videos, out, deterministic)
    out.update(self.extra_outputs(videos, out, deterministic))
    out.update(self.probabilistic_outputs(videos, tokens, batch, deterministic))
    return out

  def auxiliary_queries(self, batch: Batch, videos: Mapping[str, jax.Array],
                        deterministic: bool) -> jax.Array:
    """The query encoding QDL and OM take (`queries_aux`): a second encoding with its own
    dropout mask, as in the official code (DreamPRVR encodes it before its videos, in
    `training_videos`, and takes it from there)."""
    del videos
    return self.encode_queries(batch, deterministic)

  def extra_outputs(self, videos: Mapping[str, jax.Array], out: Mapping[str, jax.Array],
                    deterministic: bool) -> dict[str, jax.Array]:
    """More training outputs for the model's own loss terms, from the training encodings
    `videos` and the outputs so far (none by default; HLFormer's hyperbolic points)."""
    del videos, out, deterministic
    return {}


class FrameSet:
  """A frame branch scored by its best frame: `videos['frames'] [B, Lf, D]`, padded frames zero
  (GMMFormer v2, HLFormer). Mixed into a `TwoBranchModel` subclass before it."""

  def frame_similarity(self, queries: jax.Array, videos: Mapping[str, jax.Array],
                       cosine: bool) -> jax.Array:
    return max_similarity(queries, videos['frames'], cosine)

  def frame_similarities(self, queries: jax.Array, videos: Mapping[str, jax.Array]
                         ) -> tuple[jax.Array, jax.Array]:
    return max_similarities(queries, videos['frames'])

  def text_mass_sets(self, videos: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    return {'clip': videos['clips'], 'frame': videos['frames']}

  def relevance(self, queries: Batch, videos: Batch) -> dict[str, jax.Array]:
    """`ModelSpec.relevance`: `Q` queries, their `Q` videos -> {'clip cosine': `[Q, Lc]`,
    'frame cosine': `[Q, Lf]` (NaN at padded frames)}, whose maxima are the pair's S_c and,
    over a video without padding, S_f."""
    encoded, stored = self.encode_queries(queries), self.encode_videos(videos)
    return {'clip cosine': position_scores(encoded, stored['clips']),
            'frame cosine': real_positions(position_scores(encoded, stored['frames']),
                                           videos['frame_mask'])}


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
        outputs['queries_aux'], outputs['clips'], **batch_masks(batch),
        solver=cfg.get('om_solver', 'host'))
  return terms


def make_objective(extra_terms: ExtraTerms, paired_frames: bool = False) -> Objective:
  """The objective: the training forward (dropout from `rngs['dropout']`), then

    clip_nce * NCE(clip logits) + Triplet(clip cosines)
    + frame_nce * NCE(frame logits) + Triplet(frame cosines) + extra_terms(...)

  with the triplet negatives from `rngs['negatives']` and hard negatives from
  `config.loss.hard_negative_start_epoch` on (compared with the traced `ctx.epoch`); the
  other streams of `rngs` go to the forward (text mass draws from 'sampling').
  `config.loss.use_nce=False` (where the model offers it) leaves out both NCE terms.
  `extra_terms(outputs, batch, config.loss)` returns the model's other weighted terms.
  `paired_frames`: the frame matrices are `[Q, Q]` (query i against the frame feature built
  for query j, MS-SL) and use `paired_nce` / `paired_triplet_loss`.
  With text mass and `config.loss.stochastic_support` = w > 0, each branch with support
  matrices (`<branch>_support_{scores,logits}`) adds `<branch>_support` = w * (its NCE +
  its triplet, the same weights, negatives key and schedule) of the support queries.
  When the forward returns `gaussians` (the probabilistic plug-in), `probabilistic_terms`
  adds `proxy_matching` and `distribution_alignment` (after the model's own terms).
  Returns (sum of the terms, the terms).
  """
  def objective(model: nn.Module, params: Params, batch: Batch, rngs: Mapping[str, jax.Array],
                ctx: LossContext) -> tuple[jax.Array, dict[str, jax.Array]]:
    cfg = ctx.loss
    outputs = model.apply({'params': params}, batch, deterministic=False,
                          rngs={k: v for k, v in rngs.items() if k != 'negatives'})
    masks = batch_masks(batch)
    keys = dict(zip(('clip', 'frame'), jax.random.split(rngs['negatives'])))
    use_nce = cfg.get('use_nce', True)
    triplet = dict(margin=cfg.margin, hard_pool_size=cfg.hard_pool_size,
                   use_hard_negative=ctx.epoch >= cfg.hard_negative_start_epoch)

    def retrieval(branch: str, prefix: str) -> tuple[jax.Array, jax.Array]:
      """(weighted NCE, triplet) of the branch's `<prefix>_{logits,scores}`."""
      weight = cfg[f'{branch}_nce']
      if branch == 'frame' and paired_frames:
        valid = batch['query_valid']
        return (weight * losses.paired_nce(outputs[f'{prefix}_logits'], valid),
                losses.paired_triplet_loss(outputs[f'{prefix}_scores'], valid,
                                           key=keys[branch], **triplet))
      return (weight * losses.clip_nce(outputs[f'{prefix}_logits'], **masks),
              losses.triplet_loss(outputs[f'{prefix}_scores'], **masks, key=keys[branch],
                                  **triplet))

    clip_nce, clip_triplet = retrieval('clip', 'clip')
    terms = {'clip_nce': clip_nce, 'clip_triplet': clip_triplet,
             **extra_terms(outputs, batch, cfg)}
    if 'gaussians' in outputs:
      terms.update(probabilistic_terms(outputs, batch, cfg))
    terms['frame_nce'], terms['frame_triplet'] = retrieval('frame', 'frame')
    if not use_nce:
      del terms['clip_nce'], terms['frame_nce']
    support = cfg.get('stochastic_support', 0)
    for branch in ('clip', 'frame'):
      if support and f'{branch}_support_scores' in outputs:
        nce, triplet_term = retrieval(branch, f'{branch}_support')
        terms[f'{branch}_support'] = support * (nce + triplet_term if use_nce else triplet_term)
    return jnp.sum(jnp.stack(list(terms.values()))), terms
  return objective


def spec(name: str, module: type[nn.Module], objective: Objective, official: Any = None,
         extra_rng_streams: tuple[str, ...] = (), **fields: Any) -> ModelSpec:
  """The registry entry of a two-branch model: RNG streams 'dropout', 'negatives', the model's
  `extra_rng_streams`, 'sampling' (text mass) and, unless listed already, 'sample' (the
  probabilistic plug-in's samples); each plug-in's stream was appended last, so that adding it
  left the other streams' keys as they were. The official BertAdam groups, GMM branches
  clipped one by one, `text_mass.TEXT_MASS_SPEC`; with `official`, a package defining `names`
  and `infer_config`, the official checkpoints are read (the plug-ins' parameters have no
  official names: `prvr_jax.convert` refuses them). `fields` are the model's other `ModelSpec`
  fields."""
  return ModelSpec(
      name=name, module=module, objective=objective,
      rng_streams=('dropout', 'negatives', *extra_rng_streams, 'sampling',
                   *(() if SAMPLE_STREAM in extra_rng_streams else (SAMPLE_STREAM,))),
      no_decay=OFFICIAL_NO_DECAY, stacked=(rf'(^|/){BRANCHES}/',),
      official=(None if official is None else
                OfficialCheckpoint(names=official.names, infer_config=official.infer_config)),
      **TEXT_MASS_SPEC, **fields)
