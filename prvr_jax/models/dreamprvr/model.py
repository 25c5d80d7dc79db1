"""DreamPRVR (Li et al., CVPR 2026) as coded in the official implementation.

Query branch: GMMFormer v2's / HLFormer's (projection -> positional encoding -> v2 attention
block -> attention pooling). Video side: the clips are projected and position-encoded once;
from them an unwindowed v2 block (`mean_clip_encoder`) feeds a query former (K learned tokens
cross-attending to the clips: the diffusion condition `[B, K, D]`) and the video latent
sampler (`mu`, `logvar`). K registers are the T reverse diffusion steps from `x_T = mu` (the
same `mu` added as the "noise" of every step: deterministic, in training and evaluation). The
clip branch (32 clips, no mask) and the frame branch (padded to 128 frames) each run one
register-augmented Gaussian attention block with those registers; padded frames are zeroed.
Scores: cosine max over clips and over frames, fused `clip_score_weight * S_c +
frame_score_weight * S_f`.

Training also encodes the queries once before the videos (`queries_aux`, the official
`video_query`: QDL and QSP take it), perturbs each video's mean query into K diffusion targets
(the draws from the 'perturbation' stream) and predicts the noise `mu` at every timestep
(`oversample`), for the DRE term.
"""

from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from prvr_jax.layers import InputProjection, PositionalEncoding, QueryEncoder
from prvr_jax.layers.attention import AttentionBlockV2
from prvr_jax.layers.diffusion import RegisterDiffusion
from prvr_jax.layers.latent_sampler import VideoLatentSampler, perturbation_noise
from prvr_jax.layers.latent_sampler import reparameterize, text_perturbation
from prvr_jax.layers.register_block import RegisterGaussianBlock
from prvr_jax.models.spec import Batch
from prvr_jax.models.two_branch import FrameSet, TwoBranchModel

PERTURBATION = 'perturbation'  # the RNG stream of the textual perturbation sampler


class RegisterVideoBranch(nn.Module):
  """A video branch: `embed` (projection, positional encoding: `[B, L, Dv] -> [B, L, D]`) and
  `encode` (one `RegisterGaussianBlock` with the registers, `encoder`)."""
  hidden_dim: int
  num_heads: int
  max_len: int
  attention_num: int
  temperature: float
  dropout: float = 0.0
  input_dropout: float = 0.0

  def setup(self):
    self.input_proj = InputProjection(self.hidden_dim, self.input_dropout)
    self.pos_embed = PositionalEncoding(self.max_len, self.input_dropout)
    self.encoder = RegisterGaussianBlock(self.num_heads, self.attention_num, self.temperature,
                                         self.dropout)

  def embed(self, feats: jax.Array, deterministic: bool = True) -> jax.Array:
    return self.pos_embed(self.input_proj(feats, deterministic), deterministic)

  def encode(self, x: jax.Array, registers: jax.Array, mask: jax.Array | None = None,
             deterministic: bool = True) -> jax.Array:
    return self.encoder(x, registers, mask, deterministic)

  def __call__(self, feats: jax.Array, registers: jax.Array, mask: jax.Array | None = None,
               deterministic: bool = True) -> jax.Array:
    return self.encode(self.embed(feats, deterministic), registers, mask, deterministic)


class RegisterQueryFormer(nn.Module):
  """Official `QueryFormer`: K learned tokens (`tokens [1, K, D]`, N(0, 1) as the official
  `torch.randn`, which its `reset_parameters` leaves alone) cross-attend (a 1x-FFN v2 block,
  `cross`) to `[B, L, D]` -> `[B, K, D]`."""
  num_registers: int
  num_heads: int
  dropout: float = 0.0

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
    tokens = self.param('tokens', nn.initializers.normal(1.0),
                        (1, self.num_registers, x.shape[-1]))
    tokens = jnp.broadcast_to(tokens.astype(x.dtype), (x.shape[0],) + tokens.shape[1:])
    return AttentionBlockV2(self.num_heads, self.dropout, ffn_multiplier=1, name='cross')(
        tokens, x, deterministic=deterministic)


def mean_video_queries(queries: jax.Array, query_video: jax.Array, query_valid: jax.Array,
                       num_videos: int) -> jax.Array:
  """`[B, D]`: each video's mean of its valid queries (zero for a video without any); the
  official `mean_video_queries`, whose sorted labels are the batch's video order."""
  member = ((query_video[None, :] == jnp.arange(num_videos)[:, None])
            & query_valid[None, :]).astype(queries.dtype)  # [B, Q]
  total = jnp.einsum('bq,qd->bd', member, queries, precision=jax.lax.Precision.HIGHEST)
  return total / jnp.maximum(member.sum(axis=1, keepdims=True), 1.0)


class DreamPRVR(FrameSet, TwoBranchModel):
  """Attributes mirror `config.model` (see configs/dreamprvr.py); the shared ones are
  `TwoBranchModel`'s.

  Attributes:
    num_registers: K, registers per video (official `num_registers`).
    attention_num: branches per register block (windows None, 2^-2, ..., 2^(n - 4)).
    temperature: the branch-mixing softmax's temperature (official `sft_factor`).
    timesteps: T, diffusion steps (official 10).
    num_diffusion_layers: bottlenecks of the denoiser (official 2).
    beta_schedule: 'cosine' (official) or 'linear'.
    clip_denoised: the x_0 clamp of each reverse step (official 1.0; None: none).
    perturbation_scale: the textual perturbation's spread, times each query's std (0.1).
    time_table: the frozen time table's init, 'normal' (N(0, 0.02): the official
      `reset_parameters`) or 'sinusoid' (the official module's own, before that re-draw).
  """
  num_registers: int = 8
  attention_num: int = 8
  temperature: float = 0.09
  timesteps: int = 10
  num_diffusion_layers: int = 2
  beta_schedule: str = 'cosine'
  clip_denoised: float | None = 1.0
  perturbation_scale: float = 0.1
  time_table: str = 'normal'

  def setup(self):
    self.query = QueryEncoder(self.hidden_dim, self.num_heads, self.max_query_len, 'v2',
                              self.dropout, self.input_dropout)
    branch = dict(hidden_dim=self.hidden_dim, num_heads=self.num_heads, max_len=self.max_frames,
                  attention_num=self.attention_num, temperature=self.temperature,
                  dropout=self.dropout, input_dropout=self.input_dropout)
    self.clip = RegisterVideoBranch(**branch)
    self.frame = RegisterVideoBranch(**branch)
    self.condition_encoder = AttentionBlockV2(self.num_heads, self.dropout)
    self.query_former = RegisterQueryFormer(self.num_registers, self.num_heads, self.dropout)
    self.video_sampler = VideoLatentSampler()
    self.diffusion = RegisterDiffusion(self.timesteps, self.num_diffusion_layers,
                                       beta_schedule=self.beta_schedule,
                                       clip_denoised=self.clip_denoised,
                                       table_init=self.time_table)
    self.radius = self.text_mass_radius()

  def _encode(self, videos: Batch, deterministic: bool) -> dict[str, jax.Array]:
    """The encodings and what the training terms need: {'clips', 'frames' (padded frames
    zero), 'mu', 'logvar' `[B, D]`, 'condition' `[B, K, D]`}."""
    frame_feats, frame_mask = videos['frame_feats'], videos['frame_mask']
    if frame_feats.shape[1] != self.max_frames:
      raise ValueError(f'DreamPRVR expects frames padded to {self.max_frames} '
                       f'(config.model.max_frames); got {frame_feats.shape[1]}')
    clips = self.clip.embed(videos['clip_feats'], deterministic)
    context = self.condition_encoder(clips, deterministic=deterministic)
    condition = self.query_former(context, deterministic)
    mu, logvar = self.video_sampler(context)
    start = reparameterize(mu, logvar, self.num_registers, None)
    registers = self.diffusion.sample(condition, start, start, deterministic)
    encoded_clips = self.clip.encode(clips, registers, None, deterministic)
    frames = self.frame(frame_feats, registers, frame_mask, deterministic)
    return {'clips': encoded_clips, 'frames': frames * frame_mask[..., None], 'mu': mu,
            'logvar': logvar, 'condition': condition, 'start': start}

  def encode_videos(self, videos: Batch, deterministic: bool = True) -> dict[str, jax.Array]:
    """`clip_feats [B, Lc, Dv]`, `frame_feats [B, 128, Dv]`, `frame_mask [B, 128]` ->
    {'clips': `[B, Lc, D]`, 'frames': `[B, 128, D]` (padded frames zero)}, with text mass
    also `key [B]` (`video_seed`). Deterministic: the registers have no random draw."""
    encoded = self._encode(videos, deterministic)
    return self.with_key({'clips': encoded['clips'], 'frames': encoded['frames']}, videos)

  def training_videos(self, videos: Batch, deterministic: bool) -> dict[str, jax.Array]:
    """The training encodings: `_encode`'s, the first query encoding `queries_aux` (before the
    videos, as officially) and the diffusion predictions: 'noise_target' (`mu` repeated K
    times) and 'noise_pred' `[T, B, K, D]` from the perturbed mean queries. The perturbation's
    standard normals `[2, B, K, D]` come from the batch's `perturbation_noise` when it has one
    (replayed draws), else from the 'perturbation' stream; deterministic without that stream
    they are zero (the targets unperturbed)."""
    queries_aux = self.encode_queries(videos, deterministic)
    encoded = self._encode(videos, deterministic)
    num_videos = videos['frame_feats'].shape[0]
    targets = mean_video_queries(queries_aux, videos['query_video'], videos['query_valid'],
                                 num_videos)
    if 'perturbation_noise' in videos:  # replayed draws (parity with the official sampler)
      z_alpha, z_beta = videos['perturbation_noise']
    elif deterministic and not self.has_rng(PERTURBATION):
      z_alpha = z_beta = jnp.zeros((num_videos, self.num_registers, targets.shape[-1]),
                                   targets.dtype)
    else:
      z_alpha, z_beta = perturbation_noise(self.make_rng(PERTURBATION), num_videos,
                                           self.num_registers, targets.shape[-1], targets.dtype)
    x_start = text_perturbation(targets, z_alpha, z_beta, self.perturbation_scale)
    start = encoded.pop('start')
    pred, _, _ = self.diffusion.oversample(x_start, encoded.pop('condition'), start,
                                           deterministic)
    return {**encoded, 'queries_aux': queries_aux, 'noise_target': start, 'noise_pred': pred}

  def auxiliary_queries(self, batch: Batch, videos: Mapping[str, jax.Array],
                        deterministic: bool) -> jax.Array:
    del batch, deterministic
    return videos['queries_aux']

  def extra_outputs(self, videos: Mapping[str, jax.Array], out: Mapping[str, jax.Array],
                    deterministic: bool) -> dict[str, jax.Array]:
    del out, deterministic
    return {k: videos[k] for k in ('mu', 'logvar', 'noise_target', 'noise_pred')}
