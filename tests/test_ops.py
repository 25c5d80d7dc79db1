"""ops: the cosine and raw-dot similarities of one query set against item sets."""

import jax
import jax.numpy as jnp
import numpy as np

from prvr_jax import ops
import support


def _queries_and_items():
  rng = np.random.default_rng(0)
  queries = rng.normal(size=(6, 16)).astype(np.float32)
  items = rng.normal(size=(4, 5, 16)).astype(np.float32)
  items[1, 3:] = 0.0  # padded items: cosine 0, as the official code scores them
  return queries, items


def test_cosines_and_dots_from_one_product_equal_the_separate_similarities():
  queries, items = _queries_and_items()
  cosines, dots = ops.set_cosines_and_dots(queries, items)
  support.assert_close(cosines, ops.set_similarities(queries, items, cosine=True),
                       support.f32_rtol(16, ops=3))
  support.assert_close(dots, ops.set_similarities(queries, items, cosine=False),
                       support.f32_rtol(16))
  np.testing.assert_array_equal(cosines[:, 1, 3:], 0.0)
  best_cosines, best_dots = ops.max_similarities(queries, items)
  support.assert_close(best_cosines, ops.max_similarity(queries, items, cosine=True),
                       support.f32_rtol(16, ops=3))
  support.assert_close(best_dots, ops.max_similarity(queries, items, cosine=False),
                       support.f32_rtol(16))


def _dot_count(fn, *args) -> int:
  equations = support.all_equations(jax.make_jaxpr(fn)(*args).jaxpr)
  return sum(eqn.primitive.name == 'dot_general' for eqn in equations)


def test_both_maxima_and_their_gradients_take_one_product_and_its_two_gradients():
  queries, items = _queries_and_items()
  shared = lambda q, v: sum(jnp.sum(m) for m in ops.max_similarities(q, v))
  separate = lambda q, v: (jnp.sum(ops.max_similarity(q, v, cosine=True))
                           + jnp.sum(ops.max_similarity(q, v, cosine=False)))
  grad = lambda fn: jax.grad(fn, argnums=(0, 1))
  assert _dot_count(grad(shared), queries, items) == 3
  assert _dot_count(grad(separate), queries, items) == 6
  for ours, theirs in zip(grad(shared)(queries, items), grad(separate)(queries, items)):
    assert np.all(np.isfinite(ours))
    support.assert_close(ours, theirs, support.f32_rtol(16, ops=4))
