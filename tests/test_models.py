"""GMMFormer / GMMFormer v2: parameter counts of the official models, encoders, scores, loss."""

import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import support
from prvr_jax import models, summary

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_config(name: str, variant: str):
  spec = importlib.util.spec_from_file_location(name, ROOT / 'configs' / f'{name}.py')
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(variant)


@pytest.mark.parametrize('name,variant,expected', [
    ('gmmformer', 'tvr', 12_848_256),
    ('gmmformer', 'activitynet', 11_366_016),
    ('gmmformer', 'charades', 11_366_016),
    ('gmmformer_v2', 'tvr', 32_273_440),
    ('gmmformer_v2', 'activitynet', 30_791_200),
    ('gmmformer_v2', 'charades', 30_791_200),
])
def test_parameter_counts_equal_official(name, variant, expected):
  assert models.count_params(models.param_shapes(load_config(name, variant).model)) == expected


def test_summary_table_ends_with_total():
  config = load_config('gmmformer_v2', 'tvr')
  table = summary.format_table(models.param_shapes(config.model))
  assert table.splitlines()[-1] == 'total parameters: 32273440'
  assert 'clip/encoder_0/branches/attention/query/kernel' in table


def _random_batch(config_model, rng, frame_lengths=(128, 70, 5), queries_per_video=2):
  batch = models.example_batch(config_model, len(frame_lengths), queries_per_video)
  for key in ('clip_feats', 'frame_feats', 'query_feats'):
    batch[key] = rng.normal(size=batch[key].shape).astype(np.float32)
  batch['frame_mask'] = (np.arange(config_model.max_frames)[None]
                         < np.asarray(frame_lengths)[:, None]).astype(np.float32)
  batch['frame_feats'] *= batch['frame_mask'][..., None]
  batch['query_mask'][:, 7:] = 0
  return batch


@pytest.fixture(scope='module', params=['gmmformer', 'gmmformer_v2'])
def tiny(request):
  config = load_config(request.param, 'tiny')
  model = models.get_model(config.model)
  params = models.init_params(model, config.model, jax.random.key(0))
  return config, model, params


def test_encoders_and_fused_score(tiny):
  config, model, params = tiny
  batch = _random_batch(config.model, np.random.default_rng(0))
  videos = model.apply({'params': params}, batch['clip_feats'], batch['frame_feats'],
                       batch['frame_mask'], method='encode_videos')
  queries = model.apply({'params': params}, batch['query_feats'], batch['query_mask'],
                        method='encode_queries')
  d = config.model.hidden_dim
  assert videos['clips'].shape == (3, 32, d) and queries.shape == (6, d)
  outputs = model.apply({'params': params}, batch)
  expected = 0.7 * outputs['clip_scores'] + 0.3 * outputs['frame_scores']
  # The same cosines (|s| <= 1) by another program: reductions over d features, ~2 chained.
  rtol = support.f32_rtol(d, ops=2)
  support.assert_close(model.score(queries, videos), expected, rtol=rtol)
  assert np.all(np.abs(outputs['clip_scores']) <= 1 + rtol)
  # The query padding does not matter (padding of 99.0 leaking in would move them by O(1)).
  changed = dict(batch, query_feats=batch['query_feats'].copy())
  changed['query_feats'][:, 7:] = 99.0
  support.assert_close(model.apply({'params': params}, changed)['clip_scores'],
                       outputs['clip_scores'], rtol=rtol)


def test_v2_padded_frames_are_zero_and_do_not_leak(tiny):
  config, model, params = tiny
  if config.model.name != 'gmmformer_v2':
    pytest.skip('v2 only')
  batch = _random_batch(config.model, np.random.default_rng(1))
  encode = lambda b: model.apply({'params': params}, b['clip_feats'], b['frame_feats'],
                                 b['frame_mask'], method='encode_videos')
  frames = np.asarray(encode(batch)['frames'])
  assert np.all(frames[1, 70:] == 0) and np.all(frames[2, 5:] == 0)
  noisy = dict(batch, frame_feats=batch['frame_feats'] + 5.0 * (1 - batch['frame_mask'][..., None]))
  # LayerNorm-scale encodings; ~6 chained ops with reductions over <= 128 frames.
  support.assert_close(encode(noisy)['frames'], frames, rtol=support.f32_rtol(128, ops=6))


def test_v1_window_length(tiny):
  config, model, params = tiny
  if config.model.name != 'gmmformer':
    pytest.skip('v1 only')
  batch = _random_batch(config.model, np.random.default_rng(2), frame_lengths=(90, 70, 5))
  # Sharpen the attention logits so that the window sizes visibly matter.
  params = jax.tree_util.tree_map_with_path(
      lambda path, p: p * 30 if any(getattr(k, 'key', '') in ('query', 'key') for k in path)
      else p, params)
  encode = lambda b, **kw: model.apply({'params': params}, b['clip_feats'], b['frame_feats'],
                                       b['frame_mask'], method='encode_videos', **kw)
  batch_max = encode(batch)['video']  # windows sized by the batch maximum, 90
  # The same windows given another way: the same ops on the same values (bit-identical
  # here); allow one reduction over 128 frames in another order. O(1) video vectors.
  rtol = support.f32_rtol(128)
  support.assert_close(encode(batch, window_length=jnp.full((3,), 90))['video'], batch_max,
                       rtol=rtol)
  static = encode(batch, window_length=jnp.full((3,), 128))['video']
  # Other windows change the vectors by ~4e-4 of their magnitude: 5x more than the tolerance
  # (<= 2 rtol of the magnitude), so the checks above tell the windows apart.
  assert np.abs(static - batch_max).max() > 10 * rtol * np.abs(batch_max).max()
  # Each video may get its own length (evaluation emulating the official batches).
  mixed = encode(batch, window_length=jnp.array([90, 128, 128]))['video']
  support.assert_close(mixed[0], batch_max[0], rtol=rtol, scale=np.abs(batch_max).max())
  support.assert_close(mixed[1:], static[1:], rtol=rtol)


def test_loss_is_finite_and_differentiable(tiny):
  config, model, params = tiny
  batch = _random_batch(config.model, np.random.default_rng(3))

  def loss_fn(p):
    outputs = model.apply({'params': p}, batch, deterministic=False,
                          rngs={'dropout': jax.random.key(1)})
    return models.compute_loss(config, outputs, batch, jax.random.key(2), False)

  (loss, terms), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)
  assert np.isfinite(loss)
  expected_terms = {'clip_nce', 'clip_triplet', 'frame_nce', 'frame_triplet', 'qdl'}
  if config.model.name == 'gmmformer_v2':
    expected_terms.add('om')
  assert set(terms) == expected_terms
  # A float32 sum of ~6 positive terms: relative to their magnitude.
  support.assert_close(loss, sum(terms.values()), rtol=support.f32_rtol(6),
                       scale=sum(abs(float(t)) for t in terms.values()))
  grad_norms = [float(jnp.linalg.norm(g)) for g in jax.tree_util.tree_leaves(grads)]
  assert all(np.isfinite(grad_norms)) and max(grad_norms) > 0


def test_unknown_model_and_unpadded_frames_error():
  config = load_config('gmmformer_v2', 'tiny')
  config.model.name = 'nope'
  with pytest.raises(ValueError, match='config.model.name'):
    models.get_model(config.model)
  config = load_config('gmmformer_v2', 'tiny')
  model = models.get_model(config.model)
  params = models.init_params(model, config.model, jax.random.key(0))
  with pytest.raises(ValueError, match='max_frames'):
    model.apply({'params': params}, np.zeros((1, 32, 256), np.float32),
                np.zeros((1, 64, 256), np.float32), np.ones((1, 64), np.float32),
                method='encode_videos')
