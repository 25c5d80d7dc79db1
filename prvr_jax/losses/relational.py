"""Relational knowledge distillation (Park et al., CVPR 2019) over a batch of vectors.

MSC-PRVR's text correlation preservation: the pooled query encodings (student) keep the
pairwise distances and the angles of the frozen CLIP sentence vectors (teacher, no gradient).
Both terms are smooth-L1 (beta 1) means over the valid rows: `valid [N]` masks padding, the
means run over the valid pairs / triples, as the official code's over a batch without padding.
"""

import jax
import jax.numpy as jnp

from prvr_jax.ops import l2_normalize

# The official `pdist` clamps squared distances at this value before the square root.
PDIST_EPS = 1e-12


def _smooth_l1(diff: jax.Array) -> jax.Array:
  magnitude = jnp.abs(diff)
  return jnp.where(magnitude < 1.0, 0.5 * diff * diff, magnitude - 0.5)


def pairwise_distances(x: jax.Array) -> jax.Array:
  """`[N, D] -> [N, N]` Euclidean distances, `sqrt(max(|a|^2 + |b|^2 - 2 a.b, 1e-12))`, 0 on
  the diagonal (the official `pdist(e, squared=False)`)."""
  squared = jnp.sum(x * x, axis=-1)
  distance = jnp.sqrt(jnp.maximum(squared[:, None] + squared[None, :] - 2.0 * (x @ x.T),
                                  PDIST_EPS))
  return jnp.where(jnp.eye(x.shape[0], dtype=bool), 0.0, distance)


def _normalised_distances(x: jax.Array, pairs: jax.Array) -> jax.Array:
  """Distances divided by their mean over the valid pairs with a positive distance."""
  distance = pairwise_distances(x)
  positive = pairs & (distance > 0)
  mean = jnp.sum(jnp.where(positive, distance, 0.0)) / jnp.maximum(jnp.sum(positive), 1)
  return distance / mean


def rkd_distance(student: jax.Array, teacher: jax.Array, valid: jax.Array) -> jax.Array:
  """Distance-wise RKD: smooth-L1 between the mean-normalised pairwise distances of `student
  [N, D]` and `teacher [N, Dt]` (no gradient), mean over the valid pairs (diagonal included)."""
  pairs = valid[:, None] & valid[None, :]
  target = jax.lax.stop_gradient(_normalised_distances(teacher, pairs))
  loss = _smooth_l1(_normalised_distances(student, pairs) - target)
  return jnp.sum(jnp.where(pairs, loss, 0.0)) / jnp.maximum(jnp.sum(pairs), 1)


def _angles(x: jax.Array) -> jax.Array:
  """`[N, D] -> [N, N, N]`: cos of the angle at i between j and k, `<e_ij, e_ik>` with
  `e_ij = normalize(x_j - x_i)` (0 where j = i)."""
  directions = l2_normalize(x[None, :, :] - x[:, None, :])
  return jnp.einsum('ijd,ikd->ijk', directions, directions)


def rkd_angle(student: jax.Array, teacher: jax.Array, valid: jax.Array) -> jax.Array:
  """Angle-wise RKD: smooth-L1 between the angles of `student [N, D]` and `teacher [N, Dt]`
  (no gradient) over all triples, mean over the valid triples."""
  triples = valid[:, None, None] & valid[None, :, None] & valid[None, None, :]
  loss = _smooth_l1(_angles(student) - jax.lax.stop_gradient(_angles(teacher)))
  return jnp.sum(jnp.where(triples, loss, 0.0)) / jnp.maximum(jnp.sum(triples), 1)
