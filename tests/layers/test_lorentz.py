"""HLFormer's Lorentz layers (prvr_jax/layers/lorentz.py): identities against float64 numpy,
stability for tiny / large norms in float32 and bfloat16, and parity with the official code
(tests/fixtures/hlformer/README.md)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import support
from prvr_jax.layers import LorentzAttentionBlock, LorentzLinear
from prvr_jax.layers import lorentz as lz

FIXTURE = support.FIXTURES / 'hlformer' / 'lorentz.npz'
EPS = support.F32_EPS
BF16_EPS = 2.0**-8  # bfloat16's unit roundoff (8 significant bits)
CURVS = (0.5, 1.0, 2.0)
# Tangent-vector norms from float32's tiny range to just below exp_map0's saturation.
NORMS = (1e-30, 1e-12, 1e-6, 1e-3, 0.3, 1.0, 3.0, 9.0)


@pytest.fixture(scope='module')
def official():
  return np.load(FIXTURE)


def _directions(n: int, dim: int, seed: int) -> np.ndarray:
  v = np.random.default_rng(seed).normal(size=(n, dim))
  return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _tangents(curv: float, dim: int = 8) -> np.ndarray:
  """float64 tangent vectors `[len(NORMS), dim]` with `sqrt(curv) |v|` = NORMS."""
  return _directions(len(NORMS), dim, 1) * np.array(NORMS)[:, None] / math.sqrt(curv)


def _less(error, bound) -> None:
  """`error < bound` elementwise, `bound` broadcast (e.g. a per-row bound `[N, 1]`)."""
  error = np.asarray(error, np.float64)
  np.testing.assert_array_less(error, np.broadcast_to(np.asarray(bound, np.float64), error.shape))


# --------------------------------------------------------------- float64 numpy references


def _ref_exp_map0(v, c):
  s = math.sqrt(c) * np.linalg.norm(v, axis=-1, keepdims=True)
  return np.sinh(np.clip(s, 1e-8, math.asinh(2**15))) * v / np.maximum(s, 1e-8)


def _ref_pairwise_dist(x, y, c):
  tx = np.sqrt(1 / c + np.sum(x * x, -1, keepdims=True))
  ty = np.sqrt(1 / c + np.sum(y * y, -1, keepdims=True))
  z = -c * (x @ y.T - tx @ ty.T)
  return np.arccosh(np.maximum(z, 1 + 1e-8)) / math.sqrt(c), tx, ty


# --------------------------------------------------------------------------- identities


@pytest.mark.parametrize('curv', CURVS)
def test_exp_map0_lands_on_the_hyperboloid_and_log_map0_inverts_it(curv):
  v64 = _tangents(curv)
  v = jnp.asarray(v64, jnp.float32)
  x = np.asarray(lz.exp_map0(v, curv), np.float64)
  # On the hyperboloid: t^2 - |x|^2 = 1 / curv, t the stored time part (relative to t^2).
  t = np.asarray(lz.time_component(jnp.asarray(x, jnp.float32), curv), np.float64)[:, 0]
  _less(np.abs(t**2 - np.sum(x * x, -1) - 1 / curv), 4 * EPS * t**2)
  # exp_map0 vs float64, each row relative to its own norm (norms span 30 decades).
  ref = _ref_exp_map0(v64, curv)
  row = np.linalg.norm(ref, axis=-1, keepdims=True)
  _less(np.abs(x - ref), support.f32_rtol(8, 2) * row)
  # log o exp = id and exp o log = id, row-relative.
  back = np.asarray(lz.log_map0(jnp.asarray(x, jnp.float32), curv), np.float64)
  _less(np.abs(back - v64),
                               support.f32_rtol(8, 4) * np.linalg.norm(v64, axis=-1, keepdims=True))
  again = np.asarray(lz.exp_map0(lz.log_map0(jnp.asarray(x, jnp.float32), curv), curv))
  _less(np.abs(again - x), support.f32_rtol(8, 4) * row)


def test_exp_map0_saturates_as_the_official_clamp():
  # sinh's input is clamped at asinh(2**15): huge tangent vectors stop at norm 2**15 / sqrt(c).
  v = jnp.asarray(_directions(3, 8, 2) * np.array([[20.0], [1e3], [1e15]]), jnp.float32)
  x = lz.exp_map0(v, 2.0)
  assert np.isfinite(np.asarray(x)).all()
  np.testing.assert_allclose(np.linalg.norm(x, axis=-1), 2**15 / math.sqrt(2), rtol=8 * EPS)


@pytest.mark.parametrize('curv', CURVS)
def test_pairwise_dist_agrees_with_float64(curv):
  rng = np.random.default_rng(3)
  x64 = _ref_exp_map0(rng.normal(size=(7, 8)) * 0.6, curv)
  y64 = _ref_exp_map0(rng.normal(size=(5, 8)) * 0.6, curv)
  x, y = (jnp.asarray(a, jnp.float32) for a in (x64, y64))
  x64, y64 = (np.asarray(a, np.float64) for a in (x, y))  # the same (rounded) points
  ref, tx, ty = _ref_pairwise_dist(x64, y64, curv)
  got = np.asarray(lz.pairwise_dist(x, y, curv), np.float64)
  # acosh's argument -c <x, y>_L carries rounding ~ eps c (|x||y| + t_x t_y) <= 2 eps c t_x t_y;
  # acosh' = 1 / sinh(d) turns it into the distance error (the distances here are >= 0.1).
  assert ref.min() > 0.1
  bound = 10 * 2 * EPS * curv * (tx @ ty.T) / (math.sqrt(curv) * np.sinh(ref * math.sqrt(curv)))
  _less(np.abs(got - ref), bound)
  # Symmetric, and the inner product of a point with itself is -1 / curv.
  np.testing.assert_allclose(lz.pairwise_dist(y, x, curv), got.T, rtol=0, atol=1e-6 * ref.max())
  self_inner = np.diag(np.asarray(lz.pairwise_inner(x, x, curv), np.float64))
  np.testing.assert_allclose(self_inner, -1 / curv, rtol=0, atol=4 * EPS * np.max(tx**2))


def test_ambient_expmap0_logmap0_are_inverse_and_on_the_hyperboloid():
  u64 = np.pad(_tangents(1.0, 8)[:-1], [(0, 0), (1, 0)])  # norms up to 3 (< the clamp 10)
  u = jnp.asarray(u64, jnp.float32)
  p = np.asarray(lz.expmap0(u), np.float64)
  t = p[:, 0]
  _less(np.abs(lz.minkowski_inner(p, p) + 1.0), 4 * EPS * t**2)
  np.testing.assert_allclose(lz.project(jnp.asarray(p, jnp.float32)), p, rtol=4 * EPS, atol=0)
  back = np.asarray(lz.logmap0(jnp.asarray(p, jnp.float32)), np.float64)
  row = np.linalg.norm(u64, axis=-1, keepdims=True)
  # Tiny tangents (|u| < sqrt(1e-9), tangent_norm's clamp) come back as the official map gives
  # them: u sinh(3.2e-5) / 3.2e-5 = u (1 + 1.7e-10), i.e. exactly u in float32.
  _less(np.abs(back - u64), support.f32_rtol(8, 4) * row)
  np.testing.assert_allclose(back[:, 0], 0.0, atol=0)
  # Beyond the official norm clamp 10 the point stops at distance 10 from the origin.
  far = lz.expmap0(u * 1e3)
  np.testing.assert_allclose(far[-1, 0], math.cosh(10.0), rtol=4 * EPS)


def test_logmap0_is_finite_where_the_official_ratio_is_not():
  # a = y_0 = 1 exactly (the origin) is inf / NaN in the official code, a < 1 is NaN there.
  y = jnp.array([[1.0, 0.0, 0.0], [1.0, 1e-4, 0.0], [0.999, 0.01, 0.0], [1.0 + 2e-7, 0, 0]])
  out = np.asarray(lz.logmap0(y))
  assert np.isfinite(out).all()
  np.testing.assert_allclose(out[0], 0.0, atol=0)
  np.testing.assert_allclose(out[1, 1], 1e-4, rtol=4 * EPS)
  grad = jax.grad(lambda y: jnp.sum(lz.logmap0(y) ** 2))(y)
  assert np.isfinite(np.asarray(grad)).all()
  # The ratio acosh(a) / sqrt(a^2 - 1) against float64 on both sides of the series switch.
  a = np.array([1 + 1e-7, 1 + 5e-5, 1 + 1e-4, 1 + 2e-4, 1.5, 10.0, 1e4])
  a32 = a.astype(np.float32).astype(np.float64)
  ratio = np.asarray(lz._acosh_ratio(jnp.asarray(a32, jnp.float32)), np.float64)
  np.testing.assert_allclose(ratio, np.arccosh(a32) / np.sqrt(a32**2 - 1), rtol=8 * EPS)


def test_ambient_dist_and_the_official_clamps():
  rng = np.random.default_rng(4)
  x = lz.expmap0(jnp.asarray(np.pad(rng.normal(size=(6, 5)), [(0, 0), (1, 0)]), jnp.float32))
  y = lz.expmap0(jnp.asarray(np.pad(rng.normal(size=(6, 5)), [(0, 0), (1, 0)]), jnp.float32))
  x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
  z = x64[:, 0] * y64[:, 0] - np.sum(x64[:, 1:] * y64[:, 1:], -1)
  # acosh(z) with z's rounding (eps * t_x t_y) over sinh(d) (the distances here are > 0.3).
  ref = np.arccosh(z)
  assert ref.min() > 0.3
  _less(np.abs(np.asarray(lz.dist(x, y)) - ref), 10 * EPS * x64[:, 0] * y64[:, 0] / np.sinh(ref))
  # onmt's Acosh at 1: log(1 + sqrt(1e-9)) (the sum rounded to float32), not 0; its gradient
  # is the custom backward 1 / sqrt(max(z^2 - 1, 1e-9)) with z clamped to >= 1 + 1e-8.
  origin = jnp.array([1.0, 0.0, 0.0])
  at_one = math.log(float(np.float32(1.0) + np.float32(math.sqrt(1e-9))))
  np.testing.assert_allclose(lz.dist(origin, origin), at_one, rtol=8 * EPS)
  grad = jax.grad(lambda z: lz._official_acosh(z))(jnp.float32(1.0))
  np.testing.assert_allclose(grad, 1 / math.sqrt(1e-9), rtol=8 * EPS)
  # tangent_norm's LeakyClamp: value sqrt(1e-9) below the clamp, gradient slope 1e-8 there.
  u = jnp.array([0.0, 1e-6, 0.0])
  np.testing.assert_allclose(lz.tangent_norm(u), math.sqrt(1e-9), rtol=8 * EPS)
  leak = jax.grad(lambda u: lz.tangent_norm(u))(u)
  np.testing.assert_allclose(leak[1], 1e-8 * 2e-6 / (2 * math.sqrt(1e-9)), rtol=1e-5)


def test_zero_vectors_have_finite_values_and_gradients():
  zero = jnp.zeros((2, 5), jnp.float32)
  for fn in (lambda x: lz.exp_map0(x, 1.3), lambda x: lz.log_map0(x, 1.3),
             lambda x: lz.half_aperture(x, 1.3), lambda x: lz.expmap0(jnp.pad(x, [(0, 0), (1, 0)])),
             lambda x: lz.oxy_angle(lz.exp_map0(x + 0.1, 1.3), lz.exp_map0(x, 1.3), 1.3)):
    value, grad = jax.value_and_grad(lambda x, fn=fn: jnp.sum(fn(x)))(zero)
    assert np.isfinite(float(value)) and np.isfinite(np.asarray(grad)).all()
  np.testing.assert_array_equal(lz.exp_map0(zero), zero)
  np.testing.assert_allclose(lz.half_aperture(zero), math.pi / 2, rtol=4 * EPS)


@pytest.mark.parametrize('curv', (0.5, 2.0))
def test_bfloat16_is_the_float32_result_rounded(curv):
  # Half-precision inputs are computed in float32 and rounded once: against float64 on the
  # same (bf16-rounded) inputs the error is bfloat16's output rounding, 2**-8 of each row.
  v = jnp.asarray(_tangents(curv), jnp.bfloat16)
  v64 = np.asarray(v, np.float64)
  row = np.linalg.norm(_ref_exp_map0(v64, curv), axis=-1, keepdims=True)
  x = lz.exp_map0(v, curv)
  assert x.dtype == jnp.bfloat16 and np.isfinite(np.asarray(x, np.float32)).all()
  _less(np.abs(np.asarray(x, np.float64) - _ref_exp_map0(v64, curv)),
                               1.5 * BF16_EPS * row)
  x64 = np.asarray(x, np.float64)
  back = np.asarray(lz.log_map0(x, curv), np.float64)
  s = math.sqrt(curv) * np.linalg.norm(x64, axis=-1, keepdims=True)
  ref = x64 * np.where(s > 0, np.arcsinh(s) / np.where(s > 0, s, 1), 1)
  _less(np.abs(back - ref), 1.5 * BF16_EPS * np.abs(ref).max(-1,
                                                                                 keepdims=True))
  # Round trip: bf16 rounding of the intermediate point, amplified by the map's condition
  # number (<= 1 + s for the radial part), within a few bf16 ulps of each row.
  big = np.linalg.norm(v64, axis=-1, keepdims=True)
  _less(np.abs(back - v64), 4 * BF16_EPS * big * (1 + s / (1 + s)))
  for fn in (lz.half_aperture, lambda a, c: lz.oxy_angle(a, a[::-1], c),
             lambda a, c: lz.expmap0(jnp.pad(a, [(0, 0), (1, 0)])),
             lambda a, c: lz.logmap0(lz.expmap0(jnp.pad(a, [(0, 0), (1, 0)])))):
    out = fn(x, curv)
    assert out.dtype == jnp.bfloat16 and np.isfinite(np.asarray(out, np.float32)).all()


def test_lorentz_linear_heads_are_on_the_hyperboloid():
  layer = LorentzLinear(features=12, num_heads=3)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 12))
  params = layer.init(jax.random.PRNGKey(1), x)
  heads = np.asarray(layer.apply(params, x), np.float64)
  assert heads.shape == (2, 5, 3, 4)
  t = heads[..., 0]
  assert (t >= 1.1).all()
  np.testing.assert_allclose(lz.minkowski_inner(heads, heads), -1.0, atol=8 * EPS * t.max()**2)


# ------------------------------------------------------------------ parity with official


@pytest.mark.parametrize('index', range(3))
def test_space_ops_match_official(official, index):
  x, y = official['fn_x'], official['fn_y']
  c = float(official['fn_curvs'][index])
  rtol = support.f32_rtol(8, 2)  # one 8-term reduction, one transcendental chain
  cases = {
      'exp_map0': lz.exp_map0(x * 1.5, c), 'exp_map0_large': lz.exp_map0(x * 20, c),
      'log_map0': lz.log_map0(x, c), 'pairwise_inner': lz.pairwise_inner(x, y, c),
      'half_aperture': lz.half_aperture(x, c), 'oxy_angle': lz.oxy_angle(x[:5], y, c)}
  for name, got in cases.items():
    support.assert_close(got, official[f'{name}_{index}'], rtol, err_msg=name)
  # acosh of -c<x,y>_L (~16 here): its rounding (~eps * 16) over sinh(d) >= 1.
  support.assert_close(lz.pairwise_dist(x, y, c), official[f'pairwise_dist_{index}'],
                       support.f32_rtol(8, 4), err_msg='pairwise_dist')


def test_entailment_term_and_gradients_match_official(official):
  x, y = official['fn_x'][:5], official['fn_y']

  def entailment(v, q, log_curv):
    c = jnp.exp(log_curv)
    ve, qe = lz.exp_map0(v, c), lz.exp_map0(q, c)
    return jnp.mean(jnp.maximum(lz.oxy_angle(ve, qe, c) - lz.half_aperture(ve, c), 0.0))

  value, grads = jax.jit(jax.value_and_grad(entailment, (0, 1, 2)))(
      x, y, jnp.log(jnp.float32(1.3)))
  support.assert_close(value, official['entail_loss'], support.f32_rtol(8, 2))
  # The gradients pass acos' 1 / sin at angles near pi and the inner products of points whose
  # time parts reach t ~ 9: float32 rounding relative to t^2 (measured 2e-5 of the largest
  # gradient, the official float32 gradients being 5e-6 from float64).
  t2 = float(np.max(1 / 1.3 + np.sum(np.asarray(lz.exp_map0(np.concatenate([x, y]), 1.3))**2,
                                     -1)))
  rtol = 10 * EPS * t2
  for got, name in zip(grads, ('entail_grad_v', 'entail_grad_q', 'entail_grad_log_curv')):
    support.assert_close(got, official[name], rtol, err_msg=name)


def test_ambient_ops_match_official(official):
  rtol = support.f32_rtol(9, 2)
  pts = official['amb_pts']
  cases = {
      'amb_expmap0': lz.expmap0(official['amb_u']),
      'amb_logmap0': lz.logmap0(official['amb_expmap0']),
      'amb_expmap0_large': lz.expmap0(official['amb_u'] * 40),
      'amb_project': lz.project(official['amb_a']),
      'amb_cinner': lz.cinner(pts, pts),
      'amb_mid_point': lz.mid_point(pts, official['amb_w']),
      'amb_inner': lz.minkowski_inner(pts[0], pts[1])}
  for name, got in cases.items():
    support.assert_close(got, official[name], rtol, err_msg=name)


def _official_block(official, index: int):
  state = {k.split('/', 1)[1]: official[k] for k in official.files
           if k.startswith(f'blk{index}_param/')}
  width = float(official[f'blk{index}_width'])
  block = LorentzAttentionBlock(lorentz_dim=23, num_heads=4, dropout_rate=0.2,
                                width=None if math.isnan(width) else width)
  return block, state


@pytest.mark.parametrize('index', (0, 1))
def test_block_matches_official(official, index):
  """Block 0: no window; block 1: window width 4 and a stored scale_alpha > 0 (clamped to 0)."""
  block, state = _official_block(official, index)
  x, mask, cot = official['blk_input'], official['blk_mask'], official['blk_cotangent']
  params = lz.block_params_from_official(state)
  init = block.init(jax.random.PRNGKey(0), x, mask)['params']
  assert jax.tree_util.tree_structure(init) == jax.tree_util.tree_structure(params)
  for a, b in zip(jax.tree_util.tree_leaves(init), jax.tree_util.tree_leaves(params)):
    assert a.shape == b.shape
  trainable = sum(v.size for k, v in state.items() if not k.endswith('manifold.k'))
  assert sum(a.size for a in jax.tree_util.tree_leaves(init)) == trainable

  loss = lambda p, x: jnp.sum(block.apply({'params': p}, x, mask) * cot)
  out = jax.jit(lambda p, x: block.apply({'params': p}, x, mask))(params, x)
  grad_params, grad_x = jax.jit(jax.grad(loss, (0, 1)))(params, x)
  # Chains of ~4 float32 reductions of <= 32 terms (LayerNorms, projections, the Lorentz
  # inner products and centroids): measured 4.5e-6 of the magnitude, both float32 versions
  # being ~3e-6 from a float64 run of ours.
  rtol = support.f32_rtol(32, 4)
  support.assert_close(out, official[f'blk{index}_output'], rtol, err_msg='output')
  # Gradients: twice the chain, reductions over all B * L positions (measured 1.2e-5).
  grad_rtol = support.f32_rtol(128, 4)
  support.assert_close(grad_x, official[f'blk{index}_grad_input'], grad_rtol, err_msg='dx')
  grads = {k.split('/', 1)[1]: official[k] for k in official.files
           if k.startswith(f'blk{index}_grad/')}
  expected = lz.block_params_from_official({**grads, **{
      k: v for k, v in state.items() if k.endswith('manifold.k')}})
  # Relative to the largest parameter gradient: block 0's score bias has a gradient of
  # rounding size only (softmax ignores a shared shift when no window rescales the scores).
  scale = max(float(np.abs(g).max()) for g in jax.tree_util.tree_leaves(expected))
  flat_expected = jax.tree_util.tree_flatten_with_path(expected)[0]
  for (path, want), got in zip(flat_expected, jax.tree_util.tree_leaves(grad_params)):
    support.assert_close(got, want, grad_rtol, scale=scale, err_msg=jax.tree_util.keystr(path))
  # The stored scale_alpha after the official forward is the clamped one (ours: the optimiser
  # clamps it after each update, `ModelSpec.bounds`, tested in tests/models/test_hlformer.py).
  np.testing.assert_array_equal(np.minimum(params['attention']['scale_alpha'], 0),
                                official[f'blk{index}_param_after/self.scale_alpha'])


def test_block_with_bfloat16_dense_layers_stays_near_official(official):
  """Mixed precision (`precision.matmul_precision('bfloat16')`: the dense layers multiply
  bfloat16 copies): finite, and within 8 bfloat16 ulps of the magnitude of the official float32
  output (measured 1.1e-2 for block 0, 4.5e-3 for block 1: 2.8 / 1.2 ulps)."""
  from prvr_jax.layers import precision  # pylint: disable=g-import-not-at-top
  x, mask = official['blk_input'], official['blk_mask']
  for index in (0, 1):
    block, state = _official_block(official, index)
    params = lz.block_params_from_official(state)
    with precision.matmul_precision('bfloat16'):
      out = jax.jit(lambda p, x, block=block: block.apply({'params': p}, x, mask))(params, x)
    assert out.dtype == jnp.float32 and np.isfinite(np.asarray(out)).all()
    support.assert_close(out, official[f'blk{index}_output'], 8 * BF16_EPS)


def test_block_params_from_official_names_the_key_at_fault(official):
  _, state = _official_block(official, 0)
  prefixed = {f'clip_encoder.h_attns.1.{k}': v for k, v in state.items()}
  params = lz.block_params_from_official(prefixed, prefix='clip_encoder.h_attns.1.')
  assert params['ffn_in']['kernel'].shape == (32, 128)
  missing = dict(prefixed)
  del missing['clip_encoder.h_attns.1.norm2.bias']
  with pytest.raises(ValueError, match=r'clip_encoder\.h_attns\.1\.norm2\.bias$'):
    lz.block_params_from_official(missing, prefix='clip_encoder.h_attns.1.')
  bad_k = {**prefixed, 'clip_encoder.h_attns.1.self.manifold.k': np.float32(2.0)}
  with pytest.raises(ValueError, match=r'clip_encoder\.h_attns\.1\.self\.manifold\.k$'):
    lz.block_params_from_official(bad_k, prefix='clip_encoder.h_attns.1.')


def test_block_masks_padding_and_drops_out_in_training():
  # (Dropout can zero every input of a LorentzLinear in tiny widths: a 0 / 0 head, NaN in the
  # official code too; lorentz_dim 15 at rate 0.2 keeps this seed clear of it.)
  block = LorentzAttentionBlock(lorentz_dim=15, num_heads=2, dropout_rate=0.2, width=2.0)
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 6, 8))
  mask = jnp.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]], jnp.float32)
  params = jax.jit(block.init)(jax.random.PRNGKey(1), x, mask)
  apply = jax.jit(block.apply, static_argnames='deterministic')
  out = apply(params, x, mask)
  # Changing padded frames does not change the real frames' outputs.
  x2 = x.at[1, 3:].set(100.0)
  support.assert_close(apply(params, x2, mask)[1, :3], out[1, :3], support.f32_rtol(8, 4))
  train = apply(params, x, mask, deterministic=False, rngs={'dropout': jax.random.key(2)})
  assert np.isfinite(np.asarray(train)).all() and not np.allclose(train, out)
  with pytest.raises(ValueError, match=r'num_heads=2 \(config\.model\.num_heads\)'):
    LorentzAttentionBlock(lorentz_dim=8, num_heads=2).init(jax.random.PRNGKey(0), x, mask)
