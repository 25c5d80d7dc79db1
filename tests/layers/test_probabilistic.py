"""RAL's probabilistic heads, support set and confidence-weighted scores: parity with the
official code (tests/fixtures/ral/head.npz, see its README), shapes and invariants."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import support
from prvr_jax.layers import probabilistic as prob
from prvr_jax.losses import ral

FIXTURE = support.FIXTURES / 'ral' / 'head.npz'
D = 16
# The longest reductions: the 156-slot support set's attention pool and mean, a 16-wide matmul.
RTOL = support.f32_rtol(156, ops=4)


@functools.lru_cache(maxsize=1)
def _fixture() -> dict[str, np.ndarray]:
  with np.load(FIXTURE) as f:
    return {k: f[k] for k in f.files}


def _linear(f, name: str, bias: bool = True) -> dict[str, np.ndarray]:
  """A torch Linear `name` as a Dense: kernel = weight.T."""
  out = {'kernel': f[f'param/{name}.weight'].T}
  if bias:
    out['bias'] = f[f'param/{name}.bias']
  return out


def embedding_params(f, modality: str) -> dict:
  """`pie_net_{modality}.*` / `uncertain_net_{modality}.*` -> ProbabilisticEmbedding params."""
  pie, unc = f'pie_net_{modality}', f'uncertain_net_{modality}'

  def attention(prefix):
    return {'w_1': _linear(f, f'{prefix}.attention.w_1', bias=False),
            'w_2': _linear(f, f'{prefix}.attention.w_2', bias=False)}

  return {'pie_net': {'attention': attention(pie), 'fc': _linear(f, f'{pie}.fc'),
                      'layer_norm': {'scale': f[f'param/{pie}.layer_norm.weight'],
                                     'bias': f[f'param/{pie}.layer_norm.bias']}},
          'uncertain_net': {'attention': attention(unc), 'fc': _linear(f, f'{unc}.fc'),
                            'fc2': _linear(f, f'{unc}.fc2')}}


def confidence_params(f) -> dict:
  return {'fc_0': _linear(f, 'text_weight_fc.0'), 'fc_2': _linear(f, 'text_weight_fc.2')}


EMBED = prob.ProbabilisticEmbedding(D, num_samples=6)


@jax.jit
def _forward(params_v, params_t, params_c, frames, video_mask, tokens, query_mask, query_video,
             video_eps, text_eps):
  """The official `get_pred_from_raw_query`'s probabilistic part and RAL's weighted losses."""

  def objective(params_v, params_t, frames, tokens):
    support_tokens, support_mask = prob.support_set(
        tokens, query_mask, query_video, jnp.ones(query_video.shape, bool), frames.shape[0], 26)
    support_pooled = prob.masked_mean_pool(support_tokens, support_mask)
    visual_pooled = prob.normalized_mean_pool(frames, video_mask)
    text = EMBED.apply({'params': params_t}, support_pooled, support_tokens, eps=text_eps)
    video = EMBED.apply({'params': params_v}, visual_pooled, frames, eps=video_eps)
    terms = ral.ral_loss(video['samples'], video['logsigma'], text['samples'],
                         text['logsigma'])
    total = terms['proxy_matching'] + terms['distribution_alignment']
    return total, {'support_tokens': support_tokens, 'support_mask': support_mask,
                   'support_pooled': support_pooled, 'visual_pooled': visual_pooled,
                   'text': text, 'video': video, **terms}

  (total, aux), grads = jax.value_and_grad(objective, (0, 1, 2, 3), has_aux=True)(
      params_v, params_t, frames, tokens)
  scores = prob.ConfidenceWeightedScores(normalize=True).apply(
      {'params': params_c}, tokens, query_mask, frames, video_mask)
  scores_raw = prob.ConfidenceWeightedScores(normalize=False).apply(
      {'params': params_c}, tokens, query_mask, frames, video_mask)
  return total, aux, grads, scores, scores_raw


@functools.lru_cache(maxsize=1)
def _ours():
  f = _fixture()
  out = _forward(embedding_params(f, 'video'), embedding_params(f, 'text'), confidence_params(f),
                 f['input/frames'], f['input/video_mask'], f['input/tokens'],
                 f['input/query_mask'], f['input/query_video'], f['noise/video_eps'],
                 f['noise/text_eps'])
  return jax.tree.map(np.asarray, out)


@pytest.mark.parametrize('ours_key,official_key', [
    ('support_tokens', 'support_tokens'), ('support_mask', 'support_mask'),
    ('support_pooled', 'support_pooled'), ('visual_pooled', 'visual_pooled'),
    ('text/mean', 'text_mean'), ('text/logsigma', 'text_logsigma'),
    ('text/samples', 'text_samples'), ('video/mean', 'video_mean'),
    ('video/logsigma', 'video_logsigma'), ('video/samples', 'video_samples')])
def test_heads_match_official(ours_key, official_key):
  _, aux, _, _, _ = _ours()
  got = aux
  for part in ours_key.split('/'):
    got = got[part]
  support.assert_close(got, _fixture()[f'out/{official_key}'], RTOL, err_msg=ours_key)


def test_confidence_weighted_scores_match_official():
  _, _, _, scores, scores_raw = _ours()
  f = _fixture()
  support.assert_close(scores, f['out/frame_scores'], RTOL)
  support.assert_close(scores_raw, f['out/frame_scores_unnormalized'], RTOL)


def test_weighted_losses_and_input_gradients_match_official():
  total, aux, grads, _, _ = _ours()
  f = _fixture()
  support.assert_close(aux['proxy_matching'], ral.PROXY_MATCHING_WEIGHT * f['out/mil_loss'],
                       RTOL)
  support.assert_close(aux['distribution_alignment'],
                       ral.DISTRIBUTION_ALIGNMENT_WEIGHT * f['out/vib_loss'], RTOL)
  support.assert_close(total, f['out/total'], RTOL)
  support.assert_close(grads[2], f['grad/frames'], RTOL, err_msg='d/d frames')
  support.assert_close(grads[3], f['grad/tokens'], RTOL, err_msg='d/d tokens')


@pytest.mark.parametrize('modality', ['video', 'text'])
def test_parameter_gradients_match_official(modality):
  _, _, grads, _, _ = _ours()
  official = {k.removeprefix('grad/'): v for k, v in _fixture().items()
              if k.startswith('grad/param/')}
  expected = embedding_params(official, modality)
  ours = grads[0] if modality == 'video' else grads[1]
  for path, value in jax.tree_util.tree_leaves_with_path(expected):
    got = ours
    for key in path:
      got = got[key.key]
    support.assert_close(got, value, RTOL, err_msg=jax.tree_util.keystr(path))


def test_parameter_counts_equal_official():
  f = _fixture()

  def official(prefixes):
    return sum(v.size for k, v in f.items() if k.startswith(tuple(f'param/{p}' for p in prefixes)))

  ours = jax.tree.map(np.size, embedding_params(f, 'video'))
  assert sum(jax.tree.leaves(ours)) == official(['pie_net_video.', 'uncertain_net_video.'])
  x = jnp.zeros((2, 3, D))
  init = EMBED.init(jax.random.PRNGKey(0), x[:, 0], x, eps=jnp.zeros((2, 6, D)))['params']
  assert jax.tree.map(np.shape, init) == jax.tree.map(np.shape, embedding_params(f, 'video'))
  scores = prob.ConfidenceWeightedScores().init(jax.random.PRNGKey(0), x, jnp.ones((2, 3)), x,
                                                jnp.ones((2, 3)))['params']
  assert jax.tree.map(np.shape, scores) == jax.tree.map(np.shape, confidence_params(f))
  assert sum(np.size(v) for v in jax.tree.leaves(scores)) == official(['text_weight_fc.'])


def test_embedding_shapes_unit_mean_and_sampled_noise():
  key = jax.random.PRNGKey(0)
  x = jax.random.normal(key, (4, 7, D))
  pooled = jnp.mean(x, axis=1)
  params = EMBED.init(key, pooled, x, eps=jnp.zeros((4, 6, D)))['params']
  out = EMBED.apply({'params': params}, pooled, x, rngs={'sample': jax.random.PRNGKey(1)})
  assert out['mean'].shape == out['logsigma'].shape == (4, D)
  assert out['samples'].shape == (4, 6, D)
  support.assert_close(jnp.linalg.norm(out['mean'], axis=-1), np.ones(4), support.f32_rtol(D))
  zero = EMBED.apply({'params': params}, pooled, x, eps=jnp.zeros((4, 6, D)))
  support.assert_close(zero['samples'], np.broadcast_to(zero['mean'][:, None], (4, 6, D)),
                       support.f32_rtol(1))
  assert not np.allclose(out['samples'], zero['samples'])


def test_masked_attention_pool_ignores_excluded_positions():
  key = jax.random.PRNGKey(2)
  x = jax.random.normal(key, (2, 5, D))
  mask = jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], jnp.float32)
  pool = prob.SelfAttentionPool(D // 2)
  params = pool.init(key, x)['params']
  full, weights = pool.apply({'params': params}, x, mask)
  garbage = x.at[0, 3:].set(1e3)
  again, _ = pool.apply({'params': params}, garbage, mask)
  support.assert_close(again, full, support.f32_rtol(5, ops=2))
  assert float(jnp.max(weights[0, 3:])) == 0.0
  support.assert_close(jnp.sum(weights, axis=1), np.ones((2, 1)), support.f32_rtol(5))


def test_support_set_places_each_query_by_rank_and_drops_invalid_or_excess():
  tokens = jnp.arange(5 * 2 * 1, dtype=jnp.float32).reshape(5, 2, 1) + 1
  mask = jnp.ones((5, 2))
  query_video = jnp.array([1, 0, 1, 1, 0])
  valid = jnp.array([True, True, True, True, False])
  out, out_mask = prob.support_set(tokens, mask, query_video, valid, 3, max_queries=2)
  expected = np.zeros((3, 4))
  expected[0, :2] = [3, 4]           # query 1 (query 4 is padding)
  expected[1, :4] = [1, 2, 5, 6]     # queries 0 and 2; query 3 is past max_queries
  np.testing.assert_array_equal(out[..., 0], expected)
  np.testing.assert_array_equal(out_mask, expected > 0)

