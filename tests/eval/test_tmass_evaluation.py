"""T-MASS's evaluation: a (query, video) score depends on nothing but the pair (paper Eq. 10),
and the released evaluation's query/video axis mix-up, reproduced from the released code's own
output (tests/fixtures/tmass/leak.npz), ranks differently and leaks the ground truth."""

import functools
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from prvr_jax import clip
from prvr_jax import convert
from prvr_jax import metrics
from prvr_jax import torch_file
from prvr_jax.clip import weights as clip_weights
from prvr_jax.eval import EvalSplit, Evaluator
from prvr_jax.eval.evaluator import score_keys
from prvr_jax.eval.splits import video_seeds
from prvr_jax.layers import stochastic_text
from prvr_jax.models import registry
from prvr_jax.models.tmass import released
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


def _model(num_samples=20, dim=32, frames=12, noise='per_video'):
  config = support.load_config('tmass', 'tiny')
  config.model.update(hidden_dim=dim, visual_dim=dim, query_dim=dim, num_samples=num_samples,
                      noise=noise)
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


@pytest.mark.parametrize('noise', stochastic_text.NOISE_MODES)
def test_a_pairs_score_is_the_same_whatever_else_is_evaluated(noise):
  config, _, params = _model(num_samples=8, noise=noise)
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


# --------------------------------------------------------------------------- a released checkpoint
# tests/fixtures/tmass/model_best.pth: a tiny checkpoint written by the official trainer's
# `_save_checkpoint` (CLIP a tiny Hugging Face `CLIPModel`); release.npz: the official
# evaluation's inputs, recorded noise and outputs from it (tests/fixtures/tmass/README.md).
RELEASE_DIR = os.path.join(os.path.dirname(__file__), '..', 'fixtures', 'tmass')
CHECKPOINT = os.path.join(RELEASE_DIR, 'model_best.pth')


@functools.lru_cache(maxsize=None)
def _release():
  with np.load(os.path.join(RELEASE_DIR, 'release.npz')) as data:
    return {k: data[k] for k in data.files}


@functools.lru_cache(maxsize=None)
def _released_model(noise='per_pair'):
  """(config.model inferred from the checkpoint, the module, params read without torch)."""
  state_dict = torch_file.load_torch_checkpoint(CHECKPOINT, use_torch=False)
  config_model = convert.infer_model_config(state_dict, 'tmass')
  config_model.update(num_samples=int(_release()['num_trials']), noise=noise)
  params = convert.torch_to_params(state_dict, 'tmass', config_model, source=CHECKPOINT)
  return config_model, registry.get_spec(config_model).build(config_model), params


def _encoded(module, params, r):
  """Our (texts `[Nt, D]`, stored videos) of the fixture's tokens and pixels."""
  texts = module.apply({'params': params}, {'tokens': r['tokens']}, method='encode_queries')
  pixels = r['pixels'].astype(np.float32).transpose(0, 1, 3, 4, 2)   # torch NCHW -> NHWC
  stored = module.apply({'params': params},
                        {'frames': pixels, 'video_seed': np.arange(len(pixels), dtype=np.int32)},
                        method='encode_videos')
  return texts, stored


def test_released_checkpoint_reads_and_encodes_as_the_official_model():
  r = _release()
  config_model, module, params = _released_model()
  assert (config_model.backbone, config_model.hidden_dim, config_model.num_frames) == (
      'tiny', 32, 3)
  texts, stored = _encoded(module, params, r)
  # One-layer towers of width 32: a handful of chained reductions over 32 to 768 terms.
  support.assert_close(texts[:, :32], r['text_embeds'], support.f32_rtol(768, ops=8))
  support.assert_close(stored['frames'], r['video_embeds'], support.f32_rtol(768, ops=8))
  # With torch, the same tensors; the CLIP inside reads as CLIP weights too.
  if support.has_torch():
    with_torch = torch_file.load_torch_checkpoint(CHECKPOINT, use_torch=True)
    plain = torch_file.load_torch_checkpoint(CHECKPOINT, use_torch=False)
    assert set(with_torch) == set(plain)
    for k, v in plain.items():
      np.testing.assert_array_equal(with_torch[k], v, err_msg=k)
  _, clip_params = clip_weights.load(CHECKPOINT, clip.model.TINY)
  jax.tree.map(np.testing.assert_array_equal, clip_params['visual'], params['visual'])
  jax.tree.map(np.testing.assert_array_equal, clip_params['text'], params['text'])


def test_official_noise_mode_gives_the_official_leak_free_scores_and_the_leaky_ones():
  r = _release()
  _, module, params = _released_model()
  texts, stored = _encoded(module, params, r)
  noise = r['noise'].transpose(2, 0, 1, 3)           # [video, trial, text, D] -> [Q, B, M, D]
  apply = lambda method, *args: module.apply({'params': params}, *args, method=method)
  scores = apply('score', texts, stored, noise)
  best, selected, pooled = apply('best_samples', texts, stored, noise)
  # Eq. 10's max over the recorded trials: the official selection loop's own maximum.
  rtol = support.f32_rtol(768, ops=12)
  support.assert_close(scores, r['scores_correct'], rtol)
  support.assert_close(best, r['scores_correct'], rtol)
  # The official loop keeps the chosen trial normalised.
  support.assert_close(_unit(np.asarray(selected)), r['selected'].transpose(1, 0, 2), rtol)
  support.assert_close(pooled, r['pooled'].transpose(1, 0, 2), rtol)
  # The released gathering (`official_leak`): the official `sims`, NaNs included.
  video_of = r['caption_video']
  slot, own = released.caption_slots(video_of, len(r['video_ids']))
  leaky = np.asarray(released.leaky_scores(selected, pooled, slot, own))
  layout = released.scores_by_video_slot(leaky, video_of, len(r['video_ids']))
  np.testing.assert_array_equal(np.isnan(layout), np.isnan(r['sims_leaky']))
  support.assert_close(np.nan_to_num(layout), np.nan_to_num(r['sims_leaky']), rtol)
  # The official metrics, both ways, from our scores: leaky and leak-free.
  for ours, name in ((leaky, ''), (np.asarray(scores), '_correct')):
    got = released.released_metrics(ours, video_of)
    for direction, prefix in (('t2v', ''), ('v2t', 'v2t_')):
      for key in ('R1', 'R5', 'R10', 'R50', 'R100', 'MedR', 'MeanR'):
        ours_key = released.PREFIX + prefix + {'MedR': 'medr', 'MeanR': 'meanr'}.get(
            key, key.lower())
        np.testing.assert_allclose(got[ours_key], r[f'{direction}{name}/{key}'], rtol=1e-12,
                                   err_msg=f'{direction}{name} {key}')
  # The leak shows: the leaky R@5 is not the leak-free one on these weights.
  assert r['t2v/R5'] != r['t2v_correct/R5']


def test_released_evaluation_option_runs_on_a_split_in_chunks():
  r = _release()
  config_model, module, params = _released_model()
  config = ml_collections.ConfigDict({'model': config_model,
                                      'eval': {'score_seed': 3, 'tmass_official_leak': True}})
  pixels = r['pixels'].astype(np.float32).transpose(0, 1, 3, 4, 2)
  video_of = r['caption_video']

  def video_batches():
    for start in range(0, len(pixels), 3):
      keys = np.arange(start, min(start + 3, len(pixels)))
      yield {'frames': pixels[keys], 'video_index': keys}

  def query_batches():
    for start in range(0, len(video_of), 4):
      rows = np.arange(start, min(start + 4, len(video_of)))[::-1]  # any order within a batch
      yield {'tokens': r['tokens'][rows], 'query_index': rows, 'query_video_index': video_of[rows]}

  split = EvalSplit(video_batches, query_batches, list(r['video_ids']),
                    [f'q{i}' for i in range(len(video_of))])
  got = released.evaluate(config, params, split)
  # The same, unchunked and unjitted: every pair's samples drawn from the evaluator's key
  # (per-pair noise is keyed by the video's seed and the query's tokens, not by its batch).
  texts, stored = _encoded(module, params, r)
  stored['key'] = jnp.asarray(video_seeds(list(r['video_ids'])))
  _, selected, pooled = module.apply({'params': params}, texts, stored, method='best_samples',
                                     rngs=score_keys(registry.get_spec(config_model), 3))
  slot, own = released.caption_slots(video_of, len(pixels))
  expected = released.released_metrics(
      np.asarray(released.leaky_scores(selected, pooled, slot, own)), video_of)
  assert got == expected


def test_released_checkpoint_errors_name_the_key_and_the_file():
  state_dict = torch_file.load_torch_checkpoint(CHECKPOINT, use_torch=False)
  config_model = convert.infer_model_config(state_dict, 'tmass')
  # Exported back, every tensor is the file's but the three dropped names (the official code
  # loads with strict=False; CLIP's buffers are rebuilt, the scalar is never used).
  exported = convert.params_to_torch(convert.torch_to_params(state_dict, 'tmass', config_model),
                                     'tmass')
  ignored = registry.get_spec('tmass').official.ignored
  assert set(exported) == set(state_dict) - set(ignored)
  for name, value in exported.items():
    np.testing.assert_array_equal(value, state_dict[name], err_msg=name)
  missing = dict(state_dict)
  del missing['pool_frames.cross_attn.q_proj.weight']
  missing['pool_frames.extra.weight'] = np.zeros(3, np.float32)
  with pytest.raises(ValueError) as error:
    convert.torch_to_params(missing, 'tmass', config_model, source=CHECKPOINT)
  message = str(error.value)
  assert 'pool_frames.cross_attn.q_proj.weight' in message
  assert 'pool_frames.extra.weight' in message
  assert message.splitlines()[-1].strip() == f'in {CHECKPOINT}'
  # A frozen-feature config does not hold CLIP: its tensors are reported, not dropped.
  config_model.backbone = ''
  with pytest.raises(ValueError, match='unused torch keys .45.:\n    clip.text_model.'):
    convert.torch_to_params(state_dict, 'tmass', config_model, source=CHECKPOINT)
  # The official model's unused scalar and CLIP's old buffers are the only names dropped.
  assert set(ignored) == {
      'stochastic.std_branch.learnable_scalar', 'clip.text_model.embeddings.position_ids',
      'clip.vision_model.embeddings.position_ids'}
