"""RAL's proxy matching and distribution alignment terms: float64 references written from the
official code, KL identities, padding invariance and finite gradients. Parity with the official
code itself on one batch: tests/layers/test_probabilistic.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import support
from prvr_jax.losses import ral

D, K = 8, 3
RTOL = support.f32_rtol(4 * K * D, ops=3)

proxy_matching = jax.jit(ral.proxy_matching_loss)
alignment = jax.jit(ral.distribution_alignment_loss)


def ref_mil_nce_bof(anchors, candidates):
  """Official MILNCELoss_BoF on `[B*Ka, B*Kc]` dot products: -mean over positives of the row's
  log-softmax, averaged over rows."""
  b, ka, _ = anchors.shape
  kc = candidates.shape[1]
  sim = anchors.reshape(b * ka, -1).astype(np.float64) @ candidates.reshape(b * kc, -1).T
  log_p = sim - sim.max(1, keepdims=True)
  log_p -= np.log(np.exp(log_p).sum(1, keepdims=True))
  positive = np.kron(np.eye(b), np.ones((ka, kc))).astype(bool)
  return np.mean([-log_p[i][positive[i]].mean() for i in range(b * ka)])


def _samples(seed, b, k=K, scale=1.0):
  return np.random.default_rng(seed).normal(scale=scale, size=(b, k, D)).astype(np.float32)


@pytest.mark.parametrize('b,kt', [(2, K), (5, K), (4, 5)])
def test_proxy_matching_matches_official_formula(b, kt):
  video, text = _samples(b, b), _samples(b + 10, b, kt)
  expected = 0.5 * (ref_mil_nce_bof(video, text) + ref_mil_nce_bof(text, video))
  support.assert_close(proxy_matching(video, text), expected, RTOL)


def test_proxy_matching_is_at_least_log_k_and_ignores_padding():
  video, text = _samples(1, 4, scale=2.0), _samples(2, 4, scale=2.0)
  loss = float(proxy_matching(video, text))
  assert loss >= np.log(K) - 1e-6  # -mean_j log p_j >= -log mean_j p_j >= log K
  padded_v = np.concatenate([video, np.full((2, K, D), 50.0, np.float32)])
  padded_t = np.concatenate([text, np.full((2, K, D), -50.0, np.float32)])
  valid = np.arange(6) < 4
  support.assert_close(proxy_matching(padded_v, padded_t, valid), loss, RTOL)


def test_kl_to_standard_normal_is_the_log_variance_kl():
  rng = np.random.default_rng(3)
  mu, logsigma = rng.normal(size=(2, 5, D)).astype(np.float32)
  var = np.exp(logsigma.astype(np.float64))
  textbook = 0.5 * (var + mu.astype(np.float64) ** 2 - 1.0 - np.log(var))
  got = ral.kl_to_standard_normal(mu, logsigma)
  support.assert_close(got, textbook, support.f32_rtol(1, ops=4))
  assert float(jnp.min(got)) >= 0.0
  np.testing.assert_array_equal(ral.kl_to_standard_normal(np.zeros(D), np.zeros(D)), 0.0)


def test_cross_modal_kl_is_the_gaussian_kl_with_std_exp_logsigma():
  rng = np.random.default_rng(4)
  mu_v, mu_t, ls_v, ls_t = rng.normal(size=(4, 5, D))
  got = ral.cross_modal_kl(*[x.astype(np.float32) for x in (mu_v, ls_v, mu_t, ls_t)])
  var_v, var_t = np.exp(2 * ls_v), np.exp(2 * ls_t)
  textbook = 0.5 * (np.log(var_v / var_t) + (var_t + (mu_t - mu_v) ** 2) / var_v - 1.0)
  support.assert_close(got, textbook, support.f32_rtol(1, ops=6))
  assert float(jnp.min(got)) >= -support.F32_EPS * 10
  same = ral.cross_modal_kl(mu_v, ls_v, mu_v, ls_v)
  support.assert_close(same, np.zeros_like(same), support.f32_rtol(1, ops=4), scale=1.0)


def test_distribution_alignment_sums_features_averages_valid_videos():
  rng = np.random.default_rng(5)
  mu_v, mu_t, ls_v, ls_t = rng.normal(scale=0.5, size=(4, 3, D)).astype(np.float32)
  expected = sum(np.mean(np.sum(np.asarray(t, np.float64), -1)) for t in (
      ral.kl_to_standard_normal(mu_v, ls_v), ral.kl_to_standard_normal(mu_t, ls_t),
      ral.cross_modal_kl(mu_v, ls_v, mu_t, ls_t)))
  support.assert_close(alignment(mu_v, ls_v, mu_t, ls_t), expected, RTOL)
  pad = lambda x: np.concatenate([x, np.full((2, D), 30.0, np.float32)])  # noqa: E731
  valid = np.arange(5) < 3
  support.assert_close(alignment(pad(mu_v), pad(ls_v), pad(mu_t), pad(ls_t), valid), expected,
                       RTOL)
  zero = alignment(*[np.zeros((3, D), np.float32)] * 4)
  assert float(zero) == 0.0


def test_ral_loss_weights_and_finite_gradients_at_extreme_logsigma():
  video, text = _samples(6, 3, scale=3.0), _samples(7, 3, scale=3.0)
  ls_v = np.full((3, D), -8.0, np.float32)
  ls_t = np.full((3, D), 8.0, np.float32)

  def total(*args):
    terms = ral.ral_loss(*args)
    return terms['proxy_matching'] + terms['distribution_alignment'], terms

  (value, terms), grads = jax.jit(jax.value_and_grad(total, (0, 1, 2, 3), has_aux=True))(
      video, ls_v, text, ls_t)
  support.assert_close(terms['proxy_matching'],
                       ral.PROXY_MATCHING_WEIGHT * proxy_matching(video, text), RTOL)
  support.assert_close(terms['distribution_alignment'], ral.DISTRIBUTION_ALIGNMENT_WEIGHT
                       * alignment(video.mean(1), ls_v, text.mean(1), ls_t), RTOL)
  assert np.isfinite(float(value))
  assert all(np.all(np.isfinite(g)) for g in grads)
