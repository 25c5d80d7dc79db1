"""The evaluation never uses the query-video pairing: every registered model (and MS-SL with
text mass, whose scores draw noise per video), through the evaluator that `evaluate.py` and
the training loop run (`Evaluator.from_config(config, mesh).evaluate(params, split)`).

A query's ground-truth key may only pick which of its scores is the hit: the scores are the
model's pair scores and the ranks follow them by the tie rule (higher score first, equal
scores by smaller video key). With random parameters and tiny dims:

* unrelated features (videos and queries drawn independently): R@1/5/10 within a binomial
  bound of chance, with the pairing in caption-file order, drawn at random, or one query per
  video at the video's own position (where a positional leak would hit), and the same scores
  whatever the pairing;
* permuting the queries, the gallery (ids and ground truths moving with them) or the order of
  the batches gives the same scores and ranks mapped back, on unrelated and related pairings;
* unequal numbers of videos and queries (videos without a query): the ranks and metrics are
  those of the score matrix, and a pair scores the same when other videos are evaluated;
* a video duplicated under a new id scores what the original scores (models that draw noise
  per video id: what those features score under that id), whichever of the two is the ground
  truth; the tie goes to the smaller key;
* planted pairings (each query's ground truth its least, or its most, similar video): every
  rank is the last, or the first, one.

`test_the_checks_catch_leaks` injects leaks into an evaluator and sees each caught.
"""

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from prvr_jax import metrics, models, parallel
from prvr_jax.eval import EvalSplit, Evaluator, text_to_video_ranks
from prvr_jax.eval.splits import VIDEO_SEED
from prvr_jax.models import registry
import support

# Tiny dims (fields a model lacks are skipped): compiling and running every model is cheap.
TINY = dict(visual_dim=16, query_dim=16, hidden_dim=16, max_frames=16, num_clips=8,
            num_frames=8, num_samples=4, stochastic_samples=4)
# Configs beyond each registered model's 'tiny' one: <model>+<boolean field set on>.
VARIANTS = ('ms_sl+stochastic_text',)
VIDEO_BATCH = 8
QUERY_BATCH = 64
NUM_VIDEOS = 30           # 4 video batches, a 32-row gallery
# Scores are O(1); evaluations differ only in how rows are batched and sharded.
SCORE_RTOL = 1e-5
# Probability that a chance-level count falls outside its interval, per check (two-sided).
ALPHA = 1e-6


def random_params(shapes, seed: int = 0):
  """Random parameters of the model's own shapes (cheaper than compiling its initialiser):
  kernels of unit output variance, LayerNorm scales about 1, everything else small and
  nonzero, so that no symmetry of an initialiser hides a leak."""
  rng = np.random.default_rng(seed)

  def draw(path, leaf):
    name = getattr(path[-1], 'key', '')
    values = rng.normal(size=leaf.shape)
    if name == 'kernel':
      values /= np.sqrt(np.prod(leaf.shape[:-1]))
    elif name == 'scale':
      values = 1 + 0.1 * values
    else:
      values *= 0.1
    return values.astype(leaf.dtype)
  return jax.tree_util.tree_map_with_path(draw, shapes)


class Model(NamedTuple):
  """One model (or variant) as the tests evaluate it."""
  name: str
  config: Any
  evaluator: Evaluator
  params: Any


@functools.cache
def build(name: str) -> Model:
  """The evaluator and random parameters of `name` (a model, or a `VARIANTS` entry), built
  once per process: its programs compile once."""
  model_name, *switches = name.split('+')
  config = support.load_config(model_name, 'tiny')
  for key, value in TINY.items():
    if key in config.model:
      config.model[key] = min(value, config.model[key])
  for switch in switches:
    config.model[switch] = True
  spec = registry.get_spec(config.model)
  # GMMFormer's video encoding depends on its batch: one chunk holds every gallery here, so
  # that a video encodes alike under any key (the evaluator requires the official chunks).
  batch_dependent = spec.encoding_depends_on_batch(config.model)
  config.eval.video_batch_size = 32 if batch_dependent else VIDEO_BATCH
  config.eval.query_batch_size = QUERY_BATCH
  evaluator = Evaluator.from_config(config, parallel.make_mesh(), progress=False)
  return Model(name, config, evaluator, random_params(spec.param_shapes(config.model)))


@pytest.fixture(scope='module', params=registry.names() + list(VARIANTS))
def model(request):
  return build(request.param)


class Items:
  """Videos and queries of random features (model inputs by row) and their ids."""

  def __init__(self, config, rng: np.random.Generator, num_videos: int, num_queries: int,
               prefix: str = ''):
    model = config.model
    # The first video of every set has the full length: GMMFormer's frame windows follow the
    # longest video of the batch, the same in every gallery here.
    frames = rng.integers(1, model.max_frames + 1, size=num_videos)
    frames[0] = model.max_frames
    tokens = rng.integers(1, model.max_query_len + 1, size=num_queries)
    videos = models.random_batch(model, rng, tuple(frames), (1,) * num_videos)
    queries = models.random_batch(model, rng, (1,) * num_queries, tuple(tokens))
    video_inputs, query_inputs = registry.get_spec(model).inputs(model)
    self.videos = {k: videos[k] for k in video_inputs if k != VIDEO_SEED}
    self.queries = {k: queries[k] for k in query_inputs}
    self.video_ids = [f'{prefix}video{i}' for i in range(num_videos)]
    self.caption_ids = [f'{prefix}caption{i}' for i in range(num_queries)]

  def take(self, videos=None, queries=None) -> 'Items':
    """These items with the videos (and the queries) reordered or subset by index."""
    out = object.__new__(Items)
    videos = np.arange(len(self.video_ids)) if videos is None else np.asarray(videos)
    queries = np.arange(len(self.caption_ids)) if queries is None else np.asarray(queries)
    out.videos = {k: v[videos] for k, v in self.videos.items()}
    out.queries = {k: v[queries] for k, v in self.queries.items()}
    out.video_ids = [self.video_ids[i] for i in videos]
    out.caption_ids = [self.caption_ids[i] for i in queries]
    return out

  def concat(self, other: 'Items') -> 'Items':
    """The videos of both, then the queries of both."""
    out = object.__new__(Items)
    out.videos = {k: np.concatenate([v, other.videos[k]]) for k, v in self.videos.items()}
    out.queries = {k: np.concatenate([v, other.queries[k]]) for k, v in self.queries.items()}
    out.video_ids = self.video_ids + other.video_ids
    out.caption_ids = self.caption_ids + other.caption_ids
    return out


def evaluate(model, items: Items, ground_truth, video_order=None, query_order=None):
  """The evaluator's result on `items`, query i's ground truth the video of key
  `ground_truth[i]`; `video_order` / `query_order`: the keys in the order the batches hold
  them (default: key order). Checks that the ranks and metrics are the score matrix's."""
  num_videos, num_queries = len(items.video_ids), len(items.caption_ids)
  ground_truth = np.asarray(ground_truth, np.int64)
  assert ground_truth.shape == (num_queries,)
  video_order = np.arange(num_videos) if video_order is None else np.asarray(video_order)
  query_order = np.arange(num_queries) if query_order is None else np.asarray(query_order)
  video_batch = model.config.eval.video_batch_size

  def video_batches():
    for start in range(0, num_videos, video_batch):
      keys = video_order[start:start + video_batch]
      yield {**{k: v[keys] for k, v in items.videos.items()}, 'video_index': keys}

  def query_batches():
    for start in range(0, num_queries, QUERY_BATCH):
      keys = query_order[start:start + QUERY_BATCH]
      yield {**{k: v[keys] for k, v in items.queries.items()}, 'query_index': keys,
             'query_video_index': ground_truth[keys]}

  split = EvalSplit(video_batches, query_batches, items.video_ids, items.caption_ids)
  result = model.evaluator.evaluate(model.params, split)
  assert result.scores.shape == (num_queries, num_videos)
  np.testing.assert_array_equal(result.ranks,
                                metrics.text_to_video_ranks(result.scores, ground_truth))
  assert result.metrics == metrics.retrieval_metrics(result.scores, ground_truth)
  return result


def rank_bounds(scores: np.ndarray, ground_truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """The lowest and highest rank of each query's ground truth when scores within the score
  tolerance of its score may fall on either side (equal where no other score is that close)."""
  tol = 2 * SCORE_RTOL * np.abs(scores).max()
  gt_score = scores[np.arange(len(scores)), ground_truth][:, None]
  return 1 + np.sum(scores > gt_score + tol, axis=1), np.sum(scores >= gt_score - tol, axis=1)


def assert_ranks_follow(ranks, scores, ground_truth, err_msg=''):
  """`ranks` are the tie-rule ranks of `scores` up to near-ties, and near-ties are rare."""
  low, high = rank_bounds(scores, ground_truth)
  assert ((low <= ranks) & (ranks <= high)).all(), err_msg
  assert np.mean(low == high) > 0.9, f'{err_msg}: too many near-ties to check the ranks'


def chance_interval(num_queries: int, num_videos: int, k: int) -> tuple[int, int]:
  """The hits at rank <= k a ranker blind to the pairing stays within, but for `ALPHA`.

  Given the features, a query whose ground truth is uniform over the videos has a uniform rank
  (the tie rule orders every video): the hits are Binomial(n, k / Nv). With a fixed balanced
  pairing (each video the ground truth of equally many queries, queries drawn i.i.d.) they are
  independent with success probabilities averaging k / Nv, and such a sum is more concentrated
  than the binomial of the same mean (Hoeffding, 1956, Theorem 4): the interval holds too.
  """
  p = k / num_videos
  return (int(stats.binom.ppf(ALPHA / 2, num_queries, p)),
          int(stats.binom.isf(ALPHA / 2, num_queries, p)))


def assert_chance(result, num_videos, err_msg):
  """R@1/5/10 of `result` within their chance intervals."""
  num_queries = len(result.ranks)
  for k in (1, 5, 10):
    hits = int(np.sum(result.ranks <= k))
    assert result.metrics[f'r{k}'] == 100.0 * hits / num_queries
    low, high = chance_interval(num_queries, num_videos, k)
    assert low <= hits <= high, (f'{err_msg}: {hits} of {num_queries} queries at rank <= {k}, '
                                 f'chance interval [{low}, {high}]')


def check_chance(model):
  """Unrelated features rank at chance, whatever the pairing's layout."""
  config = model.config
  rng = np.random.default_rng(1)
  items = Items(config, rng, NUM_VIDEOS, 20 * NUM_VIDEOS)
  pairings = {
      # Caption-file order: 20 captions per video, videos in first-appearance order.
      'caption order': np.repeat(np.arange(NUM_VIDEOS), 20),
      # Drawn at random (some videos may have no query), then sorted as a caption file is.
      'random': np.sort(rng.integers(0, NUM_VIDEOS, size=20 * NUM_VIDEOS)),
  }
  results = {}
  for pairing, ground_truth in pairings.items():
    results[pairing] = evaluate(model, items, ground_truth)
    assert_chance(results[pairing], NUM_VIDEOS, f'{model.name}, {pairing} pairing')
  # The pairing changes no score.
  support.assert_close(results['random'].scores, results['caption order'].scores, SCORE_RTOL)
  # One query per video, query i's ground truth video i: where a positional leak would hit.
  result = evaluate(model, items.take(queries=np.arange(NUM_VIDEOS)), np.arange(NUM_VIDEOS))
  assert_chance(result, NUM_VIDEOS, f'{model.name}, one query per video')
  support.assert_close(result.scores, results['random'].scores[:NUM_VIDEOS], SCORE_RTOL)


def check_permutations(model):
  """Permuted queries, gallery or batches: the same scores and ranks, mapped back."""
  config = model.config
  rng = np.random.default_rng(2)
  num_queries = 100
  items = Items(config, rng, NUM_VIDEOS, num_queries)
  first = evaluate(model, items, rng.integers(0, NUM_VIDEOS, size=num_queries))
  # Related: each query's ground truth is its k-th most similar video, k uniform in 1..5.
  most_similar = np.argsort(-first.scores, axis=1)
  pairings = {'unrelated': rng.integers(0, NUM_VIDEOS, size=num_queries),
              'related': most_similar[np.arange(num_queries),
                                      rng.integers(0, 5, size=num_queries)]}
  for kind, ground_truth in pairings.items():
    reference = evaluate(model, items, ground_truth)
    support.assert_close(reference.scores, first.scores, SCORE_RTOL)
    assert_ranks_follow(reference.ranks, first.scores, ground_truth, kind)
    if kind == 'related':
      assert reference.metrics['r1'] > 10  # chance: 3.3
    same = np.arange(NUM_VIDEOS), np.arange(num_queries)
    layouts = {
        'queries': (same[0], rng.permutation(num_queries), {}),
        'gallery': (rng.permutation(NUM_VIDEOS), same[1], {}),
        'queries and gallery': (rng.permutation(NUM_VIDEOS), rng.permutation(num_queries), {}),
        'query batches': (*same, dict(query_order=rng.permutation(num_queries))),
    }
    if not model.evaluator.official_chunks:
      layouts['video batches'] = (*same, dict(video_order=rng.permutation(NUM_VIDEOS)))
    for layout, (videos, queries, order) in layouts.items():
      err_msg = f'{model.name}, {kind} pairing, permuted {layout}'
      # New video key j is old video videos[j]; new query i is old query queries[i].
      new_key = np.argsort(videos)
      moved = evaluate(model, items.take(videos, queries), new_key[ground_truth[queries]],
                       **order)
      support.assert_close(moved.scores, reference.scores[np.ix_(queries, videos)],
                           SCORE_RTOL, err_msg=err_msg)
      assert_ranks_follow(moved.ranks, reference.scores[queries], ground_truth[queries],
                          err_msg)


def check_unequal_numbers(model):
  """7 videos (two without a query) and 23 queries; the same among 23 more videos."""
  config = model.config
  rng = np.random.default_rng(3)
  items = Items(config, rng, 7, 23)
  ground_truth = np.array([0, 0, 0, 0, 2, 2, 2, 2, 3, 3, 3, 3, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6])
  small = evaluate(model, items, ground_truth)
  assert small.ranks.max() <= 7
  # Among 23 videos without a query, the gallery shuffled: each pair scores the same.
  everything = items.concat(Items(config, rng, 23, 0, prefix='other'))
  order = rng.permutation(30)
  key = np.argsort(order)               # new key of each video of `everything`
  large = evaluate(model, everything.take(order), key[ground_truth])
  support.assert_close(large.scores[:, key[:7]], small.scores, SCORE_RTOL)
  assert (large.ranks >= rank_bounds(small.scores, ground_truth)[0]).all()
  # Fewer queries than videos.
  few = [4, 11, 20]
  fewer = evaluate(model, everything.take(order, few), key[ground_truth[few]])
  support.assert_close(fewer.scores, large.scores[few], SCORE_RTOL)


def check_duplicate(model):
  """A copy of a video under a new id: its scores, whichever of the two is the ground
  truth, and the tie rule."""
  config, name = model.config, model.name
  rng = np.random.default_rng(4)
  num_videos, num_queries, copied = 28, 60, 5
  items = Items(config, rng, num_videos, num_queries)
  ground_truth = np.sort(np.concatenate([rng.integers(0, num_videos, size=num_queries - 4),
                                         [copied] * 4]))
  base = evaluate(model, items, ground_truth)
  # The copy first (key 0): every original moves up one key.
  with_copy = items.take([copied] + list(range(num_videos)))
  with_copy.video_ids[0] = 'copy'
  on_original = evaluate(model, with_copy, ground_truth + 1)
  on_copy = evaluate(model, with_copy, np.where(ground_truth == copied, 0, ground_truth + 1))
  support.assert_close(on_copy.scores, on_original.scores, SCORE_RTOL, err_msg=name)
  support.assert_close(on_original.scores[:, 1:], base.scores, SCORE_RTOL, err_msg=name)
  copy, original = on_original.scores[:, 0], on_original.scores[:, copied + 1]
  if VIDEO_SEED in model.evaluator.video_inputs:
    # Noise drawn per video id: the copy scores what its features score under its own id.
    renamed = items.take()
    renamed.video_ids[copied] = 'copy'
    support.assert_close(copy, evaluate(model, renamed, ground_truth).scores[:, copied],
                         SCORE_RTOL, err_msg=name)
    return
  support.assert_close(copy, original, SCORE_RTOL, err_msg=name)
  # Where the two scores are equal (every query on CPUs: one program encodes both), the tie
  # goes to the smaller key: the copy ranks ahead of the original, whichever is the ground
  # truth; placed last (the largest key), the copy leaves the original's rank as it was.
  if jax.default_backend() == 'cpu':
    np.testing.assert_array_equal(copy, original, err_msg=name)
  of_copied = (copy == original) & (ground_truth == copied)
  np.testing.assert_array_equal(on_original.ranks[of_copied], base.ranks[of_copied] + 1)
  np.testing.assert_array_equal(on_copy.ranks[of_copied], base.ranks[of_copied])
  last = items.take(list(range(num_videos)) + [copied])
  last.video_ids[-1] = 'copy'
  on_last = evaluate(model, last, ground_truth)
  of_copied = (on_last.scores[:, -1] == on_last.scores[:, copied]) & (ground_truth == copied)
  np.testing.assert_array_equal(on_last.ranks[of_copied], base.ranks[of_copied])


def check_planted(model):
  """Each query's ground truth its least (most) similar video: every rank the last (1)."""
  config, name = model.config, model.name
  rng = np.random.default_rng(5)
  num_queries = 90
  items = Items(config, rng, NUM_VIDEOS, num_queries)
  scores = evaluate(model, items, rng.integers(0, NUM_VIDEOS, size=num_queries)).scores
  for planted, rank, recall in ((np.argmin(scores, axis=1), NUM_VIDEOS, 0.0),
                                (np.argmax(scores, axis=1), 1, 100.0)):
    order = np.argsort(planted, kind='stable')   # caption-file order: grouped by video
    result = evaluate(model, items.take(queries=order), planted[order])
    support.assert_close(result.scores, scores[order], SCORE_RTOL, err_msg=name)
    low, high = rank_bounds(scores[order], planted[order])
    near = low != high                           # a near-tie with the first or last video
    assert near.mean() < 0.1, name
    np.testing.assert_array_equal(result.ranks[~near], rank, err_msg=name)
    assert ((low <= result.ranks) & (result.ranks <= high)).all(), name
    if not near.any():
      assert [result.metrics[f'r{k}'] for k in (1, 5, 10)] == [recall] * 3, name


def test_unrelated_features_rank_at_chance(model):
  check_chance(model)


def test_permutations_give_the_same_ranks(model):
  check_permutations(model)


def test_unequal_numbers_of_videos_and_queries(model):
  check_unequal_numbers(model)


def test_a_duplicated_video_scores_as_the_original(model):
  check_duplicate(model)


def test_planted_pairings_rank_by_features(model):
  check_planted(model)


def _leaky(rank_queries, leak: str):
  """The evaluator's jitted scoring and ranking with `leak`."""
  def leaky(params, encoded, gallery, gallery_keys, gt_keys):
    scores, ranks, gt_count, non_finite = rank_queries(params, encoded, gallery, gallery_keys,
                                                       gt_keys)
    is_gt = (gallery_keys[None, :] == gt_keys[:, None]).astype(scores.dtype)
    bonus = 0.3 * jnp.std(scores)
    if leak == 'the ground truth scores higher':
      scores = scores + bonus * is_gt
      ranks = text_to_video_ranks(scores, gallery_keys, gt_keys)[0]
    elif leak == 'the ground truth ranks higher':
      ranks = text_to_video_ranks(scores + bonus * is_gt, gallery_keys, gt_keys)[0]
    elif leak == 'ties go to the ground truth':
      gt_score = jnp.max(jnp.where(is_gt > 0, scores, -jnp.inf), axis=1, keepdims=True)
      ranks = 1 + jnp.sum((gallery_keys[None, :] >= 0) & (scores > gt_score), axis=1)
    elif leak == 'the query\'s position in its batch scores':
      rows, columns = jnp.indices(scores.shape)
      scores = scores + bonus * (rows == columns)
      ranks = text_to_video_ranks(scores, gallery_keys, gt_keys)[0]
    return scores, ranks, gt_count, non_finite
  return leaky


@pytest.mark.parametrize('leak,checks', [
    ('the ground truth scores higher', (check_chance, check_planted, check_duplicate)),
    ('the ground truth ranks higher', (check_chance, check_permutations, check_unequal_numbers,
                                       check_duplicate, check_planted)),
    ('ties go to the ground truth', (check_duplicate,)),
    ('the query\'s position in its batch scores', (check_chance, check_permutations)),
])
def test_the_checks_catch_leaks(leak, checks, monkeypatch):
  if leak == 'ties go to the ground truth' and jax.default_backend() != 'cpu':
    pytest.skip('exact ties between a video and its copy are asserted on CPUs only')
  model = build('amdnet')
  evaluator = model.evaluator
  monkeypatch.setattr(evaluator, '_rank_queries', _leaky(evaluator._rank_queries, leak))
  for check in checks:
    with pytest.raises(AssertionError):
      check(model)
