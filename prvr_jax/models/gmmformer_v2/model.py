"""GMMFormer v2 (Wang et al., NeurIPS 2024) as coded in the official implementation.

Query branch: projection -> positional encoding -> v2 attention block -> attention pooling.
Clip branch (32 clips) and frame branch (padded to 128 frames): projection -> positional
encoding -> one TC-GMMBlock (8 windowed v2 blocks + temporal consolidation with a learnable
query token shared by both branches). Padded frames are zeroed after encoding.
Scores: S_c = max over clips, S_f = max over frames (cosine; raw dot for InfoNCE);
eval S = 0.7 S_c + 0.3 S_f. Text mass (`stochastic_text`) applies to both branches.
"""

import flax.linen as nn
import jax

from prvr_jax.layers import QueryEncoder, VideoBranch
from prvr_jax.models.spec import Batch
from prvr_jax.models.two_branch import FrameSet, TwoBranchModel


class GMMFormerV2(FrameSet, TwoBranchModel):
  """Attributes mirror `config.model` (see configs/gmmformer_v2.py); the shared ones are
  `TwoBranchModel`'s."""
  widths: tuple[float | None, ...] = (None, 0.5, 1.0, 5.0, 10.0, 3.0, 0.1, 8.0)
  window: str = 'gaussian'
  aggregation: str = 'temporal_consolidation'
  temperature: float = 0.09

  def setup(self):
    self.query = QueryEncoder(self.hidden_dim, self.num_heads, self.max_query_len, 'v2',
                              self.dropout, self.input_dropout)
    self.setup_videos()

  def setup_videos(self) -> None:
    """The clip and frame branches, their shared weight token, the text-mass radius and the
    probabilistic heads (`setup`'s, also RAL's)."""
    branch = dict(hidden_dim=self.hidden_dim, num_heads=self.num_heads, max_len=self.max_frames,
                  widths=self.widths, block='v2', window=self.window,
                  aggregation=self.aggregation, temperature=self.temperature,
                  dropout=self.dropout, input_dropout=self.input_dropout)
    self.clip = VideoBranch(**branch)
    self.frame = VideoBranch(**branch)
    self.weight_token = self.param('weight_token', nn.initializers.normal(1.0),
                                   (self.hidden_dim,))
    self.radius = self.text_mass_radius()
    self.prob = self.probabilistic_heads()

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
