"""MS-SL and AMDNet beyond the registry contract: MS-SL's chunked pairwise scoring, AMDNet's
checked constraints."""

import jax
import numpy as np
import pytest

import support
from prvr_jax import losses, models

FRAME_LENGTHS = (128, 70, 5, 33, 90)
QUERY_LENGTHS = (30, 7, 3, 12, 25, 9, 18, 4, 11, 2)


def _ms_sl(chunk):
  config = support.load_config('ms_sl', 'tiny')
  config.model.score_query_chunk = chunk
  return config, models.get_model(config.model)


def test_ms_sl_scores_do_not_depend_on_chunks_or_gallery_split():
  config, module = _ms_sl(3)
  batch = models.random_batch(config.model, np.random.default_rng(0), FRAME_LENGTHS,
                              QUERY_LENGTHS, queries_per_video=2)
  params = jax.jit(lambda k: models.get_spec('ms_sl').init_params(config.model, k))(
      jax.random.key(0))
  v = {'params': params}
  videos = jax.jit(lambda p, b: module.apply(p, b, method='encode_videos'))(v, batch)
  queries = jax.jit(lambda p, b: module.apply(p, b, method='encode_queries'))(v, batch)
  score = lambda m, q, g: jax.jit(lambda p, q, g: m.apply(p, q, g, method='score'))(v, q, g)
  reference = score(module, queries, videos)
  assert reference.shape == (10, 5)
  rtol = support.f32_rtol(config.model.hidden_dim, ops=3)
  for chunk in (1, 4, 64):
    support.assert_close(score(_ms_sl(chunk)[1], queries, videos), reference, rtol,
                         err_msg=f'chunk {chunk}')
  halves = [jax.tree.map(lambda x, s=s: x[s], videos) for s in (slice(0, 2), slice(2, 5))]
  split = np.concatenate([score(module, queries, h) for h in halves], axis=1)
  support.assert_close(split, reference, rtol)

  # The frame score of a pair is the KCGA keyed by the query's best multi-scale clip of that
  # video: recomputed here pair by pair with numpy from the encoded frames, the official way.
  p = jax.device_get(params)['key_clip_attention']
  n = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
  encoded_frames = jax.jit(lambda v, f, m: module.apply(
      v, f, m, method=lambda model, f, m: model.frame(f, m)))(
          v, batch['frame_feats'], batch['frame_mask'])
  frames, mask = np.asarray(encoded_frames, np.float64), np.asarray(videos['frame_mask'])
  clips = np.stack([np.concatenate(
      [np.stack([c[s:s + k].mean(0) for s in range(len(c) - k + 1)]) for k in
       range(1, len(c) + 1)]) for c in np.asarray(videos['clips'], np.float64)])
  q = np.asarray(queries, np.float64)
  expected = np.zeros((10, 5))
  for i in range(10):
    for b in range(5):
      cos = n(clips[b]) @ n(q[i])
      key = clips[b, np.argmax(cos)]
      real = frames[b][mask[b] > 0]
      logits = (real @ np.asarray(p['key'], np.float64)) @ key
      a = np.exp(logits - logits.max())
      attended = (a / a.sum()) @ real @ np.asarray(p['value'], np.float64)
      expected[i, b] = 0.7 * cos.max() + 0.3 * n(attended) @ n(q[i])
  support.assert_close(reference, expected, rtol)


@pytest.mark.parametrize('field, value, match', [
    ('num_spans', 3, r'num_spans \(3\) must equal config.model.num_heads \(4\)'),
    ('max_query_len', 30, 'max_query_len must be 1'),
])
def test_amdnet_checks_its_constraints(field, value, match):
  config = support.load_config('amdnet', 'tiny')
  config.model[field] = value
  with pytest.raises(ValueError, match=match):
    models.get_spec('amdnet').param_shapes(config.model)


@pytest.mark.parametrize('name', ['ms_sl', 'amdnet'])
def test_gmmformer_v2_losses_plug_in(name):
  """`loss.qdl` / `loss.om` add GMMFormer v2's L_div and L_om (off by default, as officially):
  each term equals the shared loss function on the second query encoding and the model's
  clips, and the other terms do not change."""
  config = support.load_config(name, 'tiny')
  assert config.loss.qdl == 0 and config.loss.om == 0
  spec = models.get_spec(name)
  module = spec.build(config.model)
  batch = models.random_batch(config.model, np.random.default_rng(1), FRAME_LENGTHS,
                              QUERY_LENGTHS, queries_per_video=2)
  params = jax.jit(lambda k: spec.init_params(config.model, k))(jax.random.key(0))
  rngs = dict(zip(spec.rng_streams, jax.random.split(jax.random.key(2), len(spec.rng_streams))))
  off_loss = config.loss.copy_and_resolve_references()
  config.loss.update(qdl=0.5, om=0.25)
  contexts = [models.LossContext(loss=loss, epoch=jax.numpy.int32(0), step=jax.numpy.int32(0))
              for loss in (off_loss, config.loss)]

  @jax.jit
  def run(params, batch, rngs):
    """Both objectives' terms and the terms recomputed by the shared loss functions (one
    compile)."""
    (_, off), (_, on) = (spec.objective(module, params, batch, rngs, ctx) for ctx in contexts)
    outputs = module.apply({'params': params}, batch, deterministic=False,
                           rngs={'dropout': rngs['dropout']})
    masks = {k: batch[k] for k in ('query_video', 'query_valid', 'video_valid')}
    expected_om = 0.25 * losses.optimal_matching_loss(outputs['queries_aux'], outputs['clips'],
                                                      **masks)
    expected_qdl = 0.5 * losses.query_diverse_loss_v2(
        outputs['queries_aux'], batch['query_video'], batch['query_valid'],
        delta=config.loss.qdl_delta, alpha=config.loss.qdl_alpha, gamma=config.loss.qdl_gamma)
    return off, on, expected_om, expected_qdl

  off, on, expected_om, expected_qdl = run(params, batch, rngs)
  assert set(on) - set(off) == {'qdl', 'om'}
  for term in off:
    support.assert_close(on[term], off[term], support.f32_rtol(1), scale=1.0, err_msg=term)
  support.assert_close(on['om'], expected_om, support.f32_rtol(32, ops=2))
  support.assert_close(on['qdl'], expected_qdl, support.f32_rtol(32, ops=2))
  assert float(on['om']) > 0 and float(on['qdl']) > 0
