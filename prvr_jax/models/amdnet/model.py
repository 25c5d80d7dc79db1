"""AMDNet (Song et al., "Active Moment Discovering", 2025) as coded in the official
implementation.

Query: one sentence vector (CLIP) -> projection (LayerNorm, Linear, ReLU) -> q.
Video: the 32 clip features -> projection -> positional encoding -> X. From the mean of X,
`SpanPredictor` gives K (center, width) spans and their masks M `[K, 32]`; moments
V^m = M X. o0 = attention(X); o1 = attention(o0) with head h's logits multiplied by M_h
(masked multi-moment attention, so K must equal the number of heads); V^g = (o0 + o1) / 2.
Score: max_t cos(q, V^g_t). The official forward never reads the frame features or the video
mask: only `clip_feats` is a video input.
"""

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from prvr_jax.layers import AttentionBlockV1, InputProjection, PositionalEncoding, SpanPredictor
from prvr_jax.models.fields import SharedFields
from prvr_jax.models.spec import Batch, position_scores
from prvr_jax.ops import max_similarities, max_similarity


class AMDNet(SharedFields):
  """Attributes mirror `config.model` (see configs/amdnet.py); the shared ones are
  `SharedFields`' (`num_heads` must equal `num_spans`, `max_frames` is the official
  `max_ctx_l`, of which the first `num_clips` positions are used).

  Attributes:
    max_query_len: must be 1 (one sentence vector per query).
    num_spans: K moments per video.
  """
  max_query_len: int = 1
  num_spans: int = 4

  def setup(self):
    if self.num_spans != self.num_heads:
      raise ValueError(
          f'AMDNet multiplies head h of the moment attention by span mask h, so '
          f'config.model.num_spans ({self.num_spans}) must equal config.model.num_heads '
          f'({self.num_heads})')
    if self.max_query_len != 1:
      raise ValueError(f'AMDNet reads one sentence vector per query: config.model.max_query_len '
                       f'must be 1 (got {self.max_query_len}; use data.text_feature=clip)')
    self.query_proj = InputProjection(self.hidden_dim, self.input_dropout)
    self.clip_proj = InputProjection(self.hidden_dim, self.input_dropout)
    self.pos_embed = PositionalEncoding(self.max_frames, self.input_dropout)
    self.spans = SpanPredictor(self.num_spans)
    self.attention = AttentionBlockV1(self.num_heads, self.dropout)
    self.moment_attention = AttentionBlockV1(self.num_heads, self.dropout)

  def _encode(self, clip_feats: jax.Array, deterministic: bool) -> dict[str, jax.Array]:
    x = self.pos_embed(self.clip_proj(clip_feats, deterministic), deterministic)
    summaries, spans, masks = self.spans(x)
    first = self.attention(x, deterministic=deterministic)
    second = self.moment_attention(first, window=masks[:, :, None, :],
                                   deterministic=deterministic)
    return {'clips': (first + second) / 2, 'summaries': summaries, 'spans': spans,
            'masks': masks, 'moments': jnp.einsum('bkl,bld->bkd', masks, x)}

  def encode_videos(self, videos: Batch, deterministic: bool = True) -> dict[str, jax.Array]:
    """`clip_feats [B, Lc, Dv]` -> {'clips': moment-enhanced clips `[B, Lc, D]`}."""
    return {'clips': self._encode(videos['clip_feats'], deterministic)['clips']}

  def encode_queries(self, queries: Batch, deterministic: bool = True) -> jax.Array:
    """`query_feats [Q, 1, Dq]` (a sentence vector each) -> `[Q, D]`."""
    feats = queries['query_feats']
    if feats.shape[1] != 1:
      raise ValueError(f'AMDNet takes one sentence vector per query; got query_feats of shape '
                       f'{feats.shape} (config.model.max_query_len must be 1)')
    return self.query_proj(feats[:, 0], deterministic)

  def score(self, queries: jax.Array, videos: Mapping[str, jax.Array]) -> jax.Array:
    """`[Q, B]` = max over clips of the cosine."""
    return max_similarity(queries, videos['clips'], cosine=True)

  def relevance(self, queries: Batch, videos: Batch) -> dict[str, jax.Array]:
    """`ModelSpec.relevance`: `Q` queries, their `Q` videos -> {'clip cosine': `[Q, Lc]` (its
    max over the clips is the pair's score), 'matched span mask': `[Q, Lc]`, the mask of the
    video's span whose moment V^m_k the query matches best (the relevance loss's cosine)}."""
    encoded = self.encode_queries(queries)
    video = self._encode(videos['clip_feats'], deterministic=True)
    best = jnp.argmax(position_scores(encoded, video['moments']), axis=-1)  # [Q]
    return {'clip cosine': position_scores(encoded, video['clips']),
            'matched span mask': jnp.take_along_axis(video['masks'], best[:, None, None],
                                                     axis=1)[:, 0]}

  def learned_spans(self, queries: Batch, videos: Batch) -> jax.Array:
    """`ModelSpec.learned_spans`: `Q` queries, their `Q` videos -> `[Q, 2]` (start, end) as
    fractions of the video: the learned span (centre c, width w) whose moment V^m_k the query
    matches best (as `relevance`'s 'matched span mask'), [c - w / 2, c + w / 2] in [0, 1]."""
    encoded = self.encode_queries(queries)
    video = self._encode(videos['clip_feats'], deterministic=True)
    best = jnp.argmax(position_scores(encoded, video['moments']), axis=-1)  # [Q]
    span = jnp.take_along_axis(video['spans'], best[:, None, None], axis=1)[:, 0]  # [Q, 2]
    centre, width = span[:, 0], span[:, 1]
    return jnp.clip(jnp.stack([centre - width / 2, centre + width / 2], axis=-1), 0.0, 1.0)

  def __call__(self, batch: Batch, deterministic: bool = True) -> dict[str, jax.Array]:
    """The training forward: `scores` (cosines) and `clip_logits` (raw dots) `[Q, B]`, the
    spans, masks, moments and summaries of the videos, the query encodings."""
    videos = self._encode(batch['clip_feats'], deterministic)
    queries = self.encode_queries(batch, deterministic)
    # A second encoding with its own dropout mask feeds the L_div / L_om plug-ins.
    queries_aux = self.encode_queries(batch, deterministic)
    scores, clip_logits = max_similarities(queries, videos['clips'])
    return {'scores': scores, 'clip_logits': clip_logits,
            'queries': queries, 'queries_aux': queries_aux, **videos}
