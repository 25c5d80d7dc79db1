"""MS-SL (Dong et al., ACM MM 2022) as coded in the official implementation.

Query branch: as GMMFormer v1 (projection -> positional encoding -> attention block ->
attention pooling). Clip branch: projection -> positional encoding -> one attention block over
the 32 clips -> every average pool of length 1..32 (528 multi-scale clips). Frame branch:
projection -> positional encoding -> one masked attention block over the frames (not pooled).

Scores: S_c = max over the multi-scale clips of the cosine; S_f = cosine of the query with the
key-clip guided attention (KCGA) over the video's frames, keyed by the query's best clip of
that video. Eval S = clip_score_weight * S_c + frame_score_weight * S_f. Stored per video
(`encode_videos`): the 32 clips, the inverse norms of the multi-scale clips and the KCGA
tables of the frames (`KeyClipGuidedAttention.tables`), about a quarter of the floats of the
multi-scale clips and frames, from which a pair's score needs no `[D, D]` projection; training
scores the encoded frames themselves (`training_videos`). In training the frame matrix is
`[Q, Q]`: query i against the KCGA feature built for query j (in j's video).

Text mass (`stochastic_text`) applies to the clip branch only: the frame score is a cosine with
one attended feature per (query, video) pair, whose key clip the deterministic query picks; a
sample would need its own key clip and attention (`[Q, B, M, D]`), so S_f stays
deterministic and S = clip_score_weight * max_m S_c(sample m) + frame_score_weight * S_f.
"""

from collections.abc import Mapping
from typing import ClassVar

import jax
import jax.numpy as jnp

from prvr_jax.layers import KeyClipGuidedAttention, QueryEncoder, SequenceEncoder
from prvr_jax.layers import exhaustive_clips
from prvr_jax.layers.multiscale import averaging_matrix, key_clip_attention
from prvr_jax.models.spec import Batch, position_scores
from prvr_jax.models.two_branch import TwoBranchModel
from prvr_jax.ops import inverse_norm, l2_normalize, set_cosines_and_dots, set_similarities


class MSSL(TwoBranchModel):
  """Attributes mirror `config.model` (see configs/ms_sl.py); the shared ones are
  `TwoBranchModel`'s.

  Attributes:
    score_query_chunk: queries scored together by `score` (the KCGA of every pair of a chunk
      is materialised: about chunk * B * (P + 2 Lc + Lf + D) floats, docs/design.md).
  """
  score_query_chunk: int = 16

  TEXT_MASS_BRANCHES: ClassVar[tuple[str, ...]] = ('clip',)

  def setup(self):
    encoder = dict(hidden_dim=self.hidden_dim, num_heads=self.num_heads, block='v1',
                   dropout=self.dropout, input_dropout=self.input_dropout)
    self.query = QueryEncoder(max_query_len=self.max_query_len, **encoder)
    self.clip = SequenceEncoder(max_len=self.max_frames, **encoder)
    self.frame = SequenceEncoder(max_len=self.max_frames, **encoder)
    self.key_clip_attention = KeyClipGuidedAttention(self.hidden_dim)
    self.radius = self.text_mass_radius()
    self.prob = self.probabilistic_heads()

  def training_videos(self, videos: Batch, deterministic: bool) -> dict[str, jax.Array]:
    """`clip_feats [B, Lc, Dv]`, `frame_feats [B, Lf, Dv]`, `frame_mask [B, Lf]` ->
    {'clips': the encoded clips `[B, Lc, D]`, 'multiscale_clips': their averages
    `[B, Lc (Lc + 1) / 2, D]`, 'frames': `[B, Lf, D]`, 'frame_mask': `[B, Lf]`}, with text
    mass also `key [B]` (`video_seed`)."""
    clips = self.clip(videos['clip_feats'], None, deterministic)
    frames = self.frame(videos['frame_feats'], videos['frame_mask'], deterministic)
    return self.with_key({'clips': clips, 'multiscale_clips': exhaustive_clips(clips),
                          'frames': frames, 'frame_mask': videos['frame_mask']}, videos)

  def encode_videos(self, videos: Batch, deterministic: bool = True) -> dict[str, jax.Array]:
    """The stored form of `training_videos`' encodings: {'clips' `[B, Lc, D]`,
    'multiscale_inverse_norms' `[B, Lc (Lc + 1) / 2]` (the multi-scale clips themselves are
    formed from the clips, `clip_set`), 'frame_logits' `[B, Lc, Lf]` (each clip as a KCGA key
    against the frames), 'frame_values' `[B, Lf, D]`, 'frame_mask' `[B, Lf]`} (+ 'key')."""
    return self.stored_form(self.training_videos(videos, deterministic))

  def stored_form(self, encoded: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """`training_videos`' encodings -> `encode_videos`' (a function of the encodings alone)."""
    stored = {k: v for k, v in encoded.items() if k not in ('frames', 'multiscale_clips')}
    stored['multiscale_inverse_norms'] = inverse_norm(self.clip_set(encoded))
    stored['frame_logits'], stored['frame_values'] = self.key_clip_attention.tables(
        encoded['clips'], encoded['frames'])
    return stored

  def clip_set(self, videos: Mapping[str, jax.Array]) -> jax.Array:
    """The multi-scale clips `[B, Lc (Lc + 1) / 2, D]`: the training encodings hold them, the
    stored ones only their clips."""
    if 'multiscale_clips' in videos:
      return videos['multiscale_clips']
    return exhaustive_clips(videos['clips'])

  def text_mass_sets(self, videos: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    return {'clip': self.clip_set(videos)}

  def relevance(self, queries: Batch, videos: Batch) -> dict[str, jax.Array]:
    """`ModelSpec.relevance`: `Q` queries, their `Q` videos -> {'clip cosine': `[Q, Lc]`}, at
    each of the Lc clip positions the best cosine of the multi-scale clips covering it; its
    max over the positions is the pair's clip score S_c."""
    proposals = position_scores(self.encode_queries(queries),
                                self.clip_set(self.encode_videos(videos)))  # [Q, P]
    covers = jnp.asarray(averaging_matrix(videos['clip_feats'].shape[1]) > 0)  # [P, Lc]
    return {'clip cosine': jnp.max(jnp.where(covers, proposals[..., None], -jnp.inf), axis=1)}

  def score(self, queries: jax.Array, videos: Mapping[str, jax.Array]) -> jax.Array:
    """`[Q, B]` fused scores, `score_query_chunk` queries at a time (with text mass, the
    sampled clip branch by `text_mass_score` plus the weighted deterministic frame score)."""
    scores = self._chunked_scores(queries, videos)
    if self.stochastic_text:
      scores = scores + self.text_mass_score(queries, videos, query_chunk=self._chunk(queries))
    return scores

  def _chunk(self, queries: jax.Array) -> int:
    return min(self.score_query_chunk, queries.shape[0])

  def _chunked_scores(self, queries: jax.Array, videos: Mapping[str, jax.Array]) -> jax.Array:
    """`[Q, B]` fused scores, or with text mass only frame_score_weight * S_f.

    A multi-scale clip's cosine is its averaging row applied to the query's dot products with
    the Lc clips, times its stored inverse norm: the `[B, P, D]` multi-scale clips are never
    built."""
    clips, inverse_norms, logits, values, frame_mask = (jnp.asarray(videos[k]) for k in (
        'clips', 'multiscale_inverse_norms', 'frame_logits', 'frame_values', 'frame_mask'))
    matrix = jnp.asarray(averaging_matrix(clips.shape[1]), clips.dtype)  # [P, Lc]

    def chunk(q):  # [c, D]
      q = l2_normalize(q)
      cosines = (set_similarities(q, clips, cosine=False) @ matrix.T) * inverse_norms
      key_weights = matrix[jnp.argmax(cosines, axis=-1)]  # [c, B, Lc]
      attended = key_clip_attention(key_weights, logits, values, frame_mask)
      frame_scores = jnp.einsum('cbd,cd->cb', l2_normalize(attended), q)
      if self.stochastic_text:
        return self.frame_score_weight * frame_scores
      return self._fuse(jnp.max(cosines, axis=-1), frame_scores)

    size, count = self._chunk(queries), queries.shape[0]
    chunks = -(-count // size)
    padded = jnp.pad(queries, ((0, chunks * size - count), (0, 0)))
    scores = jax.lax.map(chunk, padded.reshape(chunks, size, -1))
    return scores.reshape(chunks * size, -1)[:count]

  def training_similarities(self, branch: str, queries: jax.Array,
                            videos: Mapping[str, jax.Array], own: jax.Array
                            ) -> tuple[jax.Array, jax.Array]:
    """The clip matrices `[Q, B]`, as the base's; the frame matrices `[Q, Q]`: query i against
    the KCGA feature built for query j in j's video, keyed by j's best clip there (the frame
    branch keeps the deterministic query)."""
    if branch == 'clip':
      return super().training_similarities(branch, queries, videos, own)
    cosines, _ = set_cosines_and_dots(queries, self.clip_set(videos))
    best = jnp.argmax(jnp.take_along_axis(cosines, own[:, None, None], axis=1)[:, 0], axis=-1)
    keys = self.clip_set(videos)[own, best]  # [Q, D]: each query's key clip in its own video
    attended = self.key_clip_attention(keys, videos['frames'][own], videos['frame_mask'][own])
    return l2_normalize(queries) @ l2_normalize(attended).T, queries @ attended.T

  def training_scores(self, queries: jax.Array, videos: Mapping[str, jax.Array],
                      out: Mapping[str, jax.Array], deterministic: bool) -> jax.Array:
    """`score`'s `[Q, B]` (on the batch's tables); training with text mass, the weighted
    deterministic frame score plus the weighted clip score of the stochastic queries
    (`out['clip_scores']`)."""
    videos = self.stored_form(videos)
    if self.stochastic_text and not deterministic:
      return (self._chunked_scores(queries, videos)
              + self.clip_score_weight * out['clip_scores'])
    return self.score(queries, videos)
