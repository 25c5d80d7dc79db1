"""`kernels.policy.fast_kernels`: where the kernels stand in for the plain layers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import support
from prvr_jax import config_lib, models, parallel, train
from prvr_jax.kernels import policy
from prvr_jax.layers import AttentionBlockV2
from prvr_jax.layers.text_pooling import TextConditionedPooling
from prvr_jax.models import registry


def _primitives(fn, *args, enabled):
  def run(*a):
    with policy.fast_kernels(enabled):
      return fn(*a)
  return str(jax.make_jaxpr(run)(*args))


def _block_and_inputs():
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 6, 8)), jnp.float32)
  block = AttentionBlockV2(num_heads=2, dropout_rate=0.1)
  return block, block.init(jax.random.key(0), x), x


def _block_loss(block):
  return lambda p, x: jnp.sum(block.apply(p, x, deterministic=False,
                                          rngs={'dropout': jax.random.key(1)}) ** 2)


def test_the_policy_enables_the_kernels_by_backend():
  """The kernels' marks in the block's program: the LayerNorm's `custom_vjp`, and no call of
  JAX's `random_bits` (the plain dropout's words)."""
  block, params, x = _block_and_inputs()
  loss = _block_loss(block)
  fast = _primitives(loss, params, x, enabled=True)
  assert 'custom_vjp_call' in fast and 'random_bits[' not in fast
  plain = _primitives(loss, params, x, enabled=False)
  assert 'custom_vjp_call' not in plain and 'random_bits[' in plain
  by_default = _primitives(loss, params, x, enabled=None)
  assert by_default == (fast if jax.default_backend() in policy.FAST_BACKENDS else plain)


def test_parameters_and_deterministic_outputs_do_not_depend_on_the_policy():
  block, params, x = _block_and_inputs()
  with policy.fast_kernels(True):
    fast_params = block.init(jax.random.key(0), x)
    fast_out = block.apply(params, x)
  assert jax.tree.structure(fast_params) == jax.tree.structure(params)
  for fast, plain in zip(jax.tree.leaves(fast_params), jax.tree.leaves(params)):
    np.testing.assert_array_equal(fast, plain)
  np.testing.assert_array_equal(fast_out, block.apply(params, x))


def test_text_conditioned_pooling_keeps_the_plain_layer_norms():
  rng = np.random.default_rng(1)
  texts = jnp.asarray(rng.normal(size=(3, 8)), jnp.float32)
  frames = jnp.asarray(rng.normal(size=(2, 5, 8)), jnp.float32)
  pool = TextConditionedPooling(features=8, num_heads=2, dropout=0.0)
  params = pool.init(jax.random.key(0), texts, frames)
  loss = lambda p: jnp.sum(pool.apply(p, texts, frames) ** 2)
  assert 'custom_vjp_call' not in _primitives(loss, params, enabled=True)


def test_the_train_step_traces_its_objective_under_the_policy(monkeypatch):
  """GMMFormer's train step: on a backend of the policy its dropout draws no word through JAX's
  `random_bits`; with the policy off (no backend listed) each of its dropouts does;
  `train.kernels` 'fast' or 'plain' decides whatever the backend."""
  config = support.load_config('gmmformer', 'tiny')
  spec = registry.get_spec('gmmformer')
  mesh = support.data_mesh(1)
  tx, schedule = train.make_model_optimizer(config, spec, total_steps=10)
  state = train.abstract_train_state(config, spec, tx, mesh)
  batch = parallel.shard_global_view(models.random_batch(
      config.model, np.random.default_rng(0), (9, 5), (4, 6, 3, 5), queries_per_video=2), mesh)

  def random_bits_calls(kernels='auto'):
    config.train.kernels = kernels
    step = train.make_train_step(config, spec, tx, schedule, mesh)
    return str(jax.make_jaxpr(step)(state, batch, np.int32(0))).count('random_bits[')

  monkeypatch.setattr(policy, 'FAST_BACKENDS', (jax.default_backend(),))
  fast = random_bits_calls()
  assert random_bits_calls('plain') > fast
  monkeypatch.setattr(policy, 'FAST_BACKENDS', ())
  plain = random_bits_calls()
  assert plain > fast
  assert random_bits_calls('fast') == fast and random_bits_calls('plain') == plain


def test_every_kernels_choice_of_the_config_is_a_policy_choice():
  assert set(config_lib.KERNEL_CHOICES) == set(policy.CHOICES)
  config = support.load_config('gmmformer', 'tiny')
  config.train.kernels = 'fastest'
  with pytest.raises(ValueError, match='train.kernels'):
    config_lib.validate(config)
