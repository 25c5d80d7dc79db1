"""HLFormer against the official code (tests/fixtures/hlformer/README.md): encodings, scores,
every loss term and the gradients of their sum on one training batch, at tiny dims with
fixed weights; the official name map and config inference on the fixture's state dict."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import support
from prvr_jax import convert
from prvr_jax.models import registry
from prvr_jax.models.hlformer import official as hl_official
from prvr_jax.models.hlformer.model import branch_widths
from prvr_jax.models.spec import LossContext

pytestmark = pytest.mark.slow  # the model's loss and gradients compile here

FIXTURE = support.FIXTURES / 'hlformer' / 'model.npz'
# The fixture's official config: hidden 16, 4 heads, lorentz_dim 15, attention_num 4,
# sft_factor 0.5, dropout 0; inputs of width 12 (video) and 10 (query).
CONFIG = dict(name='hlformer', hidden_dim=16, num_heads=4, lorentz_dim=15, attention_num=4,
              temperature=0.5, dropout=0.0, input_dropout=0.0, visual_dim=12, query_dim=10,
              max_query_len=30, max_frames=128, num_clips=32, curv_init=1.0)
LOSS = ml_collections.ConfigDict(dict(
    clip_nce=0.05, frame_nce=0.04, qdl=8e-5, partial_order=1e-3, qdl_delta=0.15,
    qdl_alpha=32.0, qdl_gamma=1.0, margin=0.1, hard_pool_size=1, hard_negative_start_epoch=0,
    om=0.0, stochastic_support=0.0))
TERMS = ('clip_nce', 'clip_triplet', 'frame_nce', 'frame_triplet', 'qdl', 'partial_order')
VIDEO_KEYS = ('clip_feats', 'frame_feats', 'frame_mask')
QUERY_KEYS = ('query_feats', 'query_mask')
# Depth of the chain the encodings pass through (projection, positional encoding, the
# branches' attention and FFN, the Lorentz maps, the mixing cross-attention, pooling), for the
# float32 tolerance.
DEPTH = 24


@pytest.fixture(scope='module')
def fixture():
  data = np.load(FIXTURE)
  state = {k[len('param/'):]: data[k] for k in data.files if k.startswith('param/')}
  spec = registry.get_spec('hlformer')
  params = jax.tree.map(jnp.asarray, convert.torch_to_params(state, 'hlformer', CONFIG))
  return data, state, spec, spec.build(ml_collections.ConfigDict(CONFIG)), params


def _batch(data):
  batch = {k: jnp.asarray(data[k]) for k in (*VIDEO_KEYS, *QUERY_KEYS, 'query_video')}
  batch['query_valid'] = jnp.ones(len(data['query_video']), bool)
  batch['video_valid'] = jnp.ones(len(data['frame_feats']), bool)
  batch['video_seed'] = jnp.arange(len(data['frame_feats']), dtype=jnp.int32)
  return batch


def test_config_inference_and_name_map_read_the_official_state_dict(fixture):
  data, state, spec, _, params = fixture
  inferred = spec.official.infer_config(state)
  assert {k: inferred[k] for k in inferred} == {k: CONFIG[k] for k in inferred}
  assert inferred['attention_num'] == 4 and branch_widths(4) == (None, 2.0)
  back = convert.params_to_torch(jax.device_get(params), 'hlformer')
  assert set(back) == set(state)
  for name, value in back.items():
    np.testing.assert_array_equal(value, state[name], err_msg=name)
  assert len(hl_official.names(params)) == len(jax.tree.leaves(params))


def test_encodings_and_scores_equal_the_official(fixture):
  data, _, spec, module, params = fixture
  batch = _batch(data)

  @jax.jit
  def run(params):
    variables = {'params': params}
    videos = module.apply(variables, {k: batch[k] for k in VIDEO_KEYS}, method='encode_videos')
    queries = module.apply(variables, {k: batch[k] for k in QUERY_KEYS},
                           method='encode_queries')
    return videos, queries, module.apply(variables, queries, videos, method='score')

  videos, queries, scores = run(params)
  rtol = support.f32_rtol(128, ops=DEPTH)
  support.assert_close(videos['clips'], data['enc_clips'], rtol, err_msg='clips')
  support.assert_close(videos['frames'], data['enc_frames'], rtol, err_msg='frames')
  support.assert_close(queries, data['enc_queries'], rtol, err_msg='queries')
  support.assert_close(scores, data['scores'], rtol, err_msg='scores')
  np.testing.assert_array_equal(np.argsort(-np.asarray(scores), axis=1),
                                np.argsort(-data['scores'], axis=1))


@pytest.fixture(scope='module')
def loss_and_grads(fixture):
  data, _, spec, module, params = fixture
  batch = _batch(data)
  ctx = LossContext(loss=LOSS, epoch=jnp.int32(0), step=jnp.int32(0))
  rngs = dict(zip(spec.rng_streams, jax.random.split(jax.random.key(0), len(spec.rng_streams))))

  def loss_fn(p):
    return spec.objective(module, p, batch, rngs, ctx)

  def forward(p):
    return module.apply({'params': p}, batch, deterministic=True)
  return jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params), jax.jit(forward)(params)


def test_every_loss_term_equals_the_official(fixture, loss_and_grads):
  data, *_ = fixture
  ((loss, terms), _), outputs = loss_and_grads
  assert set(terms) == set(TERMS)
  rtol = support.f32_rtol(128, ops=DEPTH)
  for name in TERMS:
    support.assert_close(terms[name], data[f'loss/{name}'], rtol, err_msg=name)
  support.assert_close(loss, data['loss/total'], rtol)
  support.assert_close(outputs['curvature'], data['train_curvature'], support.f32_rtol(1))
  for ours, theirs in (('query_points', 'train_query_points'),
                       ('video_points', 'train_video_points'), ('queries_aux', 'train_queries'),
                       ('clip_logits', 'train_clip_logits'),
                       ('frame_logits', 'train_frame_logits')):
    support.assert_close(outputs[ours], data[theirs], rtol, err_msg=ours)


def test_gradients_equal_the_official(fixture, loss_and_grads):
  data, *_ = fixture
  (_, grads) = loss_and_grads[0]
  theirs = convert.params_to_torch(jax.device_get(grads), 'hlformer')
  scale = max(float(np.abs(data[f'grad/{n}']).max()) for n in theirs)
  for name, value in theirs.items():
    # Each gradient is held to a float32 tolerance of the largest parameter gradient: small
    # gradients are differences of larger terms.
    support.assert_close(value, data[f'grad/{name}'], support.f32_rtol(128, ops=4 * DEPTH),
                         scale=scale, err_msg=name)
