"""The generic evaluator is leak-proof and layout-independent: ground truth by video key, ties by
key, the gallery sharded over devices; ranks equal a dense reference whatever the gallery order,
the chunk sizes, the device count, and with more, fewer or query-less videos."""

import jax
from jax.sharding import Mesh
import numpy as np
import pytest

from prvr_jax import metrics, models
from prvr_jax.eval import EvalSplit, Evaluator, text_to_video_ranks
from prvr_jax.models import registry
import support

# Per-video encodings (no batch dependence): GMMFormer v2.
MODEL = 'gmmformer_v2'


@pytest.fixture(scope='module')
def setup():
  config = support.load_config(MODEL, 'tiny')
  spec = registry.get_spec(config.model)
  params = jax.jit(lambda key: spec.init_params(config.model, key))(jax.random.key(3))
  return config, spec, params


def _items(config, num_videos, ground_truth, seed=0):
  """Videos (random lengths) and queries of ground-truth keys `ground_truth`."""
  rng = np.random.default_rng(seed)
  frames = tuple(rng.integers(1, config.model.max_frames + 1, size=num_videos))
  queries = tuple(rng.integers(1, config.model.max_query_len + 1, size=len(ground_truth)))
  videos = models.random_batch(config.model, rng, frames, (1,) * num_videos)
  texts = models.random_batch(config.model, rng, (1,) * len(ground_truth), queries)
  return ({k: videos[k] for k in ('clip_feats', 'frame_feats', 'frame_mask')},
          {k: texts[k] for k in ('query_feats', 'query_mask')},
          np.asarray(ground_truth, np.int64))


def _split(videos, queries, ground_truth, video_chunk, query_chunk, order=None):
  """An EvalSplit over these items; `order`: the gallery's video keys in batch order."""
  num_videos, num_queries = len(videos['clip_feats']), len(ground_truth)
  order = np.arange(num_videos) if order is None else np.asarray(order)

  def video_batches():
    for start in range(0, num_videos, video_chunk):
      keys = order[start:start + video_chunk]
      yield {**{k: v[keys] for k, v in videos.items()}, 'video_index': keys}

  def query_batches():
    for start in range(0, num_queries, query_chunk):
      rows = np.arange(start, min(start + query_chunk, num_queries))
      yield {**{k: v[rows] for k, v in queries.items()}, 'query_index': rows,
             'query_video_index': ground_truth[rows]}

  return EvalSplit(video_batches, query_batches, [f'v{i}' for i in range(num_videos)],
                   [f'q{i}' for i in range(num_queries)])


def _reference(setup, videos, queries):
  """Dense scores [Nq, Nv] of one direct call per encoder (no evaluator)."""
  config, spec, params = setup
  module = spec.build(config.model)

  @jax.jit
  def dense(params):
    stored = module.apply({'params': params}, videos, method='encode_videos')
    encoded = module.apply({'params': params}, queries, method='encode_queries')
    return module.apply({'params': params}, encoded, stored, method='score')
  return np.asarray(dense(params))


def _evaluate(setup, split, video_chunk, query_chunk, devices=None):
  config, _, params = setup
  mesh = support.data_mesh(devices) if devices else None
  evaluator = Evaluator(config.model, mesh or Mesh(np.array(jax.devices()), ('data',)),
                        video_chunk, query_chunk)
  return evaluator.evaluate(params, split)


def _assert_no_near_ties(scores):
  """The reference ranks (both directions) do not hang on a near-tie that another CPU could
  round the other way: scores of a row or of a column differ by far more than the score
  tolerance (1e-5 of O(1) cosines)."""
  for matrix in (scores, scores.T):
    assert np.diff(np.sort(matrix, axis=1), axis=1).min() > 1e-4


@pytest.mark.parametrize('num_videos,ground_truth', [
    (11, [3, 0, 3, 7, 10, 1, 3]),        # more videos than queries; videos without a query
    (3, [0, 2, 2, 1, 0, 2, 1, 1]),       # fewer videos than queries
])
def test_ranks_equal_dense_reference_in_any_layout(setup, num_videos, ground_truth):
  videos, queries, gt = _items(setup[0], num_videos, ground_truth)
  reference = _reference(setup, videos, queries)
  _assert_no_near_ties(reference)
  expected = metrics.text_to_video_ranks(reference, gt)
  expected_metrics = metrics.retrieval_metrics(reference, gt)
  shuffled = np.random.default_rng(1).permutation(num_videos)
  layouts = [dict(video_chunk=4, query_chunk=3), dict(video_chunk=num_videos, query_chunk=8),
             dict(video_chunk=2, query_chunk=5, order=shuffled),
             dict(video_chunk=4, query_chunk=3, order=shuffled[::-1], devices=1)]
  for layout in layouts:
    devices = layout.pop('devices', None)
    split = _split(videos, queries, gt, **layout)
    result = _evaluate(setup, split, layout['video_chunk'], layout['query_chunk'], devices)
    np.testing.assert_array_equal(result.ranks, expected, err_msg=str(layout))
    # Scores are O(1) cosines; the layouts change only how rows are batched.
    support.assert_close(result.scores, reference, rtol=1e-5)
    assert result.metrics == expected_metrics


def test_device_ranks_follow_the_tie_rule_in_any_gallery_order():
  rng = np.random.default_rng(0)
  scores = rng.integers(0, 4, size=(40, 9)).astype(np.float32)  # many exact ties
  gt = rng.integers(0, 9, size=40)
  expected = metrics.text_to_video_ranks(scores, gt)
  for order in (np.arange(9), rng.permutation(9)):
    keys = np.concatenate([order, [-1, -1, -1]])  # padding columns are ignored
    padded = np.concatenate([scores[:, order], np.full((40, 3), 9.0, np.float32)], axis=1)
    ranks, gt_count, bad = jax.jit(text_to_video_ranks)(padded, keys, gt)
    np.testing.assert_array_equal(ranks, expected)
    assert (np.asarray(gt_count) == 1).all() and not np.asarray(bad).any()


def test_malformed_galleries_and_scores_are_refused(setup):
  config, _, params = setup
  videos, queries, gt = _items(config, 5, [0, 1, 4])
  mesh = Mesh(np.array(jax.devices()), ('data',))
  evaluator = Evaluator(config.model, mesh, 3, 2)
  with pytest.raises(ValueError, match='not each of the 5 videos'):
    evaluator.evaluate(params, _split(videos, queries, gt, 3, 2, order=[0, 1, 2, 2, 4]))
  missing = r"Query 'q2' \(key 2\): its ground-truth video \(key 5\) is not in the gallery"
  with pytest.raises(ValueError, match=missing):
    evaluator.evaluate(params, _split(videos, queries, np.array([0, 1, 5]), 3, 2))
  bad = jax.tree.map(lambda p: p * np.nan, params)
  with pytest.raises(ValueError, match="Query 'q0'.*NaN or infinite"):
    evaluator.evaluate(bad, _split(videos, queries, gt, 3, 2))


def test_batch_dependent_encodings_keep_official_chunks():
  """GMMFormer's frame windows follow each chunk's longest video, so its gallery must be the
  official chunks: consecutive videos in first-appearance order."""
  config = support.load_config('gmmformer', 'tiny')
  spec = registry.get_spec(config.model)
  params = jax.jit(lambda key: spec.init_params(config.model, key))(jax.random.key(0))
  videos, queries, gt = _items(config, 6, [0, 5, 2])
  evaluator = Evaluator(config.model, Mesh(np.array(jax.devices()), ('data',)), 3, 2)
  evaluator.evaluate(params, _split(videos, queries, gt, 3, 2))
  with pytest.raises(ValueError, match='official chunks'):
    evaluator.evaluate(params, _split(videos, queries, gt, 3, 2, order=[3, 4, 5, 0, 1, 2]))
