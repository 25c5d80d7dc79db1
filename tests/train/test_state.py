"""The train state: built as the plain jitted init builds it, and described without tracing the
model again."""

import os
import re

import jax
import numpy as np

from prvr_jax import models, parallel, train
from prvr_jax.train import state as state_lib
import support


def test_the_init_compiled_for_start_up_gives_the_default_compiles_state_bit_for_bit(
    monkeypatch):
  """`create_train_state` compiles its one-off init with `INIT_COMPILER_OPTIONS` (on CPUs
  LLVM's level 1, where XLA_FLAGS does not set a level; this suite's does): every leaf equals
  that of the init compiled at XLA's default level (3) exactly. (AMDNet: at level 0 some of its
  parameters differ in the last bit.)"""
  monkeypatch.setenv('XLA_FLAGS', re.sub(r'--xla_backend_optimization_level=\S+', '',
                                         os.environ.get('XLA_FLAGS', '')))
  config = support.load_config('amdnet', 'tiny')
  spec, mesh = models.get_spec('amdnet'), parallel.make_mesh()
  tx, _ = train.make_model_optimizer(config, spec, total_steps=10)
  state = train.create_train_state(config, spec, tx, mesh)
  rng = jax.random.PRNGKey(config.train.seed)
  init = jax.jit(state_lib._init_fn(config, spec, tx))  # pylint: disable=protected-access
  default = init.lower(rng).compile(compiler_options={'xla_backend_optimization_level': 3})(rng)
  leaves, default_leaves = jax.tree.leaves(state), jax.tree.leaves(default)
  assert jax.tree.structure(state) == jax.tree.structure(default)
  assert len(leaves) > 10
  for leaf, default_leaf in zip(leaves, default_leaves):
    np.testing.assert_array_equal(np.asarray(leaf), np.asarray(default_leaf))


def test_the_abstract_state_is_the_inits_without_a_trace_of_the_model(monkeypatch):
  """`abstract_train_state` has the shapes, dtypes and tree of `jax.eval_shape` of the init,
  with replicated shardings, and takes the parameters' shapes from `ModelSpec.param_shapes`
  (traced once per model and config), not from another trace of the model."""
  config = support.load_config('gmmformer', 'tiny')
  spec, mesh = models.get_spec('gmmformer'), parallel.make_mesh()
  tx, _ = train.make_model_optimizer(config, spec, total_steps=10)
  init = state_lib._init_fn(config, spec, tx)  # pylint: disable=protected-access
  expected = jax.eval_shape(init, jax.random.PRNGKey(0))
  spec.param_shapes(config.model)  # traced (or cached) here, not below
  traced = []
  monkeypatch.setattr(type(spec), 'init_params', lambda *args: traced.append(args))
  abstract = train.abstract_train_state(config, spec, tx, mesh)
  assert not traced
  assert jax.tree.structure(abstract) == jax.tree.structure(expected)
  for leaf, want in zip(jax.tree.leaves(abstract), jax.tree.leaves(expected)):
    assert (leaf.shape, leaf.dtype) == (want.shape, want.dtype)
    assert leaf.sharding.is_fully_replicated
