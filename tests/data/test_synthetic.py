"""The synthetic benchmark: spec compliance, determinism, layouts; the reference baselines."""

import dataclasses
import os

import ml_collections
import numpy as np
import pytest

import support
support.require_tensorflow()

from prvr_jax import baselines
from prvr_jax import metrics
from prvr_jax.data import dense_gt
from prvr_jax.data import pipeline
from prvr_jax.data import release as release_lib
from prvr_jax.data import synthetic


def _arrays_equal(a, b):
  return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_generate_follows_the_spec_and_is_deterministic():
  spec = synthetic.SIZES['tiny']
  data = synthetic.generate(spec, seed=0)
  again = synthetic.generate(spec, seed=0)
  other = synthetic.generate(spec, seed=1)
  for name, count in zip(('train', 'val', 'test'), spec.num_videos):
    split = data[name]
    assert len(split.videos) == count
    assert _arrays_equal(split.videos, again[name].videos)
    assert _arrays_equal(split.caption_features, again[name].caption_features)
    assert split.captions == again[name].captions and split.moments == again[name].moments
    assert not _arrays_equal(split.videos, other[name].videos)
    per_video = {}
    for cap_id, _ in split.captions:
      per_video.setdefault(release_lib.video_id_of(cap_id), []).append(cap_id)
    assert set(per_video) == set(split.videos)
    for video_id, caps in per_video.items():
      frames = split.videos[video_id]
      assert spec.frames[0] <= len(frames) <= spec.frames[1]
      assert frames.dtype == np.float32 and frames.shape[1] == spec.visual_dim and (frames >= 0).all()
      assert spec.queries_per_video[0] <= len(caps) <= spec.queries_per_video[1]
      spans = {split.moments[c][:2] for c in caps}
      for c in caps:
        start, end, duration = split.moments[c]
        assert duration == len(frames) * spec.seconds_per_frame
        assert 0 <= start < end <= duration
        ratio = (end - start) / duration
        assert ratio <= spec.moment_ratio[1] + 1 / len(frames)
        assert ratio >= min(spec.moment_ratio[0], 1 / len(frames)) - 1e-9
      ordered = sorted(spans)  # distinct moments of a video never overlap
      assert all(a[1] <= b[0] for a, b in zip(ordered, ordered[1:]))
    lengths = [len(x) for x in split.caption_features.values()]
    assert min(lengths) >= spec.query_tokens[0] and max(lengths) <= spec.query_tokens[1]
  # Caption files are not grouped by video.
  first = [release_lib.video_id_of(c) for c, _ in data['train'].captions]
  assert first != sorted(first, key=first.index)


def test_default_knobs_cover_every_moment_to_video_group():
  spec = dataclasses.replace(synthetic.SIZES['default'], num_videos=(150, 1, 1))
  moments = synthetic.generate(spec, seed=0)['train'].moments
  ratio = np.array([(e - s) / d for s, e, d in moments.values()])
  counts = np.histogram(ratio, bins=[0, 0.25, 0.5, 1.0])[0]
  assert (counts >= 0.1 * len(ratio)).all(), counts
  assert counts[0] == counts.max()  # short moments (the hard ones) are the most common
  per_video = np.unique([release_lib.video_id_of(c) for c in moments], return_counts=True)[1]
  assert len(per_video) == 150 and 2.5 < per_video.mean() < 4.5


def test_mssl_layout_reads_back_with_moments(tmp_path):
  data = synthetic.generate(synthetic.SIZES['tiny'], seed=2)
  root = synthetic.write_mssl(data, str(tmp_path))
  rel = release_lib.Release(str(tmp_path), synthetic.COLLECTION, synthetic.VISUAL_FEATURE)
  split = rel.split('val')
  assert split.caption_ids == [c for c, _ in data['val'].captions]
  video_id = split.video_ids[0]
  np.testing.assert_array_equal(split.raw_video_features(video_id), data['val'].videos[video_id])
  moments = release_lib.read_moments(os.path.join(root, 'TextData', 'syntheticval.moments.txt'))
  # The test split's dense ground truth, in the collection folder as prvr-ea lays it out.
  config = ml_collections.ConfigDict({'data': {'dir': root, 'collection': synthetic.COLLECTION}})
  dense = dense_gt.read(*dense_gt.locate(config, ''))
  assert list(zip(dense.query_ids, map(list, dense.positives))) == (
      synthetic.dense_ground_truth(data['test']))
  for cap_id, (start, end, duration) in data['val'].moments.items():
    # Seconds written as text and read back: relative to the video's duration.
    support.assert_close(moments[cap_id], (start, end, duration), rtol=1e-5, scale=duration)


def test_ensure_reuses_and_baselines_rank(tmp_path):
  path = synthetic.ensure('tiny', str(tmp_path), seed=0)
  stamp = os.path.join(path, 'synthetic.json')
  mtime = os.stat(stamp).st_mtime_ns
  assert synthetic.ensure('tiny', str(tmp_path), seed=0) == path
  assert os.stat(stamp).st_mtime_ns == mtime
  with pytest.raises(ValueError, match='synthetic_size'):
    synthetic.ensure('huge', str(tmp_path))

  shards = pipeline.open_shards(path)
  index = pipeline.eval_index(shards, 'test')
  assert index.has_spans
  results = baselines.evaluate(shards, 'test')
  for m in results.values():
    assert m['num_queries'] == len(index.caption_ids) and 0 <= m['r1'] <= m['r5'] <= m['r100'] <= 100
    assert sum(m[k] for k in m if k.startswith('mv_') and k.endswith('_count')) == m['num_queries']
  scores, _ = baselines.mean_pooled_scores(shards, 'test')
  assert scores.shape == (len(index.caption_ids), len(index.video_ids))
  assert '| mean_pooled |' in baselines.format_table(results)

  # The test split's dense ground truth lies in the shard folder, where `--config.eval.protocol
  # =dense` finds it, and describes the shards' test split: every query, by its keys.
  config = ml_collections.ConfigDict({'data': {'dir': '', 'collection': synthetic.COLLECTION}})
  dense = dense_gt.read(*dense_gt.locate(config, path))
  targets = dense_gt.align(dense, index.caption_ids, index.video_ids, 'test')
  expected = synthetic.dense_ground_truth(synthetic.generate(synthetic.SIZES['tiny'], 0)['test'])
  assert [(q, list(p)) for q, p in zip(dense.query_ids, dense.positives)] == expected
  assert sorted(targets.rows.tolist()) == list(range(len(index.caption_ids)))
  np.testing.assert_array_equal(targets.columns, np.arange(len(index.video_ids)))
  # With one positive per query the dense R@K is the single-GT R@K of the same scores.
  rank = metrics.positive_ranks(scores[targets.rows], targets.positives[:, :1])
  single = metrics.text_to_video_ranks(scores, index.caption_video_index)[targets.rows]
  np.testing.assert_array_equal(rank[:, 0], single)


def test_dense_ground_truth_names_every_video_holding_the_query_content():
  data = synthetic.generate(synthetic.SIZES['tiny'], seed=0)['test']
  truth = synthetic.dense_ground_truth(data)
  assert [q for q, _ in truth] == [c for c, _ in data.captions]
  for cap_id, videos in truth:
    pair = data.query_concepts[cap_id]
    assert videos[0] == release_lib.video_id_of(cap_id)  # its own video first
    assert sorted(videos) == sorted(v for v, held in data.video_concepts.items() if pair in held)
  # Concept pairs recur: some queries have several positives (7 of the 39 of this split).
  assert sum(len(videos) > 1 for _, videos in truth) == 7


def test_ridge_recovers_a_linear_map():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(200, 5))
  w = rng.normal(size=(5, 3))
  fitted = baselines.fit_ridge(x, x @ w + 2.0, l2=1e-9)
  # A float64 solve (LAPACK differs by CPU kind: ~1e-14) biased by l2 = 1e-9: O(1) values,
  # 1e-6 of their magnitude is loose.
  support.assert_close(fitted[:-1], w, rtol=1e-6)
  support.assert_close(fitted[-1], np.full(3, 2.0), rtol=1e-6)
