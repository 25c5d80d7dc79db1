"""GMMFormer v2 (Wang et al., NeurIPS 2024) as coded in the official implementation.

Query branch: projection -> positional encoding -> v2 attention block -> attention pooling.
Clip branch (32 clips) and frame branch (padded to 128 frames): projection -> positional
encoding -> one TC-GMMBlock (8 windowed v2 blocks + temporal consolidation with a learnable
query token shared by both branches). Padded frames are zeroed after encoding.
Scores: S_c = max over clips, S_f = max over frames (cosine; raw dot for InfoNCE);
eval S = 0.7 S_c + 0.3 S_f. Text mass (`stochastic_text`) applies to both branches.
"""

from collections.abc import Mapping

import flax.linen as nn
import jax

from prvr_jax.layers import QueryEncoder, VideoBranch
from prvr_jax.models.spec import Batch, position_scores, real_positions
from prvr_jax.models.two_branch import TwoBranchModel
from prvr_jax.ops import max_similarities, max_similarity


class GMMFormerV2(TwoBranchModel):
  """Attributes mirror `config.model` (see configs/gmmformer_v2.py); the shared ones are
  `TwoBranchModel`'s."""
  widths: tuple[float | None, ...] = (None, 0.5, 1.0, 5.0, 10.0, 3.0, 0.1, 8.0)
  window: str = 'gaussian'
  aggregation: str = 'temporal_consolidation'
  temperature: float = 0.09

  def setup(self):
    self.query = QueryEncoder(self.hidden_dim, self.num_heads, self.max_query_len, 'v2',
                              self.dropout, self.input_dropout)
    branch = dict(hidden_dim=self.hidden_dim, num_heads=self.num_heads, max_len=self.max_frames,
                  widths=self.widths, block='v2', window=self.window,
                  aggregation=self.aggregation, temperature=self.temperature,
                  dropout=self.dropout, input_dropout=self.input_dropout)
    self.clip = VideoBranch(**branch)
    self.frame = VideoBranch(**branch)
    self.weight_token = self.param('weight_token', nn.initializers.normal(1.0),
                                   (self.hidden_dim,))
    self.radius = self.text_mass_radius()

  def encode_videos(self, videos: Batch, deterministic: bool = True) -> dict[str, jax.Array]:
    """`clip_feats [B, Lc, Dv]`, `frame_feats [B, 128, Dv]`, `frame_mask [B, 128]` ->
    {'clips': `[B, Lc, D]`, 'frames': `[B, 128, D]` (padded frames zero)}, with text mass
    also `key [B]` (`video_seed`)."""
    frame_feats, frame_mask = videos['frame_feats'], videos['frame_mask']
    if frame_feats.shape[1] != self.max_frames:
      raise ValueError(f'GMMFormer v2 expects frames padded to {self.max_frames} '
                       f'(config.model.max_frames); got {frame_feats.shape[1]}')
    clips = self.clip(videos['clip_feats'], None, None, self.weight_token, deterministic)
    frames = self.frame(frame_feats, frame_mask, None, self.weight_token, deterministic)
    return self.with_key({'clips': clips, 'frames': frames * frame_mask[..., None]}, videos)

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
    'frame cosine': `[Q, 128]` (NaN at padded frames)}, whose maxima are the pair's S_c and,
    over a video without padding, S_f."""
    encoded, stored = self.encode_queries(queries), self.encode_videos(videos)
    return {'clip cosine': position_scores(encoded, stored['clips']),
            'frame cosine': real_positions(position_scores(encoded, stored['frames']),
                                           videos['frame_mask'])}
