"""DreamPRVR's samplers: the video-centric variational sampler that gives the register
diffusion its start, and the textual perturbation sampler that gives it its targets.

Official code: `lijun2005/CVPR26-DreamPRVR`, `src/Models/DreamPRVR/latent_sampler.py`.

* `GPOPooling`: the official `GPO` (generalised pooling operator, from VSE-infinity): pooling
  weights over the L positions from a bidirectional GRU run over sinusoidal position codes
  (they depend on L only), applied to each feature dimension's values sorted in descending
  order. The official model always pools full-length sequences (lengths = L): no padding here.
* `VideoLatentSampler`: the official `VideoLatentVariableSampler`: `[B, L, D] -> (mu, logvar)`,
  `mu` L2-normalised.
* `reparameterize`, `kl_divergence`: the official `reparameterize` / `kld_loss`.
* `text_perturbation`: the official `TextSampler` (`num_samples > 1`): K perturbed copies of
  each query feature. Its Gaussian draws are arguments (`perturbation_noise(rng, ...)`).

The parameters map 1:1 to the official state dict by `OFFICIAL_SAMPLER_PARAMS` /
`sampler_params_from_official` (`prvr_jax.layers.diffusion.params_from_official`).
"""

from collections.abc import Mapping
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from prvr_jax.layers import precision
from prvr_jax.layers.attention import dense, layer_norm
from prvr_jax.layers.diffusion import params_from_official

# Official constants (latent_sampler.py).
GPO_WIDTH = 32  # VideoLatentVariableSampler: GPO(32, 32), position-code and GRU widths.
GPO_TEMPERATURE = 0.1  # GPO.compute_pool_weights: softmax(scores / 0.1).
INSTANCE_NORM_EPS = 1e-5  # TextSampler: nn.InstanceNorm1d default eps.
PERTURBATION_SCALE = 0.1  # TextSampler: perturbation_scale default.


def position_codes(length: int, width: int) -> np.ndarray:
  """`positional_encoding_1d`: `[L, width]`, sin in even columns, cos in odd, frequencies
  `10000^(-2i / width)` (float32)."""
  freqs = np.exp(np.arange(0, width, 2, dtype=np.float32) * np.float32(-math.log(10000.0)
                                                                       / width))
  angles = np.arange(length, dtype=np.float32)[:, None] * freqs
  codes = np.zeros((length, width), np.float32)
  codes[:, 0::2] = np.sin(angles)
  codes[:, 1::2] = np.cos(angles)
  return codes


class GRUDirection(nn.Module):
  """One direction of a single-layer `torch.nn.GRU` (gates r, z, n in that order):
  `[L, Din] -> [L, H]` from a zero state, run as a `lax.scan`.

  `r = sigmoid(x W_ir + b_ir + h W_hr + b_hr)`, `z` likewise, `n = tanh(x W_in + b_in
  + r (h W_hn + b_hn))`, `h' = (1 - z) n + z h`. Kernels are torch's `weight_ih` / `weight_hh`
  transposed (`[Din, 3H]`, `[H, 3H]`); init as the official `_init_gpo_weights` (Xavier, an
  orthogonal recurrent kernel, zero biases).
  """
  hidden: int
  reverse: bool = False

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    h3 = 3 * self.hidden
    w_ih = self.param('input_kernel', nn.initializers.xavier_uniform(), (x.shape[-1], h3))
    w_hh = self.param('hidden_kernel', nn.initializers.orthogonal(), (self.hidden, h3))
    b_ih = self.param('input_bias', nn.initializers.zeros, (h3,))
    b_hh = self.param('hidden_bias', nn.initializers.zeros, (h3,))
    gates_x = precision.matmul(x, w_ih) + b_ih  # [L, 3H], every step's input part at once

    def step(h, gx):
      gh = precision.matmul(h, w_hh) + b_hh
      xr, xz, xn = jnp.split(gx, 3, axis=-1)
      hr, hz, hn = jnp.split(gh, 3, axis=-1)
      r = jax.nn.sigmoid(xr + hr)
      z = jax.nn.sigmoid(xz + hz)
      n = jnp.tanh(xn + r * hn)
      h = (1.0 - z) * n + z * h
      return h, h

    h0 = jnp.zeros((self.hidden,), x.dtype)
    _, out = jax.lax.scan(step, h0, gates_x, reverse=self.reverse)
    return out


class GPOPooling(nn.Module):
  """Official `GPO` on full-length sequences: `[B, L, D] -> [B, D]`.

  Weights `softmax_L(w . (h_fwd + h_bwd) / 2 / 0.1)` from a bidirectional GRU (width
  `hidden`) over the position codes `[L, width]`; the output is `sum_l w_l sort_desc(x)_l` per
  feature dimension (the l-th largest value of each dimension gets weight l).
  """
  width: int = GPO_WIDTH
  hidden: int = GPO_WIDTH

  @nn.compact
  def __call__(self, x: jax.Array, return_weights: bool = False
               ) -> jax.Array | tuple[jax.Array, jax.Array]:
    """`[B, L, D] -> [B, D]`, and the `[L, 1]` pooling weights (the same for every sequence of
    length L) with `return_weights=True`."""
    codes = jnp.asarray(position_codes(x.shape[-2], self.width))
    forward = GRUDirection(self.hidden, name='forward')(codes)
    backward = GRUDirection(self.hidden, reverse=True, name='backward')(codes)
    scores = dense(1, 'score', use_bias=False)((forward + backward) / 2)
    weights = jax.nn.softmax(scores / GPO_TEMPERATURE, axis=0)
    ranked = -jnp.sort(-x, axis=-2)  # descending along L, per feature dimension
    pooled = jnp.sum(ranked * weights, axis=-2)
    return (pooled, weights) if return_weights else pooled


class _SingleHeadPool(nn.Module):
  """Official `MultiHeadSelfAttention(1, D, H)` (no mask): `softmax_L(w2 . tanh(W1 x))`
  weighted sum, `[B, L, D] -> [B, D]`."""
  hidden: int

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    logits = dense(1, 'w_2', use_bias=False)(jnp.tanh(dense(self.hidden, 'w_1',
                                                            use_bias=False)(x)))
    weights = jax.nn.softmax(logits, axis=-2)
    return jnp.einsum('bl,bld->bd', weights[..., 0], x)


class VideoLatentSampler(nn.Module):
  """Official `VideoLatentVariableSampler`: clip features `[B, L, D]` -> `(mu, logvar)`
  `[B, D]` of the video-centric Gaussian.

  `p = GPO(x)`; `mu = l2norm(LN(p + sigmoid(Dense(attn_pool(x)))))` (official `VideoMean`,
  one embedding); `logvar = Dense(attn_pool'(x)) + Dense'(p)` (official `VideoVar`); the two
  attention pools have width D / 2.
  """

  @nn.compact
  def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    width = x.shape[-1]
    pooled = GPOPooling(name='gpo')(x)
    residual = _SingleHeadPool(width // 2, name='mean_attention')(x)
    mean = layer_norm('mean_norm')(pooled + jax.nn.sigmoid(dense(width, 'mean_fc')(residual)))
    norm = jnp.sqrt(jnp.sum(mean * mean, axis=-1, keepdims=True))
    mu = mean / jnp.maximum(norm, 1e-12)  # F.normalize's eps
    residual = _SingleHeadPool(width // 2, name='var_attention')(x)
    logvar = dense(width, 'var_fc')(residual) + dense(width, 'var_fc2')(pooled)
    return mu, logvar


def reparameterize(mu: jax.Array, logvar: jax.Array, num_samples: int,
                   noise: jax.Array | None) -> jax.Array:
  """`[B, D] -> [B, K, D]` samples `mu + exp(logvar / 2) noise` (`noise` `[B, K, D]`), or `mu`
  repeated K times for `noise=None` (the official `deterministic=True`, the model's only use)."""
  if noise is None:
    return jnp.broadcast_to(mu[:, None], (mu.shape[0], num_samples, mu.shape[-1]))
  return noise * jnp.exp(0.5 * logvar[:, None]) + mu[:, None]


def kl_divergence(mu: jax.Array, logvar: jax.Array) -> jax.Array:
  """`-1/2 sum(1 + logvar - mu^2 - exp(logvar)) / B`: KL(N(mu, exp(logvar)) || N(0, I)) summed
  over dimensions, averaged over the batch (official `kld_loss`)."""
  return -0.5 * jnp.sum(1.0 + logvar - mu * mu - jnp.exp(logvar)) / mu.shape[0]


def perturbation_noise(rng: jax.Array, batch: int, num_samples: int, width: int,
                       dtype=jnp.float32) -> tuple[jax.Array, jax.Array]:
  """The two standard-normal draws `(z_alpha, z_beta)`, each `[B, K, D]`, of
  `text_perturbation`."""
  k_alpha, k_beta = jax.random.split(rng)
  shape = (batch, num_samples, width)
  return jax.random.normal(k_alpha, shape, dtype), jax.random.normal(k_beta, shape, dtype)


def text_perturbation(features: jax.Array, z_alpha: jax.Array, z_beta: jax.Array,
                      scale: float = PERTURBATION_SCALE, alpha_scale: float = 1.0,
                      beta_scale: float = 1.0) -> jax.Array:
  """Official `TextSampler` (`num_samples = K > 1`): `[B, D]` -> `[B, K, D]`,
  `alpha (f - mean(f)) / sqrt(var(f) + 1e-5) + beta` per row.

  `alpha ~ N(1, s)`, `beta ~ N(mean(f), s)` with `s = scale std(f)` (unbiased std over D) are
  formed from the standard normals `z_alpha`, `z_beta` `[B, K, D]` (`perturbation_noise`);
  like the official `Normal.sample` they carry no gradient. The normalisation is the official
  `InstanceNorm1d` (affine-free, biased variance) over each row's D values.
  """
  width = features.shape[-1]
  mean = jnp.mean(features, axis=-1, keepdims=True)
  centred = features - mean
  var = jnp.mean(centred * centred, axis=-1, keepdims=True)
  normed = centred / jnp.sqrt(var + INSTANCE_NORM_EPS)
  std = jnp.sqrt(jnp.sum(centred * centred, axis=-1, keepdims=True) / (width - 1))
  spread = jax.lax.stop_gradient(scale * std)[:, None]  # [B, 1, 1]
  alpha = 1.0 + spread * z_alpha
  beta = jax.lax.stop_gradient(mean)[:, None] + spread * z_beta
  return alpha_scale * alpha * normed[:, None] + beta_scale * beta


def _gru_rows(official: str, ours: str) -> tuple[tuple[str, str, bool], ...]:
  return ((f'gpo.gru.weight_ih_{official}', f'gpo/{ours}/input_kernel', True),
          (f'gpo.gru.weight_hh_{official}', f'gpo/{ours}/hidden_kernel', True),
          (f'gpo.gru.bias_ih_{official}', f'gpo/{ours}/input_bias', False),
          (f'gpo.gru.bias_hh_{official}', f'gpo/{ours}/hidden_bias', False))


# Official name (relative to a `VideoLatentVariableSampler`, e.g. under
# `video_probabilistic_variational_sampler.`) -> our path; `T`: transposed to a Dense kernel.
OFFICIAL_SAMPLER_PARAMS: tuple[tuple[str, str, bool], ...] = (
    *_gru_rows('l0', 'forward'),
    *_gru_rows('l0_reverse', 'backward'),
    ('gpo.linear.weight', 'gpo/score/kernel', True),
    ('pie_net_video.attention.w_1.weight', 'mean_attention/w_1/kernel', True),
    ('pie_net_video.attention.w_2.weight', 'mean_attention/w_2/kernel', True),
    ('pie_net_video.fc.weight', 'mean_fc/kernel', True),
    ('pie_net_video.fc.bias', 'mean_fc/bias', False),
    ('pie_net_video.layer_norm.weight', 'mean_norm/scale', False),
    ('pie_net_video.layer_norm.bias', 'mean_norm/bias', False),
    ('uncertain_net_video.attention.w_1.weight', 'var_attention/w_1/kernel', True),
    ('uncertain_net_video.attention.w_2.weight', 'var_attention/w_2/kernel', True),
    ('uncertain_net_video.fc.weight', 'var_fc/kernel', True),
    ('uncertain_net_video.fc.bias', 'var_fc/bias', False),
    ('uncertain_net_video.fc2.weight', 'var_fc2/kernel', True),
    ('uncertain_net_video.fc2.bias', 'var_fc2/bias', False),
)


def sampler_params_from_official(state: Mapping[str, np.ndarray], prefix: str = '') -> dict:
  """A `VideoLatentSampler`'s params from an official state dict (prefix e.g.
  `video_probabilistic_variational_sampler.`)."""
  return params_from_official(state, OFFICIAL_SAMPLER_PARAMS, prefix)
