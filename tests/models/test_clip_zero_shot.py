"""Zero-shot CLIP: the poolings against numpy, the score against CLIP's towers computed by
hand, an evaluation through the Evaluator, index search against the evaluator's ranking, and
the 'nothing to train' path (train.py refuses; evaluate.py runs without a checkpoint)."""

import json

import jax
from jax.sharding import Mesh
import numpy as np
import pytest

from prvr_jax import clip
from prvr_jax import train
from prvr_jax.clip import tokenizer
from prvr_jax.eval import EvalSplit, Evaluator
from prvr_jax.index import Searcher, build_index
from prvr_jax.models import clip_zero_shot, registry
import support

SPEC = clip_zero_shot.SPEC
TINY = clip.backbone_config('tiny')
NUM_VIDEOS, NUM_QUERIES, FRAMES, DIM = 7, 5, 6, 16
LENGTHS = (6, 1, 3, 6, 2, 5, 4)  # real frames per video


def _numpy_scores(texts, frames, mask, pooling, top_k=3):
  """The poolings written out with numpy, in float64."""
  t = texts / np.linalg.norm(texts, axis=-1, keepdims=True)
  f = frames / np.maximum(np.linalg.norm(frames, axis=-1, keepdims=True), 1e-12)
  out = np.zeros((len(t), len(f)))
  for b in range(len(f)):
    real = f[b][mask[b] > 0]
    if pooling == 'mean':
      pooled = real.mean(0)
      out[:, b] = t @ (pooled / np.linalg.norm(pooled))
    else:
      cosines = np.sort(t @ real.T, axis=1)[:, ::-1]
      out[:, b] = cosines[:, 0] if pooling == 'max' else cosines[:, :top_k].mean(1)
  return out


def _features(seed=0):
  rng = np.random.default_rng(seed)
  frames = rng.normal(size=(NUM_VIDEOS, FRAMES, DIM)).astype(np.float32)
  mask = (np.arange(FRAMES)[None] < np.array(LENGTHS)[:, None]).astype(np.float32)
  frames *= mask[..., None]  # padded rows are zeros, as the release reader pads them
  texts = rng.normal(size=(NUM_QUERIES, DIM)).astype(np.float32)
  return texts, frames, mask


def _config(pooling='mean', **model):
  config = support.load_config('clip_zero_shot', 'tiny')
  config.model.update({'pooling': pooling, 'hidden_dim': DIM, 'visual_dim': DIM,
                       'query_dim': DIM, 'max_frames': FRAMES, **model})
  return config


@pytest.mark.parametrize('pooling', ['mean', 'max', 'topk'])
def test_poolings_equal_numpy(pooling):
  texts, frames, mask = _features()
  expected = _numpy_scores(texts, frames, mask, pooling)
  config = _config(pooling)
  module = SPEC.build(config.model)
  params = {'logit_scale': np.float32(0.0)}
  # The stored-encoding path (what the evaluator and the index run) and the reference.
  stored = module.apply({'params': params}, {'frame_feats': frames, 'frame_mask': mask},
                        method='encode_videos')
  encoded = module.apply({'params': params}, {'query_feats': texts[:, None]},
                         method='encode_queries')
  scores = module.apply({'params': params}, encoded, stored, method='score')
  reference = clip_zero_shot.pool_scores(texts, frames, mask, pooling, top_k=3)
  # Cosines of width-16 vectors: a few float32 reductions.
  support.assert_close(scores, expected, rtol=support.f32_rtol(DIM, ops=4), scale=1.0)
  support.assert_close(reference, expected, rtol=support.f32_rtol(DIM, ops=4), scale=1.0)
  if pooling == 'mean':
    assert stored['frames'].shape == (NUM_VIDEOS, 1, DIM)
  else:  # every frame stored, zero rows and mask 0 at padding
    assert stored['frames'].shape == (NUM_VIDEOS, FRAMES, DIM)
    np.testing.assert_array_equal(stored['mask'], mask)
    assert not np.any(np.asarray(stored['frames'])[mask == 0])


def test_max_over_one_frame_videos_and_top_k_beyond_the_frames():
  texts, frames, mask = _features(1)
  # Video 1 has one real frame: every pooling is that frame's cosine; top-k with k larger than
  # any video's frames is the mean over all real frames.
  single = _numpy_scores(texts, frames, mask, 'max')[:, 1]
  for pooling in ('mean', 'max', 'topk'):
    got = clip_zero_shot.pool_scores(texts, frames, mask, pooling, top_k=3)[:, 1]
    support.assert_close(got, single, rtol=support.f32_rtol(DIM, ops=4), scale=1.0)
  all_frames = clip_zero_shot.pool_scores(texts, frames, mask, 'topk', top_k=FRAMES + 5)
  t = texts / np.linalg.norm(texts, axis=-1, keepdims=True)
  f = frames / np.maximum(np.linalg.norm(frames, axis=-1, keepdims=True), 1e-12)
  expected = np.einsum('qd,bld->qbl', t, f)
  expected = (expected * mask).sum(-1) / mask.sum(-1)
  support.assert_close(all_frames, expected, rtol=support.f32_rtol(DIM, ops=4), scale=1.0)


@pytest.fixture(scope='module')
def tiny_clip():
  """A random tiny CLIP (`clip.backbone_config('tiny')`): params, frames `[B, F, S, S, 3]`,
  tokens."""
  config = TINY
  rng = np.random.default_rng(2)
  frames = rng.normal(size=(3, 2, config.image_size, config.image_size, 3)).astype(np.float32)
  tokens = np.zeros((4, config.context_length), np.int32)
  for row, length in enumerate((3, 7, 2, 5)):
    tokens[row, :length] = rng.integers(1, config.vocab_size - 1, size=length)
    tokens[row, length] = config.vocab_size - 1  # the EOT, the largest id
  params = jax.jit(clip.CLIP(config).init)(jax.random.key(0), frames[:, 0], tokens)['params']
  return params, frames, tokens


@pytest.mark.parametrize('pooling', ['mean', 'max'])
def test_score_from_the_clip_towers_equals_a_hand_computation(tiny_clip, pooling):
  clip_params, frames, tokens = tiny_clip
  config = _config(pooling, video_input='frames', query_input='tokens', backbone='tiny',
                   hidden_dim=TINY.embed_dim, num_frames=frames.shape[1])
  # CLIP's own parameter tree drops in: the model holds exactly its towers and logit scale.
  params = clip_zero_shot.into_model(
      jax.device_get(SPEC.param_shapes(config.model)), clip_params, 'the tiny CLIP')
  model = clip.CLIP(TINY)
  images = model.apply({'params': clip_params}, frames.reshape(-1, *frames.shape[2:]),
                       method='encode_image')
  texts = model.apply({'params': clip_params}, tokens, method='encode_text')
  images = np.asarray(images).reshape(frames.shape[0], frames.shape[1], -1)
  expected = _numpy_scores(np.asarray(texts), images, np.ones(images.shape[:2]), pooling)
  module = SPEC.build(config.model)
  scores = module.apply({'params': params}, {'frames': frames, 'tokens': tokens})['scores']
  support.assert_close(scores, expected, rtol=support.f32_rtol(TINY.embed_dim, ops=8),
                       scale=1.0)


def _split(texts, frames, mask, gt, batch=3):
  def video_batches():
    for start in range(0, len(frames), batch):
      keys = np.arange(start, min(start + batch, len(frames)))
      yield {'frame_feats': frames[keys], 'frame_mask': mask[keys], 'video_index': keys}

  def query_batches():
    for start in range(0, len(texts), batch):
      rows = np.arange(start, min(start + batch, len(texts)))
      yield {'query_feats': texts[rows, None], 'query_index': rows,
             'query_video_index': gt[rows]}

  return EvalSplit(video_batches, query_batches, [f'video {i}' for i in range(len(frames))],
                   [f'query {i}' for i in range(len(texts))])


@pytest.mark.parametrize('pooling', ['mean', 'max'])
def test_evaluator_and_index_rank_as_numpy(pooling, tmp_path):
  texts, frames, mask = _features(3)
  gt = np.random.default_rng(3).integers(0, NUM_VIDEOS, size=NUM_QUERIES)
  config = _config(pooling)
  config.eval.video_batch_size = config.eval.query_batch_size = 4
  params = clip_zero_shot.pretrained_params(config)
  split = _split(texts, frames, mask, gt)
  mesh = Mesh(np.array(jax.devices()), ('data',))
  result = Evaluator.from_config(config, mesh, progress=False).evaluate(params, split)
  expected = _numpy_scores(texts, frames, mask, pooling)
  support.assert_close(result.scores, expected, rtol=support.f32_rtol(DIM, ops=4), scale=1.0)
  assert np.diff(np.sort(expected, axis=1), axis=1).min() > 1e-4  # no near-ties to reorder
  ranks = 1 + (expected > expected[np.arange(NUM_QUERIES), gt][:, None]).sum(1)
  np.testing.assert_array_equal(result.ranks, ranks)
  # The index: exact search returns the evaluator's ranking of every video.
  index = build_index(config, params, split, str(tmp_path / 'index'), shard_videos=4)
  found = Searcher(index, query_batch_size=2, chunk_videos=3, resident=False).search(
      {'query_feats': texts[:, None]}, k=NUM_VIDEOS)
  np.testing.assert_array_equal(found.rows, np.argsort(-result.scores, axis=1, kind='stable'))
  support.assert_close(found.scores, np.take_along_axis(result.scores, found.rows, 1),
                       rtol=1e-5)


def test_nothing_to_train(tmp_path):
  config = support.load_config('clip_zero_shot', 'tiny')
  assert not SPEC.trainable and registry.get_spec('gmmformer').trainable
  workdir = tmp_path / 'run'
  with pytest.raises(ValueError, match=r"config.model.name='clip_zero_shot' has no parameters "
                     r'to train .*nothing to train. Evaluate it with evaluate.py'):
    train.train_and_evaluate(config, str(workdir))
  assert not workdir.exists()
  with pytest.raises(clip_zero_shot.NothingToTrainError, match='no parameters to train'):
    SPEC.objective(None, None, None, None, None)
  # A real CLIP tower without weights is refused before anything is initialised.
  text = support.load_config('clip_zero_shot', 'tvr_clip,text_tower')
  with pytest.raises(ValueError, match=r'config.model.clip_weights is empty'):
    clip_zero_shot.pretrained_params(text)


def _hand_made_vocab(tmp_path):
  """A CLIP BPE vocabulary of 512 byte tokens and a few merges (as tests/clip makes one)."""
  return tokenizer.write_vocab(tmp_path / 'vocab.txt.gz', ['c a', 'ca t</w>', 'd o', 'do g</w>'])


def test_evaluate_a_clip_release_without_a_checkpoint(tiny_clip, tmp_path, monkeypatch):
  """evaluate.py's path without --checkpoint on a CLIP feature release, captions through the
  text tower (`data.query_tokens`): the scores are the towers' cosines computed by hand."""
  from prvr_jax.data import release  # pylint: disable=g-import-not-at-top
  from prvr_jax.tools import evaluate  # pylint: disable=g-import-not-at-top
  clip_params = tiny_clip[0]
  # The weights file's reader has its own tests (tests/clip): here it hands over the tiny CLIP.
  weights_file = str(tmp_path / 'clip.safetensors')
  loaded = []
  monkeypatch.setattr(clip_zero_shot.clip_weights, 'load',
                      lambda path: loaded.append(path) or (TINY, clip_params))
  rng = np.random.default_rng(4)
  dim = TINY.embed_dim
  lengths = {'v0': 3, 'v1': 5, 'v2': 1, 'v3': 4}  # the test videos
  split_videos = {'train': ['t0', 't1'], 'val': ['u0'], 'test': list(lengths)}
  videos = {v: rng.normal(size=(lengths.get(v, 2), dim)).astype(np.float32)
            for names in split_videos.values() for v in names}
  words = ['a cat', 'the dog', 'cats and dogs', 'a dog and a cat', 'cat', 'dog dog']
  captions = {split: [(f'{v}#enc#{i}', words[(k + i) % len(words)])
                      for k, v in enumerate(names) for i in range(2)]
              for split, names in split_videos.items()}
  sentence = {c: rng.normal(size=dim).astype(np.float32)
              for items in captions.values() for c, _ in items}
  release.write_release(str(tmp_path / 'rel'), 'tvr', videos, captions, sentence,
                        visual_feature=None, text_feature='clip')
  config = support.load_config('clip_zero_shot', 'tvr_clip,text_tower')
  config.model.update(backbone='tiny', pooling='max', hidden_dim=dim, visual_dim=dim,
                      query_dim=dim, max_frames=8, num_clips=4,
                      clip_weights=weights_file)
  config.data.update(dir=str(tmp_path / 'rel' / 'tvr'), check_published=False,
                     clip_vocab=_hand_made_vocab(tmp_path))
  with pytest.raises(ValueError, match='without --checkpoint: pass --output_dir'):
    evaluate.evaluate_checkpoint(config, None)
  out = tmp_path / 'eval'
  result = evaluate.evaluate_checkpoint(config, None, 'test', str(out))
  metrics = json.loads((out / 'metrics.json').read_text())
  assert metrics['checkpoint_source'] == 'pretrained'
  assert metrics['checkpoint'] == weights_file and loaded == [weights_file]
  assert metrics['data']['query_tokens'] and metrics['sumr'] == result.metrics['sumr']
  # By hand: CLIP's text tower on the tokenised captions, max over each video's raw frames.
  tokens = clip.Tokenizer(config.data.clip_vocab)(
      [text for _, text in captions['test']], context_length=TINY.context_length)
  texts = clip.CLIP(TINY).apply({'params': clip_params}, tokens, method='encode_text')
  frames = np.zeros((len(lengths), 8, dim), np.float32)
  mask = np.zeros((len(lengths), 8), np.float32)
  for k, v in enumerate(lengths):
    frames[k, :lengths[v]], mask[k, :lengths[v]] = videos[v], 1
  expected = _numpy_scores(np.asarray(texts), frames, mask, 'max')
  support.assert_close(result.scores, expected, rtol=support.f32_rtol(dim, ops=8), scale=1.0)
  # prvr-index build without --checkpoint, then evaluate.py --index: the same ranks.
  from prvr_jax import index as index_lib  # pylint: disable=g-import-not-at-top
  built = index_lib.build_from_checkpoint(config, None, 'test', str(tmp_path / 'index'))
  assert built.manifest['info']['checkpoint_source'] == 'pretrained'
  from_index = index_lib.evaluate_index(config, built.path, 'test', str(tmp_path / 'from_index'))
  np.testing.assert_array_equal(from_index.ranks, result.ranks)
