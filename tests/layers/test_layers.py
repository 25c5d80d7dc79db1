"""Shape and property tests of the constraint windows, attention blocks and GMMBlock."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import support
from prvr_jax.layers import (AGGREGATIONS, AttentionBlockV1, AttentionBlockV2, GMMBlock,
                             MultiHeadAttention, constraint_window, precision, stacked_windows)

# float32 Gaussian windows (max 1) vs the float64 formula. The distances between grid points
# carry float32 rounding (~1 ulp), which the window amplifies by |dw/dd| = w |d| / sigma^2 <=
# 0.61 / sigma: ~55 eps per ulp (6.5e-6, measured 6.25e-6) for the narrowest width 0.1
# (sigma = 0.1 / 9). 2e-5 of the magnitude 1 allows ~2 ulps plus exp's own rounding.
WINDOW_RTOL = 2e-5


def _official_gaussian(length, width):
  """The coded formula, written out in numpy."""
  centre = np.arange(length)[:, None] / length
  position = np.linspace(0, 1, length)[None, :]
  sigma = max(width, 0.01) / 9
  w = np.exp(-(position - centre) ** 2 / (2 * sigma**2))
  return w / w.max(-1, keepdims=True)


@pytest.mark.parametrize('length,width', [(32, 0.5), (128, 1.0), (128, 0.1), (7, 5.0), (32, 0.1)])
def test_gaussian_matches_coded_formula(length, width):
  support.assert_close(constraint_window('gaussian', width, length),
                       _official_gaussian(length, width), rtol=WINDOW_RTOL)


@pytest.mark.parametrize('kind', ['gaussian', 'bartlett', 'boxcar'])
def test_row_maxima_are_one(kind):
  window = np.asarray(constraint_window(kind, 0.5, 64))
  support.assert_close(window.max(-1), np.ones(64), rtol=support.f32_rtol(1))  # w / max(w)
  assert window.min() >= 0.0


def test_boxcar_and_bartlett_values():
  size, width = 10, 0.93  # half width 0.31 on the [0, 1] grid (no grid distance ties it)
  positions = np.arange(size) / (size - 1)
  centres = np.arange(size) / size
  distance = np.abs(positions[None, :] - centres[:, None])
  boxcar = np.asarray(constraint_window('boxcar', width, size))
  assert set(np.unique(boxcar)) <= {0.0, 1.0}
  np.testing.assert_array_equal(boxcar, (distance <= 0.31).astype(np.float32))
  bartlett = np.asarray(constraint_window('bartlett', width, size))
  triangle = np.maximum(1 - distance / 0.31, 0)
  # Values in [0, 1]; float32 grid (~eps) scaled by 1 / 0.31, then a few elementwise ops.
  support.assert_close(bartlett, triangle / triangle.max(-1, keepdims=True),
                       rtol=support.f32_rtol(1, ops=4))
  assert np.all((bartlett > 0) <= (boxcar > 0))  # the triangle lives inside the box


def test_paper_gaussian_is_index_unit_formula():
  window = np.asarray(constraint_window('gaussian_paper', 5.0, 16))
  i, j = 3, 7
  # float32 exp of an exponent of -3.2 (its rounding amplified 3.2x) and a division.
  assert window[i, j] == pytest.approx(math.exp(-(j - i) ** 2 / 5.0) / (2 * math.pi),
                                       rel=support.f32_rtol(1, ops=4))
  support.assert_close(window, window.T, rtol=support.f32_rtol(1))  # symmetric up to rounding


def test_no_width_is_plain_attention_and_unknown_kind_errors():
  np.testing.assert_array_equal(constraint_window('gaussian', None, 5), np.ones((5, 5)))
  with pytest.raises(ValueError, match='config.model.window'):
    constraint_window('hann', 1.0, 5)


def test_dynamic_length_equals_window_of_that_length():
  lengths = jnp.array([128, 70, 5])
  windows = np.asarray(constraint_window('gaussian', 0.5, 128, lengths))
  assert windows.shape == (3, 128, 128)
  for b, length in enumerate([128, 70, 5]):
    support.assert_close(windows[b, :length, :length], _official_gaussian(length, 0.5),
                         rtol=WINDOW_RTOL)
    assert np.all(windows[b, :, length:] == 0)
  assert stacked_windows('gaussian', (None, 1.0), 128, lengths).shape == (2, 3, 128, 128)


def test_masked_keys_get_zero_attention():
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(2, 6, 8)), jnp.float32)
  mask = jnp.asarray([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]], jnp.float32)
  attention = MultiHeadAttention(num_heads=2)
  params = attention.init(jax.random.key(0), x, x, mask)
  changed = x.at[0, 3:].set(100.0)  # only masked keys of video 0 change
  out = attention.apply(params, x, x, mask)
  out_changed = attention.apply(params, x[:, :], changed, mask)
  # O(1) outputs; reductions over 8 features / 6 keys, ~4 chained ops. A leak of the changed
  # keys (100.0) would move them by O(1).
  rtol = support.f32_rtol(8, ops=4)
  support.assert_close(out[0], out_changed[0], rtol=rtol)
  ones = jnp.ones((6, 6))
  support.assert_close(attention.apply(params, x, x, mask, ones), out, rtol=rtol)


@pytest.mark.parametrize('block_cls', [AttentionBlockV1, AttentionBlockV2])
def test_blocks_keep_shape_and_dropout_is_random(block_cls):
  x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 5, 8)), jnp.float32)
  block = block_cls(num_heads=2, dropout_rate=0.5)
  params = block.init(jax.random.key(0), x)
  assert block.apply(params, x).shape == x.shape
  a = block.apply(params, x, deterministic=False, rngs={'dropout': jax.random.key(1)})
  b = block.apply(params, x, deterministic=False, rngs={'dropout': jax.random.key(2)})
  assert not np.allclose(a, b)


def test_v2_block_structure():
  x = jnp.ones((1, 4, 8))
  shapes = jax.tree_util.tree_map(jnp.shape, AttentionBlockV2(2).init(jax.random.key(0), x))
  assert shapes['params']['ffn_in']['kernel'] == (8, 32)
  assert 'output' not in shapes['params']  # no output projection in v2
  cross = AttentionBlockV2(2, ffn_multiplier=1).init(jax.random.key(0), x[:, :1], x)
  assert cross['params']['ffn_in']['kernel'].shape == (8, 8)


@pytest.mark.parametrize('aggregation', AGGREGATIONS)
def test_gmm_block_aggregations(aggregation):
  x = jnp.asarray(np.random.default_rng(2).normal(size=(3, 16, 8)), jnp.float32)
  mask = jnp.ones((3, 16)).at[1, 10:].set(0)
  block = GMMBlock(widths=(None, 0.5, 5.0), num_heads=2, block='v2', aggregation=aggregation,
                   temperature=0.5)
  token = jnp.ones(8)
  params = block.init(jax.random.key(0), x, mask, None, token)
  out = block.apply(params, x, mask, None, token)
  assert out.shape == x.shape and np.all(np.isfinite(out))
  assert params['params']['branches']['attention']['query']['kernel'].shape == (3, 8, 8)


def test_gmm_branches_are_independent_blocks():
  """The vmapped branches equal K separately applied blocks with the sliced weights."""
  x = jnp.asarray(np.random.default_rng(3).normal(size=(2, 12, 8)), jnp.float32)
  mask = jnp.ones((2, 12)).at[0, 7:].set(0)
  widths = (None, 0.5, 1.0, 5.0)
  block = GMMBlock(widths=widths, num_heads=2, block='v1', aggregation='average')
  params = jax.jit(lambda key: block.init(key, x, mask))(jax.random.key(0))
  windows = stacked_windows('gaussian', widths, 12)
  single = AttentionBlockV1(num_heads=2)

  @jax.jit
  def both(params):
    """The block and each branch applied alone with its sliced weights (one compile)."""
    stacked = params['params']['branches']
    outputs = [single.apply({'params': jax.tree_util.tree_map(lambda p: p[k], stacked)}, x,
                            key_mask=mask, window=windows[k]) for k in range(len(widths))]
    return block.apply(params, x, mask), outputs

  combined, outputs = both(params)
  # O(1) LayerNorm outputs after ~6 chained ops with reductions over <= 12 keys / 8 features.
  support.assert_close(combined, np.mean(outputs, 0), rtol=support.f32_rtol(12, ops=6))
  assert not np.allclose(outputs[0], outputs[1])
  # The average is a product over the branch axis, not a reduction (slow on XLA:CPU).
  with precision.matmul_precision('bfloat16'):
    jaxpr = jax.make_jaxpr(block.apply)(params, x, mask).jaxpr
  equations = list(support.all_equations(jaxpr))
  assert not support.leading_axis_sums(equations, len(widths))
  assert [e for e in equations if e.primitive.name == 'dot_general'
          and (len(widths),) in [v.aval.shape for v in e.invars]]


@pytest.mark.parametrize('aggregation', AGGREGATIONS)
def test_every_aggregation_is_a_float32_sum_in_mixed_precision(aggregation):
  """The branch outputs are combined at HIGHEST precision, so that a bfloat16 default matmul
  precision on accelerators does not round the block's output."""
  x = jnp.asarray(np.random.default_rng(6).normal(size=(2, 6, 8)), jnp.float32)
  block = GMMBlock(widths=(None, 1.0, 3.0), num_heads=2, block='v2', aggregation=aggregation)
  token = jnp.ones(8)
  params = block.init(jax.random.key(0), x, None, None, token)
  with precision.matmul_precision('bfloat16'):
    jaxpr = jax.make_jaxpr(lambda p: block.apply(p, x, None, None, token))(params).jaxpr
  mixtures = [e for e in support.all_equations(jaxpr) if e.primitive.name == 'dot_general'
              and (3, 2, 6, 8) in [v.aval.shape for v in e.invars]
              and e.outvars[0].aval.shape == x.shape]
  assert len(mixtures) == 1
  assert mixtures[0].params['precision'] == (jax.lax.Precision.HIGHEST,) * 2


def test_temporal_consolidation_weights_sum_to_one():
  x = jnp.asarray(np.random.default_rng(4).normal(size=(2, 8, 8)), jnp.float32)
  block = GMMBlock(widths=(None, 1.0), num_heads=2, block='v2',
                   aggregation='temporal_consolidation', temperature=0.09)
  token = jnp.ones(8)
  params = jax.jit(lambda key: block.init(key, x, None, None, token))(jax.random.key(0))
  same_windows = GMMBlock(widths=(None, None), num_heads=2, block='v2',
                          aggregation='temporal_consolidation', temperature=0.09)

  @jax.jit
  def both(params):
    """The block with identical branches and one branch alone (one compile)."""
    # Identical branch weights give identical outputs; any convex combination returns them.
    same = jax.tree_util.tree_map(lambda p: p, params)
    same['params']['branches'] = jax.tree_util.tree_map(
        lambda p: jnp.broadcast_to(p[:1], p.shape), params['params']['branches'])
    single = AttentionBlockV2(2).apply(
        {'params': jax.tree_util.tree_map(lambda p: p[0], params['params']['branches'])}, x)
    return same_windows.apply(same, x, None, None, token), single

  consolidated, single = both(params)
  # O(1) outputs after ~8 chained ops (attention, FFN of width 32, consolidation softmax).
  support.assert_close(consolidated, single, rtol=support.f32_rtol(32, ops=8))
  with pytest.raises(ValueError, match='query token'):
    block.apply(params, x)


def test_folded_single_query_attention_equals_projected_keys():
  """A learnable token over a sequence takes the folded path; it computes the same function."""
  rng = np.random.default_rng(5)
  token = jnp.asarray(rng.normal(size=(3, 1, 16)), jnp.float32)
  keys = jnp.asarray(rng.normal(size=(3, 20, 16)), jnp.float32)
  mask = jnp.ones((3, 20)).at[2, 11:].set(0)
  attention = MultiHeadAttention(num_heads=2)
  params = attention.init(jax.random.key(0), token, keys, mask)
  params = jax.tree_util.tree_map(lambda p: p + 0.3 * jnp.ones_like(p), params)  # non-zero biases
  folded = attention.apply(params, token, keys, mask)
  # Sixteen query copies per video exceed the folding threshold: the keys are projected.
  projected = attention.apply(params, jnp.repeat(token, 16, axis=1), keys, mask)[:, :1]
  # Another association of the key projection (q W_k^T) x vs q (W_k x): O(1) outputs,
  # reductions over 16 features / 20 keys, ~4 chained ops.
  support.assert_close(folded, projected, rtol=support.f32_rtol(20, ops=4))


def test_attention_folds_only_where_it_saves_work():
  from prvr_jax.layers.attention import folding_is_cheaper
  assert folding_is_cheaper(1, 128, 384, 4)  # a learnable token over the frames
  assert folding_is_cheaper(1, 20, 16, 2)  # the test above
  assert not folding_is_cheaper(16, 20, 16, 2)
  # Self-attention never folds: Lq = Lk makes the folded form cost (H - 1) Lq Lk D more.
  for length, width, heads in [(32, 384, 4), (128, 384, 4), (8, 16, 1), (32, 384, 1)]:
    assert not folding_is_cheaper(length, length, width, heads)
