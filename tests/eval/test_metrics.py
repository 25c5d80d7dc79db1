"""Ranks, R@K, SumR and M/V groups on hand-made score matrices."""

import numpy as np
import pytest

from prvr_jax import metrics


def _brute_force_ranks(scores, positives):
  """Rank = 1 + position in a stable sort by (-score, column); min over positives."""
  out = []
  for s, pos in zip(scores, positives):
    order = sorted(range(len(s)), key=lambda j: (-s[j], j))
    out.append(1 + min(order.index(j) for j in np.flatnonzero(pos)))
  return np.array(out)


def test_ranks_hand_made():
  scores = np.array([[0.9, 0.5, 0.1],
                     [0.4, 0.3, 0.1],
                     [0.1, 0.2, 0.3]])
  positives = np.eye(3, dtype=bool)
  np.testing.assert_array_equal(metrics.ranks(scores, positives), [1, 2, 1])


def test_ties_break_by_column():
  scores = np.array([[0.5, 0.5, 0.5, 0.1],
                     [0.5, 0.5, 0.5, 0.1],
                     [0.5, 0.5, 0.5, 0.1],
                     [0.5, 0.5, 0.5, 0.5]])
  positives = np.eye(4, dtype=bool)
  # Equal scores: lower column first, so the GT in column j ranks j+1.
  np.testing.assert_array_equal(metrics.ranks(scores, positives), [1, 2, 3, 4])


def test_multiple_ground_truths_take_best():
  scores = np.array([[0.1, 0.9, 0.8, 0.7],
                     [0.4, 0.4, 0.9, 0.4]])
  positives = np.array([[True, False, False, True],
                        [False, True, False, True]])
  # Row 0: GT 3 at rank 3 beats GT 0 at rank 4. Row 1: tie of GTs 1 and 3 -> column 1,
  # behind column 2 (higher) and column 0 (equal, lower column) -> rank 3.
  np.testing.assert_array_equal(metrics.ranks(scores, positives), [3, 3])


def test_ranks_match_brute_force_with_many_ties():
  rng = np.random.default_rng(0)
  scores = rng.integers(0, 4, size=(50, 17)).astype(np.float32)  # heavy ties
  positives = rng.random((50, 17)) < 0.15
  positives[np.arange(50), rng.integers(0, 17, 50)] = True
  np.testing.assert_array_equal(metrics.ranks(scores, positives),
                                _brute_force_ranks(scores, positives))


def test_ranks_chunking(monkeypatch):
  monkeypatch.setattr(metrics, '_ROW_CHUNK', 3)
  rng = np.random.default_rng(1)
  scores = rng.normal(size=(10, 6))
  positives = np.eye(10, 6, dtype=bool) | (np.arange(6)[None] == 5)
  np.testing.assert_array_equal(metrics.ranks(scores, positives),
                                _brute_force_ranks(scores, positives))


def test_recalls_official_formula():
  out = metrics.recalls(np.array([1, 2, 6, 11, 101, 100]))
  assert out['r1'] == pytest.approx(100 / 6)
  assert out['r5'] == pytest.approx(200 / 6)
  assert out['r10'] == pytest.approx(300 / 6)
  assert out['r100'] == pytest.approx(500 / 6)
  assert out['sumr'] == pytest.approx(1100 / 6)


def test_retrieval_metrics_t2v_v2t_and_groups():
  # 4 queries over 3 videos; query_video = GT column.
  scores = np.array([[0.9, 0.1, 0.0],    # q0 -> v0 rank 1
                     [0.9, 0.2, 0.0],    # q1 -> v1 rank 2
                     [0.1, 0.2, 0.3],    # q2 -> v2 rank 1
                     [0.3, 0.3, 0.3]])   # q3 -> v2 rank 3 (ties by column)
  query_video = np.array([0, 1, 2, 2])
  out = metrics.retrieval_metrics(scores, query_video,
                                  moment_ratio=np.array([0.1, 0.3, 0.6, np.nan]))
  assert out['r1'] == 50.0 and out['r5'] == 100.0 and out['sumr'] == 350.0
  # v2t (columns): v0 GT q0 rank 1; v1 [.1,.2,.2,.3] GT q1 behind q3 only (ties with
  # q2 but has the lower row) -> rank 2; v2 [0,0,.3,.3] GT q2 rank 1.
  assert out['v2t_r1'] == pytest.approx(200 / 3)
  assert out['v2t_r5'] == 100.0
  assert out['num_queries'] == 4 and out['num_videos'] == 3
  assert out['mv_0_0.25_count'] == 1 and out['mv_0_0.25_sumr'] == 400.0
  assert out['mv_0.25_0.5_count'] == 1 and out['mv_0.25_0.5_sumr'] == 300.0
  assert out['mv_0.5_1_count'] == 1 and out['mv_0.5_1_sumr'] == 400.0
  empty = metrics.retrieval_metrics(scores, query_video, np.full(4, 0.1))
  assert empty['mv_0.5_1_count'] == 0 and 'mv_0.5_1_sumr' not in empty


def test_bad_inputs_raise():
  with pytest.raises(ValueError, match='NaN'):
    metrics.ranks(np.array([[np.nan, 1.0]]), np.array([[True, False]]))
  # Infinite scores are as broken as NaN: an all-inf matrix must not report SumR 333.3.
  for value in (np.inf, -np.inf):
    with pytest.raises(ValueError, match=r'4 non-finite values .* row 0, column 0'):
      metrics.retrieval_metrics(np.full((2, 2), value), np.array([0, 1]))
  with pytest.raises(ValueError, match='no ground-truth'):
    metrics.ranks(np.array([[0.0, 1.0]]), np.array([[False, False]]))
  with pytest.raises(ValueError, match='query_video'):
    metrics.retrieval_metrics(np.zeros((2, 2)), np.array([0, 2]))
