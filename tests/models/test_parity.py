"""Parity with the official PyTorch GMMFormer v1 / v2, MS-SL and AMDNet (the last two minimally
repaired; fixtures: tests/fixtures/README.md).

Each fixture checkpoint is read by `prvr_jax.torch_file` and mapped by `prvr_jax.convert`; our
forward outputs, eval scores, loss terms, gradients and BertAdam updates must match what the
official code computed.
"""

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import official_release
import support
from prvr_jax import convert, metrics, models, torch_file
from prvr_jax.data import release
from prvr_jax.models.spec import LossContext

FIXTURES = support.OFFICIAL
MODELS = ['gmmformer', 'gmmformer_v2', 'ms_sl', 'amdnet']
# The dataset variants of every official config (configs/<model>.py:<variant>).
VARIANTS = ['tvr', 'activitynet', 'charades']
# Fixture loss names -> objective term names.
TERMS = {'clip_nce': 'clip_nce', 'clip_trip': 'clip_triplet', 'frame_nce': 'frame_nce',
         'frame_trip': 'frame_triplet', 'qdl': 'qdl', 'om': 'om', 'nce': 'clip_nce',
         'div': 'moment_diversity', 'relevance': 'moment_relevance'}
# Both batches are padded to these static shapes (5 videos, 11 queries).
NUM_VIDEOS, NUM_QUERIES = 5, 11
# Parity: errors within 1e-5 (~80 eps) of each array's magnitude (max |official value|, see
# `_close`), for the float32 rounding of both implementations (torch's on another CPU). For
# the cosines and scores (magnitude 0.4-0.66) that is as strict as the former 1e-5 absolute
# bound; it scales for the encodings (3-4.6: measured errors up to 7.8e-6 with XLA -O0, close
# to that former bound) and the raw dot products (3-15, formerly 1e-4 absolute).
PARITY_RTOL = 1e-5
# AMDNet's span masks exp(-(p - c)^2 / (2 sigma^2)) with sigma = w / 9 down to 0.01 / 9: the
# rounding of the centre c (a sigmoid output, ~1 ulp) moves a mask value by up to
# ~|p - c| eps / sigma^2 * mask, about 6e-6 * 2^-23 / 1.2e-6 ~ 7e-5 for the narrowest spans;
# the fixture's masks agree with a float64 recomputation to 1.2e-5 only. The masks and what is
# pooled with them (the moments) get this bound.
SPAN_RTOL = 2e-4

# Official config fields (the fixture meta's `dims`) -> config.model fields.
DIMS = {
    'visual_feat_dim': 'visual_dim', 'visual_input_size': 'visual_dim',
    'q_feat_size': 'query_dim', 'query_input_size': 'query_dim', 'hidden_size': 'hidden_dim',
    'n_heads': 'num_heads', 'max_desc_l': 'max_query_len', 'max_ctx_l': 'max_frames',
    'map_size': 'num_clips', 'event_size': 'num_spans',
}
# Per model: (fixture out key, our encoding / training-output key) pairs compared on the real
# rows; MS-SL's frame tables are compared up to the batch's padded length (`_ms_sl_tables`).
ENCODINGS = {
    'gmmformer': [('clips', 'clips'), ('video', 'video')],
    'gmmformer_v2': [('clips', 'clips'), ('frames', 'frames')],
    'ms_sl': [('proposals', 'proposals'), ('frame_logits', 'frame_logits'),
              ('frame_values', 'frame_values')],
    'amdnet': [('clips', 'clips')],
}
TRAINING = {
    'gmmformer': [('clip_scores', 'clip_scores'), ('frame_scores', 'frame_scores'),
                  ('clip_scores_raw', 'clip_logits'), ('frame_scores_raw', 'frame_logits')],
    'ms_sl': [('clip_scores_train', 'clip_scores'), ('frame_scores_train', 'frame_scores'),
              ('clip_scores_raw', 'clip_logits'), ('frame_scores_raw', 'frame_logits')],
    'amdnet': [('clip_scores_raw', 'clip_logits'), ('video', 'summaries'), ('spans', 'spans'),
               ('masks', 'masks'), ('proposals', 'moments')],
}
TRAINING['gmmformer_v2'] = TRAINING['gmmformer']


def _meta(fixture):
  return json.loads(str(fixture['meta']))


def _optim_meta(meta):
  """(lr, warmup, weight decay, t_total) of a fixture's official optimizer steps."""
  cfg = meta.get('config', meta)
  return (cfg['lr'], cfg.get('warmup', cfg.get('lr_warmup_proportion')),
          cfg.get('weight_decay', cfg.get('wd')), meta['t_total'])


@functools.cache
def _setup(name, variant='tvr'):
  """(config, model, params, fixture) for one model and config variant; params come from the
  official checkpoint."""
  fixture = _fixture(name)
  meta = _meta(fixture)
  config = support.load_config(name, variant)
  config.model.update({DIMS[k]: v for k, v in meta['dims'].items() if k in DIMS})
  config.model.update(dropout=0.0, input_dropout=0.0)
  config.loss.hard_pool_size = meta.get('hard_pool_size', config.loss.get('hard_pool_size', 1))
  params = convert.torch_to_params(_state_dict(name), name, config.model)
  return config, models.get_model(config.model), params, fixture


@functools.cache
def _fixture(name):
  return dict(np.load(FIXTURES / f'{name}.npz'))


@functools.cache
def _state_dict(name):
  """The official checkpoint's tensors (read once; the variants' configs share them)."""
  return torch_file.load_torch_checkpoint(str(FIXTURES / f'{name}_best.ckpt'))


def _batch(fixture, prefix, config):
  """The fixture batch in our contract: frames padded to 128, words to max_query_len (AMDNet's
  sentence vectors are one-token queries), items to 5 / 11."""
  x = {k[len(prefix) + 4:]: v for k, v in fixture.items() if k.startswith(prefix + '/in/')}
  if x['query_feats'].ndim == 2:
    x['query_feats'] = x['query_feats'][:, None]
    x['query_mask'] = np.ones(x['query_feats'].shape[:2], np.float32)
  num_videos, num_queries = len(x['frame_mask']), len(x['query_mask'])
  pad = lambda a, shape: np.pad(a, [(0, s - d) for s, d in zip(shape, a.shape)])
  lf, lq = config.model.max_frames, config.model.max_query_len
  return {
      'clip_feats': pad(x['clip_feats'], (NUM_VIDEOS,) + x['clip_feats'].shape[1:]),
      'frame_feats': pad(x['frame_feats'], (NUM_VIDEOS, lf, x['frame_feats'].shape[2])),
      'frame_mask': pad(x['frame_mask'], (NUM_VIDEOS, lf)),
      'video_valid': np.arange(NUM_VIDEOS) < num_videos,
      'query_feats': pad(x['query_feats'], (NUM_QUERIES, lq, x['query_feats'].shape[2])),
      'query_mask': pad(x['query_mask'], (NUM_QUERIES, lq)),
      'query_valid': np.arange(NUM_QUERIES) < num_queries,
      'query_video': pad(x['query_labels'].astype(np.int32), (NUM_QUERIES,)),
  }, num_videos, num_queries


@functools.cache
def _step_fn(name):
  """Jitted: eval outputs, training outputs, loss terms and gradients (one compile per model:
  both fixture batches are padded to the same shapes)."""
  config, model, _, _ = _setup(name)
  spec = models.get_spec(config.model)
  # Hard negatives on (the fixtures' hard mode, pool 1); dropout is 0.
  ctx = LossContext(loss=config.loss, epoch=jnp.int32(1000), step=jnp.int32(0))
  keys = jax.random.split(jax.random.key(0), len(spec.rng_streams))
  rngs = dict(zip(spec.rng_streams, keys))

  @jax.jit
  def step(params, batch):
    v = {'params': params}
    videos = model.apply(v, {k: batch[k] for k in spec.video_inputs}, method='encode_videos')
    queries = model.apply(v, batch, method='encode_queries')
    (total, terms), grads = jax.value_and_grad(spec.objective, argnums=1, has_aux=True)(
        model, params, batch, rngs, ctx)
    return dict(videos=videos, queries=queries,
                scores=model.apply(v, queries, videos, method='score'), total=total,
                terms=terms, outputs=model.apply(v, batch), grads=grads)

  return step


@functools.cache
def _run(name, prefix):
  config, _, params, fixture = _setup(name)
  batch, num_videos, num_queries = _batch(fixture, prefix, config)
  return jax.device_get(_step_fn(name)(params, batch)), num_videos, num_queries


def _close(actual, expected, what, rtol=PARITY_RTOL, scale=None):
  """|actual - expected| <= rtol * (|expected| + scale), scale = max|expected| by default."""
  support.assert_close(actual, expected, rtol, scale=scale, err_msg=what)


def _rows(ours, expected, nv, nq):
  """Our padded array cut to the fixture's real rows (and frames / paired queries)."""
  if expected.shape[:2] == (nq, nv):
    return ours[:nq, :nv]
  if expected.shape[:2] == (nq, nq):
    return ours[:nq, :nq]
  ours = ours[:expected.shape[0]]
  return ours[:, :expected.shape[1]] if ours.ndim == 3 else ours


def _ms_sl_tables(videos, fixture, prefix, params):
  """MS-SL stores its clips and KCGA tables, the official code its proposals and frames:
  ours with `proposals` (our multi-scale clips) and frame tables cut to the official padded
  length; the fixture with the tables the official proposals (the first 32 are the clips) and
  frames give under our converted kernels."""
  proposals, frames = (np.asarray(fixture[f'{prefix}/out/{k}'], np.float64)
                       for k in ('proposals', 'frames'))
  kcga = {k: np.asarray(v, np.float64) for k, v in params['key_clip_attention'].items()}
  num_clips, length = videos['clips'].shape[1], frames.shape[1]
  fixture = {**fixture,
             f'{prefix}/out/frame_logits': np.einsum(
                 'bcd,btd->bct', proposals[:, :num_clips] @ kcga['key'].T, frames),
             f'{prefix}/out/frame_values': frames @ kcga['value']}
  videos = {'proposals': np.asarray(models.get_model(_setup('ms_sl')[0].model).apply(
      {'params': params}, videos, method='clip_set')),
            'frame_logits': videos['frame_logits'][..., :length],
            'frame_values': videos['frame_values']}
  return videos, fixture


@pytest.mark.parametrize('name', MODELS)
@pytest.mark.parametrize('prefix', ['b1', 'b2'])
def test_forward_scores_and_losses(name, prefix):
  _, _, params, fixture = _setup(name)
  ours, nv, nq = _run(name, prefix)
  if name == 'ms_sl':
    ours['videos'], fixture = _ms_sl_tables(ours['videos'], fixture, prefix, params)
  out = lambda key: fixture[f'{prefix}/out/{key}']
  rtol = lambda key: SPAN_RTOL if name == 'amdnet' and key in ('masks', 'proposals') else (
      PARITY_RTOL)

  for key, our_key in ENCODINGS[name]:
    _close(_rows(ours['videos'][our_key], out(key), nv, nq), out(key), key, rtol(key))
  _close(ours['queries'][:nq], out('queries'), 'queries')
  _close(ours['scores'][:nq, :nv], out('scores'), 'eval scores')
  for key, our_key in TRAINING[name]:
    _close(_rows(ours['outputs'][our_key], out(key), nv, nq), out(key), key, rtol(key))
  expected_terms = {TERMS[k.split('/')[-1]]: v for k, v in fixture.items()
                    if k.startswith(f'{prefix}/loss/') and not k.endswith('/total')}
  assert set(ours['terms']) == set(expected_terms)
  # The terms are summed into the total (1.2-4.8), so their absolute error is measured against
  # it: some are small by cancellation (om = 1 - mean matched cosine ~ 0.06) or by their
  # exponentials (qdl ~ 0.003-0.02), and rounding is relative to the O(1) cosines they
  # come from, not to their own value.
  total = float(fixture[f'{prefix}/loss/total'])
  for term, value in expected_terms.items():
    _close(ours['terms'][term], value, f'loss term {term}', scale=abs(total))
  _close(ours['total'], total, 'total loss')


def _span_conditioning(fixture) -> float:
  """How much AMDNet's narrowest span mask amplifies float32 rounding in the gradients of
  everything upstream of the spans (projection, positions, summary, span head): d m / d c =
  m (p - c) / sigma^2 is up to ~1 / sigma times m's own scale, so their errors are ~eps / sigma
  relative (7e-5 for b1's sigma = 0.0156 / 9, measured 0.9-1.2e-4 on an AMD Zen 4), not ~eps.
  Returns the factor on the 1e-4 (~800 eps) bounds: 20 eps / sigma_min / 1e-4 (13.8 for b1)."""
  widths = fixture['b1/out/spans'][..., 1]
  sigma = max(float(widths.min()), 0.01) / 9
  return max(1.0, 20 * support.F32_EPS / sigma / 1e-4)


@pytest.mark.parametrize('name', MODELS)
def test_gradients(name):
  _, _, _, fixture = _setup(name)
  ours = convert.params_to_torch(_run(name, 'b1')[0]['grads'], name)
  expected = {k[len('b1/grad/'):]: v for k, v in fixture.items() if k.startswith('b1/grad/')}
  assert set(ours) == set(expected)
  # Some official gradients are analytically zero and hold only rounding noise (e.g. the key
  # bias of unwindowed attention, v2's `layer2.bias`: softmax is shift invariant), so the
  # relative norm error is taken against at least 1e-3 of the global gradient norm, and each
  # element against 1e-3 of its value plus 1e-6 of the largest gradient element (no bare
  # absolute bound: both parts scale with the gradients' magnitude).
  global_norm = np.sqrt(sum(np.sum(np.square(g)) for g in expected.values()))
  global_max = max(np.abs(g).max() for g in expected.values())
  amplification = _span_conditioning(fixture) if name == 'amdnet' else 1.0
  for key, g in expected.items():
    assert np.isfinite(ours[key]).all(), f'grad {key} is not finite'
    diff = np.abs(ours[key] - g)
    rel = np.linalg.norm(diff) / max(np.linalg.norm(g), 1e-3 * global_norm)
    assert rel <= 1e-4 * amplification, f'grad {key}: relative error {rel:.3g}'
    bad = diff > amplification * (1e-6 * global_max + 1e-3 * np.abs(g))
    assert not bad.any(), f'grad {key}: {bad.sum()} elements off, max abs error {diff.max():.3g}'


@pytest.mark.parametrize('name', MODELS)
def test_bert_adam_steps(name):
  """Two updates of the training optimiser (`train.make_model_optimizer`, config TVR values)
  from the official gradients match two official BertAdam steps (the first has lr 0)."""
  config, _, params, fixture = _setup(name)
  lr, warmup, weight_decay, t_total = _optim_meta(_meta(fixture))
  assert (config.optim.name, config.optim.lr, config.optim.warmup_proportion,
          config.optim.weight_decay, config.optim.max_grad_norm) == (
              'bert_adam', lr, warmup, weight_decay, 1.0)
  grad_dict = {k[len('b1/grad/'):]: v for k, v in fixture.items() if k.startswith('b1/grad/')}
  grads = convert.torch_to_params(grad_dict, name, config.model)
  p2 = support.second_optimizer_step(config, params, grads, t_total, fixture['step2/lr'])
  expected = {k[len('step2/'):]: v for k, v in fixture.items()
              if k.startswith('step2/') and k != 'step2/lr'}
  assert expected and set(expected) <= set(p2)
  # Step 2 (lr 2e-4 / 3e-4, BertAdam's first m / sqrt(v) is +-3.2) moves elements by up to
  # ~1e-3; 1e-6 of each tensor's magnitude (0.14-2.5; ~8 eps) checks that step to ~0.1-1% while
  # allowing the float32 rounding of `p - lr * update` (<= 1 ulp) on either side.
  for key, value in expected.items():
    _close(p2[key], value, f'step-2 {key}', rtol=1e-6)


@pytest.fixture(scope='module')
def multibatch_release(tmp_path_factory):
  """layout -> (collection folder, digest) of the multi-batch release, written once."""
  root = str(tmp_path_factory.mktemp('multibatch'))
  return {layout: official_release.write(root, layout) for layout in official_release.LAYOUTS}


def _read_multibatch(folder, layout, official, config):
  """Our release readers and preprocessing on the test split of the multi-batch release:
  (captions [(cap_id, '')] in file order, video ids, video inputs, query inputs)."""
  collection, _, visual_feature, text_feature = official_release.LAYOUTS[layout]
  lf, lq = config.model.max_frames, config.model.max_query_len
  with release.Release(os.path.dirname(folder), collection, visual_feature, text_feature) as rel:
    split = rel.split('test')
    assert split.caption_ids == list(official['cap_ids'])
    assert split.video_ids == list(official['video_ids'])
    clips, frames = zip(*(split.video_features(v) for v in split.video_ids))
    tokens = [split.caption_features(c) for c in split.caption_ids]
  frame_feats = np.zeros((len(frames), lf, frames[0].shape[1]), np.float32)
  frame_mask = np.zeros((len(frames), lf), np.float32)
  for i, x in enumerate(frames):
    frame_feats[i, :len(x)], frame_mask[i, :len(x)] = x, 1
  query_feats = np.zeros((len(tokens), lq, tokens[0].shape[1]), np.float32)
  query_mask = np.zeros((len(tokens), lq), np.float32)
  for i, x in enumerate(tokens):
    query_feats[i, :len(x)], query_mask[i, :len(x)] = x, 1
  videos = {'clip_feats': np.stack(clips), 'frame_feats': frame_feats, 'frame_mask': frame_mask}
  queries = {'query_feats': query_feats, 'query_mask': query_mask}
  return [(c, '') for c in split.caption_ids], split.video_ids, videos, queries


_PROGRAMS = {}


def _multibatch_programs(config_model):
  """Jitted (encode a video batch, encode the queries and score them against the gallery's
  batches) of a model config: variants whose model configs are equal (GMMFormer v1 and
  AMDNet: all three; MS-SL: tvr and activitynet) reuse the compiled programs."""
  key = config_model.to_json(sort_keys=True)
  if key in _PROGRAMS:
    return _PROGRAMS[key]
  model = models.get_model(config_model)
  encode = jax.jit(lambda params, batch: model.apply({'params': params}, batch,
                                                     method='encode_videos'))

  @jax.jit
  def scores_fn(params, gallery, queries):
    v = {'params': params}
    gallery = jax.tree.map(lambda *x: jnp.concatenate(x), *gallery)
    encoded = model.apply(v, queries, method='encode_queries')
    return model.apply(v, encoded, gallery, method='score')

  _PROGRAMS[key] = encode, scores_fn
  return encode, scores_fn


@pytest.mark.parametrize('variant', VARIANTS)
@pytest.mark.parametrize('name', MODELS)
def test_multibatch_release_scores(name, variant, multibatch_release):
  """Our release readers, preprocessing and model, with each dataset variant's config, reproduce
  the official dataset code and evaluation loop over several official batches (54 videos in
  batches of 20, 82-83 queries in batches of 15) on the multi-batch release's test split
  (rows: caption-file order, columns: first appearance; tests/fixtures/README.md)."""
  config, _, params, _ = _setup(name, variant)
  official = np.load(FIXTURES / f'multibatch_{name}.npz')
  layout = 'clip' if name == 'amdnet' else 'token'
  folder, digest = multibatch_release[layout]
  assert digest == str(official['release_digest']), (
      'tests/official_release.py wrote another release than the fixture was made from: '
      f'multibatch_{name}.npz release_digest')
  captions, video_ids, videos, queries = _read_multibatch(folder, layout, official, config)
  # Videos are encoded in the official evaluation batches (consecutive, first-appearance order,
  # the last one padded with empty videos): GMMFormer v1's frame windows follow each batch's
  # longest video (128, 104, 67 frames here). Queries are encoded all at once.
  step = official_release.OFFICIAL_VIDEO_BATCH
  padded = -(-len(video_ids) // step) * step
  videos = {k: np.pad(v, [(0, padded - len(v))] + [(0, 0)] * (v.ndim - 1))
            for k, v in videos.items()}
  encode, scores_fn = _multibatch_programs(config.model)
  gallery = [encode(params, {k: v[i:i + step] for k, v in videos.items()})
             for i in range(0, padded, step)]
  scores = np.asarray(scores_fn(params, gallery, queries))[:, :len(video_ids)]
  _assert_same_ranking(scores, official, captions, video_ids, variant)


def _assert_same_ranking(scores, official, captions, video_ids, variant):
  """Scores equal to the official evaluation's, hence the same R@K."""
  _close(scores, official[f'{variant}/scores'], f'{variant} multi-batch release scores')
  query_video = np.array([video_ids.index(release.video_id_of(c)) for c, _ in captions])
  ours = metrics.retrieval_metrics(scores, query_video)
  # Equal ranks give equal metrics (percentages of counts, float64); a rank flipped by rounding
  # at a recall boundary would fail here. The score gap at every boundary exceeds the sum of
  # the two tolerances by >= 10x (tests/fixtures/README.md, per model and variant).
  support.assert_close([ours[k] for k in ('r1', 'r5', 'r10', 'r100', 'sumr')],
                       official[f'{variant}/metrics'], rtol=1e-12)
