"""GMMFormer (Wang et al., AAAI 2024) as coded in the official implementation.

Query branch: projection -> positional encoding -> v1 attention block -> attention pooling.
Clip branch: projection -> positional encoding -> two GMMBlocks (4 windowed post-LN blocks,
averaged). Video branch: a separate projection -> positional encoding -> two masked
GMMBlocks -> attention pooling to one vector. Scores: S_c = max-clip cosine, S_v = cosine
with the video vector (raw dots for InfoNCE); eval S = 0.7 S_c + 0.3 S_v. Text mass
(`stochastic_text`) applies to both branches, the video vector being a set of one.

The official frame branch builds its windows for the padded batch length, so a video's
encoding depends on the longest video of its batch. `frame_window_length='batch_max'`
reproduces that on static 128-frame inputs (the batch maximum is taken inside the jitted
step, i.e. over the global batch); `encode_videos(..., window_length=...)` lets evaluation
pass the lengths the official evaluation batches would have had. 'static' always uses 128.
"""

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from prvr_jax.layers import AttentionPooling, QueryEncoder, VideoBranch
from prvr_jax.models.spec import Batch, position_scores
from prvr_jax.models.two_branch import TwoBranchModel
from prvr_jax.ops import similarity

FRAME_WINDOW_LENGTHS = ('batch_max', 'static')


class GMMFormer(TwoBranchModel):
  """Attributes mirror `config.model` (see configs/gmmformer.py); the shared ones are
  `TwoBranchModel`'s."""
  widths: tuple[float | None, ...] = (None, 0.5, 1.0, 5.0)
  window: str = 'gaussian'
  aggregation: str = 'average'
  temperature: float = 1.0
  frame_window_length: str = 'batch_max'

  def setup(self):
    if self.frame_window_length not in FRAME_WINDOW_LENGTHS:
      raise ValueError(f'config.model.frame_window_length must be one of {FRAME_WINDOW_LENGTHS}, '
                       f'got {self.frame_window_length!r}')
    self.query = QueryEncoder(self.hidden_dim, self.num_heads, self.max_query_len, 'v1',
                              self.dropout, self.input_dropout)
    branch = dict(hidden_dim=self.hidden_dim, num_heads=self.num_heads, max_len=self.max_frames,
                  widths=self.widths, block='v1', num_blocks=2, window=self.window,
                  aggregation=self.aggregation, temperature=self.temperature,
                  dropout=self.dropout, input_dropout=self.input_dropout)
    self.clip = VideoBranch(**branch)
    self.frame = VideoBranch(**branch)
    self.video_pooling = AttentionPooling()
    self.radius = self.text_mass_radius()
    self.prob = self.probabilistic_heads()

  def encode_videos(self, videos: Batch, deterministic: bool = True,
                    window_length: jax.Array | None = None, frames: bool = False
                    ) -> dict[str, jax.Array]:
    """`clip_feats [B, Lc, Dv]`, `frame_feats [B, 128, Dv]`, `frame_mask [B, 128]`, optional
    window_length `[B]` -> {'clips': `[B, Lc, D]`, 'video': `[B, D]`}, with text mass also
    `key [B]` (`video_seed`); with `frames` also the encoded frames the video vector pools,
    `frames [B, 128, D]` (the training encodings of the probabilistic plug-in)."""
    frame_feats, frame_mask = videos['frame_feats'], videos['frame_mask']
    if frame_feats.shape[1] != self.max_frames:
      raise ValueError(f'GMMFormer expects frames padded to {self.max_frames} '
                       f'(config.model.max_frames); got {frame_feats.shape[1]}')
    if window_length is None and self.frame_window_length == 'batch_max':
      batch_max = jnp.max(jnp.sum(frame_mask, axis=-1))
      window_length = jnp.broadcast_to(batch_max, frame_mask.shape[:1])
    clips = self.clip(videos['clip_feats'], None, None, None, deterministic)
    encoded = self.frame(frame_feats, frame_mask, window_length, None, deterministic)
    stored = {'clips': clips, 'video': self.video_pooling(encoded, frame_mask)}
    if frames:
      stored['frames'] = encoded
    return self.with_key(stored, videos)

  def training_videos(self, videos: Batch, deterministic: bool) -> dict[str, jax.Array]:
    """`encode_videos`', with the probabilistic plug-in also the encoded `frames`."""
    return self.encode_videos(videos, deterministic, frames=self.probabilistic)

  def frame_similarity(self, queries: jax.Array, videos: Mapping[str, jax.Array],
                       cosine: bool) -> jax.Array:
    return similarity(queries, videos['video'], cosine)

  def relevance(self, queries: Batch, videos: Batch) -> dict[str, jax.Array]:
    """`ModelSpec.relevance`: `Q` queries, their `Q` videos -> {'clip cosine': `[Q, Lc]`},
    whose max over the clips is the pair's clip score S_c (the frame branch is one pooled
    vector per video: no per-frame relevance)."""
    return {'clip cosine': position_scores(self.encode_queries(queries),
                                           self.encode_videos(videos)['clips'])}

  def text_mass_sets(self, videos: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    return {'clip': videos['clips'], 'frame': videos['video'][:, None]}
