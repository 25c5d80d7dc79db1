"""HLFormer (Li et al., ICCV 2025) as coded in the official implementation.

Query branch: projection -> positional encoding -> v2 attention block -> attention pooling
(GMMFormer v2's). Clip branch (32 clips) and frame branch (padded to 128 frames): projection ->
positional encoding -> one `HLFormerBlock`: attention_num / 2 Euclidean v2 blocks and as many
Lorentz attention blocks (windows None, 2, 4, ...), mixed per position by a cross-attention
from the mean of their outputs. Padded frames are zeroed after encoding.
Scores: S_c = max over clips, S_f = max over frames (cosine; raw dot for InfoNCE);
eval S = 0.7 S_c + 0.3 S_f. Training also maps the second query encoding and the pooled video
(mean of the attention-pooled frames and clips) onto the hyperboloid of learnable curvature
for the partial-order loss.
"""

from collections.abc import Mapping
import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from prvr_jax.kernels import branches
from prvr_jax.layers import AttentionPooling, InputProjection, PositionalEncoding, QueryEncoder
from prvr_jax.layers import lorentz
from prvr_jax.layers.attention import AttentionBlockV2, dense
from prvr_jax.layers.gmm_block import consolidate, stacked_blocks
from prvr_jax.layers.windows import stacked_windows
from prvr_jax.models.spec import Batch
from prvr_jax.models.two_branch import FrameSet, TwoBranchModel


def branch_widths(attention_num: int) -> tuple[float | None, ...]:
  """Window widths of each half of an `HLFormerBlock`: None, 2, 4, ..., 2^(n/2 - 1)."""
  if attention_num < 2 or attention_num % 2:
    raise ValueError(f'attention_num must be an even number >= 2, got {attention_num} '
                     '(config.model.attention_num)')
  return (None,) + tuple(float(2**i) for i in range(1, attention_num // 2))


def straight_through_clip(x: jax.Array, lo: float = -math.inf, hi: float = math.inf
                          ) -> jax.Array:
  """`clip(x, lo, hi)` with gradient 1: the official forward clamps the stored parameter in
  place (`.data = clamp(.)`) and differentiates through the clamped value."""
  return x + jax.lax.stop_gradient(jnp.clip(x, lo, hi) - x)


class HLFormerBlock(nn.Module):
  """Official `HLFormerBlock`: `[B, L, D], key_mask [B, L] -> [B, L, D]`.

  Euclidean branches (v2 blocks, stacked under `branches`, Gaussian windows) and Lorentz
  branches (`lorentz_<i>`); the mixing token is the mean of all branch outputs over branches
  and positions; the cross-attention block (1x FFN) runs once per branch output, then Linear ->
  ReLU -> Dropout -> Linear(L) gives one logit per branch and position, softmax over branches of
  (. / temperature).
  """
  num_heads: int
  lorentz_dim: int
  attention_num: int = 8
  temperature: float = 0.09
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x: jax.Array, key_mask: jax.Array | None = None,
               deterministic: bool = True) -> jax.Array:
    widths = branch_widths(self.attention_num)
    windows = stacked_windows('gaussian', widths, x.shape[1])
    euclidean = stacked_blocks(AttentionBlockV2, len(widths), self.num_heads, self.dropout_rate)
    with branches.shared_input():
      outputs = [euclidean(x, None, key_mask, windows, deterministic)]  # [K, B, L, D]
    for i, w in enumerate(widths):
      block = lorentz.LorentzAttentionBlock(self.lorentz_dim, self.num_heads, self.dropout_rate,
                                            w, name=f'lorentz_{i}')
      outputs.append(block(x, key_mask, deterministic)[None])
    outputs = jnp.concatenate(outputs)  # [2K, B, L, D]
    return consolidate(outputs, jnp.mean(outputs, axis=(0, 2)), key_mask, self.num_heads,
                       self.dropout_rate, self.temperature, deterministic)


class HyperbolicVideoBranch(nn.Module):
  """`[B, L, Dv] -> [B, L, D]`: projection, positional encoding, one `HLFormerBlock`
  (`encoder`)."""
  hidden_dim: int
  num_heads: int
  max_len: int
  lorentz_dim: int
  attention_num: int
  temperature: float
  dropout: float = 0.0
  input_dropout: float = 0.0

  @nn.compact
  def __call__(self, feats: jax.Array, mask: jax.Array | None = None,
               deterministic: bool = True) -> jax.Array:
    x = InputProjection(self.hidden_dim, self.input_dropout, name='input_proj')(
        feats, deterministic)
    x = PositionalEncoding(self.max_len, self.input_dropout, name='pos_embed')(x, deterministic)
    return HLFormerBlock(self.num_heads, self.lorentz_dim, self.attention_num, self.temperature,
                         self.dropout, name='encoder')(x, mask, deterministic)


class HLFormer(FrameSet, TwoBranchModel):
  """Attributes mirror `config.model` (see configs/hlformer.py); the shared ones are
  `TwoBranchModel`'s.

  Attributes:
    lorentz_dim: space dimension of the Lorentz attention blocks (official 127).
    attention_num: branches per `HLFormerBlock` (half Euclidean, half Lorentz).
    temperature: the mixing softmax's temperature (official `sft_factor`).
    curv_init: initial curvature c of the partial-order loss's hyperboloid (`-c`).
    learn_curv: whether c is trained (it stays in `[curv_init / 10, 10 curv_init]`).
  """
  lorentz_dim: int = 127
  attention_num: int = 8
  temperature: float = 0.09
  curv_init: float = 1.0
  learn_curv: bool = True

  def setup(self):
    self.query = QueryEncoder(self.hidden_dim, self.num_heads, self.max_query_len, 'v2',
                              self.dropout, self.input_dropout)
    branch = dict(hidden_dim=self.hidden_dim, num_heads=self.num_heads, max_len=self.max_frames,
                  lorentz_dim=self.lorentz_dim, attention_num=self.attention_num,
                  temperature=self.temperature, dropout=self.dropout,
                  input_dropout=self.input_dropout)
    self.clip = HyperbolicVideoBranch(**branch)
    self.frame = HyperbolicVideoBranch(**branch)
    self.frame_pooling = AttentionPooling()
    self.clip_pooling = AttentionPooling()
    alpha = math.log(self.hidden_dim**-0.5)
    self.curv = self.param('curv', nn.initializers.constant(math.log(self.curv_init)), ())
    self.textual_alpha = self.param('textual_alpha', nn.initializers.constant(alpha), ())
    self.video_alpha = self.param('video_alpha', nn.initializers.constant(alpha), ())
    self.radius = self.text_mass_radius()
    self.prob = self.probabilistic_heads()

  def encode_videos(self, videos: Batch, deterministic: bool = True) -> dict[str, jax.Array]:
    """`clip_feats [B, Lc, Dv]`, `frame_feats [B, 128, Dv]`, `frame_mask [B, 128]` ->
    {'clips': `[B, Lc, D]`, 'frames': `[B, 128, D]` (padded frames zero)}, with text mass
    also `key [B]` (`video_seed`)."""
    frame_feats, frame_mask = videos['frame_feats'], videos['frame_mask']
    if frame_feats.shape[1] != self.max_frames:
      raise ValueError(f'HLFormer expects frames padded to {self.max_frames} '
                       f'(config.model.max_frames); got {frame_feats.shape[1]}')
    clips = self.clip(videos['clip_feats'], None, deterministic)
    frames = self.frame(frame_feats, frame_mask, deterministic)
    return self.with_key({'clips': clips, 'frames': frames * frame_mask[..., None]}, videos)

  def curvature(self) -> jax.Array:
    """c = exp(curv), curv clamped (straight through) to `[log(c0 / 10), log(10 c0)]`."""
    curv = straight_through_clip(self.curv, math.log(self.curv_init / 10),
                                 math.log(self.curv_init * 10))
    return jnp.exp(curv if self.learn_curv else jax.lax.stop_gradient(curv))

  def hyperbolic_points(self, queries: jax.Array, videos: Mapping[str, jax.Array]
                        ) -> dict[str, jax.Array]:
    """The partial-order loss's inputs: {'curvature': c, 'query_points': `[Q, D]`,
    'video_points': `[B, D]`}, space parts of `exp_map0` of the queries and of the mean of
    the attention-pooled frames (padded ones included, as zeros) and clips, each scaled by
    `exp(min(alpha, 0))`."""
    c = self.curvature()
    frames, clips = videos['frames'], videos['clips']
    pooled = (self.frame_pooling(frames, jnp.ones(frames.shape[:2], frames.dtype))
              + self.clip_pooling(clips, jnp.ones(clips.shape[:2], clips.dtype))) / 2
    scale = lambda alpha: jnp.exp(lorentz.clamp_max_zero(alpha))
    return {'curvature': c,
            'query_points': lorentz.exp_map0(queries * scale(self.textual_alpha), c),
            'video_points': lorentz.exp_map0(pooled * scale(self.video_alpha), c)}

  def extra_outputs(self, videos: Mapping[str, jax.Array], out: Mapping[str, jax.Array],
                    deterministic: bool) -> dict[str, jax.Array]:
    del deterministic
    return self.hyperbolic_points(out['queries_aux'], videos)
