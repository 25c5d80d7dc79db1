"""Parity of the registered RAL model with the official `RAL4GMMV2_Net` (zhanglong-ustc/RAL-PRVR
@ befbf22) at tiny dims: the official checkpoint read and converted, parameter count, weight
decay groups, encodings, evaluation scores, the training forward's matrices, every loss term
and the gradients on one batch with the official sampling noise, and four training steps
(fixtures: tests/fixtures/ral/README.md)."""

import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import support
from prvr_jax import convert, models, optim, torch_file
from prvr_jax.models import registry
from prvr_jax.models.ral.model import RAL
from prvr_jax.models.spec import LossContext
from prvr_jax.ops import max_similarity

FIXTURE = support.FIXTURES / 'ral'
# As tests/models/test_parity.py: errors within 1e-5 (~80 eps) of each array's magnitude.
PARITY_RTOL = 1e-5
# Official config fields (the fixture meta's `dims`) -> config.model fields.
DIMS = {'visual_feat_dim': 'visual_dim', 'q_feat_size': 'query_dim', 'hidden_size': 'hidden_dim',
        'n_heads': 'num_heads', 'max_desc_l': 'max_query_len', 'max_ctx_l': 'max_frames',
        'map_size': 'num_clips'}


@functools.cache
def _fixture():
  with np.load(FIXTURE / 'model.npz') as f:
    return {k: f[k] for k in f.files}


@functools.cache
def _setup():
  """(config, spec, params from the official checkpoint, fixture batch)."""
  fixture = _fixture()
  meta = json.loads(str(fixture['meta']))
  config = support.load_config('ral', 'tvr')
  config.model.update({DIMS[k]: v for k, v in meta['dims'].items()})
  config.model.update(dropout=0.0, input_dropout=0.0)
  config.loss.hard_pool_size = meta['config']['hard_pool_size']
  state_dict = torch_file.load_torch_checkpoint(str(FIXTURE / 'ral_best.ckpt'))
  params = convert.torch_to_params(state_dict, 'ral', config.model)
  x = {k[3:]: v for k, v in fixture.items() if k.startswith('in/')}
  batch = {'clip_feats': x['clip_feats'], 'frame_feats': x['frame_feats'],
           'frame_mask': x['frame_mask'], 'query_feats': x['query_feats'],
           'query_mask': x['query_mask'], 'query_video': x['query_labels'],
           'video_valid': np.ones(len(x['frame_mask']), bool),
           'query_valid': np.ones(len(x['query_mask']), bool)}
  return config, registry.get_spec('ral'), params, batch, state_dict, meta


class _BatchNoise(RAL):
  """RAL whose training forward samples with the noise the batch carries (`noise/text`,
  `noise/video`: the official recorded noise), so that one jitted step serves every batch."""

  def __call__(self, batch, deterministic=True, noise=None):
    return super().__call__(batch, deterministic,
                            {'video': batch['noise/video'], 'text': batch['noise/text']})


@functools.cache
def _train_steps_fixture():
  """train_steps.npz (tests/fixtures/ral/README.md)."""
  with np.load(FIXTURE / 'train_steps.npz') as f:
    return {k: f[k] for k in f.files}


@functools.cache
def _gradient_fn():
  """The jitted value and gradient of the objective, sampling with the batch's noise
  (test_gradients and test_training_steps share its one compile)."""
  config, spec, _, _, _, _ = _setup()
  spec = dataclasses.replace(spec, module=_BatchNoise)
  model = spec.build(config.model)
  # Hard negatives (the fixtures' hard mode, pool 1: deterministic); dropout is 0.
  ctx = LossContext(loss=config.loss, epoch=jnp.int32(1000), step=jnp.int32(0))
  rngs = dict(zip(spec.rng_streams, jax.random.split(jax.random.key(0), len(spec.rng_streams))))

  @jax.jit
  def gradient(params, batch):
    (total, terms), grads = jax.value_and_grad(spec.objective, argnums=1, has_aux=True)(
        model, params, batch, rngs, ctx)
    return dict(total=total, terms=terms, grads=grads)
  return model, gradient


@functools.cache
def _run():
  _, _, params, batch, _, _ = _setup()
  fixture = _fixture()
  batch = {**batch, 'noise/text': fixture['noise/text'], 'noise/video': fixture['noise/video']}
  model, gradient = _gradient_fn()

  @jax.jit
  def forward(params, batch):
    v = {'params': params}
    videos = model.apply(v, batch, method='encode_videos')
    queries = model.apply(v, batch, method='encode_queries')
    return dict(videos=videos, queries=queries,
                scores=model.apply(v, queries, videos, method='score'),
                clip_scores=max_similarity(queries['query'], videos['clips'], cosine=True),
                frame_scores=model.apply(v, queries, videos, True, method='word_frame_scores'),
                outputs=model.apply(v, batch, deterministic=False))
  return jax.device_get({**forward(params, batch), **gradient(params, batch)})


def _close(actual, expected, what, rtol=PARITY_RTOL, scale=None):
  support.assert_close(actual, expected, rtol, scale=scale, err_msg=what)


def test_checkpoint_parameter_count_and_weight_decay_groups():
  _, spec, params, _, state_dict, meta = _setup()
  assert models.count_params(params) == meta['num_params']
  assert len(convert.params_to_torch(params, 'ral')) == len(state_dict)
  # Official BertAdam groups: names without 'bias' / 'LayerNorm.*' are decayed, RAL's
  # `pie_net_*.layer_norm.weight` among them.
  mask = jax.tree.map(lambda decay, p: np.full(p.shape, float(decay), np.float32),
                      spec.weight_decay_mask(params), params)
  decayed = {k for k, v in convert.params_to_torch(mask, 'ral').items() if v.all()}
  assert decayed == set(meta['decayed'])
  assert {'pie_net_video.layer_norm.weight', 'pie_net_text.layer_norm.weight'} <= decayed


def test_encodings_and_evaluation_scores():
  fixture, ours = _fixture(), _run()
  _close(ours['videos']['clips'], fixture['out/clips'], 'clips')
  _close(ours['videos']['frames'], fixture['out/frames'], 'frames')
  _close(ours['queries']['query'], fixture['out/queries'], 'queries')
  _close(ours['queries']['tokens'], fixture['out/tokens'], 'frame-branch tokens')
  _close(ours['clip_scores'], fixture['out/clip_scores'], 'eval clip scores')
  _close(ours['frame_scores'], fixture['out/frame_scores'], 'eval frame (CSA) scores')
  _close(ours['scores'], fixture['out/scores'], 'eval scores')


def test_training_matrices_and_every_loss_term():
  fixture, ours = _fixture(), _run()
  for key in ('clip_scores', 'clip_logits', 'frame_scores', 'frame_logits'):
    _close(ours['outputs'][key], fixture[f'train/{key}'], key)
  expected = {k[len('loss/'):]: float(v) for k, v in fixture.items()
              if k.startswith('loss/') and k != 'loss/total'}
  assert set(ours['terms']) == set(expected)
  # As in test_parity: each term's error against the total it is summed into.
  total = float(fixture['loss/total'])
  for term, value in expected.items():
    _close(ours['terms'][term], value, f'loss term {term}', scale=abs(total))
  _close(ours['total'], total, 'total loss')
  # The RAL terms before their weights (13 and 26), each against its own magnitude.
  config = _setup()[0]
  for term in ('proxy_matching', 'distribution_alignment'):
    _close(ours['terms'][term] / config.loss[term], fixture[f'loss_raw/{term}'], term)


def test_gradients():
  fixture, ours = _fixture(), _run()
  ours = convert.params_to_torch(ours['grads'], 'ral')
  expected = {k[len('grad/'):]: v for k, v in fixture.items() if k.startswith('grad/')}
  assert set(expected) == set(ours)
  # As tests/models/test_parity.py (rounding noise of analytically zero gradients is measured
  # against 1e-3 of the global norm).
  global_norm = np.sqrt(sum(np.sum(np.square(g)) for g in expected.values()))
  global_max = max(np.abs(g).max() for g in expected.values())
  for key, g in expected.items():
    assert np.isfinite(ours[key]).all(), f'grad {key} is not finite'
    diff = np.abs(ours[key] - g)
    rel = np.linalg.norm(diff) / max(np.linalg.norm(g), 1e-3 * global_norm)
    assert rel <= 1e-4, f'grad {key}: relative error {rel:.3g}'
    bad = diff > 1e-6 * global_max + 1e-3 * np.abs(g)
    assert not bad.any(), f'grad {key}: {bad.sum()} elements off, max abs error {diff.max():.3g}'


@pytest.mark.parametrize('variant', ['tvr', 'activitynet'])
def test_official_checkpoint_evaluates_through_cli(variant, tmp_path, xla_cache):
  """evaluate.py on the official checkpoint and the multi-batch release (our own batches) =
  the official evaluation loop's scores (20-video / 15-query batches) and recalls; the two
  variants differ in the fusion weights (0.5 / 0.5, 0.6 / 0.4) and the temperature."""
  # Equal ranks give equal recalls: where a positive sits at a recall boundary K, the score gap
  # to the neighbour that could cross it is >= 2.0e-4 (tvr) / 6.2e-4 (activitynet), over 17x
  # the sum of both scores' tolerances.
  support.check_official_checkpoint_through_cli(
      'ral', variant, FIXTURE / 'ral_best.ckpt', FIXTURE / 'multibatch_ral.npz',
      ['--config.model.visual_dim=48', '--config.model.query_dim=40',
       '--config.model.hidden_dim=24'],
      tmp_path, xla_cache)


def test_bert_adam_steps():
  """Two updates of the training optimiser (`train.make_model_optimizer`, TVR values) from the
  official gradients = two official BertAdam steps (the first has lr 0), RAL's decayed
  `pie_net_*.layer_norm.weight` included."""
  config, _, params, _, _, meta = _setup()
  fixture = _fixture()
  cfg = meta['config']
  assert (config.optim.name, config.optim.lr, config.optim.warmup_proportion,
          config.optim.weight_decay, config.optim.max_grad_norm) == (
              'bert_adam', cfg['lr'], cfg['lr_warmup_proportion'], cfg['wd'], 1.0)
  grads = convert.torch_to_params(
      {k[len('grad/'):]: v for k, v in fixture.items() if k.startswith('grad/')}, 'ral',
      config.model)
  p2 = support.second_optimizer_step(config, params, grads, meta['t_total'],
                                     fixture['step2/lr'])
  expected = {k[len('step2/'):]: v for k, v in fixture.items()
              if k.startswith('step2/') and k != 'step2/lr'}
  assert 'pie_net_text.layer_norm.weight' in expected and set(expected) <= set(p2)
  # As tests/models/test_parity.py: 1e-6 of each tensor's magnitude (~8 eps) checks the
  # ~1e-3 step to ~0.1-1% while allowing the float32 rounding of `p - lr * update`.
  for key, value in expected.items():
    _close(p2[key], value, f'step-2 {key}', rtol=1e-6)


def _step_batch(fixture, i):
  """Batch `i` of train_steps.npz, carrying that step's official sampling noise."""
  x = {k[len(f'in/{i}/'):]: v for k, v in fixture.items() if k.startswith(f'in/{i}/')}
  return {'clip_feats': x['clip_feats'], 'frame_feats': x['frame_feats'],
          'frame_mask': x['frame_mask'], 'query_feats': x['query_feats'],
          'query_mask': x['query_mask'], 'query_video': x['query_labels'],
          'video_valid': np.ones(len(x['frame_mask']), bool),
          'query_valid': np.ones(len(x['query_mask']), bool),
          'noise/text': fixture[f'noise/{i}/text'], 'noise/video': fixture[f'noise/{i}/video']}


@functools.cache
def _train_steps():
  """Ours over the official run's batches from the official checkpoint: per step the loss
  terms and the lr, and, torch-named, the gradients, the BertAdam moments and the parameters
  after the update."""
  fixture = _train_steps_fixture()
  meta = json.loads(str(fixture['meta']))
  config, _, params, _, _, _ = _setup()
  _, gradient = _gradient_fn()
  update, tx, schedule = support.optimizer_step(config, meta['t_total'])
  opt_state, steps = tx.init(params), []

  def torch_named(tree):
    return convert.params_to_torch(jax.device_get(tree), 'ral')

  def is_adam(x):
    return isinstance(x, optim.ScaleByBertAdamState)

  for i in range(meta['steps']):
    out = gradient(params, _step_batch(fixture, i))
    params, opt_state = update(params, opt_state, out['grads'])
    adam, = [x for x in jax.tree.leaves(opt_state, is_leaf=is_adam) if is_adam(x)]
    steps.append(dict(terms=jax.device_get(out['terms']), lr=float(schedule(i)),
                      grads=torch_named(out['grads']), mu=torch_named(adam.mu),
                      nu=torch_named(adam.nu), params=torch_named(params)))
  return steps


def _gradient_rounding_allowance(steps, weight_decay, b1=0.9, b2=0.999, eps=1e-6):
  """Per step, per torch name: how far the parameters after that update may be from the
  official ones when each gradient element of each step is off by as much as test_gradients
  allows (`1e-6 * global max + 1e-3 * |g|`), carried through BertAdam to first order with our
  moments `m`, `v` (official constants, no bias correction).

  An update is `lr * (m / (sqrt(v) + eps) + wd * p)`. Where a gradient element is far above
  eps, the update is ~lr * sign(g) and a gradient error barely moves it. Where the element is
  within rounding of 0 -- the key biases of every attention, the GMM blocks' `layer2` biases
  and `text_weight_fc.2.bias` (all shifts a softmax cancels), sums that cancel to ~1e-8 --
  eps sets the scale and the update follows the rounding, with a sensitivity up to
  (1 - b1) / eps. A gradient error dg moves m by dm = b1 dm + (1 - b1) dg and sqrt(v) by at
  most dr = sqrt(b2 dr^2 + (1 - b2) dg^2) (a weighted 2-norm), hence the update
  m / (sqrt(v) + eps) by at most (dm + |update| dr) / (sqrt(v) + eps - dr).
  """
  names = steps[0]['grads']
  dm, dr, dp = ({k: 0.0 for k in names} for _ in range(3))
  allowance = []
  for step in steps:
    g_max = max(np.abs(g).max() for g in step['grads'].values())
    dp = dict(dp)
    for k, g in step['grads'].items():
      dg = 1e-6 * g_max + 1e-3 * np.abs(g)
      dm[k] = b1 * dm[k] + (1 - b1) * dg
      dr[k] = np.sqrt(b2 * dr[k] ** 2 + (1 - b2) * dg ** 2)
      denominator = np.sqrt(step['nu'][k]) + eps
      update = np.abs(step['mu'][k]) / denominator
      du = (dm[k] + update * dr[k]) / (denominator - dr[k])
      dp[k] = dp[k] * (1 + step['lr'] * weight_decay) + step['lr'] * du
    allowance.append(dp)
  return allowance


def test_training_steps():
  """Four updates of ours (the objective's gradient and `train.make_model_optimizer`, each
  jitted once) from the official checkpoint, on four batches with other lengths and queries
  per video and each step's official sampling noise = four official training steps (BertAdam,
  t_total 150: lr 0, then its warmup and linear-decay branches): the lr, every loss term and
  the total at each step, every parameter after each update (train_steps.npz)."""
  fixture, steps, initial = _train_steps_fixture(), _train_steps(), _setup()[4]
  config = _setup()[0]
  assert len(steps) == 4
  allowance = _gradient_rounding_allowance(steps, config.optim.weight_decay)
  for i, step in enumerate(steps):
    _close(step['lr'], fixture[f'lr/{i}'], f'step {i} lr', rtol=1e-6)  # float32 lr: ~1 rounding
    official = {k[len(f'loss/{i}/'):]: float(v) for k, v in fixture.items()
                if k.startswith(f'loss/{i}/')}
    total = official.pop('total')
    assert set(step['terms']) == set(official), f'step {i} loss terms'
    # As test_training_matrices_and_every_loss_term: each term within 1e-5 of the total it is
    # summed into. The parameters entering steps 1-3 differ from the official ones by the
    # rounding of the earlier updates (below); the terms stay within 3e-7 of the total.
    for term, value in official.items():
      _close(step['terms'][term], value, f'step {i} loss term {term}', scale=abs(total))
    _close(sum(step['terms'].values()), total, f'step {i} total loss')
    expected = {k[len(f'param/{i}/'):]: v for k, v in fixture.items()
                if k.startswith(f'param/{i}/')}
    if i == 0:  # the first update has lr 0: nothing moves (not stored)
      assert float(fixture['lr/0']) == 0 and not expected
      for key, value in step['params'].items():
        np.testing.assert_array_equal(value, initial[key], err_msg=f'step 0 {key}')
      continue
    # The GMM branches attn1..attn7 (63% of the parameters) are stored after the last update.
    branches = {k for k in step['params']
                if '.attn' in k and not k.split('.attn', 1)[1].startswith('0.')}
    want = set(step['params']) - (branches if i < len(steps) - 1 else set())
    assert set(expected) == want, f'step {i} parameter names'
    for key, value in expected.items():
      # 1e-6 of the tensor's magnitude (~8 eps: the rounding of `p - lr * update`, as
      # test_bert_adam_steps) plus, elementwise, what the gradients' float32 rounding moves
      # through BertAdam (_gradient_rounding_allowance): ~1% of the summed lr for most
      # elements, up to ~20% where the gradient is itself rounding (a softmax's shift).
      diff = np.abs(step['params'][key] - value)
      bound = 1e-6 * np.abs(value).max() + allowance[i][key]
      bad = diff > bound
      worst = diff.argmax()
      assert not bad.any(), (f'step {i} parameter {key}: {bad.sum()} elements off, max |diff| '
                             f'{diff.flat[worst]:.3g}, bound there {bound.flat[worst]:.3g}')


def test_text_mass_is_refused_naming_the_flag():
  config = support.load_config('ral', 'tiny')
  config.model.stochastic_text = True
  with pytest.raises(ValueError) as error:
    registry.get_spec('ral').param_shapes(config.model)
  assert str(error.value).splitlines()[-1].endswith('--config.model.stochastic_text')
