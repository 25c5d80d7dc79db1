"""DreamPRVR against the official code (tests/fixtures/dreamprvr/README.md): the registers,
encodings and scores of the evaluation path, every loss term and the gradients of their sum on
one training batch (the official textual-perturbation draws replayed), at tiny dims with fixed
weights; the official name map and config inference on the fixture's state dict; an official
checkpoint through evaluate.py on the multi-batch release; two BertAdam updates; a four-update
training run."""

import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import support
from prvr_jax import convert
from prvr_jax.layers.latent_sampler import reparameterize
from prvr_jax.layers.latent_sampler import kl_divergence
from prvr_jax.models.dreamprvr import mean_video_queries, noise_mse, video_kl
from prvr_jax.models.dreamprvr import official as dream_official
from prvr_jax.models.spec import LossContext

pytestmark = pytest.mark.slow  # the model's loss and gradients compile here

FIXTURES = support.FIXTURES / 'dreamprvr'
FIXTURE = FIXTURES / 'model.npz'
# The fixture's official config: hidden 16, 4 heads, attention_num 4, K = 3 registers, T = 10,
# two denoiser layers, sft_factor 0.5, dropout 0, fusion 0.6 / 0.4; inputs of width 12 (video)
# and 10 (query).
CONFIG = dict(name='dreamprvr', hidden_dim=16, num_heads=4, attention_num=4, num_registers=3,
              timesteps=10, num_diffusion_layers=2, temperature=0.5, dropout=0.0,
              input_dropout=0.0, visual_dim=12, query_dim=10, max_query_len=30,
              max_frames=128, num_clips=32, clip_score_weight=0.6, frame_score_weight=0.4)
LOSS = ml_collections.ConfigDict(dict(
    clip_nce=0.05, frame_nce=0.04, qdl=8e-5, qsp=0.01, kl=1e-4, dre=1e-3, qdl_delta=0.15,
    qdl_alpha=32.0, qdl_gamma=1.0, qsp_temperature=0.09, margin=0.1, hard_pool_size=1,
    hard_negative_start_epoch=0, om=0.0, stochastic_support=0.0))
TERMS = ('clip_nce', 'clip_triplet', 'frame_nce', 'frame_triplet', 'qdl', 'qsp', 'kl', 'dre')
VIDEO_KEYS = ('clip_feats', 'frame_feats', 'frame_mask')
QUERY_KEYS = ('query_feats', 'query_mask')
# Depth of the chain the encodings pass through (projection, positional encoding, the
# condition encoder and query former, the latent sampler, ten chained denoiser calls whose
# first recovers x_0 with a factor ~204, the register blocks' attention, FFN and mixing,
# pooling), for the float32 tolerance.
DEPTH = 64


@pytest.fixture(scope='module')
def fixture():
  return support.load_official_model_fixture(FIXTURE, 'dreamprvr', CONFIG)


def _batch(data, prefix=''):
  """The model's training batch from the fixture arrays `<prefix><key>`, with the official
  perturbation draws."""
  return support.official_fixture_batch(
      data, prefix, (*VIDEO_KEYS, *QUERY_KEYS, 'perturbation_noise'))


def test_config_inference_and_name_map_read_the_official_state_dict(fixture):
  _, state, spec, _, params = fixture
  inferred = spec.official.infer_config(state)
  assert inferred == {k: CONFIG[k] for k in inferred}
  assert {'attention_num', 'num_registers', 'timesteps', 'num_diffusion_layers'} <= set(inferred)
  back = convert.params_to_torch(jax.device_get(params), 'dreamprvr')
  assert set(back) == set(state)  # the frozen time table included
  for name, value in back.items():
    np.testing.assert_array_equal(value, state[name], err_msg=name)
  assert len(dream_official.names(params)) == len(jax.tree.leaves(params))
  with pytest.raises(ValueError, match='diffusion_mlp.time_embedding.timembedding.0.weight'):
    spec.official.infer_config({k: v for k, v in state.items() if 'timembedding.0' not in k})


def test_registers_encodings_and_scores_equal_the_official(fixture):
  data, _, _, module, params = fixture
  batch = _batch(data)

  def registers(m):
    clips = m.clip.embed(batch['clip_feats'])
    context = m.condition_encoder(clips)
    condition = m.query_former(context)
    mu, logvar = m.video_sampler(context)
    start = reparameterize(mu, logvar, m.num_registers, None)
    return m.diffusion.sample(condition, start, start), condition, mu, logvar

  rtol = support.f32_rtol(128, ops=DEPTH)
  ours = jax.jit(lambda p: module.apply({'params': p}, method=registers))(params)
  for name, value in zip(('registers', 'condition', 'mu', 'logvar'), ours):
    support.assert_close(value, data[f'eval_{name}'], rtol, err_msg=name)
  videos, _, _ = support.check_encodings_and_scores(module, params, batch, data, rtol,
                                                    VIDEO_KEYS, QUERY_KEYS)
  # Evaluation has no randomness: a second run gives the same bits.
  again, _, _ = support.check_encodings_and_scores(module, params, batch, data, rtol,
                                                   VIDEO_KEYS, QUERY_KEYS)
  jax.tree.map(np.testing.assert_array_equal, again, videos)


@pytest.fixture(scope='module')
def loss_grad_fn(fixture):
  """Jitted `(params, batch) -> ((total, terms), grads)` of the objective under LOSS (hard
  negatives with pool 1: deterministic; dropout 0; the perturbation draws from the batch),
  compiled once for the module's batches (all of model.npz's shapes)."""
  _, _, spec, module, _ = fixture
  ctx = LossContext(loss=LOSS, epoch=jnp.int32(0), step=jnp.int32(0))
  rngs = dict(zip(spec.rng_streams, jax.random.split(jax.random.key(0), len(spec.rng_streams))))

  def loss_fn(p, batch):
    return spec.objective(module, p, batch, rngs, ctx)
  return jax.jit(jax.value_and_grad(loss_fn, has_aux=True))


@pytest.fixture(scope='module')
def loss_and_grads(fixture, loss_grad_fn):
  """The objective's `((total, terms), grads)` and the training forward's outputs on the
  fixture's batch."""
  data, _, _, module, params = fixture
  batch = _batch(data)

  def forward(p):
    return module.apply({'params': p}, batch, deterministic=True)
  return loss_grad_fn(params, batch), jax.jit(forward)(params)


def test_every_loss_term_equals_the_official(fixture, loss_and_grads):
  data, *_ = fixture
  ((loss, terms), _), outputs = loss_and_grads
  assert set(terms) == set(TERMS)
  rtol = support.f32_rtol(128, ops=DEPTH)
  for name in TERMS:
    support.assert_close(terms[name], data[f'loss/{name}'], rtol, err_msg=name)
  support.assert_close(loss, data['loss/total'], rtol)
  for ours, theirs in (('queries_aux', 'train_queries'), ('mu', 'train_mu'),
                       ('logvar', 'train_logvar'), ('noise_pred', 'train_noise_pred'),
                       ('clip_logits', 'train_clip_logits'),
                       ('frame_logits', 'train_frame_logits')):
    support.assert_close(outputs[ours], data[theirs], rtol, err_msg=ours)


def test_gradients_equal_the_official(fixture, loss_and_grads):
  data, *_ = fixture
  (_, grads) = loss_and_grads[0]
  theirs = convert.params_to_torch(jax.device_get(grads), 'dreamprvr')
  table = 'diffusion_mlp.time_embedding.timembedding.0.weight'
  assert f'grad/{table}' not in data.files  # frozen officially: no gradient
  assert not np.any(theirs.pop(table))  # ours: stopped
  scale = max(float(np.abs(data[f'grad/{n}']).max()) for n in theirs)
  for name, value in theirs.items():
    # Each gradient is held to a float32 tolerance of the largest parameter gradient: small
    # gradients are differences of larger terms.
    support.assert_close(value, data[f'grad/{name}'], support.f32_rtol(128, ops=4 * DEPTH),
                         scale=scale, err_msg=name)


@pytest.mark.parametrize('variant', ['tvr', 'activitynet'])
def test_official_checkpoint_evaluates_through_cli(variant, tmp_path, xla_cache):
  """evaluate.py on the official checkpoint (K = 3 registers, read from it) and the
  multi-batch release (our own batches) = the official evaluation loop's scores (20-video /
  15-query batches, features from the official HDF5 conversion of the same release) and
  recalls; the two variants differ in the fusion weights (0.5 / 0.5, 0.6 / 0.4) and the
  temperature."""
  # Equal ranks give equal recalls: where a positive sits at a recall boundary K, the score gap
  # to the neighbour that could cross it is >= 2.4e-4 (tvr) / 5.3e-4 (activitynet), over 10x
  # the sum of both scores' tolerances.
  support.check_official_checkpoint_through_cli(
      'dreamprvr', variant, FIXTURES / 'dreamprvr_best.ckpt', FIXTURES / 'multibatch_dreamprvr.npz',
      ['--config.model.visual_dim=48', '--config.model.query_dim=40',
       '--config.model.hidden_dim=16', '--config.model.attention_num=4',
       '--config.model.num_registers=3'],
      tmp_path, xla_cache)


def test_bert_adam_steps_and_weight_decay_groups(fixture):
  """Two updates of the training optimiser (`train.make_model_optimizer`, TVR values) from the
  official gradients of model.npz = two official BertAdam steps (the first has lr 0); the
  decayed tensors are the official groups' (names without 'bias' / 'LayerNorm': the `norm1` /
  `norm2` weights, the sampler's `layer_norm` and the denoiser's LayerNorms among them, the
  GRU's `bias_*` not); the frozen time table has no gradient officially and stays as it is."""
  data, _, spec, _, params = fixture
  steps = np.load(FIXTURES / 'bert_adam.npz')
  meta = json.loads(str(steps['meta']))
  config = support.load_config('dreamprvr', 'tvr')
  config.model.update({k: v for k, v in CONFIG.items() if k != 'name'})
  cfg = meta['config']
  assert (config.optim.name, config.optim.lr, config.optim.warmup_proportion,
          config.optim.weight_decay, config.optim.max_grad_norm) == (
              'bert_adam', cfg['lr'], cfg['lr_warmup_proportion'], cfg['wd'], 1.0)
  table = 'diffusion_mlp.time_embedding.timembedding.0.weight'
  mask = jax.tree.map(lambda decay, p: np.full(p.shape, float(decay), np.float32),
                      spec.weight_decay_mask(params), params)
  decayed = {k for k, v in convert.params_to_torch(mask, 'dreamprvr').items() if v.all()}
  assert decayed == set(meta['decayed'])
  assert {'clip_encoder.e_attns.0.norm1.weight', 'video_qformer.query_tokens',
          'video_probabilistic_variational_sampler.pie_net_video.layer_norm.weight',
          'diffusion_mlp.layers.0.blcok_in.0.weight'} <= decayed
  assert table not in decayed
  assert 'video_probabilistic_variational_sampler.gpo.gru.bias_ih_l0' not in decayed
  official_grads = {k[len('grad/'):]: data[k] for k in data.files if k.startswith('grad/')}
  official_grads[table] = np.zeros_like(data[f'param/{table}'])  # None officially
  grads = convert.torch_to_params(official_grads, 'dreamprvr', CONFIG)
  p2 = support.second_optimizer_step(config, params, grads, meta['t_total'], steps['step2/lr'])
  expected = {k[len('step2/'):]: steps[k] for k in steps.files
              if k.startswith('step2/') and k != 'step2/lr'}
  assert set(expected) == set(p2)
  np.testing.assert_array_equal(p2[table], data[f'param/{table}'])
  # As tests/models/test_hlformer.py: 1e-6 of each tensor's magnitude (~8 eps) checks the
  # ~1e-3 step to ~0.1-1% while allowing the float32 rounding of `p - lr * update`.
  for key, value in expected.items():
    support.assert_close(p2[key], value, 1e-6, err_msg=f'step-2 {key}')


def test_short_training_run_follows_the_official_trajectory(fixture, loss_grad_fn):
  """Four updates of the training optimiser (`train.make_model_optimizer`: BertAdam, TVR
  values, t_total 150, so the first update has lr 0) with the objective's gradients on four
  fixed batches (each with the official run's recorded perturbation draws), from the official
  weights = the official training steps (train_steps.npz): every loss term of every step and
  every parameter after the second and the last update."""
  _, state, _, _, _ = fixture
  traj = np.load(FIXTURES / 'train_steps.npz')
  meta = json.loads(str(traj['meta']))
  official = meta['config']
  assert (official['sft_factor'], official['margin'], official['hard_pool_size'],
          official['loss_factor'], official['neg_factor'], official['deterministic_tau']) == (
              CONFIG['temperature'], LOSS.margin, LOSS.hard_pool_size,
              [LOSS.clip_nce, LOSS.frame_nce, LOSS.qdl, LOSS.qsp, LOSS.kl, LOSS.dre],
              [LOSS.qdl_delta, LOSS.qdl_alpha, LOSS.qdl_gamma], LOSS.qsp_temperature)
  config = support.load_config('dreamprvr', 'tvr')
  config.model.update({k: v for k, v in CONFIG.items() if k != 'name'})
  assert (config.optim.lr, config.optim.weight_decay) == (official['lr'], official['wd'])
  update, tx, schedule = support.optimizer_step(config, meta['t_total'])
  params = jax.tree.map(jnp.asarray, convert.torch_to_params(state, 'dreamprvr', CONFIG))
  opt_state = tx.init(params)
  table = 'diffusion_mlp.time_embedding.timembedding.0.weight'
  lr_sum = 0.0
  for k in range(meta['steps']):
    (loss, terms), grads = loss_grad_fn(params, _batch(traj, f'batch{k}/'))
    params, opt_state = update(params, opt_state, grads)
    lr = float(traj[f'step{k}/lr'])
    support.assert_close(schedule(k), lr, rtol=1e-6, err_msg=f'step {k} lr')
    # As test_every_loss_term_equals_the_official, at every step.
    rtol = support.f32_rtol(128, ops=DEPTH)
    for name in TERMS:
      support.assert_close(terms[name], traj[f'step{k}/loss/{name}'], rtol,
                           err_msg=f'step {k} {name}')
    support.assert_close(loss, traj[f'step{k}/loss/total'], rtol, err_msg=f'step {k} total')
    lr_sum += lr
    prefix = f'step{k}/param/'
    expected = {n[len(prefix):]: traj[n] for n in traj.files if n.startswith(prefix)}
    if not expected:
      continue
    ours = convert.params_to_torch(jax.device_get(params), 'dreamprvr')
    assert set(expected) == set(ours), f'step {k} parameter names'
    np.testing.assert_array_equal(ours[table], state[table])  # frozen in both
    for name, theirs in expected.items():
      # Each update moves an element by lr times BertAdam's normalised step (|m| / sqrt(v),
      # ~1-4 here). The gradients agree to float32 rounding, so ours may differ by a small
      # fraction of that: 5% of the summed lrs, plus the float32 rounding of the stored
      # values. The optimiser's own arithmetic is held to 1e-6 of each tensor by the BertAdam
      # test above.
      np.testing.assert_allclose(ours[name], theirs, rtol=1e-6, atol=0.05 * lr_sum,
                                 err_msg=f'step {k} {name}')


def test_padded_videos_and_queries_leave_kl_dre_and_targets_as_they_are():
  """KL and DRE over a batch with padded videos = the official means over the real videos;
  the diffusion targets average each video's valid queries only."""
  rng = np.random.default_rng(0)
  mu, logvar = (jnp.asarray(rng.normal(size=(3, 8)), jnp.float32) for _ in range(2))
  target = jnp.asarray(rng.normal(size=(3, 2, 8)), jnp.float32)
  pred = jnp.asarray(rng.normal(size=(4, 3, 2, 8)), jnp.float32)
  valid = jnp.array([True, True, False])
  rtol = support.f32_rtol(16)
  support.assert_close(video_kl(mu, logvar, valid), kl_divergence(mu[:2], logvar[:2]), rtol)
  support.assert_close(noise_mse(target, pred, valid),
                       np.mean((np.asarray(pred)[:, :2] - np.asarray(target)[None, :2]) ** 2),
                       rtol)
  queries = jnp.asarray(rng.normal(size=(5, 8)), jnp.float32)
  means = mean_video_queries(queries, jnp.array([0, 0, 1, 1, 0]),
                             jnp.array([True, True, True, False, False]), 3)
  support.assert_close(means, np.stack([np.mean(np.asarray(queries)[:2], 0),
                                        np.asarray(queries)[2], np.zeros(8)]), rtol)
