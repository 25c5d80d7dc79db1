"""The evaluator's phases: each keeps a bounded number of batches in flight (`pipelined`), and
their seconds reach `EvalResult.timings` and metrics.json; the index is built through the same
gallery encoder."""

import json

import jax
from jax.sharding import Mesh
import numpy as np
import pytest

from prvr_jax import models
from prvr_jax.eval import EvalSplit, Evaluator, write_outputs
from prvr_jax.eval import evaluator as evaluator_lib
from prvr_jax.index import build_index
from prvr_jax.models import registry
import support

NUM_VIDEOS, NUM_QUERIES, VIDEO_CHUNK, QUERY_CHUNK = 9, 7, 2, 3


@pytest.fixture(scope='module')
def setup():
  config = support.load_config('gmmformer_v2', 'tiny')
  config.eval.video_batch_size, config.eval.query_batch_size = VIDEO_CHUNK, QUERY_CHUNK
  spec = registry.get_spec(config.model)
  params = jax.jit(lambda key: spec.init_params(config.model, key))(jax.random.key(0))
  rng = np.random.default_rng(0)
  videos = models.random_batch(config.model, rng, (4,) * NUM_VIDEOS, (1,) * NUM_VIDEOS)
  queries = models.random_batch(config.model, rng, (1,) * NUM_QUERIES, (3,) * NUM_QUERIES)
  gt = rng.integers(0, NUM_VIDEOS, size=NUM_QUERIES)
  return config, params, videos, queries, gt


class _Counting:
  """Batches of a split, counting how many were taken."""

  def __init__(self, batches):
    self.batches, self.taken = batches, 0

  def __iter__(self):
    for batch in self.batches:
      self.taken += 1
      yield batch


def _split(setup, pulls=None):
  _, _, videos, queries, gt = setup

  def video_batches():
    batches = [{**{k: videos[k][s:s + VIDEO_CHUNK]
                   for k in ('clip_feats', 'frame_feats', 'frame_mask')},
                'video_index': np.arange(s, min(s + VIDEO_CHUNK, NUM_VIDEOS))}
               for s in range(0, NUM_VIDEOS, VIDEO_CHUNK)]
    counting = _Counting(batches)
    if pulls is not None:
      pulls.append(counting)
    return counting

  def query_batches():
    for s in range(0, NUM_QUERIES, QUERY_CHUNK):
      rows = np.arange(s, min(s + QUERY_CHUNK, NUM_QUERIES))
      yield {'query_feats': queries['query_feats'][rows],
             'query_mask': queries['query_mask'][rows], 'query_index': rows,
             'query_video_index': gt[rows]}

  return EvalSplit(video_batches, query_batches, [f'v{i}' for i in range(NUM_VIDEOS)],
                   [f'q{i}' for i in range(NUM_QUERIES)])


@pytest.mark.parametrize('in_flight', [1, 2, 3])
def test_pipelined_waits_for_batch_i_minus_in_flight_before_dispatching_batch_i(in_flight):
  events = []

  def source():
    for i in range(6):
      events.append(('take', i))
      yield i

  def dispatch(i):
    events.append(('dispatch', i))
    return i

  out = []
  for result in evaluator_lib.pipelined(source(), dispatch, in_flight,
                                        wait=lambda i: events.append(('wait', i))):
    out.append(result)
    events.append(('yield', result))
  assert out == list(range(6))
  for i in range(6):
    taken = events.index(('take', i))
    # Batch i is taken (and dispatched) only once batch i - in_flight was waited for and used.
    if i >= in_flight:
      assert events.index(('yield', i - in_flight)) < taken
    assert events.index(('dispatch', i)) < events.index(('wait', i)) < events.index(('yield', i))
  with pytest.raises(ValueError, match='in_flight=0'):
    list(evaluator_lib.pipelined([1], dispatch, 0))


def test_one_batch_in_flight_on_cpus():
  cpus = Mesh(np.array(jax.devices('cpu')), ('data',))
  assert evaluator_lib.default_in_flight(cpus) == evaluator_lib.IN_FLIGHT_CPU == 1


@pytest.mark.parametrize('in_flight', [1, 2])
def test_gallery_encoding_takes_at_most_in_flight_batches_ahead(setup, in_flight):
  config, params, *_ = setup
  evaluator = Evaluator.from_config(config, Mesh(np.array(jax.devices()), ('data',)),
                                    progress=False)
  evaluator.in_flight = in_flight
  pulls = []
  split = _split(setup, pulls)
  batches = evaluator.video_batches(split)
  for used, (encodings, _) in enumerate(evaluator.encode_batches(params, batches), 1):
    assert pulls[0].taken <= used - 1 + in_flight
    assert all(leaf.is_ready() for leaf in jax.tree.leaves(encodings))
  assert pulls[0].taken == -(-NUM_VIDEOS // VIDEO_CHUNK)


def test_timings_reach_the_result_and_metrics_json_and_results_do_not_change(setup, tmp_path):
  config, params, *_ = setup
  mesh = Mesh(np.array(jax.devices()), ('data',))
  split = _split(setup)
  one = Evaluator.from_config(config, mesh, progress=False)
  one.in_flight = 1
  expected = one.evaluate(params, split)
  two = Evaluator.from_config(config, mesh)
  two.in_flight = 2
  result = two.evaluate(params, split)
  # Batches in flight change when the host waits, not what is computed.
  np.testing.assert_array_equal(result.scores, expected.scores)
  np.testing.assert_array_equal(result.ranks, expected.ranks)
  assert result.metrics == expected.metrics
  assert set(result.timings) == {*evaluator_lib.PHASES, 'total'}
  assert all(isinstance(t, float) and t >= 0 for t in result.timings.values())
  assert sum(result.timings[k] for k in evaluator_lib.PHASES) <= result.timings['total']
  write_outputs(str(tmp_path), result, {'split': 'test'})
  written = json.loads((tmp_path / 'metrics.json').read_text())
  assert written['timings'] == pytest.approx(result.timings)
  assert {k: written[k] for k in result.metrics} == pytest.approx(result.metrics, nan_ok=True)
  assert written['split'] == 'test' and 'scores_sha256' in written


def test_index_build_encodes_through_the_evaluator(setup, tmp_path, monkeypatch):
  config, params, *_ = setup
  calls = []
  encode_batches = Evaluator.encode_batches

  def counted(self, *args, **kwargs):
    calls.append(self)
    return encode_batches(self, *args, **kwargs)

  monkeypatch.setattr(Evaluator, 'encode_batches', counted)
  phases = evaluator_lib.Phases(show=False)
  index = build_index(config, params, _split(setup), str(tmp_path / 'index'), phases=phases)
  assert len(calls) == 1 and len(index) == NUM_VIDEOS
  assert set(phases.timings) == {'encode_videos'}


def test_gallery_filled_in_place_equals_the_concatenated_one(setup):
  """A split of known length fills a preallocated gallery (each device its rows of every
  batch); the rows, found by key, are those of the concatenation of the batches."""
  config, params, *_ = setup
  evaluator = Evaluator.from_config(config, Mesh(np.array(jax.devices()), ('data',)),
                                    progress=False)
  batches = list(_split(setup).video_batches())
  in_place = evaluator.encode_gallery(params, batches)
  concatenated = evaluator.encode_gallery(params, (b for b in batches))
  # One more batch announced than given: its rows stay padding.
  announced = evaluator.encode_gallery(params, evaluator_lib._Sized(batches, len(batches) + 1))
  expected = jax.device_get(concatenated.encodings)
  order = np.argsort(concatenated.keys)[concatenated.keys[np.argsort(concatenated.keys)] >= 0]
  for gallery in (in_place, announced):
    rows = np.argsort(gallery.keys)[gallery.keys[np.argsort(gallery.keys)] >= 0]
    np.testing.assert_array_equal(gallery.keys[rows], concatenated.keys[order])
    for name, leaf in jax.device_get(gallery.encodings).items():
      np.testing.assert_array_equal(leaf[rows], expected[name][order], err_msg=name)
  assert (announced.keys == -1).sum() == (concatenated.keys == -1).sum() + VIDEO_CHUNK
  with pytest.raises(ValueError, match='announced 2 video batches and gave more'):
    evaluator.encode_gallery(params, evaluator_lib._Sized(batches, 2))
