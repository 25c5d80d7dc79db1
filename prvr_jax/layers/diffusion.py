"""DreamPRVR's register diffusion: a DDPM schedule, its conditional MLP denoiser, and the
truncated reverse process that turns a video-centric start into registers.

DreamPRVR (CVPR 2026, `lijun2005/CVPR26-DreamPRVR`, `src/Models/DreamPRVR/diffusion_model.py`)
denoises `[B, K, D]` register sets (K registers per video) in `T` steps (T = 10 in every
shipped config), conditioned on `[B, K, D]` query-former registers:

* `diffusion_schedule`: the official `cosine` (default) or `linear` beta schedule and the DDPM
  posterior constants, in float64 as the official code builds them; they enter the float32
  arithmetic cast to float32, as the official `_extract` does.
* `DiffusionMLP`: the official `DiffusionMLP` noise predictor `eps(x_t, t, cond)`.
* `RegisterDiffusion`: the denoiser plus `oversample` (the official `ddpm_forward_oversample`:
  the prediction at every timestep of one noise, all T in one batched call) and `sample` (the
  official `sample` / `p_sample_loop`, the T reverse steps as one `nn.scan`).

Randomness is explicit: every noise is an argument. The official model starts the reverse
process at the variational mean `mu` and adds the same `mu` as the "noise" of every step
(`middle_noise=noise`), so its sampling is deterministic; `sample(cond, start,
step_noise=start)` is that. `step_noise` `[T, ...]` gives fresh noise per step (the official
`middle_noise=None`, drawn here with `step_noises(rng, ...)`), `None` none at all.

The parameters map 1:1 to the official `DiffusionMLP` state dict by
`official_denoiser_params` (`OFFICIAL_DENOISER_PARAMS` at DreamPRVR's two layers) /
`denoiser_params_from_official`.
"""

from collections.abc import Mapping
import contextlib
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from prvr_jax.layers.attention import dense, layer_norm
from prvr_jax.layers.precision import matmul_precision

# Official constants (diffusion_model.py).
COSINE_S = 0.008  # cosine_beta_schedule: s.
MAX_BETA = 0.999  # cosine_beta_schedule: clamp(betas, 0, 0.999).
LINEAR_BETA_RANGE = (1e-4, 0.02)  # linear_beta_schedule at 1000 steps (scaled by 1000 / T).
CLIP_DENOISED = 1.0  # p_mean_variance: clamp(x_recon, -1, 1).
TIME_FREQ_BASE = 10000.0  # TimeEmbedding: the sinusoid's frequency base.
BETA_SCHEDULES = ('cosine', 'linear')


def diffusion_schedule(timesteps: int, kind: str = 'cosine') -> dict[str, np.ndarray]:
  """The official `GaussianDiffusion` constants `[T]` in float64.

  `kind='cosine'` (the official default, Nichol & Dhariwal): `abar(x) = cos^2(pi/2 (x / T + s)
  / (1 + s))` normalised by `abar(0)`, `beta_t = min(1 - abar(t + 1) / abar(t), 0.999)`;
  `'linear'`: `beta` from `1e-4 * 1000 / T` to `0.02 * 1000 / T` (T > 20: for fewer steps the
  official constants are NaN, here a ValueError). The posterior
  `q(x_{t-1} | x_t, x_0)` has variance `beta_t (1 - abar_{t-1}) / (1 - abar_t)` (0 at t = 0;
  its log is clipped to the t = 1 value there, as in DDPM) and mean
  `coef1_t x_0 + coef2_t x_t`.
  """
  if kind == 'cosine':
    x = np.linspace(0.0, timesteps, timesteps + 1, dtype=np.float64)
    abar = np.cos(((x / timesteps) + COSINE_S) / (1 + COSINE_S) * math.pi * 0.5) ** 2
    abar = abar / abar[0]
    betas = np.clip(1.0 - abar[1:] / abar[:-1], 0.0, MAX_BETA)
  elif kind == 'linear':
    scale = 1000.0 / timesteps
    betas = np.linspace(scale * LINEAR_BETA_RANGE[0], scale * LINEAR_BETA_RANGE[1], timesteps,
                        dtype=np.float64)
    if betas[-1] >= 1.0:  # the official code goes on with NaN constants
      raise ValueError(f'linear beta schedule needs timesteps >= 21 (its last beta 20 / T < 1); '
                       f'got {timesteps} (config.model.timesteps)')
  else:
    raise ValueError(f'unknown beta schedule {kind!r} (config.model.beta_schedule); '
                     f'known: {BETA_SCHEDULES}')
  alphas = 1.0 - betas
  abar = np.cumprod(alphas)
  abar_prev = np.concatenate([[1.0], abar[:-1]])
  posterior_variance = betas * (1.0 - abar_prev) / (1.0 - abar)
  return {
      'betas': betas,
      'alphas_cumprod': abar,
      'alphas_cumprod_prev': abar_prev,
      'sqrt_alphas_cumprod': np.sqrt(abar),
      'sqrt_one_minus_alphas_cumprod': np.sqrt(1.0 - abar),
      'sqrt_recip_alphas_cumprod': np.sqrt(1.0 / abar),
      'sqrt_recipm1_alphas_cumprod': np.sqrt(1.0 / abar - 1.0),
      'posterior_variance': posterior_variance,
      'posterior_log_variance_clipped': np.log(
          np.concatenate([posterior_variance[1:2], posterior_variance[1:]])),
      'posterior_mean_coef1': betas * np.sqrt(abar_prev) / (1.0 - abar),
      'posterior_mean_coef2': (1.0 - abar_prev) * np.sqrt(alphas) / (1.0 - abar),
  }


def _at(schedule: Mapping[str, np.ndarray], name: str, t: jax.Array, like: jax.Array
        ) -> jax.Array:
  """`schedule[name][t]` in float32, shaped to broadcast against `like` `[B, ...]` (`t` a
  scalar or `[B]`; the official `_extract`)."""
  value = jnp.asarray(np.asarray(schedule[name], np.float32))[t]
  if jnp.ndim(value):
    value = value.reshape(value.shape + (1,) * (like.ndim - 1))
  return value.astype(like.dtype)


def q_sample(schedule: Mapping[str, np.ndarray], x_start: jax.Array, t: jax.Array,
             noise: jax.Array) -> jax.Array:
  """`x_t = sqrt(abar_t) x_0 + sqrt(1 - abar_t) noise` (official `q_sample`)."""
  return (_at(schedule, 'sqrt_alphas_cumprod', t, x_start) * x_start
          + _at(schedule, 'sqrt_one_minus_alphas_cumprod', t, x_start) * noise)


def predict_start_from_noise(schedule: Mapping[str, np.ndarray], x_t: jax.Array, t: jax.Array,
                             noise: jax.Array) -> jax.Array:
  """`x_0 = sqrt(1 / abar_t) x_t - sqrt(1 / abar_t - 1) noise`, the inverse of `q_sample`."""
  return (_at(schedule, 'sqrt_recip_alphas_cumprod', t, x_t) * x_t
          - _at(schedule, 'sqrt_recipm1_alphas_cumprod', t, x_t) * noise)


def reverse_step(schedule: Mapping[str, np.ndarray], x_t: jax.Array, t: jax.Array,
                 pred_noise: jax.Array, noise: jax.Array | None,
                 clip_denoised: float | None = CLIP_DENOISED) -> jax.Array:
  """One ancestral step `x_{t-1}` from `x_t` and the predicted noise (official `p_sample`).

  `x_0` is recovered from the prediction and clamped to `[-clip, clip]` (official
  `clamp(x_recon, -1, 1)`, gradient 1 inside, 0 outside; `None`: no clamp), the posterior mean
  `coef1_t x_0 + coef2_t x_t` gets `exp(log_var_t / 2) noise` added, except at t = 0.
  """
  x_recon = predict_start_from_noise(schedule, x_t, t, pred_noise)
  if clip_denoised is not None:
    x_recon = jnp.where(x_recon >= -clip_denoised, x_recon, -clip_denoised)
    x_recon = jnp.where(x_recon <= clip_denoised, x_recon, clip_denoised)
  mean = (_at(schedule, 'posterior_mean_coef1', t, x_t) * x_recon
          + _at(schedule, 'posterior_mean_coef2', t, x_t) * x_t)
  if noise is None:
    return mean
  std = jnp.exp(0.5 * _at(schedule, 'posterior_log_variance_clipped', t, x_t))
  return mean + jnp.where(t != 0, 1.0, 0.0).astype(x_t.dtype) * std * noise


def step_noises(rng: jax.Array, timesteps: int, shape: tuple[int, ...],
                dtype=jnp.float32) -> jax.Array:
  """Fresh standard-normal noise for every reverse step, `[T, *shape]`; row `i` is the noise of
  the i-th step taken (timestep `T - 1 - i`), the order the official loop draws it."""
  return jax.random.normal(rng, (timesteps,) + tuple(shape), dtype)


def swish(x: jax.Array) -> jax.Array:
  """`x sigmoid(x)` (official `Swish`)."""
  return x * jax.nn.sigmoid(x)


def sinusoidal_table(timesteps: int, width: int) -> np.ndarray:
  """The official `TimeEmbedding` table `[T, width]` (float32): row t interleaves
  `sin(t w_i), cos(t w_i)` with `w_i = 10000^(-2i / width)`."""
  if width % 2:
    raise ValueError(f'time-embedding width {width} must be even (the register width, '
                     'config.model.hidden_size)')
  freqs = np.exp(-(np.arange(0, width, 2, dtype=np.float32) / width)
                 * np.float32(math.log(TIME_FREQ_BASE)))
  angles = np.arange(timesteps, dtype=np.float32)[:, None] * freqs[None, :]
  return np.stack([np.sin(angles), np.cos(angles)], axis=-1).reshape(timesteps, width)


TIME_TABLE_INITS = ('sinusoid', 'normal')


def _table_init(kind: str, timesteps: int, width: int):
  """The time table's initialiser: 'sinusoid' (`sinusoidal_table`) or 'normal' (N(0, 0.02),
  what the official `reset_parameters` leaves in every trained DreamPRVR)."""
  if kind == 'sinusoid':
    return lambda *_: jnp.asarray(sinusoidal_table(timesteps, width))
  if kind == 'normal':
    return lambda key, *_: 0.02 * jax.random.normal(key, (timesteps, width), jnp.float32)
  raise ValueError(f'unknown time table init {kind!r} (config.model.time_table); '
                   f'known: {TIME_TABLE_INITS}')


class TimeEmbedding(nn.Module):
  """Official `TimeEmbedding`: a frozen table lookup `[T, D]` -> Dense -> swish -> Dense:
  `t [B] -> [B, features]`.

  The table (`table`) is built sinusoidal and never trained (official
  `Embedding.from_pretrained`, frozen): its gradient is stopped here. NB the official
  `DreamPRVR_Net.reset_parameters` re-initialises every `nn.Embedding`, this table included,
  with N(0, 0.02): a checkpoint's table is that random draw, loaded as it is
  (`table_init='normal'` initialises it so).
  """
  timesteps: int
  features: int
  table_init: str = 'sinusoid'

  @nn.compact
  def __call__(self, t: jax.Array, width: int) -> jax.Array:
    table = self.param('table', _table_init(self.table_init, self.timesteps, width))
    emb = jnp.take(jax.lax.stop_gradient(jnp.asarray(table)), t, axis=0)
    return dense(self.features, 'dense_out')(swish(dense(self.features, 'dense_in')(emb)))


class DiffusionBottleneck(nn.Module):
  """Official `BottleNeck`: `[B, K, D]` (+ time `[B, H]`, condition `[B, K, H]`) -> `[B, K, D]`.

  `h = Dense(swish(LN(x))) + Dense(swish(t))[:, None] + Dense(swish(cond))`, then
  `Dense(dropout(swish(LN(h)))) + Dense(x)`.
  """
  hidden: int
  dropout_rate: float = 0.0

  @nn.compact
  def __call__(self, x: jax.Array, temb: jax.Array, cond: jax.Array,
               deterministic: bool = True) -> jax.Array:
    width = x.shape[-1]
    h = dense(self.hidden, 'block_in_dense')(swish(layer_norm('block_in_norm')(x)))
    h = h + dense(self.hidden, 'temb_proj')(swish(temb))[:, None]
    h = h + dense(self.hidden, 'cond_proj')(swish(cond))
    h = swish(layer_norm('block_out_norm')(h))
    h = nn.Dropout(self.dropout_rate)(h, deterministic=deterministic)
    return dense(width, 'block_out_dense')(h) + dense(width, 'short_cut')(x)


class DiffusionMLP(nn.Module):
  """Official `DiffusionMLP` noise predictor: `x_t [B, K, D], t [B], cond [B, K, D] ->
  [B, K, D]`.

  `cond' = Dense(relu(LN(cond)))`, `h = x_t` through `num_layers` `DiffusionBottleneck`s
  (time embedding and `cond'` into each), output `Dense(h + x_t)`. `hidden`: the inner width
  (None: D; DreamPRVR uses D). `dropout_rate`: the bottlenecks' dropout (DreamPRVR: 0).
  `table_init`: the frozen time table's initialiser (`TimeEmbedding`).
  """
  timesteps: int
  num_layers: int = 2
  hidden: int | None = None
  dropout_rate: float = 0.0
  table_init: str = 'sinusoid'

  @nn.compact
  def __call__(self, x: jax.Array, t: jax.Array, cond: jax.Array,
               deterministic: bool = True) -> jax.Array:
    width = x.shape[-1]
    hidden = self.hidden or width
    t = jnp.broadcast_to(t, x.shape[:1])
    temb = TimeEmbedding(self.timesteps, hidden, self.table_init, name='time_embedding')(
        t, width)
    cond = dense(hidden, 'cond_dense')(nn.relu(layer_norm('cond_norm')(cond)))
    h = x
    for i in range(self.num_layers):
      h = DiffusionBottleneck(hidden, self.dropout_rate, name=f'layers_{i}')(
          h, temb, cond, deterministic)
    return dense(width, 'short_cut')(h + x)


class RegisterDiffusion(nn.Module):
  """The official `DiffusionMLP` + `GaussianDiffusion` pair: a conditional DDPM over register
  sets `[B, K, D]` (parameters under `denoiser/`).

  `__call__(x_t, t, cond)`: the predicted noise. `oversample`: training's predictions at every
  timestep. `sample`: the T reverse steps. `beta_schedule` 'cosine' (official) or 'linear';
  `clip_denoised`: the `x_0` clamp of each reverse step (official 1.0; None: none).
  `table_init`: the denoiser's time-table initialiser (`TimeEmbedding`).
  `float32_reverse`: `sample` runs its denoiser calls in float32 even when the enclosing code is
  traced in mixed precision (`matmul_precision('bfloat16')`): the first reverse step recovers
  `x_0` with the factor `sqrt(1 / abar)` (about 204 at the official cosine schedule, T = 10),
  which magnifies the bfloat16 rounding of the denoiser into the registers (docs/dreamprvr.md,
  "Precision"). `oversample` follows the enclosing precision.
  """
  timesteps: int = 10
  num_layers: int = 2
  hidden: int | None = None
  beta_schedule: str = 'cosine'
  clip_denoised: float | None = CLIP_DENOISED
  dropout_rate: float = 0.0
  table_init: str = 'sinusoid'
  float32_reverse: bool = True

  def setup(self):
    self.schedule = diffusion_schedule(self.timesteps, self.beta_schedule)
    self.denoiser = DiffusionMLP(self.timesteps, self.num_layers, self.hidden,
                                 self.dropout_rate, self.table_init)

  def __call__(self, x_t: jax.Array, t: jax.Array, cond: jax.Array,
               deterministic: bool = True) -> jax.Array:
    return self.denoiser(x_t, t, cond, deterministic)

  def oversample(self, x_start: jax.Array, cond: jax.Array, noise: jax.Array,
                 deterministic: bool = True) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(predicted noise, recovered `x_0`, `x_t`), each `[T, B, K, D]`, at every timestep t of
    `x_t = q_sample(x_start, t, noise)` (official `ddpm_forward_oversample`; its loss is
    `mean((noise - predicted)^2)`). The T timesteps run as one batch of `T B` register sets.
    """
    steps = self.timesteps
    batch = x_start.shape[0]
    t = jnp.repeat(jnp.arange(steps), batch)
    tile = lambda a: jnp.broadcast_to(a, (steps,) + a.shape).reshape((-1,) + a.shape[1:])
    x_t = q_sample(self.schedule, tile(x_start), t, tile(noise))
    pred = self.denoiser(x_t, t, tile(cond), deterministic)
    recon = predict_start_from_noise(self.schedule, x_t, t, pred)
    unfold = lambda a: a.reshape((steps, batch) + a.shape[1:])
    return unfold(pred), unfold(recon), unfold(x_t)

  def sample(self, cond: jax.Array, start: jax.Array, step_noise: jax.Array | None,
             deterministic: bool = True) -> jax.Array:
    """`x_0` `[B, K, D]` after the T reverse steps from `x_T = start` (official `sample`).

    `step_noise`: the noise each step adds, `start.shape` (the same at every step: the official
    model passes `start` itself) or `[T, *start.shape]` (row i at the i-th step taken,
    timestep `T - 1 - i`; see `step_noises`), or None (no noise: the posterior mean).
    """
    steps = self.timesteps
    if step_noise is not None and step_noise.shape == start.shape:
      step_noise = jnp.broadcast_to(step_noise, (steps,) + start.shape)
    elif step_noise is not None and step_noise.shape != (steps,) + start.shape:
      raise ValueError(f'step_noise shape {step_noise.shape} is neither {start.shape} nor '
                       f'{(steps,) + start.shape} (T = {steps}, config.model.timesteps)')
    timesteps = jnp.arange(steps - 1, -1, -1)

    def body(module, x_t, inputs):
      t, noise = inputs
      pred = module.denoiser(x_t, t, cond, deterministic)
      return reverse_step(module.schedule, x_t, t, pred, noise, module.clip_denoised), None

    scan = nn.scan(body, variable_broadcast='params', split_rngs={'params': False,
                                                                  'dropout': True},
                   length=steps)
    with matmul_precision('float32') if self.float32_reverse else contextlib.nullcontext():
      return scan(self, start, (timesteps, step_noise))[0]


def official_denoiser_params(num_layers: int) -> tuple[tuple[str, str, bool], ...]:
  """Official name (relative to a `DiffusionMLP`, e.g. under `diffusion_mlp.`) -> our path
  under `DiffusionMLP` (under `RegisterDiffusion`: `denoiser/` + path); `T`: a Linear weight,
  transposed to a Dense kernel. The official module names keep their spelling (`blcok_`)."""
  rows = [
      ('time_embedding.timembedding.0.weight', 'time_embedding/table', False),
      ('time_embedding.timembedding.1.weight', 'time_embedding/dense_in/kernel', True),
      ('time_embedding.timembedding.1.bias', 'time_embedding/dense_in/bias', False),
      ('time_embedding.timembedding.3.weight', 'time_embedding/dense_out/kernel', True),
      ('time_embedding.timembedding.3.bias', 'time_embedding/dense_out/bias', False),
      ('cond_embedding.0.weight', 'cond_norm/scale', False),
      ('cond_embedding.0.bias', 'cond_norm/bias', False),
      ('cond_embedding.2.weight', 'cond_dense/kernel', True),
      ('cond_embedding.2.bias', 'cond_dense/bias', False),
      ('short_cut.weight', 'short_cut/kernel', True),
      ('short_cut.bias', 'short_cut/bias', False),
  ]
  block = (('blcok_in.0', 'block_in_norm', False), ('blcok_in.2', 'block_in_dense', True),
           ('blcok_out.0', 'block_out_norm', False), ('blcok_out.3', 'block_out_dense', True),
           ('temb_proj.1', 'temb_proj', True), ('cond_proj.1', 'cond_proj', True),
           ('short_cut', 'short_cut', True))
  for i in range(num_layers):
    for official, ours, is_linear in block:
      weight = 'kernel' if is_linear else 'scale'
      rows.append((f'layers.{i}.{official}.weight', f'layers_{i}/{ours}/{weight}', is_linear))
      rows.append((f'layers.{i}.{official}.bias', f'layers_{i}/{ours}/bias', False))
  return tuple(rows)


# The table of DreamPRVR's denoiser (`num_diffusion_layers = 2` in every shipped config).
OFFICIAL_DENOISER_PARAMS = official_denoiser_params(2)


def params_from_official(state: Mapping[str, np.ndarray],
                         table: tuple[tuple[str, str, bool], ...], prefix: str = '') -> dict:
  """Nested params from an official state dict by a name table (arrays keyed by
  `prefix + name`). Raises ValueError naming the key when one is missing."""
  params: dict = {}
  for name, path, transpose in table:
    key = prefix + name
    if key not in state:
      raise ValueError(f'official DreamPRVR parameter missing: {key}')
    value = np.asarray(state[key], np.float32)
    node = params
    *parents, leaf = path.split('/')
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = jnp.asarray(value.T if transpose else value)
  return params


def denoiser_params_from_official(state: Mapping[str, np.ndarray], num_layers: int,
                                  prefix: str = '') -> dict:
  """A `DiffusionMLP`'s params from an official state dict (prefix e.g. `diffusion_mlp.`)."""
  return params_from_official(state, official_denoiser_params(num_layers), prefix)
