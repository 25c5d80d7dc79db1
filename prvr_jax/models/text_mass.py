"""T-MASS's "text mass" as a plug-in for models that score a query against stored sets by the
max over each set (docs/text_mass_plugin.md).

`TextMass` is a mixin a Linen model lists among its bases to opt in (`TwoBranchModel` does, so
MS-SL, GMMFormer, GMMFormer v2 and ProtoPRVR have it). It adds the `stochastic_*` fields (all
off by default, which leaves the model, its parameter tree and its stored encodings as they
were) and the plug-in's methods. The model provides:

* `hidden_dim`, the width of the query and stored vectors;
* `TEXT_MASS_BRANCHES`, its max-over-set branches, and `text_mass_sets(stored)`, each one's set;
* `branch_weights()`, branch -> the weight of its score in the fused score (every branch the
  model scores; those outside `TEXT_MASS_BRANCHES` keep the deterministic query);
* `branch_query(queries, branch)` when a branch scores its own query vector (default: one
  `[Q, D]` query for every branch);
* in `setup`, `self.radius = self.text_mass_radius()`, and from `encode_videos`,
  `self.with_key(stored, videos)`;
* in `score`, `text_mass_score` when `stochastic_text` is on, and in its training forward the
  queries of `text_mass_training`.
"""

from collections.abc import Mapping
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from prvr_jax.layers import stochastic_text
from prvr_jax.models import batch as batch_lib
from prvr_jax.models.spec import Batch
from prvr_jax.ops import l2_normalize, set_similarities


class TextMass(nn.Module):
  """The text-mass plug-in (T-MASS): fields and methods; see the module docstring for what the
  model that lists it provides.

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
  stochastic_text: bool = False
  stochastic_samples: int = 20
  stochastic_top_k: int = 8
  stochastic_prior: str = 'uniform01'
  stochastic_std: float = 1.0

  # The branches whose score is a max over a stored set: text mass applies to them.
  TEXT_MASS_BRANCHES: ClassVar[tuple[str, ...]] = ('clip', 'frame')

  def text_mass_sets(self, videos: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """branch of `TEXT_MASS_BRANCHES` -> the stored set `[B, L, D]` its score is the max
    over."""
    raise NotImplementedError

  def branch_weights(self) -> dict[str, float]:
    """Every scored branch -> the weight of its score in the fused score."""
    raise NotImplementedError

  def branch_query(self, queries: Any, branch: str) -> jax.Array:
    """The query embedding `[Q, D]` a branch scores (one for every branch by default)."""
    del branch
    return queries

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
    model with a deterministic branch adds its weighted score to the result."""
    if 'key' not in videos:
      raise ValueError('stochastic_text: the stored videos have no `key`; encode_videos needs '
                       'the video batch\'s `video_seed`')
    sets = self.text_mass_sets(videos)
    branches = list(sets)
    texts = [self.branch_query(queries, branch) for branch in branches]
    branch_weights = self.branch_weights()
    weights = [branch_weights[branch] for branch in branches]

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

  def text_mass_training(self, queries: Any, videos: Mapping[str, jax.Array], own: jax.Array,
                         deterministic: bool) -> tuple[dict[str, jax.Array],
                                                       dict[str, jax.Array]]:
    """(branch -> the query `[Q, D]` its training matrices score, branch -> support query),
    over the branches of `branch_weights`; `own [Q]` is each query's video in the batch.

    Off or deterministic: each branch's deterministic query, no support queries. Training
    with text mass: one draw `eps [Q, D]` (the 'sampling' stream) per query, shared by the
    branches; branch c scores `q_c + eps * R_c(q_c, own video)`, and its support query is
    `q_c + (e* - q_c) / ||e* - q_c|| * R_c` with e* the element of the own video's set
    closest (cosine) to q_c (paper Eq. 8). Branches outside `TEXT_MASS_BRANCHES` keep q.
    """
    scored = {b: self.branch_query(queries, b) for b in self.branch_weights()}
    if not self.stochastic_text or deterministic:
      return scored, {}
    eps = stochastic_text.draw_noise(self.make_rng('sampling'),
                                     scored[self.TEXT_MASS_BRANCHES[0]].shape,
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


def text_mass_inputs(config_model: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """(video inputs, query inputs): with text mass, the videos' `video_seed` too."""
  videos = batch_lib.VIDEO_INPUTS
  if config_model.get('stochastic_text'):
    videos += ('video_seed',)
  return videos, batch_lib.QUERY_INPUTS


# What the spec of a model with the plug-in adds (unused while it is off): the 'sampling'
# stream in `score` (and, last in `rng_streams`, in training: `jax.random.split` then leaves
# the other streams' keys as they were), and the video seed among the video inputs.
TEXT_MASS_SPEC = dict(score_rng_streams=('sampling',), input_keys=text_mass_inputs)
