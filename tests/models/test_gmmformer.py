"""GMMFormer / GMMFormer v2 specifics (the shared contract is tests/models/test_contract.py):
padding, v1's frame windows, the loss terms of each objective, the parameter table, errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import support
from prvr_jax import models, summary
from prvr_jax.models.spec import LossContext

VIDEO_KEYS = ('clip_feats', 'frame_feats', 'frame_mask')


def _batch(config_model, seed, frame_lengths=(128, 70, 5)):
  """Two queries per video of 7 real tokens; the query padding holds random features."""
  rng = np.random.default_rng(seed)
  batch = models.random_batch(config_model, rng, frame_lengths, (30,) * 2 * len(frame_lengths),
                              queries_per_video=2)
  batch['query_mask'][:, 7:] = 0
  return batch


@pytest.fixture(scope='module', params=['gmmformer', 'gmmformer_v2'])
def tiny(request):
  config = support.load_config(request.param, 'tiny')
  spec = models.get_spec(config.model)
  params = jax.jit(lambda key: spec.init_params(config.model, key))(jax.random.key(0))
  return config, spec, spec.build(config.model), params


def _encode_videos(model, params, batch, **kwargs):
  encode = jax.jit(lambda p, videos, kw: model.apply({'params': p}, videos,
                                                     method='encode_videos', **kw))
  return encode(params, {k: batch[k] for k in VIDEO_KEYS}, kwargs)


def test_query_padding_does_not_matter(tiny):
  config, _, model, params = tiny
  batch = _batch(config.model, 0)
  forward = jax.jit(lambda b: model.apply({'params': params}, b))
  outputs = forward(batch)
  d = config.model.hidden_dim
  assert outputs['clips'].shape == (3, 32, d) and outputs['queries'].shape == (6, d)
  # The same cosines (|s| <= 1) by the same program: reductions over d features, ~2 chained.
  rtol = support.f32_rtol(d, ops=2)
  assert np.all(np.abs(outputs['clip_scores']) <= 1 + rtol)
  # Padding of 99.0 leaking in would move them by O(1).
  changed = dict(batch, query_feats=batch['query_feats'].copy())
  changed['query_feats'][:, 7:] = 99.0
  support.assert_close(forward(changed)['clip_scores'], outputs['clip_scores'], rtol=rtol)


def test_v2_padded_frames_are_zero_and_do_not_leak(tiny):
  config, _, model, params = tiny
  if config.model.name != 'gmmformer_v2':
    pytest.skip('v2 only')
  batch = _batch(config.model, 1)
  frames = np.asarray(_encode_videos(model, params, batch)['frames'])
  assert np.all(frames[1, 70:] == 0) and np.all(frames[2, 5:] == 0)
  noisy = dict(batch, frame_feats=batch['frame_feats'] + 5.0 * (1 - batch['frame_mask'][..., None]))
  # LayerNorm-scale encodings; ~6 chained ops with reductions over <= 128 frames.
  support.assert_close(_encode_videos(model, params, noisy)['frames'], frames,
                       rtol=support.f32_rtol(128, ops=6))


def test_v1_window_length(tiny):
  config, _, model, params = tiny
  if config.model.name != 'gmmformer':
    pytest.skip('v1 only')
  batch = _batch(config.model, 2, frame_lengths=(90, 70, 5))
  # Sharpen the attention logits so that the window sizes visibly matter.
  params = jax.tree_util.tree_map_with_path(
      lambda path, p: p * 30 if any(getattr(k, 'key', '') in ('query', 'key') for k in path)
      else p, params)
  encode = lambda **kw: _encode_videos(model, params, batch, **kw)['video']
  batch_max = encode()  # windows sized by the batch maximum, 90
  # The same windows given another way: the same ops on the same values (bit-identical
  # here); allow one reduction over 128 frames in another order. O(1) video vectors.
  rtol = support.f32_rtol(128)
  support.assert_close(encode(window_length=jnp.full((3,), 90)), batch_max, rtol=rtol)
  static = encode(window_length=jnp.full((3,), 128))
  # Other windows change the vectors by ~4e-4 of their magnitude: 5x more than the tolerance
  # (<= 2 rtol of the magnitude), so the checks above tell the windows apart.
  assert np.abs(static - batch_max).max() > 10 * rtol * np.abs(batch_max).max()
  # Each video may get its own length (evaluation emulating the official batches).
  mixed = encode(window_length=jnp.array([90, 128, 128]))
  support.assert_close(mixed[0], batch_max[0], rtol=rtol, scale=np.abs(batch_max).max())
  support.assert_close(mixed[1:], static[1:], rtol=rtol)


def test_objective_terms(tiny):
  """v1: QDL v1 and no OM; v2: focal QDL and OM, which `loss.om = 0` leaves out."""
  config, spec, model, params = tiny
  batch = _batch(config.model, 3)
  rngs = {'dropout': jax.random.key(1), 'negatives': jax.random.key(2)}
  terms_of = lambda cfg: jax.eval_shape(lambda p: spec.objective(model, p, batch, rngs, LossContext(
      loss=cfg.loss, epoch=jnp.int32(0), step=jnp.int32(0)))[1], params)
  expected = {'clip_nce', 'clip_triplet', 'frame_nce', 'frame_triplet', 'qdl'}
  if config.model.name == 'gmmformer_v2':
    assert set(terms_of(config)) == expected | {'om'}
    config = support.load_config('gmmformer_v2', 'tiny')
    config.loss.om = 0.0
  assert set(terms_of(config)) == expected


def test_summary_table_ends_with_total():
  config = support.load_config('gmmformer_v2', 'tvr')
  shapes = models.get_spec(config.model).param_shapes(config.model)
  table = summary.format_table(shapes)
  assert table.splitlines()[-1] == 'total parameters: 32273440'
  assert 'clip/encoder_0/branches/attention/query/kernel' in table
  grouped = summary.format_table(shapes, depth=2)
  assert grouped.splitlines()[-1] == 'total parameters: 32273440'
  assert 'clip/encoder_0 ' in grouped and 'branches' not in grouped


def test_unknown_model_and_unpadded_frames_error():
  config = support.load_config('gmmformer_v2', 'tiny')
  config.model.name = 'nope'
  with pytest.raises(ValueError, match='config.model.name'):
    models.get_model(config.model)
  config = support.load_config('gmmformer_v2', 'tiny')
  spec = models.get_spec(config.model)
  params = spec.param_shapes(config.model)
  videos = {'clip_feats': np.zeros((1, 32, 256), np.float32),
            'frame_feats': np.zeros((1, 64, 256), np.float32),
            'frame_mask': np.ones((1, 64), np.float32)}
  with pytest.raises(ValueError, match='max_frames'):
    jax.eval_shape(lambda p: spec.build(config.model).apply({'params': p}, videos,
                                                            method='encode_videos'), params)
