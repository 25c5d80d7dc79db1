"""Holmes (ICML 2026) as coded in the official implementation (`src/`, and `multisrc/` with
`frame_branch_query`).

GMMFormer v2's model with another mixing in its GMM blocks. Query branch: projection ->
positional encoding -> v2 attention block -> attention pooling. Clip branch (32 clips) and
frame branch (padded to 128 frames): projection -> positional encoding -> one GMM block of 8
windowed v2 blocks (Gaussian widths None, 2^-1, 2^0, ..., 2^5) mixed per position by a
cross-attention from the mean of their outputs (`GMMBlock(aggregation='mean_consolidation')`,
the official `DyGMMBlock`). Padded frames are zeroed after encoding.
Scores: S_c = max over clips, S_f = max over frames (cosine; raw dot for InfoNCE);
eval S = 0.6 S_c + 0.4 S_f. The learnable `weight_token` is kept (the official model holds it
and its checkpoints store it) but unused, as officially.

`frame_branch_query` (the official `multisrc/`, "multi"): the frame branch scores its own
query tokens instead of the pooled query, as RAL's frame branch: a second projection and v2
attention block over the shared positional encoding (`RALQueryEncoder`), and
confidence-weighted word-frame maxima (`ConfidenceWeightedScores`, the official
`text_weight_fc`); the clip branch and the second query encoding (QDL, the transport) keep the
pooled query.
"""

from collections.abc import Mapping
from typing import Any

import jax

from prvr_jax import ops
from prvr_jax.layers.probabilistic import ConfidenceWeightedScores
from prvr_jax.models.gmmformer_v2.model import GMMFormerV2
from prvr_jax.models.ral.model import RALQueryEncoder
from prvr_jax.models.spec import Batch
from prvr_jax.ops import max_similarity

# The official `DyGMMBlock` windows: plain attention, then 2^i for i = -1..5.
WIDTHS = (None,) + tuple(2.0**i for i in range(-1, 6))


class Holmes(GMMFormerV2):
  """Attributes mirror `config.model` (see configs/holmes.py); GMMFormer v2's with Holmes's
  defaults, and `frame_branch_query` (the official `multisrc/` model; default off, `src/`)."""
  widths: tuple[float | None, ...] = WIDTHS
  aggregation: str = 'mean_consolidation'
  clip_score_weight: float = 0.6
  frame_score_weight: float = 0.4
  frame_branch_query: bool = False

  def setup(self):
    if not self.frame_branch_query:
      super().setup()
      return
    for flag, on in (('stochastic_text', self.stochastic_text),
                     ('probabilistic', self.probabilistic)):
      if on:
        raise ValueError('Holmes with the frame-branch query scores query tokens, not one '
                         f'query vector, and offers no plug-in: --config.model.{flag}')
    self.query = RALQueryEncoder(self.hidden_dim, self.num_heads, self.max_query_len,
                                 self.dropout, self.input_dropout)
    self.setup_videos()
    self.text_weight_fc = ConfidenceWeightedScores(normalize=False)

  def encode_videos(self, videos: Batch, deterministic: bool = True) -> dict[str, jax.Array]:
    """GMMFormer v2's stored sets; with `frame_branch_query` also `frame_mask [B, 128]` (the
    word-frame scores read it)."""
    stored = super().encode_videos(videos, deterministic)
    if not self.frame_branch_query:
      return stored
    return {**stored, 'frame_mask': videos['frame_mask'].astype(stored['frames'].dtype)}

  def encode_queries(self, queries: Batch, deterministic: bool = True) -> Any:
    """`[Q, D]`; with `frame_branch_query` {'query': `[Q, D]` (clip branch), 'tokens':
    `[Q, Lq, D]` (frame branch), 'token_mask': `[Q, Lq]`}."""
    if not self.frame_branch_query:
      return super().encode_queries(queries, deterministic)
    mask = queries['query_mask']
    query, tokens = self.query(queries['query_feats'], mask, deterministic)
    return {'query': query, 'tokens': tokens, 'token_mask': mask.astype(tokens.dtype)}

  def auxiliary_queries(self, batch: Batch, videos: Mapping[str, jax.Array],
                        deterministic: bool) -> jax.Array:
    """The second encoding (QDL, the transport): always the pooled query `[Q, D]` (the
    official `encode_query`)."""
    if not self.frame_branch_query:
      return super().auxiliary_queries(batch, videos, deterministic)
    return self.query(batch['query_feats'], batch['query_mask'], deterministic, tokens=False)

  def branch_query(self, queries: Any, branch: str) -> Any:
    """With `frame_branch_query`: the pooled query for the clip branch, the token set for the
    frame branch."""
    if not self.frame_branch_query:
      return super().branch_query(queries, branch)
    return queries['query'] if branch == 'clip' else queries

  def word_frame_scores(self, queries: Mapping[str, jax.Array],
                        videos: Mapping[str, jax.Array], cosine: bool) -> jax.Array:
    """`[Q, B]` confidence-weighted word-frame scores; `cosine`: of unit-norm tokens and frames
    (the confidences then read the unit-norm tokens too, as officially)."""
    tokens, frames = queries['tokens'], videos['frames']
    if cosine:
      tokens, frames = ops.l2_normalize(tokens), ops.l2_normalize(frames)
    return self.text_weight_fc(tokens, queries['token_mask'], frames, videos['frame_mask'])

  def frame_similarity(self, queries: Any, videos: Mapping[str, jax.Array],
                       cosine: bool) -> jax.Array:
    if not self.frame_branch_query:
      return super().frame_similarity(queries, videos, cosine)
    return self.word_frame_scores(queries, videos, cosine)

  def frame_similarities(self, queries: Any, videos: Mapping[str, jax.Array]
                         ) -> tuple[jax.Array, jax.Array]:
    if not self.frame_branch_query:
      return super().frame_similarities(queries, videos)
    return (self.word_frame_scores(queries, videos, cosine=True),
            self.word_frame_scores(queries, videos, cosine=False))

  def score(self, queries: Any, videos: Mapping[str, jax.Array]) -> jax.Array:
    """`[Q, B]` = clip_score_weight * S_c + frame_score_weight * S_f."""
    if not self.frame_branch_query:
      return super().score(queries, videos)
    return self._fuse(max_similarity(queries['query'], self.clip_set(videos), cosine=True),
                      self.word_frame_scores(queries, videos, cosine=True))

  def __call__(self, batch: Batch, deterministic: bool = True) -> dict[str, jax.Array]:
    """GMMFormer v2's training forward; with `frame_branch_query`, 'queries' is the pooled
    query and 'query_tokens' the frame-branch tokens."""
    out = super().__call__(batch, deterministic)
    if self.frame_branch_query:
      queries = out['queries']
      out['queries'], out['query_tokens'] = queries['query'], queries['tokens']
    return out

  def relevance(self, queries: Batch, videos: Batch) -> dict[str, jax.Array]:
    """GMMFormer v2's clip and frame cosines; not offered with `frame_branch_query` (its frame
    score is a weighted sum over words of per-word maxima, not one max over frames)."""
    if self.frame_branch_query:
      raise NotImplementedError('Holmes with --config.model.frame_branch_query has no moment '
                                'relevance curves (its frame score is a weighted sum over '
                                'words, not a max over frames)')
    return super().relevance(queries, videos)
