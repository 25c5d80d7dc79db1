"""MS-SL's exhaustive clips and key-clip guided attention, AMDNet's span masks: against
loop-based numpy references written from the official code."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import support
from prvr_jax import layers
from prvr_jax.layers import multiscale


def test_exhaustive_clips_are_every_average_pool_in_official_order():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(3, 32, 8)).astype(np.float32)
  got = np.asarray(jax.jit(layers.exhaustive_clips)(x))
  # Official: Identity, then AvgPool1d(k, stride 1) for k = 2..32, concatenated along time.
  expected = np.concatenate(
      [np.stack([x[:, s:s + k].astype(np.float64).mean(1) for s in range(32 - k + 1)], 1)
       for k in range(1, 33)], axis=1)
  assert got.shape == (3, 528, 8) == expected.shape
  support.assert_close(got, expected, support.f32_rtol(32))
  # The index formula of the reference notes: p = (k-1) * 33 - (k-1) k / 2 + s.
  for k, s in ((1, 0), (2, 5), (17, 3), (32, 0)):
    p = (k - 1) * 33 - (k - 1) * k // 2 + s
    assert multiscale.proposal_span(p, 32) == (s, s + k)
    support.assert_close(got[:, p], expected[:, p], support.f32_rtol(32))


def test_key_clip_guided_attention_equals_the_unfolded_official_form():
  """Both forms of KCGA are the official function (project every frame, attend with the key),
  padded frames excluded: one key per video (`__call__`), and keys that are multi-scale clips
  attending from the per-video tables (`tables`, `key_clip_attention`)."""
  rng = np.random.default_rng(1)
  q, b, c, l, d = 3, 4, 5, 10, 16
  clips = rng.normal(size=(b, c, d)).astype(np.float32)
  frames = rng.normal(size=(b, l, d)).astype(np.float32)
  lengths = np.array([10, 7, 1, 4])
  mask = (np.arange(l)[None] < lengths[:, None]).astype(np.float32)
  frames[mask == 0] = 1e3  # padding must not leak
  proposals = rng.integers(0, multiscale.num_proposals(c), size=(q, b))
  weights = multiscale.averaging_matrix(c)[proposals]  # [q, b, c]
  module = layers.KeyClipGuidedAttention(d)
  params = module.init(jax.random.key(0), clips[:, 0], frames, mask)

  @jax.jit
  def attend(params, clips, frames, mask, weights):
    logits, values = module.apply(params, clips, frames, method='tables')
    return (multiscale.key_clip_attention(weights, logits, values, mask),
            module.apply(params, jnp.einsum('bl,bld->bd', weights[0], clips), frames, mask))

  from_tables, one_key = (np.asarray(x) for x in attend(params, clips, frames, mask, weights))
  wk = np.asarray(params['params']['key'], np.float64)
  wv = np.asarray(params['params']['value'], np.float64)
  expected = np.zeros((q, b, d))
  for i in range(q):
    for v in range(b):
      start, stop = multiscale.proposal_span(int(proposals[i, v]), c)
      key = clips[v, start:stop].astype(np.float64).mean(0)
      f = frames[v, :lengths[v]].astype(np.float64)
      logits = (f @ wk) @ key
      a = np.exp(logits - logits.max())
      expected[i, v] = (a / a.sum()) @ (f @ wv)
  rtol = support.f32_rtol(d, ops=3)
  support.assert_close(from_tables, expected, rtol)
  support.assert_close(one_key, expected[0], rtol)


def ref_span_masks(centers, widths, length):
  """Official generate_v_gauss_weight, the 1/(width sqrt(2 pi)) factor included."""
  pos = np.linspace(0, 1, length)
  w = np.maximum(widths, 1e-2)[..., None] / 9
  weight = 0.3989422804014327 / w * np.exp(-(pos - centers[..., None]) ** 2 / (2 * w ** 2))
  return weight / weight.max(-1, keepdims=True)


def test_span_masks_match_the_official_formula():
  rng = np.random.default_rng(2)
  centers = rng.uniform(size=(5, 4)).astype(np.float32)
  widths = np.concatenate([rng.uniform(size=(5, 3)), np.full((5, 1), 0.001)], 1)
  widths = widths.astype(np.float32)  # the last width is clamped to 0.01
  got = np.asarray(jax.jit(layers.span_masks, static_argnums=2)(centers, widths, 32))
  support.assert_close(got, ref_span_masks(centers.astype(np.float64), widths, 32),
                       support.f32_rtol(32, ops=2))
  assert np.allclose(got.max(-1), 1.0)


def test_span_masks_stay_finite_where_the_official_formula_underflows():
  """A span narrower than the 0.01 clamp centred midway between two of 32 clip positions: every
  official `exp` underflows in float32 (its mask is 0 / 0 = NaN); ours peaks at 1 on the two
  nearest clips and is 0 elsewhere, as the float64 formula (its exponents are about -105, so
  float32 rounding of the positions moves the two peaks by up to about 1e-3 of each other)."""
  centers = np.float32([[15.5 / 31]])
  widths = np.float32([[0.001]])
  got = np.asarray(jax.jit(layers.span_masks, static_argnums=2)(centers, widths, 32))
  official_exp = np.exp(-(np.linspace(0, 1, 32, dtype=np.float32) - centers[..., None]) ** 2
                        / np.float32(2 * (0.01 / 9) ** 2))
  assert np.all(official_exp == 0)  # in float32: the official row maximum is 0
  expected = ref_span_masks(centers.astype(np.float64), widths, 32)
  assert np.isfinite(got).all() and np.isclose(got.max(), 1.0, rtol=1e-5)
  np.testing.assert_allclose(got[0, 0, 15:17], expected[0, 0, 15:17], rtol=1e-2)
  others = np.delete(np.arange(32), [15, 16])
  assert np.all(got[0, 0, others] == 0) and np.all(expected[0, 0, others] < 1e-300)


def test_span_predictor_shapes_and_spans_in_unit_square():
  x = np.random.default_rng(3).normal(size=(2, 32, 16)).astype(np.float32)
  module = layers.SpanPredictor(num_spans=4)
  params = module.init(jax.random.key(0), x)
  summary, spans, masks = module.apply(params, x)
  assert summary.shape == (2, 16) and spans.shape == (2, 4, 2) and masks.shape == (2, 4, 32)
  assert np.all((np.asarray(spans) > 0) & (np.asarray(spans) < 1))
  support.assert_close(masks, layers.span_masks(spans[..., 0], spans[..., 1], 32),
                       support.f32_rtol(1))


@pytest.mark.parametrize('num_clips', [1, 4])
def test_exhaustive_clips_small(num_clips):
  x = jnp.arange(num_clips * 2, dtype=jnp.float32).reshape(1, num_clips, 2)
  assert layers.exhaustive_clips(x).shape == (1, multiscale.num_proposals(num_clips), 2)
