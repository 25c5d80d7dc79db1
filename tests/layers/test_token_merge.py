"""Order-preserving token merging (`layers.token_merge`, MSC-PRVR): plain-numpy references of
the official rules (neighbour pairs by dot product; greedy bipartite pairs by cosine), the
frame labels and sizes they carry, the resampling to a fixed length, and the attention key
bias the merged sizes enter through. The official outputs themselves are compared in
tests/models/test_msc_prvr.py."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prvr_jax.layers import token_merge as tm
from prvr_jax.layers.attention import MultiHeadAttention


def _reference_adjacent(x, sizes, labels, target):
  """The official loader's rule, written out: pairs (2i, 2i+1), the largest dot products."""
  num = len(x)
  sim = (x[0::2] * x[1::2]).sum(-1)
  chosen = set(np.argsort(-sim, kind='stable')[:num - target].tolist())
  out, out_sizes, where = [], [], {}
  for i in range(num // 2):
    if i in chosen:
      w1, w2 = sizes[2 * i], sizes[2 * i + 1]
      where[2 * i] = where[2 * i + 1] = len(out)
      out.append((x[2 * i] * w1 + x[2 * i + 1] * w2) / (w1 + w2)); out_sizes.append(w1 + w2)
    else:
      for j in (2 * i, 2 * i + 1):
        where[j] = len(out); out.append(x[j]); out_sizes.append(sizes[j])
  return np.stack(out), np.array(out_sizes), np.array([where[int(l)] for l in labels])


def _reference_bipartite(x, metric, sizes, labels, target):
  """ToMe's greedy matching as the official loss writes it: every (A, B) pair sorted by
  cosine (stable, descending), taken when both are unused; the merged token at A's place."""
  unit = metric / np.linalg.norm(metric, axis=-1, keepdims=True)
  sim = unit[0::2] @ unit[1::2].T
  candidates = sorted(((float(sim[a, b]), a, b) for a in range(len(sim))
                       for b in range(len(sim))), key=lambda c: c[0], reverse=True)
  pairs, used_a, used_b = {}, set(), set()
  for _, a, b in candidates:
    if len(pairs) == len(x) - target:
      break
    if a not in used_a and b not in used_b:
      pairs[2 * a] = 2 * b + 1; used_a.add(a); used_b.add(b)
  merged_b = set(pairs.values())
  out, out_metric, out_sizes, where = [], [], [], {}
  for i in range(len(x)):
    if i in pairs:
      j, w1, w2 = pairs[i], sizes[i], sizes[pairs[i]]
      where[i] = where[j] = len(out)
      out.append((x[i] * w1 + x[j] * w2) / (w1 + w2))
      out_metric.append((metric[i] * w1 + metric[j] * w2) / (w1 + w2))
      out_sizes.append(w1 + w2)
    elif i not in merged_b:
      where[i] = len(out); out.append(x[i]); out_metric.append(metric[i])
      out_sizes.append(sizes[i])
  return (np.stack(out), np.stack(out_metric), np.array(out_sizes),
          np.array([where[int(l)] for l in labels]))


@pytest.fixture(scope='module')
def merges():
  return (jax.jit(tm.merge_adjacent_pairs, static_argnums=3),
          jax.jit(tm.merge_bipartite, static_argnums=4))


@pytest.mark.parametrize('num,target', [(16, 10), (16, 8), (10, 7)])
def test_both_merges_equal_their_references(merges, num, target):
  adjacent, bipartite = merges
  rng = np.random.default_rng(num * 100 + target)
  x = rng.standard_normal((num, 6)).astype(np.float32)
  metric = rng.standard_normal((num, 5)).astype(np.float32)
  sizes = rng.integers(1, 5, num).astype(np.float32)
  labels = np.sort(rng.integers(0, num, 40)).astype(np.int32)
  ours = adjacent(x, sizes, labels, target)
  expected = _reference_adjacent(x, sizes, labels, target)
  np.testing.assert_allclose(ours[0], expected[0], rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(ours[1], expected[1])
  np.testing.assert_array_equal(ours[2], expected[2])
  ours = bipartite(x, metric, sizes, labels, target)
  expected = _reference_bipartite(x, metric, sizes, labels, target)
  for got, want in zip(ours[:2], expected[:2]):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
  np.testing.assert_array_equal(ours[2], expected[2])
  np.testing.assert_array_equal(ours[3], expected[3])
  assert ours[2].sum() == sizes.sum()  # every frame stays in exactly one token


def test_unmerged_tokens_pass_bit_for_bit_and_bad_counts_name_the_target():
  x = np.arange(12, dtype=np.float32).reshape(4, 3) / 7
  tokens, sizes, labels = tm.merge_adjacent_pairs(x, np.array([3., 1, 1, 1]), np.arange(4), 4)
  np.testing.assert_array_equal(tokens, x)
  np.testing.assert_array_equal(labels, np.arange(4))
  with pytest.raises(ValueError, match='into 1 by neighbour pairs'):
    tm.merge_adjacent_pairs(x, np.ones(4), np.arange(4), 1)
  with pytest.raises(ValueError, match='5 tokens into 4 by bipartite'):
    tm.merge_bipartite(x[:1].repeat(5, 0), x[:1].repeat(5, 0), np.ones(5), np.arange(5), 4)


def test_merge_frames_cascade_keeps_the_order_of_the_frames():
  """Neighbour merging keeps every token's frames contiguous and in time order."""
  frames = np.random.default_rng(1).standard_normal((128, 8)).astype(np.float32)
  tokens, sizes, labels = jax.jit(functools.partial(tm.merge_frames, targets=(80, 52, 32)))(
      frames)
  assert tokens.shape == (32, 8)
  assert np.all(np.diff(np.asarray(labels)) >= 0) and set(np.asarray(labels)) == set(range(32))
  np.testing.assert_array_equal(np.bincount(np.asarray(labels), minlength=32), sizes)


def test_resample_frames_repeats_a_short_video_as_the_official_averaging():
  """A video of n <= L frames resampled to L: row k is frame min(round(k n / L), n - 1)."""
  frames = np.arange(16 * 2, dtype=np.float32).reshape(16, 2)
  for n in (16, 7, 1):
    mask = (np.arange(16) < n).astype(np.float32)
    out = tm.resample_frames(jnp.asarray(np.where(mask[:, None] > 0, frames, 0)), mask)
    index = np.minimum(np.round(np.arange(16) / 16 * n), n - 1).astype(int)
    np.testing.assert_array_equal(out, frames[index])


def test_key_bias_adds_log_sizes_before_the_softmax():
  """A key bias of log(size) weights each key's probability by its size (proportional
  attention): a token of size 2 counts as two copies of itself."""
  rng = np.random.default_rng(3)
  x = rng.standard_normal((1, 3, 8)).astype(np.float32)
  layer = MultiHeadAttention(num_heads=2)
  params = layer.init(jax.random.key(0), x, x)
  merged = layer.apply(params, x, x, key_bias=jnp.log(jnp.array([[2.0, 1.0, 1.0]])))
  copies = np.concatenate([x[:, :1], x], axis=1)
  expanded = layer.apply(params, x, copies)
  np.testing.assert_allclose(merged, expanded, rtol=1e-5, atol=1e-6)
