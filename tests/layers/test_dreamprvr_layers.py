"""DreamPRVR's register diffusion, samplers and register block (prvr_jax/layers/{diffusion,
latent_sampler,register_block}.py): parity with the official modules, outputs and gradients
(tests/fixtures/dreamprvr/README.md), and the properties the official code relies on."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import support
from prvr_jax.layers import diffusion as df
from prvr_jax.layers import latent_sampler as lsm
from prvr_jax.layers import precision
from prvr_jax.layers import register_block as rb

FIXTURE = support.FIXTURES / 'dreamprvr' / 'diffusion.npz'
SCHEDULE_KEYS = ('betas', 'alphas_cumprod', 'alphas_cumprod_prev', 'posterior_variance',
                 'posterior_log_variance_clipped', 'posterior_mean_coef1',
                 'posterior_mean_coef2', 'sqrt_recip_alphas_cumprod',
                 'sqrt_recipm1_alphas_cumprod')


@pytest.fixture(scope='module')
def official():
  with np.load(FIXTURE) as f:
    return {k: f[k] for k in f.files}


@pytest.fixture(scope='module')
def dims(official):
  batch, registers, width, length, steps = (int(v) for v in official['dims'])
  return batch, registers, width, length, steps


def _state(official: dict, prefix: str) -> dict:
  """The official parameters stored under `<prefix>param/`, keyed by official name."""
  head = prefix + 'param/'
  return {k[len(head):]: v for k, v in official.items() if k.startswith(head)}


def _leaf(tree, path: str):
  for part in path.split('/'):
    tree = tree[part]
  return np.asarray(tree)


def _check_param_grads(official: dict, prefix: str, grads, table, rtol: float) -> None:
  """Every official parameter gradient (relative to the largest of them); a parameter the
  official code holds frozen (no gradient stored) must get exactly 0 here."""
  stored = {k[len(prefix) + 5:]: v for k, v in official.items() if k.startswith(prefix + 'grad/')}
  scale = max(float(np.abs(v).max()) for v in stored.values())
  for name, path, transpose in table:
    ours = _leaf(grads, path)
    ours = ours.T if transpose else ours
    if name not in stored:
      np.testing.assert_array_equal(ours, 0.0, err_msg=name)
      continue
    support.assert_close(ours, stored[name], rtol, scale=scale, err_msg=name)


# ------------------------------------------------------------------------------ schedules


@pytest.mark.parametrize('kind,steps', [('cosine', 10), ('linear', 100)])
def test_schedule_constants_equal_the_official_ones(official, kind, steps):
  ours = df.diffusion_schedule(steps, kind)
  for key in SCHEDULE_KEYS:
    expected = official[f'sched_{kind}{steps}/{key}']
    assert np.isfinite(expected).all(), key
    np.testing.assert_allclose(ours[key], expected, rtol=1e-13, atol=0, err_msg=key)


def test_schedule_rejects_what_the_official_code_turns_into_nan():
  with pytest.raises(ValueError, match='config.model.timesteps'):
    df.diffusion_schedule(10, 'linear')
  with pytest.raises(ValueError, match='config.model.beta_schedule'):
    df.diffusion_schedule(10, 'sigmoid')


def test_time_table_is_the_official_sinusoid(official, dims):
  *_, width, _, steps = dims
  table = df.sinusoidal_table(steps, width)
  support.assert_close(table, official['time_table_init'], support.f32_rtol(1, 4))


# ------------------------------------------------------------------------------ denoiser


def test_denoiser_matches_official(official, dims):
  *_, steps = dims
  table = df.official_denoiser_params(2)
  assert {name for name, _, _ in table} == set(_state(official, 'mlp_'))
  params = df.denoiser_params_from_official(_state(official, 'mlp_'), 2)
  mlp = df.DiffusionMLP(steps, 2)
  t = jnp.asarray(official['mlp_t'])

  @jax.jit
  def value_and_grads(params, x, cond):
    def f(params, x, cond):
      out = mlp.apply({'params': params}, x, t, cond)
      return jnp.sum(out * official['mlp_cotangent']), out
    return jax.grad(f, argnums=(0, 1, 2), has_aux=True)(params, x, cond)

  (g_params, g_x, g_cond), out = value_and_grads(params, official['mlp_x'], official['mlp_cond'])
  # Two bottlenecks of D = 16 wide matmuls and LayerNorms between input and output.
  rtol = support.f32_rtol(16, 6)
  support.assert_close(out, official['mlp_out'], rtol)
  support.assert_close(g_x, official['mlp_grad_x'], rtol)
  support.assert_close(g_cond, official['mlp_grad_cond'], rtol)
  # The frozen time table (no official gradient) gets exactly 0.
  _check_param_grads(official, 'mlp_', g_params, table, rtol)


def test_missing_official_parameter_is_named(official):
  state = _state(official, 'mlp_')
  del state['layers.1.cond_proj.1.bias']
  with pytest.raises(ValueError, match=r'diffusion_mlp\.layers\.1\.cond_proj\.1\.bias'):
    df.denoiser_params_from_official({'diffusion_mlp.' + k: v for k, v in state.items()}, 2,
                                     prefix='diffusion_mlp.')


# ------------------------------------------------------------------- forward and reverse


@pytest.fixture(scope='module')
def diffusion(official, dims):
  *_, steps = dims
  params = df.denoiser_params_from_official(_state(official, 'mlp_'), 2)
  return df.RegisterDiffusion(steps, 2), {'params': {'denoiser': params}}


def test_oversample_matches_official(official, diffusion, dims):
  module, variables = diffusion
  *_, steps = dims

  @jax.jit
  def loss_and_grads(variables, x0, noise, cond):
    def f(variables, x0, noise, cond):
      pred, recon, noisy = module.apply(variables, x0, cond, noise, method='oversample')
      return jnp.mean((noise[None] - pred) ** 2), (pred, recon, noisy)
    return jax.value_and_grad(f, argnums=(0, 1, 2, 3), has_aux=True)(variables, x0, noise,
                                                                      cond)

  (loss, (pred, recon, noisy)), grads = loss_and_grads(
      variables, official['over_x0'], official['over_noise'], official['over_cond'])
  assert pred.shape == (steps,) + official['over_x0'].shape
  rtol = support.f32_rtol(16, 6)
  support.assert_close(noisy, official['over_noisy'], support.f32_rtol(1, 2))
  support.assert_close(pred, official['over_pred'], rtol)
  # x_0 from the prediction: sqrt(1 / abar_t - 1) (up to 204 at t = 9) times its rounding.
  support.assert_close(recon, official['over_recon'], rtol)
  support.assert_close(loss, official['over_loss'], support.f32_rtol(steps * recon[0].size, 1))
  for i, name in enumerate(('x0', 'noise', 'cond'), start=1):
    support.assert_close(grads[i], official[f'over_grad_{name}'], rtol, err_msg=name)
  _check_param_grads(official, 'over_', grads[0]['params']['denoiser'],
                     df.official_denoiser_params(2), rtol)


def test_sample_matches_official_evaluation_path(official, diffusion, dims):
  """The official model's sampling: start and every step's noise are the same tensor."""
  module, variables = diffusion
  *_, steps = dims
  start, cond = official['samp_start'], official['samp_cond']
  # The same steps one at a time: the x_0 clamp is active in some entries and steps and not
  # in others (both branches, with gradients 0 and 1, are exercised), and the scan agrees.
  schedule = df.diffusion_schedule(steps)

  @jax.jit
  def one_step(x_t, t):
    pred = module.apply(variables, x_t, t, cond)
    recon = df.predict_start_from_noise(schedule, x_t, t, pred)
    return df.reverse_step(schedule, x_t, t, pred, start), recon

  x_t, clamped, kept = start, 0, 0
  for t in range(steps - 1, -1, -1):
    x_t, recon = one_step(x_t, jnp.asarray(t))
    recon = np.abs(np.asarray(recon))
    clamped, kept = clamped + int((recon > 1).sum()), kept + int((recon < 1).sum())
  assert clamped > 0 and kept > 0

  @jax.jit
  def value_and_grads(variables, start, cond):
    def f(variables, start, cond):
      out = module.apply(variables, cond, start, start, method='sample')
      return jnp.sum(out * official['samp_cotangent']), out
    return jax.grad(f, argnums=(0, 1, 2), has_aux=True)(variables, start, cond)

  (g_vars, g_start, g_cond), out = value_and_grads(variables, start, cond)
  # T = 10 chained denoiser evaluations.
  rtol = support.f32_rtol(16, 6 * steps)
  support.assert_close(out, x_t, rtol)
  support.assert_close(out, official['samp_out'], rtol)
  support.assert_close(g_start, official['samp_grad_start'], rtol)
  support.assert_close(g_cond, official['samp_grad_cond'], rtol)
  _check_param_grads(official, 'samp_', g_vars['params']['denoiser'],
                     df.official_denoiser_params(2), rtol)


def test_sample_keeps_its_reverse_loop_float32_under_mixed_precision(official, diffusion):
  """The reverse loop magnifies the denoiser's rounding (x_0 recovered with a factor ~204):
  under `matmul_precision('bfloat16')` `sample` still runs its denoiser in float32 (equal to
  the float32 trace), and the same loop in bfloat16 (`float32_reverse=False`) is measurably
  off; the gradients flow through the float32 loop too."""
  module, variables = diffusion
  start, cond = official['samp_start'], official['samp_cond']

  def run(module, name):
    with precision.matmul_precision(name):
      return np.asarray(jax.jit(lambda v: module.apply(v, cond, start, start,
                                                       method='sample'))(variables))

  reference = run(module, 'float32')
  support.assert_close(run(module, 'bfloat16'), reference, support.f32_rtol(16, 60))
  bf16_loop = module.clone(float32_reverse=False)
  assert np.abs(run(bf16_loop, 'bfloat16') - reference).max() > 1e-2 * np.abs(reference).max()


def test_sample_with_fresh_noise_per_step_matches_official(official, diffusion, dims):
  module, variables = diffusion
  *_, steps = dims
  sample = jax.jit(lambda v, c, s, n: module.apply(v, c, s, n, method='sample'))
  noise = official['rand_step_noise']  # [T, B, K, D] in the order the official loop drew it
  out = sample(variables, official['samp_cond'], official['samp_start'], noise)
  support.assert_close(out, official['rand_out'], support.f32_rtol(16, 6 * steps))
  # Noise enters every step but the last (t = 0): changing the last row changes nothing.
  last_changed = noise.copy()
  last_changed[-1] += 1.0
  np.testing.assert_array_equal(
      sample(variables, official['samp_cond'], official['samp_start'], last_changed), out)
  with pytest.raises(ValueError, match='config.model.timesteps'):
    module.apply(variables, official['samp_cond'], official['samp_start'], noise[:3],
                 method='sample')


def test_sample_initialises_and_draws_from_an_explicit_rng():
  module = df.RegisterDiffusion(timesteps=4, num_layers=1)
  cond = jnp.ones((2, 3, 8))
  start = jnp.linspace(-1, 1, 48).reshape(2, 3, 8)
  variables = jax.jit(lambda: module.init(jax.random.PRNGKey(0), cond, start, None,
                                          method='sample'))()
  assert set(variables['params']) == {'denoiser'}
  sample = jax.jit(lambda noise: module.apply(variables, cond, start, noise, method='sample'))
  noise = df.step_noises(jax.random.PRNGKey(1), 4, start.shape)
  first = sample(noise)
  np.testing.assert_array_equal(sample(noise), first)
  other = sample(df.step_noises(jax.random.PRNGKey(2), 4, start.shape))
  assert np.abs(np.asarray(other - first)).max() > 1e-3


# ------------------------------------------------------------------------------ samplers


def test_video_latent_sampler_matches_official(official, dims):
  assert {name for name, _, _ in lsm.OFFICIAL_SAMPLER_PARAMS} == set(_state(official, 'pvs_'))
  params = lsm.sampler_params_from_official(_state(official, 'pvs_'))
  sampler = lsm.VideoLatentSampler()

  @jax.jit
  def value_and_grads(params, x):
    def f(params, x):
      mu, logvar = sampler.apply({'params': params}, x)
      kld = lsm.kl_divergence(mu, logvar)
      total = (jnp.sum(mu * official['pvs_cot_mu']) + jnp.sum(logvar * official['pvs_cot_logvar'])
               + kld)
      return total, (mu, logvar, kld)
    return jax.grad(f, argnums=(0, 1), has_aux=True)(params, x)

  (g_params, g_x), (mu, logvar, kld) = value_and_grads(params, official['pvs_x'])
  # GRU of L = 8 steps (32 wide), a softmax over L, attention pools and LayerNorm over D = 16.
  rtol = support.f32_rtol(32, 8)
  support.assert_close(mu, official['pvs_mu'], rtol)
  np.testing.assert_allclose(np.linalg.norm(mu, axis=-1), 1.0, rtol=4 * support.F32_EPS)
  support.assert_close(logvar, official['pvs_logvar'], rtol)
  support.assert_close(kld, official['pvs_kld'], rtol)
  support.assert_close(g_x, official['pvs_grad_x'], rtol)
  _check_param_grads(official, 'pvs_', g_params, lsm.OFFICIAL_SAMPLER_PARAMS, rtol)
  _, weights = lsm.GPOPooling().apply({'params': params['gpo']}, official['pvs_x'],
                                      return_weights=True)
  support.assert_close(weights, official['pvs_pool_weights'][0], rtol)


def test_text_perturbation_matches_official(official):
  z_alpha = official['tps_z_alpha'].astype(np.float32)
  z_beta = official['tps_z_beta'].astype(np.float32)
  features = official['tps_features']
  fn = jax.jit(jax.value_and_grad(
      lambda f: jnp.sum(lsm.text_perturbation(f, z_alpha, z_beta) * official['tps_cotangent'])))
  out = lsm.text_perturbation(features, z_alpha, z_beta)
  rtol = support.f32_rtol(16, 3)
  support.assert_close(out, official['tps_out'], rtol)
  # The official draws are sample() outputs: no gradient reaches the features through them.
  _, grad = fn(features)
  support.assert_close(grad, official['tps_grad_features'], rtol)
  # Zero draws: every copy is the instance-normalised row plus its mean.
  plain = np.asarray(lsm.text_perturbation(features, 0 * z_alpha, 0 * z_beta))
  row = features - features.mean(-1, keepdims=True)
  expected = row / np.sqrt(row.var(-1, keepdims=True) + 1e-5) + features.mean(-1, keepdims=True)
  support.assert_close(plain, np.broadcast_to(expected[:, None], plain.shape), rtol)


def test_reparameterize_and_kl():
  mu = jnp.asarray(np.random.default_rng(0).normal(size=(2, 5)), jnp.float32)
  logvar = jnp.asarray(np.random.default_rng(1).normal(size=(2, 5)), jnp.float32)
  same = lsm.reparameterize(mu, logvar, 3, None)
  assert same.shape == (2, 3, 5)
  np.testing.assert_array_equal(same, np.broadcast_to(np.asarray(mu)[:, None], (2, 3, 5)))
  noise = jnp.ones((2, 3, 5))
  expected = np.asarray(mu)[:, None] + np.exp(0.5 * np.asarray(logvar))[:, None]
  support.assert_close(lsm.reparameterize(mu, logvar, 3, noise),
                       np.broadcast_to(expected, (2, 3, 5)),
                       support.f32_rtol(1, 2))
  np.testing.assert_array_equal(lsm.kl_divergence(jnp.zeros((4, 5)), jnp.zeros((4, 5))), 0.0)
  expected = -0.5 * np.sum(1 + logvar - mu**2 - np.exp(logvar)) / 2
  support.assert_close(lsm.kl_divergence(mu, logvar), expected, support.f32_rtol(10, 2))


# ------------------------------------------------------------------------ register block


def test_register_block_matches_official():
  """The official `DreamPRVRBlock` (token rows only, as the official block returns them),
  with a key mask (frame branch) and without (clip branch)."""
  with np.load(support.FIXTURES / 'dreamprvr' / 'register_block.npz') as f:
    official = {k: f[k] for k in f.files}
  state = {k[len('param/'):]: v for k, v in official.items() if k.startswith('param/')}
  num_branches = len(official['widths'])
  widths = rb.register_widths(num_branches)
  assert widths[0] is None
  np.testing.assert_array_equal(widths[1:], official['widths'][1:])
  names = set()
  for name, _, _ in rb.OFFICIAL_REGISTER_BLOCK_PARAMS:
    names |= ({name.replace('{k}', str(k)) for k in range(num_branches)} if '{k}' in name
              else {name})
  assert names == set(state)
  params = rb.register_block_params_from_official(state, num_branches)
  block = rb.RegisterGaussianBlock(num_heads=2, attention_num=num_branches, temperature=0.3)

  @jax.jit
  def value_and_grads(params, x, registers, mask, cotangent):
    def f(params, x, registers):
      out = block.apply({'params': params}, x, registers, mask)
      return jnp.sum(out * cotangent), out
    return jax.grad(f, argnums=(0, 1, 2), has_aux=True)(params, x, registers)

  # Five branches of attention, FFN and LayerNorm over D = 8 (L + K = 11 keys), the mixer.
  rtol = support.f32_rtol(32, 8)
  for tag, mask in (('masked', official['mask']), ('nomask', np.ones_like(official['mask']))):
    (g_params, g_x, g_reg), out = value_and_grads(params, official['input'],
                                                  official['registers'], mask,
                                                  official[f'{tag}_cotangent'])
    support.assert_close(out, official[f'{tag}_output'], rtol, err_msg=tag)
    support.assert_close(g_x, official[f'{tag}_grad_input'], rtol, err_msg=tag)
    support.assert_close(g_reg, official[f'{tag}_grad_registers'], rtol, err_msg=tag)
  # No mask at all (the clip branch's call) is the all-ones mask.
  no_mask = jax.jit(lambda p, x, r: block.apply({'params': p}, x, r))
  support.assert_close(no_mask(params, official['input'], official['registers']),
                       official['nomask_output'], rtol)
  # Parameter gradients of the masked call.
  (g_params, _, _), _ = value_and_grads(params, official['input'], official['registers'],
                                        official['mask'], official['masked_cotangent'])
  stored = {k[len('masked_grad/'):]: v for k, v in official.items()
            if k.startswith('masked_grad/')}
  scale = max(float(np.abs(v).max()) for v in stored.values())
  for name, path, transpose in rb.OFFICIAL_REGISTER_BLOCK_PARAMS:
    leaf = _leaf(g_params, path)
    for k in range(num_branches) if '{k}' in name else (None,):
      value = leaf if k is None else leaf[k]
      key = name if k is None else name.replace('{k}', str(k))
      support.assert_close(value.T if transpose else value, stored[key], rtol, scale=scale,
                           err_msg=key)
  with pytest.raises(ValueError, match=r'clip_encoder\.layer2\.bias'):
    rb.register_block_params_from_official(
        {'clip_encoder.' + k: v for k, v in state.items() if k != 'layer2.bias'},
        num_branches, prefix='clip_encoder.')
