"""GMMFormer v2 (Wang et al., NeurIPS 2024) as coded in the official implementation.

Query branch: projection -> positional encoding -> v2 attention block -> attention pooling.
Clip branch (32 clips) and frame branch (padded to 128 frames): projection -> positional
encoding -> one TC-GMMBlock (8 windowed v2 blocks + temporal consolidation with a learnable
query token shared by both branches). Padded frames are zeroed after encoding.
Scores: S_c = max over clips, S_f = max over frames (cosine; raw dot for InfoNCE);
eval S = 0.7 S_c + 0.3 S_f.
"""

import flax.linen as nn
import jax

from prvr_jax.models.common import QueryEncoder, RetrievalModel, VideoBranch, max_similarity


class GMMFormerV2(RetrievalModel):
  """Attributes mirror `config.model` (see configs/gmmformer_v2.py)."""
  hidden_dim: int = 384
  num_heads: int = 4
  max_query_len: int = 30
  max_frames: int = 128
  num_clips: int = 32
  widths: tuple[float | None, ...] = (None, 0.5, 1.0, 5.0, 10.0, 3.0, 0.1, 8.0)
  window: str = 'gaussian'
  aggregation: str = 'temporal_consolidation'
  temperature: float = 0.09
  dropout: float = 0.2
  input_dropout: float = 0.2
  clip_score_weight: float = 0.7
  frame_score_weight: float = 0.3

  qdl_version = 'v2'

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

  def encode_videos(self, clip_feats: jax.Array, frame_feats: jax.Array, frame_mask: jax.Array,
                    deterministic: bool = True) -> dict[str, jax.Array]:
    """clip_feats `[B, Lc, Dv]`, frame_feats `[B, 128, Dv]`, frame_mask `[B, 128]` ->
    {'clips': `[B, Lc, D]`, 'frames': `[B, 128, D]` (padded frames zero)}."""
    if frame_feats.shape[1] != self.max_frames:
      raise ValueError(f'GMMFormer v2 expects frames padded to {self.max_frames} '
                       f'(config.model.max_frames); got {frame_feats.shape[1]}')
    clips = self.clip(clip_feats, None, None, self.weight_token, deterministic)
    frames = self.frame(frame_feats, frame_mask, None, self.weight_token, deterministic)
    return {'clips': clips, 'frames': frames * frame_mask[..., None]}

  def frame_similarity(self, queries: jax.Array, videos: dict[str, jax.Array],
                       cosine: bool) -> jax.Array:
    return max_similarity(queries, videos['frames'], cosine)
