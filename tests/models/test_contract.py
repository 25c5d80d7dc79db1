"""The model contract, checked for every registered model (a new model gets all of it by
registering): init by `jax.eval_shape`, encode/score shapes, the training forward's scores
equal `score`, a finite loss with gradients for every parameter (and, in mixed precision,
close to them), a train step that compiles once and gives the same result on 1 and 2
devices, a checkpoint round trip, the official name map (where there is one) and the
parameter counts the model's docs state."""

import dataclasses
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prvr_jax import checkpoint, convert, models, parallel, train
from prvr_jax.layers import precision
from prvr_jax.models import registry
from prvr_jax.models.spec import LossContext, match_paths, path_of
import support

pytestmark = pytest.mark.slow  # every model's train step, loss and gradients compile here

FRAME_LENGTHS = (128, 70, 5, 33)
QUERY_LENGTHS = (30, 7, 3, 12, 25, 9, 18, 4)  # two queries per video
TOTAL_STEPS = 100  # of the optimizer's schedule in the train-step test


@pytest.fixture(scope='module', params=registry.names())
def model(request):
  """(spec, tiny config, module, params) of one registered model. The parameters are those of
  a fresh train state on one device, made as the train-step test makes its own: that test then
  loads this init program from the compilation cache instead of compiling a second one."""
  spec = registry.get_spec(request.param)
  config = support.load_config(request.param, 'tiny')
  tx, _ = train.make_model_optimizer(config, spec, total_steps=TOTAL_STEPS)
  params = train.create_train_state(config, spec, tx, support.data_mesh(1)).params
  return spec, config, spec.build(config.model), params


def _batch(config, seed=0):
  return models.random_batch(config.model, np.random.default_rng(seed), FRAME_LENGTHS,
                             QUERY_LENGTHS, queries_per_video=2)


def _rngs(streams, seed=0):
  """One key per stream name."""
  keys = jax.random.split(jax.random.key(seed), max(len(streams), 1))
  return dict(zip(streams, keys))


def test_init_by_eval_shape_and_documented_counts(model):
  spec, config, _, params = model
  shapes = spec.param_shapes(config.model)
  assert jax.tree.map(lambda s: (s.shape, s.dtype), shapes) == jax.tree.map(
      lambda p: (p.shape, p.dtype), params)
  assert spec.param_counts, f'{spec.name} states no parameter counts'
  doc = importlib.import_module(spec.module.__module__.rsplit('.', 1)[0]).__doc__
  for variant, count in spec.param_counts.items():
    config_variant = support.load_config(spec.name, variant)
    assert models.count_params(spec.param_shapes(config_variant.model)) == count, variant
    assert f'{count:,}' in doc, f'the {spec.name} package docstring does not state {count:,}'


def test_encode_score_and_training_scores_agree(model):
  spec, config, module, params = model
  batch = _batch(config)

  @jax.jit
  def run(params, batch):
    variables = {'params': params}
    videos = module.apply(variables, {k: batch[k] for k in spec.video_inputs},
                          method='encode_videos')
    queries = module.apply(variables, {k: batch[k] for k in spec.query_inputs},
                           method='encode_queries')
    score_rngs = _rngs(spec.score_rng_streams)
    scores = module.apply(variables, queries, videos, method='score', rngs=score_rngs)
    return videos, queries, scores, module.apply(variables, batch, rngs=score_rngs)

  videos, queries, scores, outputs = run(params, batch)
  num_videos, num_queries = len(FRAME_LENGTHS), len(QUERY_LENGTHS)
  assert all(x.shape[0] == num_videos for x in jax.tree.leaves(videos))
  assert all(x.shape[0] == num_queries for x in jax.tree.leaves(queries))
  assert scores.shape == (num_queries, num_videos) and np.isfinite(scores).all()
  # The training forward scores every pair of the batch from its own encodings; in
  # deterministic mode they equal the evaluation path's. O(1) cosines through a few layers
  # of width <= 32: a few f32 roundings of reductions over the width.
  support.assert_close(outputs['scores'], scores,
                       rtol=support.f32_rtol(config.model.hidden_dim, ops=8))
  stored = spec.stored_per_video(config.model)
  assert {path_of(p): x.shape[1:] for p, x in jax.tree_util.tree_leaves_with_path(videos)} == {
      k: s.shape for k, s in stored.items()}
  assert spec.bytes_per_video(config.model) == sum(
      x[0].size * x.dtype.itemsize for x in jax.tree.leaves(videos))


def _skip_untrainable(spec):
  """Skips the training checks for a model with nothing to train (zero-shot CLIP: its
  objective refuses, and train.py too: tests/models/test_clip_zero_shot.py)."""
  if not spec.trainable:
    pytest.skip(f'{spec.name} has nothing to train')


def _loss_and_grads(model, matmul_precision):
  """The objective's loss, terms and gradients on a fixed batch, jitted, forward and backward
  at `matmul_precision`."""
  spec, config, module, params = model
  _skip_untrainable(spec)
  batch = _batch(config, seed=1)
  ctx = LossContext(loss=config.loss, epoch=jnp.int32(0), step=jnp.int32(0))
  loss_fn = lambda p: spec.objective(module, p, batch, _rngs(spec.rng_streams), ctx)

  def run(params):
    with precision.matmul_precision(matmul_precision):
      return jax.value_and_grad(loss_fn, has_aux=True)(params)
  return jax.jit(run)(params)


@pytest.fixture(scope='module')
def float32_loss_and_grads(model):
  return _loss_and_grads(model, 'float32')


def test_loss_is_finite_and_every_parameter_gets_a_gradient(model, float32_loss_and_grads):
  spec, _, _, params = model
  (loss, terms), grads = float32_loss_and_grads
  assert np.isfinite(loss) and terms
  # The total is the sum of the terms: float32 sum of a few O(1) values.
  support.assert_close(loss, sum(terms.values()), rtol=support.f32_rtol(len(terms)))
  exempt = match_paths(grads, spec.gradient_free)
  for (path, grad), free in zip(jax.tree_util.tree_leaves_with_path(grads),
                                jax.tree.leaves(exempt)):
    assert np.isfinite(grad).all(), f'{path_of(path)}: non-finite gradient'
    if not free:
      assert np.abs(grad).max() > 0, f'{path_of(path)} gets no gradient'
  for pattern in spec.gradient_free:  # no stale declarations
    assert any(jax.tree.leaves(match_paths(params, (pattern,)))), pattern


# This and the train-step check compile each model's program once more (bfloat16; a second
# mesh): the suite's largest costs, run by CI once (`-m end_to_end`, docs/testing.md).
@pytest.mark.end_to_end
def test_mixed_precision_loss_and_gradients_follow_float32(model, float32_loss_and_grads):
  # `train.matmul_precision=bfloat16` (dense layers in bfloat16) runs every model jitted,
  # forward and backward: XLA:CPU cannot run some layouts of a bfloat16 product at all
  # (prvr_jax.layers.precision), so a model that reaches one fails here.
  (loss, _), grads = float32_loss_and_grads
  (mixed_loss, _), mixed_grads = _loss_and_grads(model, 'bfloat16')
  flat, mixed_flat = (np.concatenate([np.ravel(g) for g in jax.tree.leaves(t)])
                      for t in (grads, mixed_grads))
  assert np.isfinite(mixed_flat).all()
  # bfloat16 keeps 8 significant bits: each dense product is off by about 2^-8 relative, over
  # a few layers; the losses are sums of O(1) terms (measured: 0.3% apart at most).
  support.assert_close(mixed_loss, loss, rtol=0.05, scale=1.0)
  # The gradient may differ by more where a hinge or a hard-negative choice flips; it still
  # points the same way (measured: cosines of 0.990 to 1.000).
  cosine = flat @ mixed_flat / (np.linalg.norm(flat) * np.linalg.norm(mixed_flat))
  assert cosine >= 0.9, cosine


def _run_steps(spec, config, mesh, epochs):
  tx, schedule = train.make_model_optimizer(config, spec, total_steps=TOTAL_STEPS)
  state = train.create_train_state(config, spec, tx, mesh)
  step = train.make_train_step(config, spec, tx, schedule, mesh)
  losses = []
  for i, epoch in enumerate(epochs):
    batch = parallel.shard_global_view(_batch(config, seed=10 + i), mesh)
    state, metrics = step(state, batch, np.int32(epoch))
    losses.append(float(metrics['loss']))
  return jax.device_get(state.params), losses


@pytest.mark.end_to_end
def test_train_step_compiles_once_and_two_devices_equal_one(model):
  spec, config, _, _ = model
  _skip_untrainable(spec)
  traces = []

  def counted(*args):
    traces.append(1)
    return spec.objective(*args)

  counting = dataclasses.replace(spec, objective=counted)
  # Three batches of equal shapes, across the `tiny` hard-negative epoch (1): one trace.
  epochs = (0, 1, 2)
  one, one_losses = _run_steps(counting, config, support.data_mesh(1),
                               epochs)
  assert len(traces) == 1
  two, two_losses = _run_steps(counting, config, support.data_mesh(2),
                               epochs)
  assert len(traces) == 2  # one more for the other mesh
  # Data parallelism changes only the summation order of the batch reductions. BertAdam
  # normalises each update, so a parameter whose gradient is pure rounding noise (declared
  # gradient-free) moves by +-lr either way and is not compared.
  support.assert_close(two_losses, one_losses, rtol=1e-5)
  exempt = jax.tree.leaves(match_paths(one, spec.gradient_free))
  for (path, a), b, free in zip(jax.tree_util.tree_leaves_with_path(one), jax.tree.leaves(two),
                                exempt):
    if not free:
      support.assert_close(b, a, rtol=1e-4, err_msg=path_of(path))


def test_checkpoint_round_trip(model, tmp_path):
  spec, config, _, _ = model
  mesh = parallel.make_mesh()
  tx, _ = train.make_model_optimizer(config, spec, total_steps=10)
  state = train.create_train_state(config, spec, tx, mesh)
  meta = {**checkpoint.model_fingerprint(config.model, spec), 'step': 7}
  saved = checkpoint.Checkpoints(str(tmp_path))
  saved.save_latest(state, meta)
  saved.save_best(state.params, meta)
  saved.close()
  reopened = checkpoint.Checkpoints(str(tmp_path))
  restored, restored_meta = reopened.restore_latest(
      train.abstract_train_state(config, spec, tx, mesh))
  reopened.close()
  assert set(restored_meta.pop('digests')) == {'state', 'params'}  # checksums of the arrays
  assert restored_meta == meta
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(restored),
               jax.device_get(state))
  for path in (tmp_path, tmp_path / checkpoint.LATEST_DIR):  # best params / a full state
    params, info = checkpoint.load_params(str(path), config, mesh)
    assert info['step'] == 7
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(params),
                 jax.device_get(state.params))


def test_official_name_map_round_trip(model):
  spec, config, _, params = model
  if spec.official is None:
    pytest.skip(f'{spec.name} has no official checkpoint format')
  params = jax.device_get(params)
  state_dict = convert.params_to_torch(params, spec.name)
  assert len(state_dict) >= len(jax.tree.leaves(params))
  jax.tree.map(np.testing.assert_array_equal,
               convert.torch_to_params(state_dict, spec.name, config.model), params)
