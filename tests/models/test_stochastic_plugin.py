"""T-MASS's text mass as a plug-in of the two-branch models (`config.model.stochastic_text`,
docs/text_mass_plugin.md): off, nothing changes; on, the scores are an explicit max over
samples and stored elements of per-video noise banks, a pair's score depends on nothing else
in the gallery or the query batch, no `[Q, B, M, D]` intermediate is formed, and the model
contract (training objective, gradients, deterministic forward = `score`) holds."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prvr_jax import config_lib, models
from prvr_jax.layers import multiscale
from prvr_jax.models.spec import LossContext, match_paths, path_of
import support

MODELS = ('ms_sl', 'gmmformer', 'gmmformer_v2', 'protoprvr', 'hlformer')
FRAME_LENGTHS = (16, 9, 3, 12)
QUERY_LENGTHS = (8, 5, 2, 7, 8, 3, 6, 4)  # two queries per video
SEEDS = np.array([11, 3, 7, 42], np.int32)  # the videos' `video_seed`
SAMPLES = 5  # M: distinct from Q = 8, B = 4 and D = 32, for the shape check
ORDER = np.array([2, 0, 3, 1])  # a shuffled gallery
# The scorers whose invariance is checked: the shared one (through ProtoPRVR; GMMFormer v1 and
# v2 score through it as well) and MS-SL's, chunked over queries.
INVARIANCE_MODELS = ('ms_sl', 'protoprvr')
# The models whose jitted run (one compile each, the suite's budget) is checked: MS-SL's own
# scorer and the shared scorer with a per-branch query (ProtoPRVR); GMMFormer v1 and v2 score
# through the shared scorer too (their sets differ only in shape: test_off_... covers them).
COMPILED_MODELS = INVARIANCE_MODELS
# Each model's max-over-set branches: stored pytree -> branch -> `[B, L, D]`.
SETS = {
    'ms_sl': lambda s: {'clip': np.einsum('pl,bld->bpd', multiscale.averaging_matrix(
        s['clips'].shape[1]).astype(np.float64), np.asarray(s['clips'], np.float64))},
    'gmmformer': lambda s: {'clip': s['clips'], 'frame': s['video'][:, None]},
    'gmmformer_v2': lambda s: {'clip': s['clips'], 'frame': s['frames']},
    'protoprvr': lambda s: {b: s[f'{b}_prototypes'] for b in ('clip', 'frame')},
    'hlformer': lambda s: {'clip': s['clips'], 'frame': s['frames']},
}


def _config(name, on=True):
  """The tiny config at shorter input lengths and two GMM branches (cheap compiles), text mass
  on or off."""
  config = support.load_config(name, 'tiny')
  config.model.update(max_frames=16, num_clips=8, max_query_len=8, stochastic_text=on,
                      stochastic_samples=SAMPLES)
  if 'widths' in config.model:
    config.model.widths = (None, 1.0)
  config.loss.stochastic_support = 0.5
  return config


def _batch(config, seed, video_seeds):
  batch = models.random_batch(config.model, np.random.default_rng(seed), FRAME_LENGTHS,
                              QUERY_LENGTHS, queries_per_video=2)
  return {**batch, 'video_seed': video_seeds}


def _rngs(streams, seed=0):
  return dict(zip(streams, jax.random.split(jax.random.key(seed), len(streams))))


def _take(tree, index):
  return jax.tree.map(lambda x: x[index], tree)


@functools.cache
def _run(name):
  """Everything the tests compare, from one jitted program per model (one compile)."""
  config = _config(name)
  spec = models.get_spec(name)
  module = spec.build(config.model)
  video_inputs, query_inputs = spec.inputs(config.model)
  batch = _batch(config, 0, SEEDS)
  distractors = _batch(config, 1, SEEDS + 100)
  ctx = LossContext(loss=config.loss, epoch=jnp.int32(1), step=jnp.int32(0))

  @jax.jit
  def run(key, batch, distractors):
    params = spec.init_params(config.model, key)
    v = {'params': params}
    encode = lambda b: module.apply(v, {k: b[k] for k in video_inputs}, method='encode_videos')
    stored, extra = encode(batch), encode(distractors)
    queries = module.apply(v, {k: batch[k] for k in query_inputs}, method='encode_queries')
    sampling = {'sampling': jax.random.key(7)}
    score = lambda q, s: module.apply(v, q, s, method='score', rngs=sampling)
    (loss, terms), grads = jax.value_and_grad(spec.objective, argnums=1, has_aux=True)(
        module, params, batch, _rngs(spec.rng_streams), ctx)
    out = dict(
        params=params, stored=stored, queries=queries, scores=score(queries, stored),
        noise=module.apply(v, stored['key'], method='text_mass_noise', rngs=sampling),
        forward=module.apply(v, batch, rngs=sampling)['scores'],
        loss=loss, terms=terms, grads=grads)
    if name in INVARIANCE_MODELS:  # the gallery shuffled after distractors, halved; other queries
      out.update(
          extended=score(queries, jax.tree.map(lambda a, b: jnp.concatenate([b, a[ORDER]]),
                                               stored, extra)),
          half=score(queries, _take(stored, np.arange(2))),
          fewer_queries=score(_take(queries, np.array([5, 1, 6])), stored))
    return out

  return config, spec, module, jax.device_get(run(jax.random.key(0), batch, distractors))


def _unit(x):
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def _explicit_scores(name, config, params, queries, stored, noise):
  """`max_m sum_c w_c max_l cos(q_c + noise[b, m] * R_c[q, b], e_c[b, l])` in float64 numpy,
  forming every sample `[Q, B, M, D]`; R_c = exp(sorted top-k cosines @ W_c + b_c)."""
  weights = {'clip': config.model.clip_score_weight, 'frame': config.model.frame_score_weight}
  fused = 0.0
  for branch, elements in SETS[name](stored).items():
    q = np.asarray(queries[branch] if isinstance(queries, dict) else queries, np.float64)
    e = np.asarray(elements, np.float64)
    cosines = np.einsum('qd,bld->qbl', _unit(q), _unit(e))
    top = -np.sort(-cosines, axis=-1)[..., :config.model.stochastic_top_k]
    layer = params[f'radius_{branch}']['linear']
    radius = np.exp(top @ layer['kernel'] + layer['bias'])                    # [Q, B, D]
    samples = q[:, None, None] + noise[None] * radius[:, :, None]             # [Q, B, M, D]
    per_sample = np.einsum('qbmd,bld->qbml', _unit(samples), _unit(e)).max(-1)
    fused = fused + weights[branch] * per_sample
  return fused.max(-1)


@pytest.mark.parametrize('name', MODELS)
def test_off_leaves_params_inputs_and_stored_sets_as_they_were(name):
  spec = models.get_spec(name)
  off, on = _config(name, on=False), _config(name)
  assert spec.inputs(off.model) == (spec.video_inputs, spec.query_inputs)
  assert spec.inputs(on.model)[0] == spec.video_inputs + ('video_seed',)
  shapes_off = spec.param_shapes(off.model)
  shapes_on = spec.param_shapes(on.model)
  assert not [k for k in shapes_off if k.startswith('radius')]
  added = {k: v for k, v in shapes_on.items() if k not in shapes_off}
  assert set(added) == {f'radius_{b}' for b in spec.module.TEXT_MASS_BRANCHES}
  assert jax.tree.map(lambda s: s.shape, {k: shapes_on[k] for k in shapes_off}) == jax.tree.map(
      lambda s: s.shape, shapes_off)
  stored_off = spec.stored_per_video(off.model)
  assert 'key' not in stored_off
  assert spec.stored_per_video(on.model) == {**stored_off,
                                             'key': jax.ShapeDtypeStruct((), jnp.int32)}


@pytest.mark.parametrize('name', COMPILED_MODELS)
def test_scores_are_an_explicit_max_over_samples_and_elements(name):
  config, _, module, out = _run(name)
  assert out['noise'].shape == (len(SEEDS), SAMPLES, config.model.hidden_dim)
  expected = _explicit_scores(name, config, out['params'], out['queries'], out['stored'],
                              out['noise'])
  if name == 'ms_sl':
    # MS-SL's frame branch stays deterministic: its weighted score is the off model's fused
    # score minus its weighted clip score.
    off = module.clone(stochastic_text=False)
    params = {k: v for k, v in out['params'].items() if not k.startswith('radius')}
    stored = {k: v for k, v in out['stored'].items() if k != 'key'}
    deterministic = np.asarray(off.apply({'params': params}, out['queries'], stored,
                                         method='score'), np.float64)
    clip = np.einsum('qd,bld->qbl', _unit(np.asarray(out['queries'], np.float64)),
                     _unit(SETS['ms_sl'](stored)['clip'])).max(-1)
    expected = expected + deterministic - config.model.clip_score_weight * clip
  # O(1) cosines from reductions over D = 32 and a few elementwise steps.
  support.assert_close(out['scores'], expected, support.f32_rtol(config.model.hidden_dim, ops=8))


@pytest.mark.parametrize('name', INVARIANCE_MODELS)
def test_a_pairs_score_depends_only_on_the_pair(name):
  config, _, _, out = _run(name)
  scores = out['scores']
  rtol = support.f32_rtol(config.model.hidden_dim, ops=4)  # other batch sizes: other roundings
  support.assert_close(out['extended'][:, len(SEEDS):], scores[:, ORDER], rtol)
  support.assert_close(out['half'], scores[:, :2], rtol)
  support.assert_close(out['fewer_queries'], scores[[5, 1, 6]], rtol)
  # The distractors' own seeds give them other noise: their scores are not copies.
  assert not np.allclose(out['extended'][:, :len(SEEDS)], scores)


@pytest.mark.parametrize('name', COMPILED_MODELS)
def test_contract_with_text_mass(name):
  config, spec, _, out = _run(name)
  # The deterministic forward scores every pair of the batch as `score` does (same stream).
  support.assert_close(out['forward'], out['scores'],
                       support.f32_rtol(config.model.hidden_dim, ops=8))
  terms = out['terms']
  assert {f'{b}_support' for b in spec.module.TEXT_MASS_BRANCHES} <= set(terms)
  assert np.isfinite(out['loss'])
  support.assert_close(out['loss'], sum(terms.values()), support.f32_rtol(len(terms)))
  exempt = jax.tree.leaves(match_paths(out['grads'], spec.gradient_free))
  for (path, grad), free in zip(jax.tree_util.tree_leaves_with_path(out['grads']), exempt):
    assert np.isfinite(grad).all(), path_of(path)
    if not free:
      assert np.abs(grad).max() > 0, f'{path_of(path)} gets no gradient'


def _shapes(jaxpr):
  """Every intermediate's shape in a jaxpr, sub-jaxprs (lax.map, jit) included."""
  for eqn in support.all_equations(jaxpr):
    yield from (v.aval.shape for v in eqn.outvars)


def _holds_all_pairs_and_samples(jaxpr, num_queries, num_videos, dim):
  """Whether an intermediate has axes of sizes Q (or a query chunk), B, M and D at once."""
  return any({num_videos, SAMPLES, dim} <= set(shape) and len(shape) >= 4
             and (num_queries in shape or len(shape) > 4) for shape in _shapes(jaxpr))


@pytest.mark.parametrize('name', INVARIANCE_MODELS)
def test_score_never_forms_samples_of_every_pair(name):
  config, _, module, out = _run(name)
  queries, stored = out['queries'], out['stored']
  jaxpr = jax.make_jaxpr(lambda p, q, s: module.apply(
      {'params': p}, q, s, method='score', rngs={'sampling': jax.random.key(0)}))(
          out['params'], queries, stored).jaxpr
  num_queries, dim = jax.tree.leaves(queries)[0].shape  # ProtoPRVR: one query per branch
  assert not _holds_all_pairs_and_samples(jaxpr, num_queries, len(SEEDS), dim)
  # The check sees the explicit computation's `[Q, B, M, D]` samples.
  naive = jax.make_jaxpr(lambda q, r, n: q[:, None, None] + n[None] * r[:, :, None])(
      jax.tree.leaves(queries)[0], jnp.ones((num_queries, len(SEEDS), dim)), out['noise']).jaxpr
  assert _holds_all_pairs_and_samples(naive, num_queries, len(SEEDS), dim)


def test_the_switch_is_a_config_flag_of_each_model():
  for name in MODELS:
    argv = ['train.py', f'--config=configs/{name}.py:tiny', '--config.model.stochastic_text=True',
            '--config.loss.stochastic_support=0.5']
    config_lib.check_override_flags(argv)
    config = _config(name)
    config_lib.validate(config)
  config.model.stochastic_prior = 'laplace'
  with pytest.raises(ValueError, match=r'stochastic_prior=.laplace. must be one of'):
    config_lib.validate(config)
