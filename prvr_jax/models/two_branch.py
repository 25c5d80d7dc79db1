"""What the clip-and-frame models of the MS-SL lineage share (MS-SL, GMMFormer, GMMFormer v2,
ProtoPRVR).

* `TwoBranchModel`: a query vector scored against a clip branch (max over clips) and a frame
  branch, fused `clip_score_weight * S_c + frame_score_weight * S_f`; the query branch; the
  training forward with the in-batch matrices the losses use; T-MASS's "text mass" as a
  plug-in (`stochastic_text`, docs/text_mass_plugin.md).
* `make_objective`: InfoNCE (raw dot products) + triplet (cosines) on both branches, plus the
  model's own terms; `diversity_and_matching`, GMMFormer v2's L_div and L_om, which any model
  with a second query encoding and clip features can add.
* `spec`: their registry entry, with the official BertAdam weight-decay groups as
  parameter-path rules and the GMM blocks' stacked branches.
"""

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from prvr_jax import losses
from prvr_jax.layers import stochastic_text
from prvr_jax.layers.gmm_block import BRANCHES
from prvr_jax.models import batch as batch_lib
from prvr_jax.models.spec import Batch, LossContext, ModelSpec, Objective, OfficialCheckpoint
from prvr_jax.models.spec import Params
from prvr_jax.ops import l2_normalize, max_similarities, max_similarity, set_similarities

# The official groups exempt torch names containing 'bias', 'LayerNorm.weight' or
# 'LayerNorm.bias'. Our modules named `norm` are exactly the official `LayerNorm`s (v2's
# `norm1`/`norm2` keep their official names and are decayed, as officially).
OFFICIAL_NO_DECAY = (r'(^|/)bias$', r'(^|/)norm/scale$')


class TwoBranchModel(nn.Module):
  """Base of the two-branch models: the fields they share (the official defaults; the
  config's `model` section sets them). Subclasses define `setup` (setting `self.query`, a
  `QueryEncoder`, and `self.radius = self.text_mass_radius()`), `encode_videos` (returning
  `self.with_key(stored, videos)`), `frame_similarity` and `text_mass_sets`.

  Text mass (T-MASS as a plug-in; all off by default, which leaves the model as it was):

  Attributes:
    stochastic_text: the query of each max-over-set branch (`TEXT_MASS_BRANCHES`) becomes a
      mass `q + eps * R`; evaluation scores each (query, video) pair by the best of
      `stochastic_samples` samples (branches fused per sample), training uses one draw per
      query with the radius of its own video.
    stochastic_samples: M, samples per pair at evaluation.
    stochastic_top_k: the radius input: the query's k largest cosines with the branch's
      stored elements of the video, sorted descending (order-invariant).
    stochastic_prior: 'uniform01' (T-MASS's official default) or 'normal'.
    stochastic_std: the normal prior's std.
  """
  hidden_dim: int = 384
  num_heads: int = 4
  max_query_len: int = 30
  max_frames: int = 128
  num_clips: int = 32
  dropout: float = 0.2
  input_dropout: float = 0.2
  clip_score_weight: float = 0.7
  frame_score_weight: float = 0.3
  stochastic_text: bool = False
  stochastic_samples: int = 20
  stochastic_top_k: int = 8
  stochastic_prior: str = 'uniform01'
  stochastic_std: float = 1.0

  # The branches whose score is a max over a stored set: text mass applies to them.
  TEXT_MASS_BRANCHES: ClassVar[tuple[str, ...]] = ('clip', 'frame')

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

  def text_mass_sets(self, videos: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """branch of `TEXT_MASS_BRANCHES` -> the stored set `[B, L, D]` its score is the max
    over."""
    raise NotImplementedError

  def encode_queries(self, queries: Batch, deterministic: bool = True) -> jax.Array:
    """A query batch (`query_feats [Q, Lq, Dq]`, `query_mask [Q, Lq]`) -> `[Q, D]`."""
    return self.query(queries['query_feats'], queries['query_mask'], deterministic)

  def score(self, queries: jax.Array, videos: Mapping[str, jax.Array]) -> jax.Array:
    """`[Q, B]` = clip_score_weight * max-clip cosine + frame_score_weight * frame cosine
    (with text mass: `text_mass_score`)."""
    if self.stochastic_text:
      return self.text_mass_score(queries, videos)
    return self._fuse(max_similarity(queries, videos['clips'], cosine=True),
                      self.frame_similarity(queries, videos, cosine=True))

  def _fuse(self, clip_scores: jax.Array, frame_scores: jax.Array) -> jax.Array:
    return self.clip_score_weight * clip_scores + self.frame_score_weight * frame_scores

  def _branch_similarities(self, branch: str, queries: jax.Array,
                           videos: Mapping[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """(cosine, raw dot) similarities `[Q, B]` of a branch."""
    if branch == 'clip':
      return max_similarities(queries, videos['clips'])
    return self.frame_similarities(queries, videos)

  def __call__(self, batch: Batch, deterministic: bool = True) -> dict[str, jax.Array]:
    """The training forward: in-batch matrices `[Q, B]` (cosines for the triplet terms and the
    fused `scores`, raw dots for InfoNCE) and the embeddings the other terms need. With text
    mass the training matrices score the stochastic queries, `<branch>_support_{scores,
    logits}` the support queries; deterministic `scores` are `score`'s."""
    videos = self.encode_videos(batch, deterministic)
    queries = self.encode_queries(batch, deterministic)
    # A second encoding with its own dropout mask feeds QDL and OM, as in the official code.
    queries_aux = self.encode_queries(batch, deterministic)
    scored, support = self.text_mass_training(queries, videos, batch['query_video'],
                                              deterministic)
    out = {'queries': queries, 'queries_aux': queries_aux, 'clips': videos['clips']}
    for branch in ('clip', 'frame'):
      out[f'{branch}_scores'], out[f'{branch}_logits'] = self._branch_similarities(
          branch, scored[branch], videos)
    for branch, point in support.items():
      out[f'{branch}_support_scores'], out[f'{branch}_support_logits'] = (
          self._branch_similarities(branch, point, videos))
    out['scores'] = (self.score(queries, videos) if self.stochastic_text and deterministic
                     else self._fuse(out['clip_scores'], out['frame_scores']))
    return out

  # --------------------------------------------------------------------------- text mass

  def text_mass_radius(self) -> dict[str, nn.Module]:
    """The radius layers (for `setup`): one `SimilarityRadius` per text-mass branch, none
    when text mass is off (the parameter tree is then unchanged)."""
    if not self.stochastic_text:
      return {}
    if self.stochastic_prior not in stochastic_text.PRIORS:
      raise ValueError(f'config.model.stochastic_prior={self.stochastic_prior!r}; expected one '
                       f'of {stochastic_text.PRIORS}')
    return {branch: stochastic_text.SimilarityRadius(self.hidden_dim)
            for branch in self.TEXT_MASS_BRANCHES}

  def with_key(self, stored: dict[str, jax.Array], videos: Batch) -> dict[str, jax.Array]:
    """`stored` plus, with text mass on and a `video_seed` in `videos` (evaluation batches),
    `key [B]` int32: the video's seed (a hash of its id), which draws its noise bank."""
    if self.stochastic_text and 'video_seed' in videos:
      stored = {**stored, 'key': videos['video_seed'].astype(jnp.int32)}
    return stored

  def text_mass_noise(self, keys: jax.Array) -> jax.Array:
    """`[B, M, D]` noise banks of the videos `keys [B]`, from the 'sampling' stream."""
    return stochastic_text.video_noise_bank(self.make_rng('sampling'), keys,
                                            self.stochastic_samples, self.hidden_dim,
                                            self.stochastic_prior, self.stochastic_std)

  def _top_k(self, cosines: jax.Array) -> jax.Array:
    """The radius input: cosines `[..., L]` with a set -> its sorted top-k `[..., k]`."""
    return stochastic_text.sorted_top_k(cosines, self.stochastic_top_k)

  def _radius(self, branch: str, top_k: jax.Array) -> jax.Array:
    """R `[..., D]` = exp(SimilarityRadius(top_k `[..., k]`)) of the branch."""
    return jnp.exp(self.radius[branch](top_k))

  def text_mass_score(self, queries: Any, videos: Mapping[str, jax.Array],
                      query_chunk: int | None = None) -> jax.Array:
    """`[Q, B]` = max over M samples of the fused text-mass branches (paper Eq. 10 with a max
    over each set), each pair with its own radius and each video with its own noise bank
    (`fold_in(key, videos['key'][b])`), so a pair's score does not depend on the other
    queries and videos. `query_chunk` queries at a time (all when None): per chunk c the
    cosines `[c, B, L]` of one sample; the radii `[Q, B, D]` are held for all queries. A
    subclass with a deterministic branch adds its weighted score to the result."""
    if 'key' not in videos:
      raise ValueError('stochastic_text: the stored videos have no `key`; encode_videos needs '
                       'the video batch\'s `video_seed`')
    sets = self.text_mass_sets(videos)
    branches = list(sets)
    texts = [self.branch_query(queries, branch) for branch in branches]
    weights = [self.clip_score_weight if b == 'clip' else self.frame_score_weight
               for b in branches]

    def by_queries(fn, *args):  # fn of [Q, ...] arrays, applied query_chunk queries at a time
      if query_chunk is None:
        return fn(*args)
      return jax.lax.map(lambda xs: fn(*[x[None] for x in xs])[0], args,
                         batch_size=min(query_chunk, args[0].shape[0]))

    radii = [self._radius(branch, by_queries(
        lambda t, b=branch: self._top_k(set_similarities(t, sets[b], cosine=True)), text))
             for branch, text in zip(branches, texts)]
    noise = self.text_mass_noise(videos['key'])
    elements = [sets[branch] for branch in branches]
    return by_queries(
        lambda *xs: stochastic_text.max_over_samples_and_sets(
            xs[:len(branches)], xs[len(branches):], elements, weights, noise), *texts, *radii)

  def branch_query(self, queries: Any, branch: str) -> jax.Array:
    """The query embedding `[Q, D]` a branch scores (one for both branches by default)."""
    del branch
    return queries

  def text_mass_training(self, queries: Any, videos: Mapping[str, jax.Array], own: jax.Array,
                         deterministic: bool) -> tuple[dict[str, jax.Array],
                                                       dict[str, jax.Array]]:
    """(branch -> the query `[Q, D]` its training matrices score, branch -> support query).

    Off or deterministic: each branch's deterministic query, no support queries. Training
    with text mass: one draw `eps [Q, D]` (the 'sampling' stream) per query, shared by the
    branches; branch c scores `q_c + eps * R_c(q_c, own video)`, and its support query is
    `q_c + (e* - q_c) / ||e* - q_c|| * R_c` with e* the element of the own video's set
    closest (cosine) to q_c (paper Eq. 8). Branches outside `TEXT_MASS_BRANCHES` keep q.
    """
    scored = {b: self.branch_query(queries, b) for b in ('clip', 'frame')}
    if not self.stochastic_text or deterministic:
      return scored, {}
    eps = stochastic_text.draw_noise(self.make_rng('sampling'), scored['clip'].shape,
                                     self.stochastic_prior, self.stochastic_std)
    support = {}
    for branch, elements in self.text_mass_sets(videos).items():
      text, own_set = scored[branch], elements[own]  # [Q, D], [Q, L, D]
      cosines = jnp.einsum('qd,qld->ql', l2_normalize(text), l2_normalize(own_set))
      radius = self._radius(branch, self._top_k(cosines))
      best = jnp.take_along_axis(own_set, jnp.argmax(cosines, axis=-1)[:, None, None],
                                 axis=1)[:, 0]
      scored[branch] = text + eps * radius
      support[branch] = stochastic_text.support_text(text, best, radius)
    return scored, support


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


def text_mass_inputs(config_model: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """(video inputs, query inputs): with text mass, the videos' `video_seed` too."""
  videos = batch_lib.VIDEO_INPUTS
  if config_model.get('stochastic_text'):
    videos += ('video_seed',)
  return videos, batch_lib.QUERY_INPUTS


# What a two-branch model's spec adds for text mass (unused while it is off): the 'sampling'
# stream in `score` (and, last in `rng_streams`, in training: `jax.random.split` then leaves
# the other streams' keys as they were), and the video seed among the video inputs.
TEXT_MASS_SPEC = dict(score_rng_streams=('sampling',), input_keys=text_mass_inputs)


def spec(name: str, module: type[nn.Module], objective: Objective, official: Any,
         **fields: Any) -> ModelSpec:
  """The registry entry of a two-branch model whose package `official` defines `names` and
  `infer_config`: RNG streams 'dropout', 'negatives' and 'sampling', the official BertAdam
  groups, GMM branches clipped one by one, `TEXT_MASS_SPEC`; `fields` are the model's other
  `ModelSpec` fields."""
  return ModelSpec(
      name=name, module=module, objective=objective,
      rng_streams=('dropout', 'negatives', 'sampling'), no_decay=OFFICIAL_NO_DECAY,
      stacked=(rf'(^|/){BRANCHES}/',),
      official=OfficialCheckpoint(names=official.names, infer_config=official.infer_config),
      **TEXT_MASS_SPEC, **fields)
