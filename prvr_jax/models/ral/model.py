"""RAL (Zhang et al., EMNLP 2025 Findings) as coded in the official implementation: GMMFormer v2
with a frame-branch query encoder, confidence-weighted word-frame scores and, in training,
Gaussian embeddings of each video and of each video's query support set.

Query branch: GMMFormer v2's (projection -> positional encoding -> v2 attention block ->
attention pooling) for the clip branch; for the frame branch a second projection and v2
attention block over the same positional encoding, kept per token. Clip branch: GMMFormer v2's.
Frame branch: GMMFormer v2's encoder; its score is `ConfidenceWeightedScores` of the query
tokens against the frames (unit-norm for the triplet loss and evaluation, raw for InfoNCE).
Eval S = clip_score_weight * S_c + frame_score_weight * S_f. docs/ral.md has the formulas.
"""

from collections.abc import Mapping

import flax.linen as nn
import jax

from prvr_jax import ops
from prvr_jax.layers.attention import BLOCKS
from prvr_jax.layers.common import AttentionPooling, InputProjection, PositionalEncoding
from prvr_jax.layers.probabilistic import ConfidenceWeightedScores
from prvr_jax.models.gmmformer_v2.model import GMMFormerV2
from prvr_jax.models.spec import Batch
from prvr_jax.ops import max_similarities, max_similarity


class RALQueryEncoder(nn.Module):
  """`[Q, Lq, Dq], [Q, Lq] ->` the clip-branch query vector `[Q, D]` and, with `tokens`, the
  frame-branch tokens `[Q, Lq, D]`.

  Parameters `input_proj`, `pos_embed`, `encoder`, `pooling` are GMMFormer v2's
  `QueryEncoder`'s; `frame_input_proj` and `frame_encoder` (the official
  `frame_branch_query_proj` / `frame_branch_query_encoder`) feed the shared `pos_embed`.
  """
  hidden_dim: int
  num_heads: int
  max_query_len: int
  dropout: float = 0.0
  input_dropout: float = 0.0

  @nn.compact
  def __call__(self, query_feats: jax.Array, query_mask: jax.Array, deterministic: bool = True,
               tokens: bool = True) -> jax.Array | tuple[jax.Array, jax.Array]:
    pos_embed = PositionalEncoding(self.max_query_len, self.input_dropout, name='pos_embed')

    def encode(prefix: str) -> jax.Array:
      x = InputProjection(self.hidden_dim, self.input_dropout, name=f'{prefix}input_proj')(
          query_feats, deterministic)
      return BLOCKS['v2'](self.num_heads, self.dropout, name=f'{prefix}encoder')(
          pos_embed(x, deterministic), key_mask=query_mask, deterministic=deterministic)

    query = AttentionPooling(name='pooling')(encode(''), query_mask)
    if not tokens:
      return query
    return query, encode('frame_')


class RAL(GMMFormerV2):
  """Attributes mirror `config.model` (see configs/ral.py): GMMFormer v2's (the fusion weights
  default to RAL's TVR 0.5 / 0.5) with the probabilistic plug-in always on
  (`ProbabilisticPlugin`: `num_samples` K = 6, `support_slots` 26, the official values); its
  query support sets read the frame-branch query tokens.
  """
  clip_score_weight: float = 0.5
  frame_score_weight: float = 0.5
  probabilistic: bool = True

  def setup(self):
    if self.stochastic_text:
      raise ValueError('RAL scores its frame branch with query tokens, not one query vector, '
                       'and offers no text-mass plug-in: --config.model.stochastic_text')
    if not self.probabilistic:
      raise ValueError('RAL is GMMFormer v2 with its probabilistic heads always on (the '
                       'official model holds them): --config.model.probabilistic must be True')
    self.query = RALQueryEncoder(self.hidden_dim, self.num_heads, self.max_query_len,
                                 self.dropout, self.input_dropout)
    self.setup_videos()
    self.text_weight_fc = ConfidenceWeightedScores(normalize=False)

  def encode_videos(self, videos: Batch, deterministic: bool = True) -> dict[str, jax.Array]:
    """GMMFormer v2's stored sets plus `frame_mask [B, 128]` (the word-frame scores read it)."""
    stored = super().encode_videos(videos, deterministic)
    return {**stored, 'frame_mask': videos['frame_mask'].astype(stored['frames'].dtype)}

  def encode_queries(self, queries: Batch, deterministic: bool = True) -> dict[str, jax.Array]:
    """{'query': `[Q, D]` (clip branch), 'tokens': `[Q, Lq, D]` (frame branch), 'token_mask':
    `[Q, Lq]`}."""
    mask = queries['query_mask']
    query, tokens = self.query(queries['query_feats'], mask, deterministic)
    return {'query': query, 'tokens': tokens, 'token_mask': mask.astype(tokens.dtype)}

  def word_frame_scores(self, queries: Mapping[str, jax.Array],
                        videos: Mapping[str, jax.Array], cosine: bool) -> jax.Array:
    """`[Q, B]` confidence-weighted word-frame scores; `cosine`: of unit-norm tokens and frames
    (the confidences then read the unit-norm tokens too)."""
    tokens, frames = queries['tokens'], videos['frames']
    if cosine:
      tokens, frames = ops.l2_normalize(tokens), ops.l2_normalize(frames)
    return self.text_weight_fc(tokens, queries['token_mask'], frames, videos['frame_mask'])

  def score(self, queries: Mapping[str, jax.Array], videos: Mapping[str, jax.Array]
            ) -> jax.Array:
    """`[Q, B]` = clip_score_weight * max-clip cosine + frame_score_weight * word-frame
    cosine score."""
    return self._fuse(max_similarity(queries['query'], videos['clips'], cosine=True),
                      self.word_frame_scores(queries, videos, cosine=True))

  def __call__(self, batch: Batch, deterministic: bool = True,
               noise: Mapping[str, jax.Array] | None = None) -> dict[str, jax.Array]:
    """The training forward: GMMFormer v2's outputs (`queries` the clip-branch vectors; the
    frame matrices the word-frame scores) and, in training (not `deterministic`) or with
    `noise`, `gaussians` (`ProbabilisticPlugin.gaussians` of the frames and the frame-branch
    query tokens; `noise` {'video', 'text'}: the standard normal `[B, K, D]` of the samples,
    without it they draw from the 'sample' rng)."""
    videos = self.encode_videos(batch, deterministic)
    queries = self.encode_queries(batch, deterministic)
    # A second encoding with its own dropout mask feeds QDL and OM, as in the official code.
    queries_aux = self.query(batch['query_feats'], batch['query_mask'], deterministic,
                             tokens=False)
    out = {'queries': queries['query'], 'queries_aux': queries_aux, 'clips': videos['clips']}
    out['clip_scores'], out['clip_logits'] = max_similarities(queries['query'], videos['clips'])
    out['frame_scores'] = self.word_frame_scores(queries, videos, cosine=True)
    out['frame_logits'] = self.word_frame_scores(queries, videos, cosine=False)
    out['scores'] = self._fuse(out['clip_scores'], out['frame_scores'])
    if self.wants_gaussians(deterministic) or noise is not None:
      out['gaussians'] = self.gaussians(videos['frames'], videos['frame_mask'],
                                        queries['tokens'], queries['token_mask'], batch, noise)
    return out

  def relevance(self, queries: Batch, videos: Batch) -> dict[str, jax.Array]:
    """Not offered (`SPEC.relevance` is None): the frame score is a weighted sum over words of
    per-word maxima, not one max over frames."""
    raise NotImplementedError('RAL has no moment relevance curves (its frame score is a '
                              'weighted sum over words, not a max over frames)')
