"""Dense multi-ground-truth evaluation: metric functions on hand-computed values (ties as the
single-GT evaluator breaks them), and the evaluator reporting both tables from one score
matrix, exported per query (docs/dense_eval.md)."""

import hashlib
import json
import math

import jax
from jax.sharding import Mesh
import ml_collections
import numpy as np
import pytest

from prvr_jax import config_lib, metrics, models
from prvr_jax.data import dense_gt
from prvr_jax.eval import EvalSplit, Evaluator, outputs, write_outputs
import support

# Row 0: column 0 first, then 4, then the tie 1 = 2 (column 1 first), then 3.
# Row 1: every score tied: columns in index order. Row 2: ascending scores.
SCORES = np.array([[0.9, 0.5, 0.5, 0.1, 0.7],
                   [0.3, 0.3, 0.3, 0.3, 0.3],
                   [0.1, 0.2, 0.3, 0.4, 0.5]], np.float32)
POSITIVES = np.array([[1, 2, 4], [3, 0, -1], [0, -1, -1]])


def _d(rank):  # the binary-gain discount of nDCG
  return 1 / math.log2(rank + 1)


def test_positive_ranks_and_metrics_hand_computed():
  rank = metrics.positive_ranks(SCORES, POSITIVES)
  np.testing.assert_array_equal(rank, [[3, 4, 2], [4, 1, 0], [5, 0, 0]])
  per_query = metrics.multi_positive_per_query(rank)
  np.testing.assert_array_equal(per_query['best_rank'], [2, 1, 5])
  ap = [(1 / 2 + 2 / 3 + 3 / 4) / 3, (1 / 1 + 2 / 4) / 2, 1 / 5]
  ndcg = [(_d(2) + _d(3) + _d(4)) / (_d(1) + _d(2) + _d(3)), (_d(1) + _d(4)) / (_d(1) + _d(2)),
          _d(5) / _d(1)]
  np.testing.assert_allclose(per_query['ap'], ap, rtol=1e-12)
  np.testing.assert_allclose(per_query['ndcg'], ndcg, rtol=1e-12)
  out = metrics.multi_positive_metrics(rank)
  expected = {'r1': 100 / 3, 'r5': 100.0, 'r10': 100.0, 'r100': 100.0,
              'cov_r1': 100 * (0 + 1 / 2 + 0) / 3, 'cov_r5': 100.0, 'cov_r10': 100.0,
              'cov_r100': 100.0, 'map': 100 * np.mean(ap), 'ndcg10': 100 * np.mean(ndcg),
              'medr': 2.0, 'meanr': 8 / 3, 'num_queries': 3}
  expected['sumr'] = expected['r1'] + 300
  expected['cov_sumr'] = expected['cov_r1'] + 300
  assert out.keys() == expected.keys()
  for key, value in expected.items():
    assert out[key] == pytest.approx(value, rel=1e-12), key
  # Row 0 with K = 3: two of its three positives in the top 3.
  assert metrics.multi_positive_metrics(rank[:1], ks=(3,))['cov_r3'] == pytest.approx(200 / 3)


def test_ranks_follow_the_single_gt_tie_rule_and_ndcg_caps_at_k():
  rng = np.random.default_rng(0)
  scores = rng.integers(0, 3, size=(40, 23)).astype(np.float32)  # heavy ties
  positives = np.full((40, 14), -1)
  for i in range(40):
    chosen = rng.choice(23, size=rng.integers(1, 15), replace=False)
    positives[i, :len(chosen)] = chosen
  rank = metrics.positive_ranks(scores, positives)
  mask = np.zeros(scores.shape, bool)
  rows = np.broadcast_to(np.arange(40)[:, None], positives.shape)
  mask[rows[positives >= 0], positives[positives >= 0]] = True
  # The best positive's rank is the single-GT evaluator's rank with these ground truths.
  np.testing.assert_array_equal(np.where(rank > 0, rank, 99).min(axis=1),
                                metrics.ranks(scores, mask))
  for i in range(40):  # every positive: its place in the stable (-score, column) order
    order = sorted(range(23), key=lambda j: (-scores[i, j], j))
    for p, r in zip(positives[i], rank[i]):
      assert r == (order.index(p) + 1 if p >= 0 else 0)
  # Twelve positives, all in the top 12: nDCG@10 is 1 (the ideal stops at 10).
  top = metrics.positive_ranks(np.arange(20, 0, -1, dtype=np.float32)[None],
                               np.arange(12)[None])
  assert metrics.multi_positive_per_query(top)['ndcg'][0] == pytest.approx(1.0)
  assert metrics.multi_positive_per_query(top)['ap'][0] == pytest.approx(1.0)


def test_positive_ranks_refuse_bad_input():
  with pytest.raises(ValueError, match=r'Rows \[1\] have no positive column'):
    metrics.positive_ranks(SCORES, np.array([[0], [-1], [1]]))
  with pytest.raises(ValueError, match=r'Rows \[0\] list a positive column twice'):
    metrics.positive_ranks(SCORES, np.array([[1, 1], [0, -1], [2, -1]]))
  with pytest.raises(ValueError, match=r'column indices in \[0, 5\)'):
    metrics.positive_ranks(SCORES, np.array([[5], [0], [1]]))
  with pytest.raises(ValueError, match='non-finite'):
    metrics.positive_ranks(np.where(SCORES > 0.8, np.nan, SCORES), POSITIVES)


def test_protocol_is_a_validated_config_field():
  config = support.load_config('gmmformer_v2', 'tiny')
  assert config.eval.protocol == 'single'
  config.eval.protocol = 'dense'
  config_lib.validate(config)
  config.eval.protocol = 'multi'
  with pytest.raises(ValueError, match=r"--config.eval.protocol='multi' must be one of "
                                       r"\['single', 'dense'\]"):
    config_lib.validate(config)


# ----------------------------------------------------------------------------- evaluator

CAPTION_IDS = ['v2#0', 'v0#0', 'v1#0', 'v0#1', 'v3#0', 'v4#0', 'v2#1']
VIDEO_IDS = ['v2', 'v0', 'v1', 'v3', 'v4']


@pytest.fixture(scope='module')
def evaluated(tmp_path_factory):
  """A tiny AMDNet (the cheapest model to compile) evaluated on one device on a split with
  dense targets read from files: the result, the targets, the files' folder."""
  config = support.load_config('amdnet', 'tiny')
  spec = models.registry.get_spec(config.model)
  params = jax.jit(lambda key: spec.init_params(config.model, key))(jax.random.key(3))
  rng = np.random.default_rng(0)
  ground_truth = np.array([VIDEO_IDS.index(c.split('#')[0]) for c in CAPTION_IDS])
  videos = models.random_batch(config.model, rng, (3,) * len(VIDEO_IDS), (1,) * len(VIDEO_IDS))
  texts = models.random_batch(config.model, rng, (1,) * len(CAPTION_IDS),
                              (1,) * len(CAPTION_IDS))
  video_inputs, query_inputs = spec.inputs(config.model)

  def video_batches():
    for start in range(0, len(VIDEO_IDS), 4):
      keys = np.arange(start, min(start + 4, len(VIDEO_IDS)))
      yield {**{k: videos[k][keys] for k in video_inputs}, 'video_index': keys}

  def query_batches():
    for start in range(0, len(CAPTION_IDS), 4):
      rows = np.arange(start, min(start + 4, len(CAPTION_IDS)))
      yield {**{k: texts[k][rows] for k in query_inputs}, 'query_index': rows,
             'query_video_index': ground_truth[rows]}

  # The dense files: v4 is no candidate; three dense queries, one with three positives.
  folder = tmp_path_factory.mktemp('dense')
  (folder / 'syntheticdenseval.caption.txt').write_text(
      ''.join(f'{c} words\n' for c in CAPTION_IDS if not c.startswith('v4')))
  gt = [{'query_id': 'v0#1', 'gt_video_ids': ['v0', 'v3', 'v2']},
        {'query_id': 'v2#0', 'gt_video_ids': ['v2']},
        {'query_id': 'v3#0', 'gt_video_ids': ['v1', 'v3']}]
  (folder / 'syntheticdenseval.gt.jsonl').write_text(''.join(json.dumps(g) + '\n' for g in gt))
  split = EvalSplit(video_batches, query_batches, VIDEO_IDS, CAPTION_IDS)
  # The glue of evaluate.py (`outputs.load_split` under --config.eval.protocol=dense).
  dense_config = ml_collections.ConfigDict({'data': {'dir': '', 'collection': 'synthetic'}})
  targets = outputs.dense_targets(dense_config, split, str(folder), 'test')
  split.dense = targets
  evaluator = Evaluator(config.model, Mesh(np.array(jax.devices()[:1]), ('data',)), 4, 4,
                        progress=False)
  return evaluator.evaluate(params, split), targets, folder


def test_evaluator_reports_both_tables_from_the_same_scores(evaluated):
  result, targets, _ = evaluated
  scores = result.scores
  # The single-GT table is unchanged by the dense targets.
  ground_truth = np.array([VIDEO_IDS.index(c.split('#')[0]) for c in CAPTION_IDS])
  single = metrics.retrieval_metrics(scores, ground_truth)
  assert {k: v for k, v in result.metrics.items() if not k.startswith('dense_')} == single
  # The dense table: rows v0#1, v2#0, v3#0 against the candidates v2, v0, v1, v3 (keys 0-3).
  np.testing.assert_array_equal(targets.columns, [0, 1, 2, 3])
  block = scores[np.ix_([3, 0, 4], [0, 1, 2, 3])]
  rank = metrics.positive_ranks(block, np.array([[1, 3, 0], [0, -1, -1], [2, 3, -1]]))
  expected = metrics.multi_positive_metrics(rank, prefix='dense_')
  own = metrics.positive_ranks(block, np.array([[1], [0], [3]]))[:, 0]
  expected.update(metrics.recalls(own, prefix='dense_single_'))
  expected.update(dense_num_videos=4, dense_num_positives=6)
  assert {k: v for k, v in result.metrics.items() if k.startswith('dense_')} == expected
  np.testing.assert_array_equal(result.dense.positive_ranks, rank)
  # Against all videos, a query's own-video rank is the single-GT evaluator's rank.
  full = metrics.positive_ranks(scores, ground_truth[:, None])[:, 0]
  np.testing.assert_array_equal(full, result.ranks)


def test_per_query_results_are_exported_with_the_outputs(evaluated, tmp_path):
  result, targets, folder = evaluated
  write_outputs(str(tmp_path), result, {'split': 'test'})
  saved = json.loads((tmp_path / 'metrics.json').read_text())
  raw = (tmp_path / 'dense_queries.jsonl').read_bytes()
  assert saved['dense_queries_sha256'] == hashlib.sha256(raw).hexdigest()
  assert saved['dense_files']['ground_truth'] == str(folder / 'syntheticdenseval.gt.jsonl')
  assert saved['dense_files']['ground_truth_sha256'] == hashlib.sha256(
      (folder / 'syntheticdenseval.gt.jsonl').read_bytes()).hexdigest()
  assert saved['dense_map'] == result.metrics['dense_map'] and saved['sumr'] == (
      result.metrics['sumr'])
  records = [json.loads(line) for line in raw.decode().splitlines()]
  assert [r['query_id'] for r in records] == ['v0#1', 'v2#0', 'v3#0']
  assert records[0]['positives'] == ['v0', 'v3', 'v2']
  for i, record in enumerate(records):
    ranks = result.dense.positive_ranks[i]
    assert record['positive_ranks'] == ranks[ranks > 0].tolist()
    assert record['best_rank'] == min(record['positive_ranks'])
    assert record['single_rank'] == int(result.dense.single_ranks[i])
    assert record['ap'] == result.dense.ap[i] and record['ndcg10'] == result.dense.ndcg[i]
  assert np.mean([r['ap'] for r in records]) * 100 == pytest.approx(saved['dense_map'])
  # A single-protocol evaluation leaves no dense file behind in its folder.
  result.dense, dense = None, result.dense
  try:
    write_outputs(str(tmp_path / 'single'), result, {'split': 'test'})
  finally:
    result.dense = dense
  assert not (tmp_path / 'single' / 'dense_queries.jsonl').exists()
  assert 'dense_files' not in json.loads((tmp_path / 'single' / 'metrics.json').read_text())


def test_dense_files_of_other_data_are_refused(tmp_path):
  (tmp_path / 'syntheticdenseval.caption.txt').write_text('v9#0 words\nv0#0 words\n')
  (tmp_path / 'syntheticdenseval.gt.jsonl').write_text(
      '{"query_id": "v0#0", "gt_video_ids": ["v0", "v9"]}\n')
  config = ml_collections.ConfigDict({'data': {'dir': '', 'collection': 'synthetic'}})
  split = EvalSplit(lambda: [], lambda: [], VIDEO_IDS, CAPTION_IDS)
  with pytest.raises(dense_gt.DataError, match=r"caption.txt: video 'v9' is not a video of the "
                                               r"evaluated split 'test'"):
    outputs.dense_targets(config, split, str(tmp_path), 'test')


def test_evaluate_loads_the_dense_ground_truth_of_the_synthetic_benchmark(tiny_data, tmp_path):
  """`evaluate.py --config.eval.protocol=dense` on the synthetic benchmark: the split it
  evaluates carries the dense targets of the files the generator left in the shard folder."""
  config = support.load_config('gmmformer_v2', 'tiny')
  config.data.dir = tiny_data
  loaded = outputs.load_split(config, 'test', str(tmp_path), None, 'checkpoint')
  assert loaded['data'].dense is None  # the default protocol: single
  config.eval.protocol = 'dense'
  data = outputs.load_split(config, 'test', str(tmp_path), None, 'checkpoint')['data']
  assert sorted(data.dense.rows.tolist()) == list(range(len(data.caption_ids)))
  assert data.dense.files['ground_truth'].startswith(tiny_data)
  assert (data.dense.positives >= 0).sum(axis=1).max() > 1  # several positives somewhere
