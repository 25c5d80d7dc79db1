"""Relational knowledge distillation (`losses.relational`, MSC-PRVR's text correlation
preservation): float64 numpy references of the official RkdDistance / RKdAngle, padding
invariance, no gradient to the teacher. The official values are compared in
tests/models/test_msc_prvr.py."""

import jax
import numpy as np

from prvr_jax.losses import relational


def _smooth_l1(d):
  return np.where(np.abs(d) < 1, 0.5 * d * d, np.abs(d) - 0.5)


def _reference(student, teacher):
  def dist(e):
    sq = (e * e).sum(1)
    d = np.sqrt(np.maximum(sq[:, None] + sq[None] - 2 * e @ e.T, 1e-12))
    np.fill_diagonal(d, 0)
    return d / d[d > 0].mean()

  def angle(e):
    diff = e[None] - e[:, None]
    norm = np.maximum(np.linalg.norm(diff, axis=2, keepdims=True), 1e-12)
    unit = diff / norm
    return np.einsum('ijd,ikd->ijk', unit, unit)

  return (_smooth_l1(dist(student) - dist(teacher)).mean(),
          _smooth_l1(angle(student) - angle(teacher)).mean())


@jax.jit
def _terms(student, teacher, valid):
  return (relational.rkd_distance(student, teacher, valid),
          relational.rkd_angle(student, teacher, valid))


_grads = jax.jit(jax.grad(lambda s, t, v: sum(_terms(s, t, v)), argnums=(0, 1)))


def test_rkd_terms_equal_the_reference_ignore_padding_and_spare_the_teacher():
  rng = np.random.default_rng(0)
  student = rng.standard_normal((6, 5)).astype(np.float32)
  teacher = rng.standard_normal((6, 7)).astype(np.float32)
  valid = np.ones(6, bool)
  expected = _reference(student.astype(np.float64), teacher.astype(np.float64))
  np.testing.assert_allclose(_terms(student, teacher, valid), expected, rtol=2e-6)
  padded = lambda x: np.concatenate([x, rng.standard_normal((2, x.shape[1]))]).astype(np.float32)
  mask = np.r_[valid, False, False]
  np.testing.assert_allclose(_terms(padded(student), padded(teacher), mask), expected,
                             rtol=2e-6)
  grads = _grads(student, teacher, valid)
  assert np.all(np.isfinite(grads[0])) and np.any(grads[0] != 0)
  assert not np.any(grads[1])
  # Equal rows (a repeated query): no NaN through the clamped distance or the zero angle.
  same = np.concatenate([np.repeat(student[:1], 3, axis=0), student[3:]])
  assert all(np.all(np.isfinite(g)) for g in _grads(same, teacher, valid))
