"""RAL's probabilistic heads and losses as a plug-in of the two-branch models
(`config.model.probabilistic`, docs/ral.md): off, the parameter tree is unchanged; on, it adds
exactly the two heads, the objective gains L_PM and L_DA, the loss is finite, every head
parameter gets a gradient, and with both weights 0 the objective is the plain model's. The
heads have no official names: the official converter refuses them, naming them.

The jitted checks (one program per model: the suite's budget) run for the three models the
plug-in was made for; HLFormer goes through the same training forward as GMMFormer v2
(`FrameSet`, `TwoBranchModel.__call__`), ProtoPRVR through its own (both passed a first form
of these checks, run for all five models)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prvr_jax import config_lib, convert, models
from prvr_jax.models.probabilistic import TERMS, probabilistic_terms
from prvr_jax.models.spec import LossContext, path_of
import support

MODELS = ('gmmformer', 'gmmformer_v2', 'ms_sl', 'hlformer', 'protoprvr')
FRAME_LENGTHS = (16, 9, 3, 12)
QUERY_LENGTHS = (8, 5, 2, 7, 8, 3, 6, 4)  # two queries per video
HEADS = ('prob_text', 'prob_video')
COMPILED_MODELS = ('gmmformer', 'gmmformer_v2', 'ms_sl')


def _config(name, on=True):
  """The tiny config at shorter input lengths and two GMM branches (cheap compiles)."""
  config = support.load_config(name, 'tiny')
  config.model.update(max_frames=16, num_clips=8, max_query_len=8, probabilistic=on)
  if 'widths' in config.model:
    config.model.widths = (None, 1.0)
  if name == 'hlformer':
    config.model.attention_num = 2
  return config


@functools.cache
def _run(name):
  """One jitted program per model: the objective with the plug-in on (loss, terms, the heads'
  gradients) and that of the model without the plug-in (same parameters, same keys). The
  forward does not depend on the weights: with weights 0 the objective's terms are the on
  objective's less the two `probabilistic_terms` leaves out (`test_weight_zero_...`)."""
  config = _config(name)
  spec = models.get_spec(name)
  module = spec.build(config.model)
  plain = spec.build(_config(name, on=False).model)
  batch = models.random_batch(config.model, np.random.default_rng(0), FRAME_LENGTHS,
                              QUERY_LENGTHS, queries_per_video=2)
  ctx = LossContext(loss=config.loss, epoch=jnp.int32(1), step=jnp.int32(0))

  @jax.jit
  def run(key, batch):
    params = spec.init_params(config.model, key)
    plain_params = {k: v for k, v in params.items() if k not in HEADS}
    rngs = dict(zip(spec.rng_streams, jax.random.split(key, len(spec.rng_streams))))
    # Gradients of the heads only: the encoders' backward pass would only add compile time.
    (loss, terms), grads = jax.value_and_grad(
        lambda heads: spec.objective(module, {**plain_params, **heads}, batch, rngs, ctx),
        has_aux=True)({k: params[k] for k in HEADS})
    plain_loss, plain_terms = spec.objective(plain, plain_params, batch, rngs, ctx)
    return dict(loss=loss, terms=terms, grads=grads, plain_loss=plain_loss,
                plain_terms=plain_terms)

  return config, spec, run(jax.random.key(0), batch)


@pytest.mark.parametrize('name', MODELS)
def test_off_leaves_the_parameters_on_adds_the_two_heads(name):
  spec = models.get_spec(name)
  shapes_off = spec.param_shapes(_config(name, on=False).model)
  shapes_on = spec.param_shapes(_config(name).model)
  assert not [k for k in shapes_off if k.startswith('prob')]
  assert set(shapes_on) - set(shapes_off) == set(HEADS)
  assert jax.tree.map(lambda s: s.shape, {k: shapes_on[k] for k in shapes_off}) == jax.tree.map(
      lambda s: s.shape, shapes_off)
  # Evaluation is unchanged: the stored encodings are those of the plain model.
  assert spec.stored_per_video(_config(name).model) == spec.stored_per_video(
      _config(name, on=False).model)


@pytest.mark.parametrize('name', COMPILED_MODELS)
def test_the_switch_adds_the_terms_with_gradients_to_every_head_parameter(name):
  config, _, out = _run(name)
  terms = out['terms']
  assert set(terms) == set(out['plain_terms']) | set(TERMS)
  assert np.isfinite(out['loss'])
  support.assert_close(out['loss'], sum(terms.values()), support.f32_rtol(len(terms)))
  for term in TERMS:
    assert terms[term] > 0, term
  leaves = jax.tree_util.tree_leaves_with_path(out['grads'])
  assert {path_of(path).split('/')[0] for path, _ in leaves} == set(HEADS)
  for path, grad in leaves:
    assert np.isfinite(grad).all(), path_of(path)
    assert np.abs(grad).max() > 0, f'{path_of(path)} gets no gradient'


@pytest.mark.parametrize('name', COMPILED_MODELS)
def test_weight_zero_is_the_plain_models_objective(name):
  config, _, out = _run(name)
  rng = np.random.default_rng(0)
  shape = (len(FRAME_LENGTHS), config.model.num_samples, config.model.hidden_dim)
  gaussians = {'gaussians': {m: {'samples': rng.normal(size=shape).astype(np.float32),
                                 'logsigma': rng.normal(size=shape[::2]).astype(np.float32)}
                             for m in ('video', 'text')}}
  batch = {'video_valid': np.ones(len(FRAME_LENGTHS), bool)}
  zero = config.loss.copy_and_resolve_references()
  zero.update({k: 0.0 for k in TERMS})
  assert probabilistic_terms(gaussians, batch, zero) == {}
  zero.distribution_alignment = config.loss.distribution_alignment
  assert set(probabilistic_terms(gaussians, batch, zero)) == {'distribution_alignment'}
  # The other terms are the plain model's (same parameters and keys), so with both weights 0
  # the objective is the plain model's, term by term.
  rtol = support.f32_rtol(config.model.hidden_dim, ops=4)
  others = {k: v for k, v in out['terms'].items() if k not in TERMS}
  assert set(others) == set(out['plain_terms'])
  for term, value in out['plain_terms'].items():
    support.assert_close(others[term], value, rtol, scale=out['plain_loss'], err_msg=term)
  support.assert_close(sum(others.values()), out['plain_loss'], rtol)


def test_the_official_converter_refuses_the_heads():
  spec = models.get_spec('gmmformer_v2')
  params = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype),
                        spec.param_shapes(_config('gmmformer_v2').model))
  with pytest.raises(ValueError, match=r'without an official counterpart.*prob_text/'):
    convert.params_to_torch(params, 'gmmformer_v2')


def test_the_switch_is_a_config_flag_and_ral_keeps_it_on():
  for name in MODELS:
    argv = ['train.py', f'--config=configs/{name}.py:tiny', '--config.model.probabilistic=True',
            '--config.loss.proxy_matching=0.01', '--config.loss.distribution_alignment=0.001']
    config_lib.check_override_flags(argv)
    config_lib.validate(_config(name))
  config = _config('gmmformer')
  config.model.support_slots = 0
  with pytest.raises(ValueError, match=r'support_slots=0'):
    config_lib.validate(config)
  # RAL's heads are always on: its config has no switch (the module's True), and a config
  # that turns them off is refused.
  ral = support.load_config('ral', 'tiny')
  assert 'probabilistic' not in ral.model and models.get_spec('ral').module.probabilistic
  config_lib.validate(ral)
  with ral.model.unlocked():
    ral.model.probabilistic = False
  with pytest.raises(ValueError, match=r'config.model.probabilistic'):
    models.get_spec('ral').param_shapes(ral.model)
