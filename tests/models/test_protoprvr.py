"""ProtoPRVR: the prototype generators (Eq. 1 in both forms against a numpy reference), each
loss against a hand-computed value, the video mixing targets, padding invariance, stored
bytes, the fusion weights, every ablation config of Tables 4-6 (builds, trains a step,
changes what it claims) and the paper's CLIP-L/14 setting (every variant and ablation
validates and builds at its dims)."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prvr_jax import config_lib, layers, losses, models
from prvr_jax.layers.prototypes import UPDATES
from prvr_jax.models.protoprvr import model as proto_model
from prvr_jax.models.protoprvr.objective import PROTOTYPE_TERMS, guide_validity
from prvr_jax.models.spec import LossContext
import support

CONFIG = 'protoprvr'
ABLATIONS = support.load_config_module(CONFIG).ABLATIONS
CLIP_L14 = support.load_config_module(CONFIG).CLIP_L14


def _small(arg='tiny'):
  """The tiny config at even smaller input lengths (cheap compiles)."""
  config = support.load_config(CONFIG, arg)
  config.model.update(max_frames=16, num_clips=8, max_query_len=8)
  return config


@functools.cache
def _cached_params(num_prototypes, generator, iterations, seed):
  config = _small()
  config.model.update(num_prototypes=num_prototypes, prototype_generator=generator,
                      prototype_iterations=iterations)
  spec = models.get_spec(CONFIG)
  return jax.jit(lambda key: spec.init_params(config.model, key))(jax.random.key(seed))


def _params(config, seed=0):
  """Initial parameters of `config.model` (a `_small` config), shared by the configs whose
  parameter tree is the same."""
  m = config.model
  return _cached_params(m.num_prototypes, m.prototype_generator, m.prototype_iterations, seed)


def _batch(config, seed=0):
  return models.random_batch(config.model, np.random.default_rng(seed), (16, 9, 3, 12),
                             (8, 5, 2, 7, 8, 3, 6, 4), queries_per_video=2)


# ----------------------------------------------------------------------------- losses


def test_masked_token_nce_by_hand():
  reconstructed = np.array([[[1., 0.]], [[0., 2.]], [[5., 5.]]])
  targets = np.array([[[3., 0.]], [[1., 1.]], [[0., 1.]]])
  valid = np.array([[True], [True], [False]])  # the third query is padding
  c = 1 / math.sqrt(2)  # cosines: r0.t0 = 1, r0.t1 = c, r1.t0 = 0, r1.t1 = c
  expected = ((math.log(math.exp(1) + math.exp(c)) - 1)
              + (math.log(math.exp(0) + math.exp(c)) - c)) / 2
  support.assert_close(losses.masked_token_nce(reconstructed, targets, valid), expected, 1e-6)
  tau = 0.5
  expected_tau = ((math.log(math.exp(1 / tau) + math.exp(c / tau)) - 1 / tau)
                  + (math.log(1 + math.exp(c / tau)) - c / tau)) / 2
  support.assert_close(losses.masked_token_nce(reconstructed, targets, valid, tau),
                       expected_tau, 1e-6)


def test_reconstruction_mse_by_hand():
  rebuilt = np.array([[[1., 2.], [3., 4.]]])
  target = np.array([[[1., 0.], [0., 0.]]])
  # Only the first position is real: mean((0, 2)^2) = 2.
  support.assert_close(losses.reconstruction_mse(rebuilt, target, np.array([[1., 0.]])), 2.0,
                       1e-7)
  support.assert_close(losses.reconstruction_mse(rebuilt, target, np.array([[1., 1.]])),
                       (2.0 + 12.5) / 2, 1e-7)


def test_attention_guidance_by_hand():
  a1 = np.array([0.7, 0.3, 0.9])
  own_first = np.array([True, False, True])
  valid = np.array([True, True, False])
  # -log(0.7 + 0.2) and -log(1 - (0.3 - 0.2)): both -log(0.9).
  support.assert_close(losses.attention_guidance_loss(a1, own_first, valid, margin=0.2),
                       -math.log(0.9), 1e-6)
  support.assert_close(losses.attention_guidance_loss(a1, own_first, valid, margin=0.0),
                       -(math.log(0.7) + math.log(0.7)) / 2, 1e-6)


def test_orthogonality_by_hand():
  prototypes = np.array([[[1., 0.], [0., 3.], [2., 2.]],
                         [[1., 0.], [-1., 0.], [0., 1.]],   # negative overlap is not penalised
                         [[1., 1.], [1., 1.], [1., 1.]]])   # padding video
  # Video 0: four off-diagonal entries 1/sqrt(2): ||.||_F = sqrt(2), over 3 * 2.
  support.assert_close(losses.orthogonality_loss(prototypes, np.array([True, True, False])),
                       (math.sqrt(2) / 6 + 0.0) / 2, 1e-6)
  grad = jax.grad(losses.orthogonality_loss)(jnp.asarray(prototypes[1:2]), np.array([True]))
  assert np.all(np.isfinite(grad)), 'orthogonal prototypes must have a finite gradient'


# ----------------------------------------------------------------------------- generators


@pytest.mark.parametrize('kind', sorted(layers.GENERATORS))
def test_generators_are_invariant_to_padding_and_order(kind):
  rng = np.random.default_rng(0)
  feats = rng.normal(size=(2, 10, 16)).astype(np.float32)
  mask = np.ones((2, 10), np.float32)
  mask[1, 6:] = 0
  layer = layers.GENERATORS[kind](num_prototypes=5, num_heads=2, iterations=2)
  variables = layer.init(jax.random.key(0), feats, mask)
  prototypes, attention = layer.apply(variables, feats, mask)
  assert prototypes.shape == (2, 5, 16) and attention.shape == (2, 5, 10)
  support.assert_close(attention.sum(-1), np.ones((2, 5)), 1e-5)  # a1 + a2 = 1 on any split
  assert np.all(np.asarray(attention)[1, :, 6:] == 0)

  empty = layer.apply(variables, feats, np.zeros_like(mask))  # a padding video
  assert all(np.all(np.isfinite(x)) for x in empty)

  garbage = feats.copy()
  garbage[1, 6:] = 100 * rng.normal(size=(4, 16))
  longer = np.concatenate([garbage, rng.normal(size=(2, 5, 16)).astype(np.float32)], axis=1)
  longer_mask = np.concatenate([mask, np.zeros((2, 5), np.float32)], axis=1)
  order = np.concatenate([rng.permutation(6), np.arange(6, 10)])
  for other, other_mask in ((garbage, mask), (longer, longer_mask),
                            (feats[:, order], mask[:, order])):
    support.assert_close(layer.apply(variables, other, other_mask)[0][1], prototypes[1], 1e-5,
                         scale=float(np.abs(prototypes).max()))


def _layer_norm(x, params):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + 1e-5) * params['scale'] + params['bias']


def _eq1_reference(params, feats, mask, iterations, num_heads, form):
  """Eq. 1 in numpy (float64): P^(k) = CA(P^(k-1); V; V), CA one post-LN multi-head
  cross-attention block, LN(state + W_o MHA(query = state [+ P], key = value = V)).
  'paper': the state starts at the learned P (P^(0) = P) and is the query; 'detr': it starts
  at 0 and P is added to the query. -> (P^(K) [B, P, D], last attention [B, P, L])."""
  p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
  block = p['cross_attention']
  learned = np.broadcast_to(p['prototypes'], (feats.shape[0],) + p['prototypes'].shape)
  state = learned if form == 'paper' else np.zeros_like(learned)
  offset = np.zeros_like(learned) if form == 'paper' else learned
  width = feats.shape[-1]
  head = width // num_heads
  proj = lambda x, name: x @ block['attention'][name]['kernel'] + block['attention'][name]['bias']
  split = lambda x: x.reshape(x.shape[:-1] + (num_heads, head)).swapaxes(1, 2)  # [B, H, N, d]
  keys, values = split(proj(feats, 'key')), split(proj(feats, 'value'))
  for _ in range(iterations):
    queries = split(proj(state + offset, 'query'))
    logits = queries @ keys.swapaxes(-1, -2) / math.sqrt(head)
    logits = logits + (1 - mask[:, None, None, :]) * -10000.0
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    attended = (probs @ values).swapaxes(1, 2).reshape(state.shape)
    update = attended @ block['output']['kernel'] + block['output']['bias']
    state = _layer_norm(state + update, block['norm'])
  return state, probs.mean(axis=1)


def test_eq1_forms_against_a_numpy_reference():
  """`update='paper'` computes Eq. 1 as written, the default its DETR-style form; both from the
  same parameters, and they differ."""
  rng = np.random.default_rng(3)
  feats = rng.normal(size=(2, 7, 8)).astype(np.float32)
  mask = np.ones((2, 7), np.float32)
  mask[1, 4:] = 0
  out = {}
  layers_by_form = {form: layers.PrototypeCrossAttention(num_prototypes=3, num_heads=2,
                                                         iterations=2, update=form)
                    for form in UPDATES}
  variables = layers_by_form['detr'].init(jax.random.key(0), feats, mask)
  for form, layer in layers_by_form.items():
    prototypes, attention = layer.apply(variables, feats, mask)
    expected, expected_attention = _eq1_reference(variables['params'], feats, mask, 2, 2, form)
    support.assert_close(prototypes, expected, 1e-5, scale=float(np.abs(expected).max()))
    support.assert_close(attention, expected_attention, 1e-5)
    out[form] = np.asarray(prototypes)
  assert np.abs(out['paper'] - out['detr']).max() > 0.1  # the switch changes the result
  with pytest.raises(ValueError, match=r"PrototypeCrossAttention.update='eq1'"):
    layers.PrototypeCrossAttention(num_prototypes=3, num_heads=2, update='eq1').init(
        jax.random.key(0), feats, mask)


def test_model_prototype_update_switches_eq1():
  """`model.prototype_update` reaches both branches' generators (the forms' arithmetic: the
  numpy test above), with the same parameters; a bad value is named."""
  config = _small()
  spec = models.get_spec(CONFIG)
  shapes = {}
  for form in UPDATES:
    config.model.prototype_update = form
    shapes[form] = jax.tree.map(np.shape, spec.param_shapes(config.model))
    bound = spec.build(config.model).bind({})
    assert (bound.clip_prototypes.update, bound.frame_prototypes.update) == (form, form)
  assert shapes['paper'] == shapes['detr']
  config.model.prototype_update = 'eq1'
  with pytest.raises(ValueError, match=r"model.prototype_update='eq1'"):
    spec.param_shapes(config.model)


def test_fusion_weights_are_the_config_fields():
  """S = clip_score_weight * S_c + frame_score_weight * S_f (default 0.7 / 0.3 everywhere)."""
  for variant in ('tvr', 'activitynet', 'qvhighlights', *CLIP_L14):
    model = support.load_config(CONFIG, variant).model
    assert (model.clip_score_weight, model.frame_score_weight) == (0.7, 0.3), variant
  rng = np.random.default_rng(4)
  queries = {b: rng.normal(size=(5, 16)).astype(np.float32) for b in proto_model.BRANCHES}
  videos = {f'{b}_prototypes': rng.normal(size=(3, 4, 16)).astype(np.float32)
            for b in proto_model.BRANCHES}

  def branch(name):  # max over the prototypes of the cosine, [Q, B]
    q = queries[name] / np.linalg.norm(queries[name], axis=-1, keepdims=True)
    p = videos[f'{name}_prototypes']
    p = p / np.linalg.norm(p, axis=-1, keepdims=True)
    return np.einsum('qd,bpd->qbp', q, p).max(-1)

  config = _small()
  spec = models.get_spec(CONFIG)
  for weights in ((0.7, 0.3), (0.5, 0.5), (1.0, 0.0)):
    config.model.clip_score_weight, config.model.frame_score_weight = weights
    scores = spec.build(config.model).apply({}, queries, videos, method='score')
    support.assert_close(scores, weights[0] * branch('clip') + weights[1] * branch('frame'),
                         1e-5)


def test_model_prototypes_ignore_padded_frames():
  config = _small()
  spec = models.get_spec(CONFIG)
  params = _params(config)
  batch = _batch(config)
  videos = {k: batch[k] for k in spec.video_inputs}
  noisy = dict(videos, frame_feats=videos['frame_feats']
               + 50 * (1 - videos['frame_mask'][..., None]))
  encode = lambda v: spec.build(config.model).apply({'params': params}, v,
                                                    method='encode_videos')
  clean, dirty = jax.jit(encode)(videos), jax.jit(encode)(noisy)
  support.assert_close(dirty['frame_prototypes'], clean['frame_prototypes'], 1e-5,
                       scale=float(np.abs(clean['frame_prototypes']).max()))


# ----------------------------------------------------------------------------- mixing


def test_mix_halves_places_each_video_in_its_half():
  feats = np.arange(3 * 4, dtype=np.float32).reshape(3, 4, 1)  # video b, frame t: 4b + t
  mixed = np.asarray(proto_model.mix_halves(feats, np.array([4, 2, 0])))[..., 0]
  # Pair b: video b at twice the frame rate (frames 1, 3 of 4; 0, 1 of 2), then video b + 1.
  np.testing.assert_array_equal(mixed, [[1, 3, 4, 5], [4, 5, 8, 8], [8, 8, 1, 3]])
  np.testing.assert_array_equal(proto_model.first_half_share(4), [1, 1, 0, 0])
  multiscale = proto_model.first_half_share(4, multiscale=True)
  # Pools of 1 clip, 2 (starts 0, 1, 2), 3 (starts 0, 1), 4 clips.
  support.assert_close(multiscale, [1, 1, 0, 0, 1, .5, 0, 2 / 3, 1 / 3, .5], 1e-6)


def test_guide_validity_needs_two_distinct_valid_videos():
  batch = {'query_video': np.array([0, 1, 2, 2]), 'query_valid': np.array([True] * 3 + [False]),
           'video_valid': np.array([True, True, False])}
  np.testing.assert_array_equal(guide_validity(batch),
                                [[True, False], [False, True], [False, False], [False, False]])


def test_guidance_moves_attention_to_the_querys_own_half():
  config = _small()
  spec = models.get_spec(CONFIG)
  module = spec.build(config.model)
  params = _params(config, seed=1)
  batch = _batch(config, seed=1)
  valid = guide_validity(batch)
  own_first = np.broadcast_to([True, False], valid.shape)

  @jax.jit
  def shares(p):
    out = module.apply({'params': p}, batch)
    return {b: out[f'{b}_first_share'] for b in proto_model.BRANCHES}

  def guide(p):
    return sum(losses.attention_guidance_loss(s, own_first, valid)
               for s in shares(p).values())

  before = shares(params)
  step = jax.jit(lambda p: jax.tree.map(lambda x, g: x - 0.5 * g, p, jax.grad(guide)(p)))
  for _ in range(5):
    params = step(params)
  after = shares(params)
  for branch in proto_model.BRANCHES:
    a_before, a_after = np.asarray(before[branch]), np.asarray(after[branch])
    assert np.all((0 <= a_after) & (a_after <= 1))
    # A query of the first video pulls the retrieved prototype's attention to the first half,
    # a query of the second video pushes it to the second.
    assert a_after[valid & own_first].mean() > a_before[valid & own_first].mean(), branch
    assert a_after[valid & ~own_first].mean() < a_before[valid & ~own_first].mean(), branch


# ----------------------------------------------------------------------------- configs


def test_default_stores_92160_bytes_per_video():
  spec = models.get_spec(CONFIG)
  for variant in ('tvr', 'activitynet', 'qvhighlights'):
    assert spec.bytes_per_video(support.load_config(CONFIG, variant).model) == 92_160
  assert spec.bytes_per_video(support.load_config(CONFIG, 'tvr,table5_prototypes10').model) \
      == 30_720


def test_config_args_are_checked():
  with pytest.raises(ValueError, match=r"unknown protoprvr ablation 'table9' .*table4_retrieval"):
    support.load_config(CONFIG, 'tvr,table9')
  with pytest.raises(ValueError, match=r"no config variant 'charades'; it offers"):
    support.load_config(CONFIG, 'charades')
  config = support.load_config(CONFIG, 'tvr')
  assert (config.model.prototype_iterations, config.loss.clip_nce, config.loss.ortho) == (
      6, 0.03, 0.01)
  assert support.load_config(CONFIG, 'activitynet').loss.ortho == 0.3
  qvh = support.load_config(CONFIG, 'qvhighlights')
  assert (qvh.data.collection, qvh.data.text_feature, qvh.model.visual_dim) == (
      'qvhighlights', 'clip_text', 2816)


def _expected_terms(config):
  on = [t for t in PROTOTYPE_TERMS if config.loss[f'use_{t}']]
  return {'clip_nce', 'clip_triplet', 'frame_nce', 'frame_triplet', *on}


# The ablations that are the default config (table4_full = table5_prototypes30 =
# table6_cross_attention) are trained once, as table4_full.
DEFAULT = support.load_config(CONFIG, 'synthetic').to_dict()
SAME_AS_DEFAULT = {k for k in ABLATIONS
                   if support.load_config(CONFIG, f'synthetic,{k}').to_dict() == DEFAULT}
DISTINCT_ABLATIONS = sorted(set(ABLATIONS) - SAME_AS_DEFAULT | {'table4_full'})


def test_the_full_model_is_the_default_of_tables_4_5_6():
  assert SAME_AS_DEFAULT == {'table4_full', 'table5_prototypes30', 'table6_cross_attention'}


@pytest.mark.parametrize('ablation', DISTINCT_ABLATIONS)
def test_every_ablation_builds_trains_a_step_and_changes_what_it_claims(ablation):
  config = _small(f'tiny,{ablation}')
  spec = models.get_spec(CONFIG)
  stored = spec.stored_per_video(config.model)
  assert stored['clip_prototypes'].shape == (config.model.num_prototypes,
                                             config.model.hidden_dim)
  if ablation.startswith('table5_prototypes'):
    return  # only the prototype count differs from table4_full's 30 (trained below)
  module = spec.build(config.model)
  params = _params(config)
  batch = _batch(config)
  rngs = dict(zip(spec.rng_streams, jax.random.split(jax.random.key(1), 3)))
  ctx = LossContext(config.loss, jnp.int32(0), jnp.int32(0))
  step = jax.jit(jax.value_and_grad(lambda p: spec.objective(module, p, batch, rngs, ctx),
                                    has_aux=True))
  (loss, terms), grads = step(params)
  assert np.isfinite(loss) and set(terms) == _expected_terms(config)
  support.assert_close(loss, sum(terms.values()), 1e-5)
  (updated_loss, _), _ = step(jax.tree.map(lambda p, g: p - 1e-2 * g, params, grads))
  assert float(updated_loss) < float(loss)

  # What the ablation claims to change.
  trained = {path.split('/')[0] for path, g in _leaves(grads) if np.any(np.asarray(g))}
  assert ('text_decoder' in trained) == config.loss.use_crecon
  assert ({'clip_decoder', 'frame_decoder'} <= trained) == config.loss.use_urecon
  generator = {path.split('/')[1] for path, _ in _leaves(params)
               if path.startswith('clip_prototypes/')}
  assert generator == {'cross_attention': {'prototypes', 'cross_attention'},
                       'perceiver': {'prototypes', 'cross_attention', 'latent_transformer'},
                       'slot_attention': {'prototypes', 'input_norm', 'key', 'value', 'query',
                                          'slot_norm', 'mlp_norm', 'gru', 'mlp_in',
                                          'mlp_out'}}[config.model.prototype_generator]


@pytest.mark.parametrize('variant', sorted(CLIP_L14))
def test_clip_l14_variants_are_the_papers_ablation_setting(variant):
  """Table 8 with CLIP-L/14 on the base dataset's recipe: 768-d inputs, K = 1, lambda_ortho
  0.01; every ablation over it validates and keeps those; the model builds at those dims
  (abstract evaluation only) for each prototype generator."""
  config = support.load_config(CONFIG, variant)
  base = support.load_config(CONFIG, CLIP_L14[variant])
  config_lib.validate(config)
  assert config.variant == variant
  assert (config.model.visual_dim, config.model.query_dim) == (768, 768)
  assert (config.model.prototype_iterations, config.loss.ortho) == (1, 0.01)
  assert (config.data.collection, config.data.visual_feature, config.data.text_feature) == (
      base.data.collection, 'clip_vit_l14', 'clip_text')
  changed = {k for k, v in config_lib.flat_items(config).items()
             if config_lib.flat_items(base)[k] != v}
  assert changed <= {'variant', 'model.visual_dim', 'model.query_dim',
                     'model.prototype_iterations', 'loss.ortho', 'data.visual_feature',
                     'data.text_feature'}
  spec = models.get_spec(CONFIG)
  generators = {}
  for ablation, overrides in ABLATIONS.items():
    ablated = support.load_config(CONFIG, f'{variant},{ablation}')
    config_lib.validate(ablated)
    expected = config.copy_and_resolve_references()
    config_lib.apply_overrides(expected, overrides)
    assert ablated.to_dict() == expected.to_dict(), ablation
    generators.setdefault(ablated.model.prototype_generator, ablated)
  assert set(generators) == set(layers.GENERATORS)
  if variant != 'tvr_clip_l14':  # Tables 4-6 ran on TVR: there every generator is built
    generators = {'cross_attention': config}
  for generator, ablated in generators.items():
    shapes = spec.param_shapes(ablated.model)
    for encoder in ('query', 'clip', 'frame'):
      assert shapes[encoder]['input_proj']['dense']['kernel'].shape == (768, 384), generator
    for decoder in ('text_decoder', 'clip_decoder', 'frame_decoder'):
      assert shapes[decoder]['output']['kernel'].shape == (384, 768), generator
    if generator == 'cross_attention':
      assert models.count_params(shapes) == spec.param_counts[variant]


def test_shared_prototypes_use_one_generator():
  config = _small()
  config.model.share_prototypes = True
  spec = models.get_spec(CONFIG)
  params = spec.param_shapes(config.model)
  assert 'clip_prototypes' in params and 'frame_prototypes' not in params
  separate = spec.param_shapes(_small().model)
  assert (models.count_params(separate) - models.count_params(params)
          == models.count_params(separate['frame_prototypes']))


def _leaves(tree):
  return [(jax.tree_util.keystr(k, simple=True, separator='/'), v)
          for k, v in jax.tree_util.tree_leaves_with_path(tree)]
