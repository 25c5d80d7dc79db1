"""BertAdam / warmup-linear vs a numpy re-implementation of the official update."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

import support
from prvr_jax import convert, models, optim


def ref_warmup_linear(step, warmup, total):
  progress = step / total
  if progress < warmup:
    return progress / warmup
  return max((progress - 1.) / (warmup - 1.), 0.)


class RefBertAdam:
  """Official BertAdam step, per tensor, float64."""

  def __init__(self, params, decayed, lr, warmup, total, wd, max_norm=1.0,
               b1=0.9, b2=0.999, eps=1e-6):
    self.params = {k: v.astype(np.float64) for k, v in params.items()}
    self.decayed, self.lr, self.warmup, self.total = decayed, lr, warmup, total
    self.wd, self.max_norm, self.b1, self.b2, self.eps = wd, max_norm, b1, b2, eps
    self.m = {k: np.zeros_like(v) for k, v in self.params.items()}
    self.v = {k: np.zeros_like(v) for k, v in self.params.items()}
    self.step_count = 0

  def step(self, grads):
    lr_t = self.lr * ref_warmup_linear(self.step_count, self.warmup, self.total)
    for k, p in self.params.items():
      g = grads[k].astype(np.float64)
      norm = np.sqrt((g * g).sum())
      g = g * min(1., self.max_norm / (norm + 1e-6))
      self.m[k] = self.b1 * self.m[k] + (1 - self.b1) * g
      self.v[k] = self.b2 * self.v[k] + (1 - self.b2) * g * g
      update = self.m[k] / (np.sqrt(self.v[k]) + self.eps)
      if self.decayed[k]:
        update = update + self.wd * p
      self.params[k] = p - lr_t * update
    self.step_count += 1


def make_params(rng):
  return {
      'dense': {'kernel': rng.normal(size=(3, 4)), 'bias': rng.normal(size=4)},
      'LayerNorm': {'scale': 1 + 0.1 * rng.normal(size=4),
                    'bias': rng.normal(size=4)},
      'norm1': {'scale': 1 + 0.1 * rng.normal(size=4)},
  }


def flat(tree):
  return {'/'.join(k.key for k in path): np.asarray(v, np.float64)
          for path, v in jax.tree_util.tree_leaves_with_path(tree)}


def official_no_decay(torch_name: str) -> bool:
  """The official BertAdam groups (all four official repos): no decay for torch names
  containing 'bias', 'LayerNorm.bias' or 'LayerNorm.weight'."""
  return any(part in torch_name for part in ('bias', 'LayerNorm.bias', 'LayerNorm.weight'))


@pytest.mark.parametrize('name,aggregation', [
    ('gmmformer', 'average'), ('gmmformer', 'weighted'),
    ('gmmformer_v2', 'temporal_consolidation'), ('gmmformer_v2', 'dynamic')])
def test_declared_decay_rules_are_the_official_groups(name, aggregation):
  """The model's path rules (`ModelSpec.no_decay`) decay exactly the leaves whose official
  torch names the official rule decays; ablation-only leaves (no official name) keep their
  path joined with dots, as the official code would name them."""
  config = support.load_config(name, 'tvr')
  config.model.aggregation = aggregation
  spec = models.get_spec(name)
  shapes = spec.param_shapes(config.model)
  torch_names = convert.torch_names(shapes, name)
  expected = jax.tree.map(lambda n: not official_no_decay(n), torch_names)
  assert spec.weight_decay_mask(shapes) == expected
  decayed = [n for n, d in zip(jax.tree.leaves(torch_names), jax.tree.leaves(expected)) if d]
  if name == 'gmmformer_v2':  # a LayerNorm, but named norm1 officially: decayed
    assert 'clip_encoder.attn*.norm1.weight' in decayed
  assert 'query_input_proj.LayerNorm.weight' not in decayed
  # BertAdam clips per official tensor: exactly the leaves standing for attn0..attnK-1 stack.
  assert spec.stacked_mask(shapes) == jax.tree.map(lambda n: 'attn*' in n, torch_names)


def test_default_decay_mask_skips_biases_and_scales():
  mask = flat(optim.default_decay_mask(make_params(np.random.default_rng(0))))
  assert mask == {'dense/kernel': True, 'dense/bias': False,
                  'LayerNorm/scale': False, 'LayerNorm/bias': False,
                  'norm1/scale': False}


def test_warmup_linear_schedule_values():
  schedule = optim.warmup_linear_schedule(3e-4, 0.01, 1000)
  for step, expected in [(0, 0.), (1, 0.1), (5, 0.5), (10, 1.), (11, 989 / 990),
                         (505, 0.5), (999, 1 / 990), (1000, 0.), (1500, 0.)]:
    # A few float32 roundings of O(1) fractions of the peak lr (scale: zero lrs must be ~0).
    support.assert_close(schedule(step), 3e-4 * expected, rtol=support.f32_rtol(1, ops=4),
                         scale=3e-4, err_msg=str(step))
    support.assert_close(expected, ref_warmup_linear(step, 0.01, 1000), rtol=1e-12,
                         scale=1.0)  # float64 fractions in [0, 1]
  no_warmup = optim.warmup_linear_schedule(1., -1, 10)
  support.assert_close([no_warmup(s) for s in (0, 5, 10)], [1., .5, 0.],
                       rtol=support.f32_rtol(1, ops=4))
  assert optim.warmup_linear_schedule(2., 0.1, -1)(123) == 2.
  with pytest.raises(ValueError, match='warmup_proportion'):
    optim.warmup_linear_schedule(1., 1.0, 10)


def test_bert_adam_matches_official_update():
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32),
                        make_params(rng))
  mask = {'dense': {'kernel': True, 'bias': False},
          'LayerNorm': {'scale': False, 'bias': False},
          'norm1': {'scale': True}}
  total, warmup, lr, wd = 10, 0.2, 1e-2, 0.01
  opt = optim.bert_adam(optim.warmup_linear_schedule(lr, warmup, total),
                        weight_decay=wd, weight_decay_mask=mask)
  state = opt.init(params)
  ref = RefBertAdam(flat(params), flat(mask), lr, warmup, total, wd)
  update = jax.jit(opt.update)

  for step in range(6):
    grads = jax.tree.map(
        lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
    if step in (0, 3):  # a large gradient: clipped to norm 1
      grads['dense']['kernel'] = grads['dense']['kernel'] * 100.
    before = flat(params)
    updates, state = update(grads, state, params)
    params = optax.apply_updates(params, updates)
    ref.step(flat(grads))
    if step == 0:  # lr 0 on the first update
      for k, v in flat(params).items():
        np.testing.assert_array_equal(v, before[k])
    # float32 parameters (O(1)) vs the float64 reference: each step rounds `p - lr * u` once
    # (<= 1/2 ulp of the tensor's magnitude); the update itself (norms over <= 12 elements)
    # is ~1e-2 of it. 6 steps.
    for k, v in flat(params).items():
      support.assert_close(v, ref.params[k], rtol=support.f32_rtol(1, ops=6),
                           err_msg=f'{k} step {step}')
  assert not np.allclose(flat(params)['dense/kernel'], before['dense/kernel'])


def test_make_gradient_transformation_bert_adam_and_adamw():
  rng = np.random.default_rng(1)
  params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32),
                        make_params(rng))
  config = ml_collections.ConfigDict(dict(
      name='bert_adam', lr=1e-3, warmup_proportion=0., weight_decay=0.5,
      max_grad_norm=1.0))
  zeros = jax.tree.map(jnp.zeros_like, params)

  # Zero gradients: the update is the weight decay alone, -lr * wd * p.
  opt = optim.make_gradient_transformation(config, total_steps=100)
  updates, _ = opt.update(zeros, opt.init(params), params)
  decay_scale = 1e-3 * 0.5 * max(np.abs(p).max() for p in flat(params).values())
  for k, u in flat(updates).items():
    expected = -1e-3 * 0.5 * flat(params)[k] if k == 'dense/kernel' else np.zeros_like(u)
    # float32 -lr * wd * p: two roundings; scale: the decay step's magnitude (zero updates
    # must be ~0 against it).
    support.assert_close(u, expected, rtol=support.f32_rtol(1, ops=2), scale=decay_scale,
                         err_msg=k)

  mask = {'dense': {'kernel': False, 'bias': False},
          'LayerNorm': {'scale': False, 'bias': False}, 'norm1': {'scale': True}}
  opt = optim.make_gradient_transformation(config, total_steps=100, weight_decay_mask=mask)
  updates, _ = opt.update(zeros, opt.init(params), params)
  decayed = {k for k, u in flat(updates).items() if np.any(u != 0)}
  assert decayed == {'norm1/scale'}

  config.name = 'adamw'
  opt = optim.make_gradient_transformation(config, total_steps=100)
  updates, _ = opt.update(zeros, opt.init(params), params)
  decayed = {k for k, u in flat(updates).items() if np.any(u != 0)}
  assert decayed == {'dense/kernel'}

  config.name = 'sgd'
  with pytest.raises(ValueError, match='config.optim.name'):
    optim.make_gradient_transformation(config, total_steps=100)


def test_stacked_branches_are_clipped_per_official_tensor():
  """Each of the K slices of a stacked leaf is one torch tensor and is clipped on its own."""
  rng = np.random.default_rng(0)
  stacked = rng.normal(size=(3, 4, 5)).astype(np.float32)
  stacked[0] *= 0.01  # a small slice: its norm stays below 1 and must not be scaled
  plain = rng.normal(size=(4, 5)).astype(np.float32)
  grads = {'branches': {'kernel': jnp.asarray(stacked)}, 'dense': {'kernel': jnp.asarray(plain)}}
  stacked_mask = {'branches': {'kernel': True}, 'dense': {'kernel': False}}
  clipped, _ = optim.clip_by_tensor_norm(1.0, stacked_mask).update(grads, optax.EmptyState())
  # Scaling by 1 / norm: the norm's rounding (20 terms, numpy vs XLA order) and a product.
  rtol = support.f32_rtol(20, ops=2)
  for k in range(3):
    norm = np.linalg.norm(stacked[k])
    support.assert_close(clipped['branches']['kernel'][k],
                         stacked[k] * min(1.0, 1.0 / (norm + 1e-6)), rtol=rtol)
  # Not scaled: equal up to one rounding at most.
  support.assert_close(clipped['branches']['kernel'][0], stacked[0], rtol=support.f32_rtol(1))
  support.assert_close(np.linalg.norm(clipped['dense']['kernel']), 1.0, rtol=rtol)


@pytest.mark.parametrize('name', ['bert_adam', 'adamw', 'hf_adamw'])
def test_declared_bounds_hold_after_every_update_under_every_optimiser(name):
  """HLFormer's bounded weights (`ModelSpec.bounds`: `curv` within a decade of `curv_init`,
  the scale factors <= 0) are clamped after every update, as the official forward clamps the
  stored values in place; a weight without bounds, or inside its bounds, moves freely."""
  config = support.load_config('hlformer', 'tiny')
  config.optim.name = name
  spec = models.get_spec(config.model)
  # The model's bounded leaves and one unbounded one, under their paths in the model.
  attention = lambda: {'attention': {'scale_alpha': jnp.float32(0.)}}
  params = {'curv': jnp.float32(np.log(10.) - 1e-4), 'textual_alpha': jnp.float32(-1e-4),
            'video_alpha': jnp.float32(-1e-4),
            'clip': {'encoder': {'lorentz_0': attention()},
                     'input_proj': {'dense': {'bias': jnp.zeros(4)}}},
            'frame': {'encoder': {'lorentz_0': attention()}}}
  tx = optim.make_gradient_transformation(config.optim, 20,
                                          bounds=spec.bound_trees(config.model, params))
  # Every gradient pushes its weight up (updates of lr ~ 1e-4 per step, after the warm-up's
  # first), except that of one scale factor, pushed down, away from its bound.
  grads = jax.tree.map(lambda p: -jnp.ones_like(p), params)
  grads['frame']['encoder']['lorentz_0']['attention']['scale_alpha'] = jnp.float32(1.)

  @jax.jit
  def step(params, state, grads):
    updates, state = tx.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  state = tx.init(params)
  for _ in range(4):
    params, state = step(params, state, grads)
  assert np.log(10.) * (1 - 1e-6) <= float(params['curv']) <= np.float32(np.log(10.))
  for alpha in (params['textual_alpha'], params['video_alpha'],
                params['clip']['encoder']['lorentz_0']['attention']['scale_alpha']):
    assert float(alpha) == 0.0
  assert float(params['frame']['encoder']['lorentz_0']['attention']['scale_alpha']) < 0.0
  assert float(params['clip']['input_proj']['dense']['bias'][0]) > 1e-4  # unbounded

  # The lower bound of `curv`: pushed down from just above log(1/10), it stops there.
  params['curv'] = jnp.float32(np.log(.1) + 1e-4)
  grads['curv'] = jnp.float32(1.)
  state = tx.init(params)
  for _ in range(4):
    params, state = step(params, state, grads)
  assert np.float32(np.log(.1)) <= float(params['curv']) <= np.log(.1) * (1 - 1e-6)
