"""HLFormer's Lorentz-model (hyperboloid) operations and its Lorentz attention block.

HLFormer (ICCV 2025, `lijun2005/ICCV25-HLFormer`) uses two families of hyperboloid code:

* **Space-component ops** (`src/Models/HLFormer/lorentz.py`, from MERU): a point is stored by
  its space part `x` only; its time part is `sqrt(1 / curv + |x|^2)` on the hyperboloid of
  curvature `-curv`. The model maps pooled query / video vectors with `exp_map0` under a
  learnable `curv`, and its partial-order loss uses `oxy_angle` and `half_aperture`.
  Functions: `time_component`, `pairwise_inner`, `pairwise_dist`, `exp_map0`, `log_map0`,
  `half_aperture`, `oxy_angle`.
* **Ambient ops** (`src/Models/onmt/{lmath,lorentz}.py`, a geoopt `Lorentz` subclass): a point
  is the full `[time, space]` vector with `-t^2 + |s|^2 = -k`; the model builds `Lorentz()`, so
  `k = 1`, fixed. The Lorentz attention block uses these. Functions: `minkowski_inner`,
  `tangent_norm`, `project`, `expmap0`, `logmap0`, `dist`, `cinner`, `mid_point`. As in the
  official code, `expmap0` and `logmap0` do not scale by `k` (they are the `k = 1` maps).

Every clamp and epsilon is the official one, named where it is used. A few forms differ from
the official arithmetic, only where it has no accuracy left (`log_map0`, `logmap0`, the
gradient of a zero vector's norm; docs/hlformer.md, "Where ours differs"). bfloat16 / float16
inputs are computed in float32 and the results cast back.

`LorentzAttentionBlock` is the official `LorentzAttentionBlock` (model_components.py); its
parameters map 1:1 to the official state dict by `OFFICIAL_BLOCK_PARAMS` /
`block_params_from_official`.
"""

from collections.abc import Mapping
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from prvr_jax.layers.attention import dense, layer_norm
from prvr_jax.layers.common import InputProjection
from prvr_jax.layers.windows import constraint_window

# Official constants (file: constant).
EPS = 1e-8  # HLFormer/lorentz.py: every `eps` default; onmt/utils.py: `eps` (LeakyClamp, Acosh).
EXP_MAP0_MAX = math.asinh(2.0**15)  # HLFormer/lorentz.py exp_map0: sinh input clamp.
EXPMAP0_MAX_NORM = 10.0  # onmt/lmath.py EXP_MAX_NORM: expmap0's tangent-norm clamp.
SQRT_MIN = 1e-9  # onmt/utils.py sqrt: clamp(x, min=1e-9) before sqrt (tangent_norm).
MID_POINT_MIN = 1e-8  # onmt/lorentz.py mid_point: clamp_min of |<ave, ave>_L|.
LEAKY_SLOPE = 1e-8  # onmt/utils.py LeakyClamp: gradient slope outside the clamp range.
HALF_APERTURE_MIN_RADIUS = 0.1  # HLFormer/lorentz.py half_aperture: min_radius default.
TIME_OFFSET = 1.1  # onmt/hyper_nets.py LorentzLinear: time = sigmoid(.) * exp(scale) + 1.1.
LINEAR_SCALE_INIT = 2.3  # onmt/hyper_nets.py LorentzLinear: self.scale init.
MASKED_LOGIT = -1e18  # onmt/hyper_nets.py LorentzMultiHeadedAttention: masked_fill value.


def _compute_dtype(*xs: jax.Array) -> tuple[jnp.dtype, jnp.dtype]:
  """(result dtype, compute dtype): half-precision inputs are computed in float32."""
  dtype = jnp.result_type(*xs)
  if not jnp.issubdtype(dtype, jnp.floating):
    dtype = jnp.dtype(jnp.float32)
  compute = jnp.promote_types(dtype, jnp.float32)
  return dtype, compute


def _sum_sq(x: jax.Array, keepdims: bool = True) -> jax.Array:
  return jnp.sum(x * x, axis=-1, keepdims=keepdims)


def _norm(x: jax.Array, keepdims: bool = True) -> jax.Array:
  """Euclidean norm over the last axis with `torch.norm`'s gradient 0 at the zero vector."""
  sq = _sum_sq(x, keepdims)
  positive = sq > 0
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, sq, 1.0)), 0.0)


def _clamp(x: jax.Array, lo: float | None = None, hi: float | None = None) -> jax.Array:
  """`torch.clamp`: gradient 1 inside `[lo, hi]` (bounds included), 0 outside."""
  if lo is not None:
    x = jnp.where(x >= lo, x, lo)
  if hi is not None:
    x = jnp.where(x <= hi, x, hi)
  return x


def _leaky_clamp(x: jax.Array, lo: float = -math.inf, hi: float = math.inf) -> jax.Array:
  """onmt's `LeakyClamp`: the clamped value, gradient 1 inside `[lo, hi]`, `LEAKY_SLOPE`
  outside."""
  inside = (x >= lo) & (x <= hi)
  slope = jnp.where(inside, 1.0, LEAKY_SLOPE).astype(x.dtype)
  clamped = jnp.clip(x, lo, hi)
  return jax.lax.stop_gradient(clamped) + slope * (x - jax.lax.stop_gradient(x))


def _time(x: jax.Array, curv) -> jax.Array:
  return jnp.sqrt(1.0 / curv + _sum_sq(x))


# ------------------------------------------------------------------- space-component ops


def time_component(x: jax.Array, curv: float | jax.Array = 1.0) -> jax.Array:
  """Time part `sqrt(1 / curv + |x|^2)` `[..., 1]` of space parts `x` `[..., D]`."""
  dtype, compute = _compute_dtype(x)
  return _time(x.astype(compute), curv).astype(dtype)


def pairwise_inner(x: jax.Array, y: jax.Array, curv: float | jax.Array = 1.0) -> jax.Array:
  """Lorentzian inner products `<x_i, y_j>_L = x_i . y_j - t(x_i) t(y_j)`: `[B1, D], [B2, D]
  -> [B1, B2]` (official `pairwise_inner`)."""
  dtype, compute = _compute_dtype(x, y)
  x, y = x.astype(compute), y.astype(compute)
  inner = x @ y.T - _time(x, curv) @ _time(y, curv).T
  return inner.astype(dtype)


def pairwise_dist(x: jax.Array, y: jax.Array, curv: float | jax.Array = 1.0,
                  eps: float = EPS) -> jax.Array:
  """Geodesic distances `acosh(max(-curv <x_i, y_j>_L, 1 + eps)) / sqrt(curv)`: `[B1, B2]`.

  The clamp (official `pairwise_dist`) keeps acosh's argument >= 1 against rounding; in float32
  `1 + 1e-8 == 1`, so it clamps to 1 (distance 0) and acosh's gradient there is infinite, as in
  the official code (the model does not use this function; its loss uses `oxy_angle`).
  """
  dtype, compute = _compute_dtype(x, y)
  c_xyl = -curv * pairwise_inner(x.astype(compute), y.astype(compute), curv)
  return (jnp.arccosh(_clamp(c_xyl, lo=1 + eps)) / curv**0.5).astype(dtype)


def exp_map0(x: jax.Array, curv: float | jax.Array = 1.0, eps: float = EPS) -> jax.Array:
  """Exponential map at the vertex: tangent vectors `[..., D]` -> space parts `[..., D]`,
  `sinh(s) x / s` with `s = sqrt(curv) |x|` (official `exp_map0`).

  Clamps (official): sinh's input to `[eps, asinh(2**15)]` (no overflow: the output norm
  saturates at `2**15 / sqrt(curv)`, so large tangent vectors are not inverted by `log_map0`),
  and the divisor `s` to `>= eps` (the zero vector maps to itself). The factor
  `sinh(.) / max(s, eps)` is formed before multiplying `x` (the official order,
  `sinh(.) * x / .`, passes through subnormals for `|x| < 1e-30`, which XLA flushes to 0).
  Norms whose square overflows (`|x| > ~1e19`) give 0, as in the official code.
  """
  dtype, compute = _compute_dtype(x)
  x = x.astype(compute)
  rc_xnorm = curv**0.5 * _norm(x)
  sinh_input = _clamp(rc_xnorm, lo=eps, hi=EXP_MAP0_MAX)
  return (x * (jnp.sinh(sinh_input) / _clamp(rc_xnorm, lo=eps))).astype(dtype)


def log_map0(x: jax.Array, curv: float | jax.Array = 1.0, eps: float = EPS) -> jax.Array:
  """Logarithmic map at the vertex (inverse of `exp_map0`): space parts `[..., D]` -> tangent
  vectors, `x asinh(s) / s` with `s = sqrt(curv) |x|` (and `x` at `s = 0`).

  The official `log_map0` computes `x acosh(max(sqrt(1 + s^2), 1 + eps)) / max(s, eps)`: the
  same value for `s >~ 1e-3`; below that `sqrt(1 + s^2)` rounds to 1 in float32 and the
  official result collapses to 0 (in float64 its clamps distort `s < 1.4e-4`). `asinh(s) / s`
  is accurate down to the smallest norms (`eps` is kept for the signature, unused).
  """
  del eps
  dtype, compute = _compute_dtype(x)
  x = x.astype(compute)
  rc_xnorm = curv**0.5 * _norm(x)
  positive = rc_xnorm > 0
  safe = jnp.where(positive, rc_xnorm, 1.0)
  return (x * jnp.where(positive, jnp.arcsinh(safe) / safe, 1.0)).astype(dtype)


def half_aperture(x: jax.Array, curv: float | jax.Array = 1.0,
                  min_radius: float = HALF_APERTURE_MIN_RADIUS, eps: float = EPS) -> jax.Array:
  """Half aperture `asin(2 min_radius / (sqrt(curv) |x| + eps))` `[...]` of the entailment
  cones at space parts `x` `[..., D]` (official `half_aperture`).

  Clamps (official): `+ eps` in the denominator (the vertex), asin's input to
  `[-1 + eps, 1 - eps]` (in float32 `1 - 1e-8 == 1`: points within `2 min_radius` of the
  vertex get the aperture pi/2).
  """
  dtype, compute = _compute_dtype(x)
  x = x.astype(compute)
  asin_input = 2 * min_radius / (_norm(x, keepdims=False) * curv**0.5 + eps)
  return jnp.arcsin(_clamp(asin_input, lo=-1 + eps, hi=1 - eps)).astype(dtype)


def oxy_angle(x: jax.Array, y: jax.Array, curv: float | jax.Array = 1.0,
              eps: float = EPS) -> jax.Array:
  """Exterior angle `[...]` at `x` of the hyperbolic triangle (vertex, x, y), by the hyperbolic
  law of cosines (official `oxy_angle`; pairs of space parts `[..., D]`).

  Clamps (official): `c <x, y>_L^2 - 1 >= eps` under the square root, `+ eps` in the acos
  denominator, acos's input to `[-1 + eps, 1 - eps]`.
  """
  dtype, compute = _compute_dtype(x, y)
  x, y = x.astype(compute), y.astype(compute)
  x_time = _time(x, curv)[..., 0]
  y_time = _time(y, curv)[..., 0]
  c_xyl = curv * (jnp.sum(x * y, axis=-1) - x_time * y_time)
  acos_numer = y_time + c_xyl * x_time
  acos_denom = jnp.sqrt(_clamp(c_xyl**2 - 1, lo=eps))
  acos_input = acos_numer / (_norm(x, keepdims=False) * acos_denom + eps)
  return jnp.arccos(_clamp(acos_input, lo=-1 + eps, hi=1 - eps)).astype(dtype)


# ------------------------------------------------------------------------- ambient ops


def minkowski_inner(u: jax.Array, v: jax.Array, keepdims: bool = False) -> jax.Array:
  """`<u, v>_L = -u_0 v_0 + sum_i u_i v_i` over the last axis (onmt `inner`)."""
  uv = u * v
  inner = -uv[..., :1] + jnp.sum(uv[..., 1:], axis=-1, keepdims=True)
  return inner if keepdims else inner[..., 0]


def tangent_norm(u: jax.Array, keepdims: bool = False) -> jax.Array:
  """`sqrt(max(<u, u>_L, 1e-9))` (onmt `norm`; the clamp is a LeakyClamp: gradient slope
  `LEAKY_SLOPE` below it)."""
  return jnp.sqrt(_leaky_clamp(minkowski_inner(u, u, keepdims), lo=SQRT_MIN))


def project(x: jax.Array, k: float | jax.Array = 1.0) -> jax.Array:
  """Onto the hyperboloid: the time part replaced by `sqrt(k + |space|^2)` (onmt `project`)."""
  dtype, compute = _compute_dtype(x)
  x = x.astype(compute)
  space = x[..., 1:]
  return jnp.concatenate([jnp.sqrt(k + _sum_sq(space)), space], axis=-1).astype(dtype)


def expmap0(u: jax.Array, k: float | jax.Array = 1.0, projected: bool = True) -> jax.Array:
  """Exponential map at the origin `(1, 0, ..., 0)` of ambient tangent vectors `[..., D+1]`
  (onmt `expmap0`; `Lorentz.expmap0` projects the result, `projected=True`).

  `cosh(n) e_0 + sinh(n) u / |u|_L` with `n = min(|u|_L, 10)`: `tangent_norm`'s clamp
  (`|u|_L >= sqrt(1e-9)`) and the official norm clamp `EXPMAP0_MAX_NORM = 10` (the point stops
  at distance 10 from the origin, so `logmap0` does not invert larger tangent vectors). `k`
  enters only through the projection, as in the official code.
  """
  dtype, compute = _compute_dtype(u)
  u = u.astype(compute)
  nomin = tangent_norm(u, keepdims=True)
  u = u / nomin
  nomin = _clamp(nomin, hi=EXPMAP0_MAX_NORM)
  r_v = jnp.sinh(nomin) * u
  p = jnp.concatenate([jnp.cosh(nomin) + r_v[..., :1], r_v[..., 1:]], axis=-1)
  return (project(p, k) if projected else p).astype(dtype)


def _acosh_ratio(alpha: jax.Array) -> jax.Array:
  """`acosh(a) / sqrt(a^2 - 1)` without cancellation; its series `1 - t/3 + 2 t^2 / 15`
  (`t = a - 1`) below `t = 1e-4` (error < t^3), where the closed form loses accuracy."""
  t = alpha - 1.0
  small = t < 1e-4
  t_big = jnp.where(small, 1.0, t)
  w = jnp.sqrt(t_big * (t_big + 2.0))  # sqrt(a^2 - 1) without cancellation
  closed = jnp.log1p(t_big + w) / w
  return jnp.where(small, 1.0 - t / 3.0 + 2.0 * t * t / 15.0, closed)


def logmap0(y: jax.Array, k: float | jax.Array = 1.0) -> jax.Array:
  """Logarithmic map at the origin of ambient points `[..., D+1]` (onmt `logmap0`):
  `acosh(a) / sqrt(a^2 - 1) (y - a e_0)` with `a = y_0` (the stored time part: the model
  applies it to concatenated heads, which are not on the hyperboloid).

  The official code computes the ratio with its clamped Acosh (`a >= 1 + 1e-8`,
  `sqrt(max(a^2 - 1, 1e-9))`) over an unclamped `sqrt(a^2 - 1)`: equal to ours for
  `a - 1 >~ 1e-3`, inaccurate closer to 1, infinite / NaN at `a = 1` and NaN for `a < 1`.
  `k` is unused, as in the official code.
  """
  del k
  dtype, compute = _compute_dtype(y)
  y = y.astype(compute)
  alpha = y[..., :1]
  e0 = jnp.zeros(y.shape[-1], compute).at[0].set(1.0)
  return (_acosh_ratio(alpha) * (y - alpha * e0)).astype(dtype)


def _official_acosh(x: jax.Array) -> jax.Array:
  """onmt's `Acosh`: `log(max(x, 1 + eps) + sqrt(max(x^2 - 1, 1e-9)))`; gradient
  `1 / sqrt(max(x^2 - 1, 1e-9))` (its custom backward, clamp included)."""
  clamped = jnp.maximum(x, 1.0 + EPS)
  z = jnp.sqrt(jnp.maximum(clamped * clamped - 1.0, SQRT_MIN))
  value = jnp.log(clamped + z)
  return jax.lax.stop_gradient(value) + (x - jax.lax.stop_gradient(x)) / jax.lax.stop_gradient(z)


def dist(x: jax.Array, y: jax.Array, k: float | jax.Array = 1.0) -> jax.Array:
  """Geodesic distance `acosh(-<x, y>_L / k)` `[...]` of ambient points (onmt `dist`, with its
  clamped Acosh: the distance of a point to itself is `log(1 + sqrt(1e-9)) ~ 3.2e-5`)."""
  dtype, compute = _compute_dtype(x, y)
  d = -minkowski_inner(x.astype(compute), y.astype(compute))
  return _official_acosh(d / k).astype(dtype)


def cinner(x: jax.Array, y: jax.Array) -> jax.Array:
  """All Lorentzian inner products `[..., N, M]` of `x` `[..., N, D+1]` and `y` `[..., M, D+1]`
  (onmt `cinner`)."""
  x = jnp.concatenate([-x[..., :1], x[..., 1:]], axis=-1)
  return jnp.einsum('...nd,...md->...nm', x, y)


def mid_point(x: jax.Array, weights: jax.Array | None = None) -> jax.Array:
  """Lorentzian centroid `ave / sqrt(max(|<ave, ave>_L|, 1e-8))` of points `x` `[..., N, D+1]`
  with `ave = weights @ x` (`weights` `[..., M, N]`; default the mean over N) (onmt
  `mid_point`; the clamp guards an all-zero weight row)."""
  dtype, compute = _compute_dtype(x)
  x = x.astype(compute)
  if weights is None:
    ave = jnp.mean(x, axis=-2)
  else:
    ave = jnp.einsum('...mn,...nd->...md', weights.astype(compute), x)
  denom = jnp.sqrt(_clamp(jnp.abs(-minkowski_inner(ave, ave, keepdims=True)), lo=MID_POINT_MIN))
  return (ave / denom).astype(dtype)


# ------------------------------------------------------------------------------ layers


def clamp_max_zero(alpha: jax.Array) -> jax.Array:
  """`min(alpha, 0)` with gradient 1 everywhere: the official forward clamps the stored
  parameter in place (`scale_alpha.data = clamp(., max=0)`), then differentiates through the
  clamped value. The stored value itself is clamped after each update by the optimiser
  (`ModelSpec.bounds`), which gives the same trajectory."""
  return alpha + jax.lax.stop_gradient(jnp.minimum(alpha, 0.0) - alpha)


class LorentzLinear(nn.Module):
  """onmt `LorentzLinear` (no bias, as the official layers are built), split into heads:
  `[..., Din] -> [..., num_heads, features / num_heads]` points on the `k` hyperboloid.

  Each head `h = (h_0, h_s)` of `dropout(x) W` becomes `(t, h_s sqrt((t^2 - k) / |h_s|^2))`
  with `t = sigmoid(h_0) exp(scale) + 1.1` (`scale` learnable, init 2.3). `|h_s|^2` has no
  epsilon in the official code (an all-zero head gives NaN there and here).
  """
  features: int
  num_heads: int
  dropout_rate: float = 0.0
  k: float = 1.0

  @nn.compact
  def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
    x = nn.Dropout(self.dropout_rate)(x, deterministic=deterministic)
    x = dense(self.features, 'dense', use_bias=False)(x)
    x = x.reshape(x.shape[:-1] + (self.num_heads, self.features // self.num_heads))
    scale = self.param('scale', nn.initializers.constant(LINEAR_SCALE_INIT), ())
    space = x[..., 1:]
    time = jax.nn.sigmoid(x[..., :1]) * jnp.exp(scale) + TIME_OFFSET
    factor = (time * time - self.k) / _sum_sq(space)
    return jnp.concatenate([time, space * jnp.sqrt(factor)], axis=-1)


class LorentzMultiHeadAttention(nn.Module):
  """onmt `LorentzMultiHeadedAttention` (self-attention form used by HLFormer): points
  `[B, L, D+1]` -> per-head Lorentzian centroids concatenated `[B, L, D+1]`.

  Scores `(2 + 2 <q, k>_L) / scale + bias` (`scale` init `sqrt(D+1)`, `bias` init 0), times
  GMMFormer's Gaussian window of `width` (None: none) before the key mask (`-1e18`), softmax,
  then `mid_point` of the values. The official attention-probability dropout is built but
  never applied; only the projections' input dropout is.
  """
  num_heads: int
  dropout_rate: float = 0.0
  width: float | None = None
  k: float = 1.0

  @nn.compact
  def __call__(self, x: jax.Array, key_mask: jax.Array | None = None,
               deterministic: bool = True) -> jax.Array:
    model_dim = x.shape[-1]
    if model_dim % self.num_heads:
      raise ValueError(f'Lorentz model width {model_dim} (lorentz_dim + 1) is not divisible by '
                       f'num_heads={self.num_heads} (config.model.num_heads)')
    project_heads = lambda name: LorentzLinear(  # pylint: disable=g-long-lambda
        model_dim, self.num_heads, self.dropout_rate, self.k, name=name)(x, deterministic)
    keys = project_heads('linear_keys')
    values = project_heads('linear_values')
    queries = project_heads('linear_query')
    keys, values, queries = (jnp.swapaxes(t, -3, -2) for t in (keys, values, queries))
    scale = self.param('scale', nn.initializers.constant(math.sqrt(model_dim)), (1,))
    bias = self.param('bias', nn.initializers.zeros, ())
    scores = (2 + 2 * cinner(queries, keys)) / scale + bias  # [B, H, L, L]
    if self.width is not None:
      scores = scores * constraint_window('gaussian', self.width, scores.shape[-1])
    if key_mask is not None:
      key_mask = key_mask[:, None, None, :] if key_mask.ndim == 2 else key_mask[:, None]
      scores = jnp.where(key_mask > 0, scores, MASKED_LOGIT)
    probs = jax.nn.softmax(scores, axis=-1)
    context = mid_point(values, probs)  # [B, H, L, D/H]
    context = jnp.swapaxes(context, -3, -2)
    return context.reshape(context.shape[:-2] + (model_dim,))


class LorentzSelfAttention(nn.Module):
  """Official `LorentzSelfAttention`: `[B, L, D] -> [B, L, D]`.

  LayerNorm-Dropout-Linear-ReLU to `lorentz_dim`, times `exp(min(scale_alpha, 0))`
  (`scale_alpha` init `log(lorentz_dim ** -0.5)`), a zero time part prepended, `expmap0`,
  `LorentzMultiHeadAttention`, `logmap0`'s space part, divided by the same factor,
  LayerNorm-Dropout-Linear-ReLU back to D.
  """
  lorentz_dim: int
  num_heads: int
  dropout_rate: float = 0.0
  width: float | None = None
  k: float = 1.0

  @nn.compact
  def __call__(self, x: jax.Array, key_mask: jax.Array | None = None,
               deterministic: bool = True) -> jax.Array:
    width = x.shape[-1]
    x = InputProjection(self.lorentz_dim, self.dropout_rate, name='input_proj')(x, deterministic)
    alpha = self.param('scale_alpha', nn.initializers.constant(
        math.log(self.lorentz_dim**-0.5)), ())
    factor = jnp.exp(clamp_max_zero(alpha))
    x = x * factor
    x = jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(1, 0)])
    x = expmap0(x, self.k)
    x = LorentzMultiHeadAttention(self.num_heads, self.dropout_rate, self.width, self.k,
                                  name='lorentz_attention')(x, key_mask, deterministic)
    x = logmap0(x, self.k)[..., 1:] / factor
    return InputProjection(width, self.dropout_rate, name='output_proj')(x, deterministic)


class LorentzAttentionBlock(nn.Module):
  """Official `LorentzAttentionBlock`: `LorentzSelfAttention` -> dropout -> LayerNorm(x + .)
  -> FFN(4 D, ReLU) -> dropout -> LayerNorm(x + .): `[B, L, D], key_mask [B, L] -> [B, L, D]`.

  `width`: the Gaussian window's width (HLFormer's blocks use None, 2, 4, 8). `dropout_rate`
  is the official `config.drop` (every dropout of the block).
  """
  lorentz_dim: int
  num_heads: int
  dropout_rate: float = 0.0
  width: float | None = None
  k: float = 1.0

  @nn.compact
  def __call__(self, x: jax.Array, key_mask: jax.Array | None = None,
               deterministic: bool = True) -> jax.Array:
    drop = lambda y: nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)
    y = LorentzSelfAttention(self.lorentz_dim, self.num_heads, self.dropout_rate, self.width,
                             self.k, name='attention')(x, key_mask, deterministic)
    x = layer_norm('norm1')(x + drop(y))
    y = dense(4 * x.shape[-1], 'ffn_in')(x)
    y = dense(x.shape[-1], 'ffn_out')(drop(nn.relu(y)))
    return layer_norm('norm2')(x + drop(y))


# Official name (relative to a `LorentzAttentionBlock`, e.g. under
# `clip_encoder.h_attns.<i>.`) -> our parameter path; `T`: a Linear weight, transposed to a
# Dense kernel. The manifold's `k` (`*.manifold.k`, a frozen parameter = 1.0) has no
# counterpart: it is the constant `k` attribute.
OFFICIAL_BLOCK_PARAMS: tuple[tuple[str, str, bool], ...] = (
    ('self.input_proj.LayerNorm.weight', 'attention/input_proj/norm/scale', False),
    ('self.input_proj.LayerNorm.bias', 'attention/input_proj/norm/bias', False),
    ('self.input_proj.net.1.weight', 'attention/input_proj/dense/kernel', True),
    ('self.input_proj.net.1.bias', 'attention/input_proj/dense/bias', False),
    ('self.scale_alpha', 'attention/scale_alpha', False),
    *((f'self.lorentz_multiattention.linear_{n}.weight.weight',
       f'attention/lorentz_attention/linear_{n}/dense/kernel', True)
      for n in ('keys', 'values', 'query')),
    *((f'self.lorentz_multiattention.linear_{n}.scale',
       f'attention/lorentz_attention/linear_{n}/scale', False)
      for n in ('keys', 'values', 'query')),
    ('self.lorentz_multiattention.scale', 'attention/lorentz_attention/scale', False),
    ('self.lorentz_multiattention.bias', 'attention/lorentz_attention/bias', False),
    ('self.output_proj.LayerNorm.weight', 'attention/output_proj/norm/scale', False),
    ('self.output_proj.LayerNorm.bias', 'attention/output_proj/norm/bias', False),
    ('self.output_proj.net.1.weight', 'attention/output_proj/dense/kernel', True),
    ('self.output_proj.net.1.bias', 'attention/output_proj/dense/bias', False),
    ('output.layer1.weight', 'ffn_in/kernel', True),
    ('output.layer1.bias', 'ffn_in/bias', False),
    ('output.layer2.weight', 'ffn_out/kernel', True),
    ('output.layer2.bias', 'ffn_out/bias', False),
    ('norm1.weight', 'norm1/scale', False),
    ('norm1.bias', 'norm1/bias', False),
    ('norm2.weight', 'norm2/scale', False),
    ('norm2.bias', 'norm2/bias', False),
)


def block_params_from_official(state: Mapping[str, np.ndarray], prefix: str = '',
                               k: float = 1.0) -> dict:
  """A `LorentzAttentionBlock`'s params from an official state dict (arrays keyed by
  `prefix + name`, e.g. prefix `clip_encoder.h_attns.1.`).

  Raises ValueError naming the key when one is missing, or a `manifold.k` under `prefix`
  differs from `k`.
  """
  params: dict = {}
  for name, path, transpose in OFFICIAL_BLOCK_PARAMS:
    key = prefix + name
    if key not in state:
      raise ValueError(f'official Lorentz block parameter missing: {key}')
    value = np.asarray(state[key], np.float32)
    node = params
    *parents, leaf = path.split('/')
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = jnp.asarray(value.T if transpose else value)
  for key, value in state.items():
    if key.startswith(prefix) and key.endswith('manifold.k'):
      if not np.allclose(np.asarray(value, np.float64), k):
        raise ValueError(f'official manifold curvature {np.asarray(value)} != k={k}: {key}')
  return params
