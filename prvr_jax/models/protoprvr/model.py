"""ProtoPRVR (Moon et al., ICCV 2025): each video is stored as a fixed set of prototypes.

Branches (as MS-SL): the clip branch encodes the 32 clips (projection, positional encoding,
one attention block) and forms the 528 exhaustive multi-scale clips; the frame branch encodes
the frames. A prototype generator (`prvr_jax.layers.prototypes`) aggregates each branch into
`num_prototypes` vectors, which are all that is stored. The query tokens are encoded once and
attention-pooled to one vector per branch. Score per branch: max over the prototypes of the
cosine; S = clip_score_weight * S_c + frame_score_weight * S_f. Text mass (`stochastic_text`)
applies to both branches (each branch's query vector with its own radius, one noise draw).

The training forward also returns what the prototype losses need (docs/protoprvr.md):
the retrieved prototype's reconstruction of masked query tokens, the prototypes'
reconstruction of the input features, and, for videos mixed in pairs, the retrieved
prototype's attention mass on each half.
"""

from collections.abc import Mapping
import functools

import jax
import jax.numpy as jnp
import numpy as np

from prvr_jax.layers import AttentionPooling, SequenceEncoder, exhaustive_clips
from prvr_jax.layers.multiscale import averaging_matrix
from prvr_jax.layers.prototypes import GENERATORS, UPDATES
from prvr_jax.layers.reconstruction import BroadcastDecoder, MaskedTokenDecoder
from prvr_jax.models.spec import Batch, position_scores, real_positions
from prvr_jax.models.two_branch import TwoBranchModel
from prvr_jax.ops import l2_normalize, max_similarities, max_similarity, set_cosines_and_dots

BRANCHES = ('clip', 'frame')


def mix_halves(feats: jax.Array, lengths: jax.Array) -> jax.Array:
  """Video b and video b + 1 (mod B) in one sequence at twice the frame rate.

  Each video's real positions are resampled (nearest, evenly spaced) to half of L, video b's
  into the first half and video b + 1's into the second.

  Args:
    feats: [B, L, D] features, real positions first.
    lengths: [B] int, real positions per video (0 for padding videos).
  Returns:
    [B, L, D]; positions < L // 2 come from video b.
  """
  size = feats.shape[1]
  halves = []
  for shift, slots in ((0, size // 2), (1, size - size // 2)):
    source, length = jnp.roll(feats, -shift, axis=0), jnp.roll(lengths, -shift)
    index = jnp.floor((jnp.arange(slots) + 0.5) * length[:, None] / slots).astype(jnp.int32)
    index = jnp.clip(index, 0, jnp.maximum(length[:, None] - 1, 0))
    halves.append(jnp.take_along_axis(source, index[..., None], axis=1))
  return jnp.concatenate(halves, axis=1)


def first_half_share(length: int, multiscale: bool = False) -> np.ndarray:
  """The share of each position of a `mix_halves` sequence of `length` that lies in the first
  video: `[length]` of 1 / 0, or with `multiscale` `[length (length + 1) / 2]` for the
  exhaustive pools of `length` mixed clips (a pool straddling the two videos counts the
  fraction of its clips in the first half)."""
  first = (np.arange(length) < length // 2).astype(np.float32)
  return averaging_matrix(length) @ first if multiscale else first


class ProtoPRVR(TwoBranchModel):
  """Attributes mirror `config.model` (configs/protoprvr.py); the shared ones are
  `TwoBranchModel`'s.

  Attributes:
    num_prototypes: prototypes per branch (L^p).
    prototype_iterations: K.
    prototype_generator: 'cross_attention' (ProtoPRVR), 'perceiver' or 'slot_attention'
      (Table 6).
    prototype_update: Eq. 1's form (`layers.prototypes.UPDATES`): 'detr' (the learned
      prototypes added to the attention queries, the content starting at 0) or 'paper'
      (P^(0) = P, the state the only query). Slot Attention always starts its slots at P.
    share_prototypes: both branches use one generator (one set of learned prototypes).
    mask_ratio: share of the query length masked for the cross-modal reconstruction (the
      count, at least 1, is round(mask_ratio * max_query_len), the same positions for every
      query of the batch).
  """
  dropout: float = 0.1
  input_dropout: float = 0.1
  num_prototypes: int = 30
  prototype_iterations: int = 1
  prototype_generator: str = 'cross_attention'
  prototype_update: str = 'detr'
  share_prototypes: bool = False
  mask_ratio: float = 0.15

  def setup(self):
    if self.prototype_generator not in GENERATORS:
      raise ValueError(f'model.prototype_generator={self.prototype_generator!r}: expected one '
                       f'of {sorted(GENERATORS)}')
    if self.prototype_update not in UPDATES:
      raise ValueError(f'model.prototype_update={self.prototype_update!r}: expected one of '
                       f'{list(UPDATES)}')
    encoder = dict(hidden_dim=self.hidden_dim, num_heads=self.num_heads, block='v1',
                   dropout=self.dropout, input_dropout=self.input_dropout)
    self.query = SequenceEncoder(max_len=self.max_query_len, **encoder)
    self.clip_query_pooling = AttentionPooling()
    self.frame_query_pooling = AttentionPooling()
    self.clip = SequenceEncoder(max_len=self.max_frames, **encoder)
    self.frame = SequenceEncoder(max_len=self.max_frames, **encoder)
    update = ({} if self.prototype_generator == 'slot_attention'
              else {'update': self.prototype_update})
    generator = functools.partial(
        GENERATORS[self.prototype_generator], num_prototypes=self.num_prototypes,
        num_heads=self.num_heads, iterations=self.prototype_iterations, dropout=self.dropout,
        **update)
    self.clip_prototypes = generator()
    self.frame_prototypes = self.clip_prototypes if self.share_prototypes else generator()
    self.text_decoder = MaskedTokenDecoder(self.hidden_dim, self.num_heads, self.max_query_len,
                                           self.dropout)
    self.clip_decoder = BroadcastDecoder(self.hidden_dim, self.num_clips)
    self.frame_decoder = BroadcastDecoder(self.hidden_dim, self.max_frames)
    self.radius = self.text_mass_radius()
    self.prob = self.probabilistic_heads()

  def _prototypes(self, videos: Batch, deterministic: bool, frames: bool = False
                  ) -> dict[str, tuple[jax.Array, jax.Array]]:
    """branch -> (prototypes `[B, P, D]`, attention `[B, P, L]` over the branch's positions:
    528 multi-scale clips, or the frames); with `frames` also 'frames': the encoded frames
    `[B, Lf, D]` the frame prototypes aggregate."""
    clips = exhaustive_clips(self.clip(videos['clip_feats'], None, deterministic))
    encoded = self.frame(videos['frame_feats'], videos['frame_mask'], deterministic)
    out = {'clip': self.clip_prototypes(clips, None, deterministic),
           'frame': self.frame_prototypes(encoded, videos['frame_mask'], deterministic)}
    if frames:
      out['frames'] = encoded
    return out

  def encode_videos(self, videos: Batch, deterministic: bool = True) -> dict[str, jax.Array]:
    """`clip_feats [B, Lc, Dv]`, `frame_feats [B, Lf, Dv]`, `frame_mask [B, Lf]` ->
    {'clip_prototypes', 'frame_prototypes'}, each `[B, P, D]`, with text mass also `key [B]`
    (`video_seed`)."""
    return self.with_key({f'{branch}_prototypes': prototypes for branch, (prototypes, _)
                          in self._prototypes(videos, deterministic).items()}, videos)

  def text_mass_sets(self, videos: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    return {branch: videos[f'{branch}_prototypes'] for branch in BRANCHES}

  def branch_query(self, queries: Mapping[str, jax.Array], branch: str) -> jax.Array:
    return queries[branch]

  def _query_tokens(self, queries: Batch, deterministic: bool) -> jax.Array:
    return self.query(queries['query_feats'], queries['query_mask'], deterministic)

  def _pool(self, tokens: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
    return {'clip': self.clip_query_pooling(tokens, mask),
            'frame': self.frame_query_pooling(tokens, mask)}

  def encode_queries(self, queries: Batch, deterministic: bool = True) -> dict[str, jax.Array]:
    """`query_feats [Q, Lq, Dq]`, `query_mask [Q, Lq]` -> {'clip', 'frame'}, each `[Q, D]`."""
    return self._pool(self._query_tokens(queries, deterministic), queries['query_mask'])

  def score(self, queries: Mapping[str, jax.Array], videos: Mapping[str, jax.Array]
            ) -> jax.Array:
    """`[Q, B]`: clip_score_weight * max-prototype cosine (clip) + frame_score_weight * the
    same of the frame branch (with text mass: `text_mass_score`)."""
    if self.stochastic_text:
      return self.text_mass_score(queries, videos)
    return self._fuse(*(max_similarity(queries[b], videos[f'{b}_prototypes'], cosine=True)
                        for b in BRANCHES))

  def relevance(self, queries: Batch, videos: Batch) -> dict[str, jax.Array]:
    """`ModelSpec.relevance`: `Q` queries, their `Q` videos -> the attention of the prototype
    that scores the pair (the best cosine) in each branch: 'clip prototype attention'
    `[Q, Lc]` (its weights on the multi-scale clips shared out over the clips each covers)
    and 'frame prototype attention' `[Q, Lf]` (NaN at padded frames); each sums to 1."""
    encoded = self.encode_queries(queries)
    chosen = {}
    for branch, (prototypes, attention) in self._prototypes(videos, deterministic=True).items():
      best = jnp.argmax(position_scores(encoded[branch], prototypes), axis=-1)  # [Q]
      chosen[branch] = jnp.take_along_axis(attention, best[:, None, None], axis=1)[:, 0]
    spread = jnp.asarray(averaging_matrix(videos['clip_feats'].shape[1]))  # [P, Lc]
    return {'clip prototype attention': chosen['clip'] @ spread,
            'frame prototype attention': real_positions(chosen['frame'], videos['frame_mask'])}

  def _masked_positions(self, query_mask: jax.Array, deterministic: bool
                        ) -> tuple[jax.Array, jax.Array]:
    """(positions `[M]`, masked `[Q, Lq]` bool): M = round(mask_ratio * Lq) (at least 1)
    distinct positions shared by the batch, drawn from the 'masking' stream among the
    positions every query has (then the others); the first M when deterministic."""
    length = query_mask.shape[1]
    count = min(length, max(1, round(self.mask_ratio * length)))
    if deterministic:
      positions = jnp.arange(count)
    else:
      lengths = query_mask.sum(axis=1)
      shortest = jnp.min(jnp.where(lengths > 0, lengths, length))
      priority = (jax.random.uniform(self.make_rng('masking'), (length,))
                  + (jnp.arange(length) >= shortest))
      positions = jnp.argsort(priority)[:count]
    masked = jnp.zeros(query_mask.shape, bool).at[:, positions].set(True) & (query_mask > 0)
    return positions, masked

  def __call__(self, batch: Batch, deterministic: bool = True) -> dict[str, jax.Array]:
    """The training forward: per branch the in-batch `[Q, B]` matrices (max-prototype cosines
    `<b>_scores`, raw dots `<b>_logits`), the fused `scores`, and the prototype terms' inputs:
    `<b>_prototypes [B, P, D]`; `<b>_reconstructed_tokens [Q, M, Dq]` against
    `masked_tokens [Q, M, Dq]` (`masked_real [Q, M]`); `<b>_reconstruction` of
    `<b>_reconstruction_target` (`[B, L, Dv]`); `<b>_first_share [Q, 2]`, the retrieved
    prototype's attention on the first video of the pair (query's video, next video) and of
    the pair (previous video, query's video). Training with text mass: `<b>_scores` /
    `<b>_logits` of the stochastic queries, `<b>_support_{scores,logits}` of the support
    queries. With the probabilistic plug-in, in training, `gaussians` of the encoded frames
    and the query tokens."""
    prototypes = self._prototypes(batch, deterministic,
                                  frames=self.wants_gaussians(deterministic))
    tokens = self._query_tokens(batch, deterministic)
    queries = self._pool(tokens, batch['query_mask'])
    own = batch['query_video']
    num_queries = own.shape[0]
    stored = self.with_key({f'{b}_prototypes': prototypes[b][0] for b in BRANCHES}, batch)
    # Text mass in training: the retrieval matrices score the stochastic queries (the
    # prototype terms keep the deterministic ones).
    scored, support = self.text_mass_training(queries, stored, own, deterministic)
    out = {}
    cosines = {}
    for branch in BRANCHES:
      protos = prototypes[branch][0]
      cosines[branch], products = set_cosines_and_dots(queries[branch], protos)
      if support:
        out[f'{branch}_scores'], out[f'{branch}_logits'] = max_similarities(scored[branch], protos)
        out[f'{branch}_support_scores'], out[f'{branch}_support_logits'] = max_similarities(
            support[branch], protos)
      else:
        out[f'{branch}_scores'] = jnp.max(cosines[branch], axis=-1)
        out[f'{branch}_logits'] = jnp.max(products, axis=-1)
      out[f'{branch}_prototypes'] = protos
    out['scores'] = (self.score(queries, stored) if self.stochastic_text and deterministic
                     else self._fuse(out['clip_scores'], out['frame_scores']))

    # Cross-modal: masked tokens rebuilt from the query's best prototype in its own video.
    positions, masked = self._masked_positions(batch['query_mask'], deterministic)
    out['masked_tokens'] = jnp.take(batch['query_feats'], positions, axis=1)
    out['masked_real'] = jnp.take(masked, positions, axis=1)
    for branch in BRANCHES:
      best = jnp.argmax(cosines[branch][jnp.arange(num_queries), own], axis=-1)
      retrieved = prototypes[branch][0][own, best]
      rebuilt = self.text_decoder(batch['query_feats'], batch['query_mask'], masked, retrieved,
                                  deterministic)
      out[f'{branch}_reconstructed_tokens'] = jnp.take(rebuilt, positions, axis=1)

    # Uni-modal: the input features rebuilt from all prototypes.
    for branch, decoder, target in (('clip', self.clip_decoder, batch['clip_feats']),
                                    ('frame', self.frame_decoder, batch['frame_feats'])):
      out[f'{branch}_reconstruction'] = decoder(prototypes[branch][0], target.shape[1],
                                                target.shape[-1])
      out[f'{branch}_reconstruction_target'] = target

    # Weak guidance: pair b holds video b (first half) and video b + 1 (second half).
    frame_lengths = batch['frame_mask'].sum(axis=1).astype(jnp.int32)
    num_clips = batch['clip_feats'].shape[1]
    mixed = self._prototypes({
        'clip_feats': mix_halves(batch['clip_feats'],
                                 jnp.full(frame_lengths.shape, num_clips, jnp.int32)),
        'frame_feats': mix_halves(batch['frame_feats'], frame_lengths),
        'frame_mask': mix_halves(batch['frame_mask'][..., None], frame_lengths)[..., 0]},
        deterministic)
    shares = {'clip': first_half_share(num_clips, multiscale=True),
              'frame': first_half_share(batch['frame_feats'].shape[1])}
    pairs = jnp.stack([own, own - 1], axis=1) % prototypes['clip'][0].shape[0]  # [Q, 2]
    for branch in BRANCHES:
      protos, attention = mixed[branch]
      first_share = attention @ jnp.asarray(shares[branch], attention.dtype)  # [B, P]
      pair_cosines = jnp.einsum('qd,qkpd->qkp', l2_normalize(queries[branch]),
                                l2_normalize(protos[pairs]))
      best = jnp.argmax(pair_cosines, axis=-1)  # [Q, 2]
      out[f'{branch}_first_share'] = jnp.take_along_axis(first_share[pairs], best[..., None],
                                                         axis=-1)[..., 0]
    # The probabilistic plug-in, in training: the encoded frames and the query tokens.
    out.update(self.probabilistic_outputs({'frames': prototypes.get('frames')}, tokens, batch,
                                          deterministic))
    return out

