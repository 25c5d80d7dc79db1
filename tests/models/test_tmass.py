"""T-MASS against the official code (fixtures in tests/fixtures/tmass/, see its README): X-Pool
pooling, the radius, the stochastic and support texts, the losses, and four updates of the
official optimiser (HF AdamW, two lr groups, cosine warm-up, clipping, logit-scale clamp)."""

import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from prvr_jax import clip
from prvr_jax import optim
from prvr_jax.clip import weights as clip_weights
from prvr_jax.layers import stochastic_text
from prvr_jax.layers import text_pooling
from prvr_jax.layers.attention import folding_is_cheaper
from prvr_jax.losses import stochastic
from prvr_jax.models import registry
from prvr_jax.models.spec import LossContext
from prvr_jax.models.tmass import TMASS, objective
from prvr_jax.models.tmass.model import frame_similarities
import support

FIXTURES = os.path.join(os.path.dirname(__file__), '..', 'fixtures', 'tmass')
D, F = 16, 6


def _load(name):
  with np.load(os.path.join(FIXTURES, name)) as data:
    return {k: data[k] for k in data.files}


def _head_params(sd, pool, radius, logit_scale):
  """Our T-MASS params from official names (`pool` / `radius` name prefixes)."""
  dense = lambda name: {'kernel': sd[f'{name}.weight'].T, 'bias': sd[f'{name}.bias']}
  norm = lambda name: {'scale': sd[f'{name}.weight'], 'bias': sd[f'{name}.bias']}
  return {
      'pool': {**{f'{p}_proj': dense(f'{pool}cross_attn.{p}_proj') for p in 'qkv'},
               'out_proj': dense(f'{pool}cross_attn.out_proj'),
               'linear_proj': dense(f'{pool}linear_proj'),
               **{f'layer_norm{i}': norm(f'{pool}layer_norm{i}') for i in (1, 2, 3)}},
      'radius': {'linear': dense(f'{radius}std_branch.linear_proj')},
      'logit_scale': np.asarray(logit_scale, np.float32)}


def _pool(params, texts, frames, num_heads=1):
  module = TMASS(hidden_dim=D, num_frames=F, num_heads=num_heads, dropout=0.0)
  return module.apply({'params': params}, texts, frames, method=lambda m, t, f: m.pool(t, f))


def _radius(params, texts, frames):
  """exp(log R) of each text with its own video, `[N, D]`."""
  module = TMASS(hidden_dim=D, num_frames=F)
  sims = jnp.einsum('nnf->nf', frame_similarities(texts, frames))
  return jnp.exp(module.apply({'params': params}, sims, method=lambda m, s: m.radius(s)))


def _masks(n):
  return dict(query_video=jnp.arange(n), query_valid=jnp.ones(n, bool),
              video_valid=jnp.ones(n, bool))


def _losses(params, texts, frames, noise, alpha):
  """(L_s + alpha L_sup, L_s, L_sup) of paired texts/frames with the noise fed in."""
  pooled = _pool(params, texts, frames)
  radius = _radius(params, texts, frames)
  masks = _masks(texts.shape[0])
  ce = lambda t: stochastic.symmetric_cross_entropy(
      stochastic.pooled_logits(t, pooled, params['logit_scale']), **masks)
  target = stochastic.support_targets(pooled, masks['query_video'], masks['query_valid'])
  loss_s = ce(texts + noise * radius)
  loss_sup = ce(stochastic_text.support_text(texts, target, radius))
  return loss_s + alpha * loss_sup, (loss_s, loss_sup)


def test_initialisation_is_the_official_one():
  head = _load('head.npz')
  sd = {k.split('/', 1)[1]: v for k, v in head.items() if k.startswith('init_')}
  expected = _head_params(sd, '', '', np.log(100.0))
  ours = jax.jit(lambda k: TMASS(hidden_dim=D, num_frames=F).init(
      {'params': k}, {'clip_feats': jnp.zeros((2, F, D)), 'query_feats': jnp.zeros((2, 1, D)),
                      'video_seed': jnp.arange(2)})['params'])(jax.random.key(0))
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(ours), expected)


def test_pooling_radius_stochastic_and_support_texts_match_the_official_code():
  h = _load('head.npz')
  sd = {k.split('/', 1)[1]: v for k, v in h.items() if k.startswith(('pool/', 'radius/'))}
  params = _head_params(sd, '', '', h['logit_scale'])
  texts, frames = h['text'], h['frames']
  # Official pooled is [video, text, D]; ours [text, video, D]. LayerNorms and softmaxes over
  # D = 16 / F = 6 of O(1) values.
  rtol = support.f32_rtol(D, ops=8)
  support.assert_close(_pool(params, texts, frames), h['pooled'].transpose(1, 0, 2), rtol)
  support.assert_close(_pool(params, texts, frames[:3]), h['pooled_rect'].transpose(1, 0, 2),
                       rtol)
  support.assert_close(_pool(params, texts, frames, num_heads=2),
                       h['pooled_h2'].transpose(1, 0, 2), rtol)
  radius = _radius(params, texts, frames)
  support.assert_close(jnp.log(radius), h['log_var'], rtol)
  support.assert_close(texts + h['noise'] * radius, h['stochastic_text'], rtol)
  support.assert_close(texts + h['noise_normal'] * radius, h['stochastic_text_normal'], rtol)
  pooled = _pool(params, texts, frames)
  target = stochastic.support_targets(pooled, jnp.arange(4), jnp.ones(4, bool))
  support.assert_close(stochastic_text.support_text(texts, target, radius), h['support_text'],
                       rtol)
  total, (loss_s, loss_sup) = _losses(params, texts, frames, h['noise'], float(h['alpha']))
  for ours, key in ((loss_s, 'loss_s'), (loss_sup, 'loss_sup'), (total, 'loss_total')):
    support.assert_close(ours, h[key], rtol, err_msg=key)


@pytest.mark.parametrize('folds', ['never', 'always'])
@pytest.mark.parametrize('num_heads,official', [(1, 'pooled'), (2, 'pooled_h2')])
def test_pooling_folds_compute_the_official_function(monkeypatch, folds, num_heads, official):
  """X-Pool's projection folds (k_proj into the texts, out_proj into the frames' values) all
  left out or all taken: the official pooled output, and the parameters' gradients of the
  folds chosen by cost (at the fixture's size: k_proj folded, out_proj not)."""
  h = _load('head.npz')
  sd = {k.split('/', 1)[1]: v for k, v in h.items() if k.startswith(('pool/', 'radius/'))}
  params = _head_params(sd, '', '', h['logit_scale'])
  texts, frames = h['text'], h['frames']
  weights = np.random.default_rng(0).normal(size=(len(texts), len(frames), D))
  objective = lambda p: jnp.sum(_pool(p, texts, frames, num_heads) * weights)
  by_cost = jax.grad(objective)(params)
  monkeypatch.setattr(text_pooling, 'folding_is_cheaper', lambda *_: folds == 'always')
  rtol = support.f32_rtol(D, ops=8)
  support.assert_close(_pool(params, texts, frames, num_heads), h[official].transpose(1, 0, 2),
                       rtol)
  grads = jax.grad(objective)(params)
  scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(by_cost))
  jax.tree.map(lambda a, b: support.assert_close(a, b, rtol, scale=scale), grads, by_cost)


def test_pooling_folds_both_projections_at_training_sizes():
  # T-MASS on MSR-VTT features: D 512, 12 frames, one caption per video in a batch.
  for videos in (16, 32, 64, 128):
    assert folding_is_cheaper(videos, videos * 12, 512, 1)  # k_proj into the texts
    assert folding_is_cheaper(12, videos, 512, 1)  # out_proj into the frames' values


def _step_tree(values, prefix):
  """The step fixture's parameters (torch names after `prefix`) as our tree: the CLIP stand-in
  (`clip`) and the T-MASS head (`head`)."""
  sd = {k[len(prefix):]: v for k, v in values.items() if k.startswith(prefix)}
  linear = lambda name: {'kernel': sd[f'{name}.weight'].T, 'bias': sd[f'{name}.bias']}
  head = _head_params(sd, 'pool_frames.', 'stochastic.', sd['clip.logit_scale'])
  return {'clip': {'text_proj': linear('clip.text_proj'),
                   'visual_proj': linear('clip.visual_proj')}, 'head': head}


def _step_loss(tree, text_in, frames_in, noise, alpha):
  clip = tree['clip']
  texts = text_in @ clip['text_proj']['kernel'] + clip['text_proj']['bias']
  frames = frames_in @ clip['visual_proj']['kernel'] + clip['visual_proj']['bias']
  return _losses(tree['head'], texts, frames, noise, alpha)


def test_four_updates_of_the_official_optimiser():
  s = _load('step.npz')
  alpha = float(s['alpha'])
  tree = _step_tree(s, 'before/')
  in_clip_group = {'clip': jax.tree.map(lambda _: True, tree['clip']),
                   'head': {**jax.tree.map(lambda _: False, tree['head']), 'logit_scale': True}}
  head_lr, clip_lr = float(s['base_lr'][1]), float(s['base_lr'][0])
  config = ml_collections.ConfigDict(dict(
      name='hf_adamw', schedule='warmup_cosine', warmup_proportion=0.1, lr=head_lr,
      weight_decay=float(s['weight_decay']), max_grad_norm=float(s['max_grad_norm']),
      eps=float(s['adam_eps'])))
  upper = jax.tree.map(lambda _: np.inf, tree)
  upper['head']['logit_scale'] = float(s['logit_scale_max'])
  tx = optim.make_gradient_transformation(
      config, int(s['num_training_steps']),
      lr_multiplier=jax.tree.map(lambda c: clip_lr / head_lr if c else 1., in_clip_group),
      bounds=(jax.tree.map(lambda _: -np.inf, tree), upper))
  schedule = optim.make_schedule(config, int(s['num_training_steps']))
  grad_fn = jax.jit(jax.value_and_grad(_step_loss, has_aux=True), static_argnums=4)
  state = tx.init(tree)
  for k in range(4):
    support.assert_close(schedule(k), s['lr'][k, 1], support.f32_rtol(1))
    (loss, (loss_s, loss_sup)), grads = grad_fn(tree, s['text_in'], s['frames_in'], s['noise'][k],
                                                alpha)
    # Losses and gradients through CLIP stand-in, pooling and radius: a few dozen chained
    # reductions over 16 or 6 terms; the parameters after an update compound that rounding.
    rtol = support.f32_rtol(D, ops=30)
    # The losses fall to ~0 by update 3: their rounding is that of the first update's terms.
    scale = float(s['loss_total'][0])
    support.assert_close(loss, s['loss_total'][k], rtol, scale=scale, err_msg=f'loss {k}')
    support.assert_close(loss_sup, s['loss_sup'][k], rtol, scale=scale,
                         err_msg=f'support loss {k}')
    if k == 0:
      expected = _step_tree({k2.replace('grad/', 'g/'): v for k2, v in s.items()
                             if k2.startswith('grad/') or k2 == 'before/clip.logit_scale'}, 'g/')
      expected['head']['logit_scale'] = s['grad/clip.logit_scale']
      # X-Pool's key bias has an analytically zero gradient (softmax shift invariance): both
      # sides hold rounding noise there, so gradients compare at the scale of all gradients.
      scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(expected))
      jax.tree.map(lambda a, b: support.assert_close(a, b, rtol, scale=scale), grads, expected)
    updates, state = tx.update(grads, state, tree)
    tree = jax.tree.map(lambda p, u: p + u, tree, updates)
    expected = _step_tree(s, f'after{k + 1}/')
    for (path, ours), theirs in zip(jax.tree_util.tree_leaves_with_path(tree),
                                    jax.tree.leaves(expected)):
      if 'k_proj' in jax.tree_util.keystr(path) and 'bias' in jax.tree_util.keystr(path):
        continue  # Adam normalises its rounding-noise gradient: +-lr either way
      support.assert_close(ours, theirs, rtol, err_msg=f'update {k + 1} {path}')
  assert float(tree['head']['logit_scale']) <= float(s['logit_scale_max'])


def test_eval_scores_are_the_max_over_samples_of_explicit_stochastic_texts():
  rng = np.random.default_rng(0)
  params = _head_params({**{f'cross_attn.{p}_proj.weight': np.eye(D) + 0.1 * rng.normal(size=(D, D))
                            for p in ('q', 'k', 'v', 'out')},
                         **{f'cross_attn.{p}_proj.bias': 0.1 * rng.normal(size=D)
                            for p in ('q', 'k', 'v', 'out')},
                         'linear_proj.weight': np.eye(D), 'linear_proj.bias': np.zeros(D),
                         **{f'layer_norm{i}.weight': np.ones(D) for i in (1, 2, 3)},
                         **{f'layer_norm{i}.bias': np.zeros(D) for i in (1, 2, 3)},
                         'std_branch.linear_proj.weight': 0.5 * rng.normal(size=(D, F)),
                         'std_branch.linear_proj.bias': 0.1 * rng.normal(size=D)}, '', '', 0.)
  module = TMASS(hidden_dim=D, num_frames=F, num_samples=5, stochastic_prior='normal')
  texts = rng.normal(size=(3, D)).astype(np.float32)
  frames = rng.normal(size=(4, F, D)).astype(np.float32)
  keys = np.array([7, 3, 11, 0], np.int32)
  key = jax.random.key(1)
  scores = module.apply({'params': params}, texts, {'frames': frames, 'key': keys},
                        method='score', rngs={'sampling': key})
  pooled = np.asarray(_pool(params, texts, frames))
  radius = np.exp(np.asarray(module.apply(
      {'params': params}, frame_similarities(texts, frames), method=lambda m, s: m.radius(s))))
  # The bank `score` draws: from the 'sampling' key as the module's scope hands it out.
  noise = np.asarray(module.apply(
      {'params': params}, method=lambda m: stochastic_text.video_noise_bank(
          m.make_rng('sampling'), keys, 5, D, 'normal', 1.0), rngs={'sampling': key}))
  samples = texts[:, None, None] + noise[None] * radius[:, :, None]       # [Q, B, M, D]
  unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  expected = np.max(np.sum(unit(samples) * unit(pooled)[:, :, None], -1), -1)
  support.assert_close(scores, expected, support.f32_rtol(D, ops=8))
  single = module.apply({'params': params}, texts, {'frames': frames[2:3], 'key': keys[2:3]},
                        method='score', rngs={'sampling': key})
  support.assert_close(single[:, 0], scores[:, 2], support.f32_rtol(D, ops=2))


@pytest.mark.parametrize('prior', stochastic_text.PRIORS)
def test_noise_bank_depends_only_on_the_video_key(prior):
  key = jax.random.key(3)
  bank = stochastic_text.video_noise_bank(key, jnp.array([5, 9, 5]), 4, 8, prior, 0.1)
  np.testing.assert_array_equal(bank[0], bank[2])
  assert not np.array_equal(bank[0], bank[1])
  if prior == 'uniform01':
    assert float(bank.min()) >= 0 and float(bank.max()) < 1


def test_end_to_end_backbone_reads_pixels_and_tokens_and_takes_clip_weights():
  # Training it is tests/train/test_tmass_end_to_end.py.
  config = support.load_config('tmass', 'tiny')
  config.model.update(backbone='tiny', num_frames=3)
  spec = registry.get_spec(config.model)
  assert spec.inputs(config.model) == (('frames', 'video_seed'), ('tokens',))
  shapes = spec.param_shapes(config.model)
  clip_shapes = clip.model.param_shapes(clip.model.TINY)
  # The model holds CLIP's tree: converted CLIP weights drop in, a misfit is refused.
  assert jax.tree.map(np.shape, shapes['visual']) == jax.tree.map(np.shape, clip_shapes['visual'])
  zeros = lambda tree: jax.tree.map(lambda x: np.zeros(x.shape, x.dtype), tree)
  clip_params = jax.tree.map(lambda x: np.full(x.shape, 0.5, x.dtype), clip_shapes)
  merged = clip_weights.into_model(zeros(shapes), clip_params)
  assert all((x == 0.5).all() for x in jax.tree.leaves(merged['text']))
  assert all((x == 0).all() for x in jax.tree.leaves(merged['pool']))
  bad = {**clip_params, 'visual': {**clip_params['visual'], 'proj': {'kernel': np.zeros((3, 3))}}}
  with pytest.raises(ValueError, match='visual'):
    clip_weights.into_model(zeros(shapes), bad)
  assert spec.bytes_per_video(config.model) == 3 * 32 * 4 + 4


def _objective_batch(texts, frames, order):
  """A training batch of paired texts and frames with the videos in `order` (caption i's own
  video sits at row `argsort(order)[i]`), as the official pairs text i with video i."""
  n = len(texts)
  return {'query_feats': jnp.asarray(texts)[:, None],
          'clip_feats': jnp.asarray(frames)[np.asarray(order)],
          'query_video': jnp.asarray(np.argsort(order)), 'query_valid': jnp.ones(n, bool),
          'video_valid': jnp.ones(n, bool), 'video_seed': jnp.arange(n)}


def _run_objective(monkeypatch, params, batch, noise, alpha, dim, frames):
  """(total, terms) and gradients of the model's `objective()`, the noise fed in where the
  training forward draws it."""
  monkeypatch.setattr(stochastic_text, 'draw_noise',
                      lambda key, shape, prior, std: jnp.asarray(noise).reshape(shape))
  model = TMASS(hidden_dim=dim, num_frames=frames, dropout=0.0)
  ctx = LossContext(loss=ml_collections.ConfigDict({'support': alpha, 'text_ce': 0.0}),
                    epoch=jnp.int32(0), step=jnp.int32(0))
  rngs = {'dropout': jax.random.key(0), 'sampling': jax.random.key(1)}
  return jax.jit(jax.value_and_grad(lambda p: objective(model, p, batch, rngs, ctx),
                                    has_aux=True))(params)


@pytest.mark.parametrize('order', [[0, 1, 2, 3], [2, 0, 3, 1]])
def test_objective_gives_the_official_losses(monkeypatch, order):
  """The training path (`objective()`: radius of each caption with its own video, support
  target, masks) on head.npz, with the batch's videos in the official order and shuffled."""
  h = _load('head.npz')
  sd = {k.split('/', 1)[1]: v for k, v in h.items() if k.startswith(('pool/', 'radius/'))}
  params = _head_params(sd, '', '', h['logit_scale'])
  batch = _objective_batch(h['text'], h['frames'], order)
  alpha = float(h['alpha'])
  (total, terms), _ = _run_objective(monkeypatch, params, batch, h['noise'], alpha, D, F)
  rtol = support.f32_rtol(D, ops=8)
  support.assert_close(terms['stochastic_ce'], h['loss_s'], rtol)
  support.assert_close(terms['support_ce'], alpha * h['loss_sup'], rtol)
  support.assert_close(total, h['loss_total'], rtol)


def test_objective_gives_the_official_first_update_gradients(monkeypatch):
  """step.npz's first update through `objective()`: the official trainer's losses and the raw
  gradients of the T-MASS head (X-Pool, radius, logit scale) on the CLIP stand-in's features."""
  s = _load('step.npz')
  tree = _step_tree(s, 'before/')
  linear = lambda x, p: x @ p['kernel'] + p['bias']
  texts = linear(s['text_in'], tree['clip']['text_proj'])
  frames = linear(s['frames_in'], tree['clip']['visual_proj'])
  order = [3, 1, 0, 2]
  batch = _objective_batch(texts, frames, order)
  alpha = float(s['alpha'])
  (total, terms), grads = _run_objective(monkeypatch, tree['head'], batch, s['noise'][0], alpha,
                                         D, F)
  rtol = support.f32_rtol(D, ops=30)
  support.assert_close(total, s['loss_total'][0], rtol)
  support.assert_close(terms['stochastic_ce'], s['loss_s'][0], rtol)
  support.assert_close(terms['support_ce'], alpha * s['loss_sup'][0], rtol)
  expected = _step_tree({k.replace('grad/', 'g/'): v for k, v in s.items()
                         if k.startswith('grad/') or k == 'before/clip.logit_scale'}, 'g/')['head']
  expected['logit_scale'] = s['grad/clip.logit_scale']
  # X-Pool's key bias has an analytically zero gradient: compared at the scale of all of them.
  scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(expected))
  jax.tree.map(lambda a, b: support.assert_close(a, b, rtol, scale=scale), grads, expected)
