"""T-MASS's evaluation: a (query, video) score depends on nothing but the pair (paper Eq. 10),
and the released evaluation's query/video axis mix-up, reproduced from the released code's own
output (tests/fixtures/tmass/leak.npz), ranks differently and leaks the ground truth."""

import os

import jax
import numpy as np

from prvr_jax import metrics
from prvr_jax.eval import EvalSplit, Evaluator
from prvr_jax.layers import stochastic_text
from prvr_jax.models import registry
from prvr_jax.models.tmass.model import frame_similarities
import support

LEAK = os.path.join(os.path.dirname(__file__), '..', 'fixtures', 'tmass', 'leak.npz')


def _unit(x):
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def released_scores(selected: np.ndarray, pooled: np.ndarray, video_of: list[str]
                    ) -> np.ndarray:
  """What the released `sim_matrix_inference_stochastic` computes, in closed form.

  Args:
    selected: `[Nv, Nt, D]`, [a, g] = caption g's best stochastic text against video a.
    pooled: `[Nv, Nt, D]`, [a, g] = video a pooled by caption g.
    video_of: the video id of each caption, in caption order.

  Returns:
    `[Nv (query's video b), K (its k-th caption), Nv (candidate a)]`: cos(selected[a, c(b, k)],
    pooled[a, c(a, k)]), c(v, k) the k-th caption of video v: the candidate is pooled by ITS
    OWN k-th caption instead of the query. NaN where video a or b has no k-th caption.
  """
  videos = list(dict.fromkeys(video_of))
  captions = [[g for g, v in enumerate(video_of) if v == video] for video in videos]
  k_max = max(len(c) for c in captions)
  out = np.full((len(videos), k_max, len(videos)), np.nan, np.float32)
  for b, own in enumerate(captions):
    for k, g in enumerate(own):
      for a in range(len(videos)):
        if k < len(captions[a]):
          out[b, k, a] = np.sum(_unit(selected[a, g]) * _unit(pooled[a, captions[a][k]]))
  return out


def test_closed_form_reproduces_the_released_evaluation():
  with np.load(LEAK) as leak:
    for case in ('A', 'B'):
      expected = leak[f'{case}/sims']
      ours = released_scores(leak[f'{case}/text_stochastic_allpairs'], leak[f'{case}/pooled'],
                             list(leak[f'{case}/all_vid_ids']))
      np.testing.assert_array_equal(np.isnan(ours), np.isnan(expected))
      support.assert_close(np.nan_to_num(ours), np.nan_to_num(expected), support.f32_rtol(8))


def _model(num_samples=20, dim=32, frames=12):
  config = support.load_config('tmass', 'tiny')
  config.model.update(hidden_dim=dim, visual_dim=dim, query_dim=dim, num_samples=num_samples)
  spec = registry.get_spec(config.model)
  params = jax.jit(lambda key: spec.init_params(config.model, key))(jax.random.key(0))
  return config, spec.build(config.model), params


def _explicit(module, params, texts, frames, keys, key):
  """(Eq. 10 scores `[Q, B]`, the selected stochastic texts `[B, Q, D]`, pooled `[B, Q, D]`)
  built sample by sample in numpy."""
  apply = lambda fn, *args: np.asarray(module.apply({'params': params}, *args, method=fn,
                                                    rngs={'sampling': key}))
  pooled = apply(lambda m, t, f: m.pool(t, f), texts, frames)                    # [Q, B, D]
  radius = np.exp(apply(lambda m, s: m.radius(s), frame_similarities(texts, frames)))
  noise = apply(lambda m: stochastic_text.video_noise_bank(
      m.make_rng('sampling'), keys, module.num_samples, module.hidden_dim, 'uniform01', 1.0))
  samples = texts[:, None, None] + noise[None] * radius[:, :, None]             # [Q, B, M, D]
  cosines = np.sum(_unit(samples) * _unit(pooled)[:, :, None], axis=-1)
  q, b = np.meshgrid(np.arange(len(texts)), np.arange(len(frames)), indexing='ij')
  selected = samples[q, b, cosines.argmax(-1)]
  return cosines.max(-1), selected.transpose(1, 0, 2), pooled.transpose(1, 0, 2)


def test_released_evaluation_leaks_the_ground_truth_and_ours_does_not():
  # Captions and videos drawn independently: no ranker can beat chance (R@1 = 1/64 = 1.6%).
  _, module, params = _model()
  rng = np.random.default_rng(0)
  n = 64
  texts = rng.normal(size=(n, 32)).astype(np.float32)
  frames = rng.normal(size=(n, 12, 32)).astype(np.float32)
  keys = np.arange(n, dtype=np.int32)
  key = jax.random.key(1)
  ours = np.asarray(module.apply({'params': params}, texts, {'frames': frames, 'key': keys},
                                 method='score', rngs={'sampling': key}))
  explicit, selected, pooled = _explicit(module, params, texts, frames, keys, key)
  support.assert_close(ours, explicit, support.f32_rtol(32, ops=8))
  video_of = [str(i) for i in range(n)]
  released = released_scores(selected, pooled, video_of)[:, 0, :]
  ground_truth = np.arange(n)
  r1 = lambda s: metrics.recalls(metrics.text_to_video_ranks(s, ground_truth))['r1']
  # Measured: released 39.1, ours 1.6 (chance 1.6).
  assert r1(released) > 25 > 6 > r1(ours)
  # Reorder the captions (the ground truth goes with them): our scores follow the captions;
  # the released ones change, since a video is pooled by whichever caption sits at its row.
  order = rng.permutation(n)
  _, selected_p, pooled_p = _explicit(module, params, texts[order], frames, keys, key)
  moved = released_scores(selected_p, pooled_p, [video_of[i] for i in order])[:, 0, :]
  ours_moved = np.asarray(module.apply({'params': params}, texts[order],
                                       {'frames': frames, 'key': keys}, method='score',
                                       rngs={'sampling': key}))
  support.assert_close(ours_moved, ours[order], support.f32_rtol(32, ops=8))
  # Released row b is the query of video b's caption whatever the caption order, so a
  # consistent evaluator would give the same matrix: it does not.
  assert np.abs(moved - released).max() > 0.05


def _split(frames, texts, ground_truth, names, video_chunk, query_chunk, order):
  """An EvalSplit of videos `names` (keys 0..n-1 in that order), batched in `order`."""
  def video_batches():
    for start in range(0, len(order), video_chunk):
      keys = np.asarray(order[start:start + video_chunk])
      yield {'clip_feats': frames[keys], 'video_index': keys}

  def query_batches():
    for start in range(0, len(texts), query_chunk):
      rows = np.arange(start, min(start + query_chunk, len(texts)))
      yield {'query_feats': texts[rows], 'query_index': rows,
             'query_video_index': ground_truth[rows]}

  return EvalSplit(video_batches, query_batches, names,
                   [f'q{i}' for i in range(len(texts))])


def test_a_pairs_score_is_the_same_whatever_else_is_evaluated():
  config, _, params = _model(num_samples=8)
  rng = np.random.default_rng(2)
  frames = rng.normal(size=(12, 12, 32)).astype(np.float32)   # videos 8..11 are distractors
  texts = rng.normal(size=(7, 1, 32)).astype(np.float32)
  ground_truth = np.array([3, 0, 5, 7, 1, 2, 4])

  def scores(videos, queries, video_chunk, query_chunk, num_devices, shuffle=False):
    """Scores of `queries` x `videos` (original numbers) evaluated as a split of their own."""
    position = {v: i for i, v in enumerate(videos)}
    order = rng.permutation(len(videos)) if shuffle else np.arange(len(videos))
    split = _split(frames[videos], texts[queries], np.array([position[ground_truth[q]]
                                                             for q in queries]),
                   [f'video{v}' for v in videos], video_chunk, query_chunk, order)
    evaluator = Evaluator(config.model, support.data_mesh(num_devices), video_chunk, query_chunk)
    return evaluator.evaluate(params, split).scores

  everything = scores(list(range(12)), list(range(7)), 5, 3, 2)
  cases = [
      (list(range(12)), list(range(7)), 4, 2, 1, True),        # shuffled gallery, 1 device
      (list(range(8)), list(range(7)), 8, 7, 2, False),        # no distractors
      (list(range(12)), [0, 2, 4, 6], 3, 4, 2, True),          # half the queries
      ([5, 0, 3, 7, 1, 2, 4], [1, 3, 5], 2, 1, 1, False),      # fewer videos, other order
      ([0, 1, 2, 3, 4, 5, 7, 9, 10, 11], [6], 7, 1, 2, True),  # one query, more videos
  ]
  for videos, queries, video_chunk, query_chunk, num_devices, shuffle in cases:
    ours = scores(videos, queries, video_chunk, query_chunk, num_devices, shuffle)
    # Scores are O(1) cosines; only the batching of rows changes.
    support.assert_close(ours, everything[np.ix_(queries, videos)], rtol=1e-5,
                         err_msg=str((videos, queries)))
