"""The released T-MASS evaluation (`_valid_epoch_step` + `sim_matrix_inference_stochastic`),
reproduced on purpose: it leaks the ground truth (docs/tmass.md).

Each pair's best sample `T[a, g]` (of caption g against video a) is the one Eq. 10 picks, but
the released gathering then compares it with video a pooled by **video a's own** k-th caption,
k the query's slot among its own video's captions:

  leaky(g, a) = cos(T[a, g], P[a, c(a, k(g))])     NaN where video a has no k(g)-th caption

and ranks the way its `t2v_metrics` / `v2t_metrics` do (a NaN in a query's row counts as
ahead of the target; in the video-to-text direction NaN becomes -inf). With
`config.eval.tmass_official_leak=True`, `evaluate.py` reports these metrics as
`official_leak_*` beside the leak-free ones, from the same samples (the evaluator's noise and
`score_seed`), so the published (leaky) and the corrected numbers come from one checkpoint.
Use `config.model.noise='per_pair'` for the official noise as well.
"""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from prvr_jax import metrics as metrics_lib
from prvr_jax import ops
from prvr_jax.eval.evaluator import score_keys, with_video_seeds
from prvr_jax.eval.splits import EvalSplit, GROUND_TRUTH_KEY, QUERY_KEY, VIDEO_KEY
from prvr_jax.models import registry

PREFIX = 'official_leak_'


def caption_slots(query_video: np.ndarray, num_videos: int) -> tuple[np.ndarray, np.ndarray]:
  """(slot `[Nq]`: each caption's place among its video's captions in caption order, own
  `[Nv, K]`: the caption index of video a's k-th caption, -1 past its last)."""
  query_video = np.asarray(query_video, np.int64)
  slot = np.zeros(len(query_video), np.int64)
  counts = np.zeros(num_videos, np.int64)
  for g, a in enumerate(query_video):
    slot[g], counts[a] = counts[a], counts[a] + 1
  own = np.full((num_videos, max(int(counts.max(initial=0)), 1)), -1, np.int64)
  own[query_video, slot] = np.arange(len(query_video))
  return slot, own


def leaky_scores(selected: jax.Array, pooled: jax.Array, slot: np.ndarray,
                 own: np.ndarray) -> jax.Array:
  """`[Nq, B]` released scores of videos `own`'s rows (see the module docstring).

  Args:
    selected: `[Nq, B, D]` each pair's best sample (`TMASS.best_samples`).
    pooled: `[Nq, B, D]` each video pooled by each caption.
    slot, own: `caption_slots` (`own` restricted to these B videos).
  """
  own_k = jnp.asarray(own)[:, jnp.asarray(slot)]                 # [B, Nq]: c(a, k(g))
  b = jnp.arange(own_k.shape[0])[:, None]
  target = pooled[jnp.maximum(own_k, 0), b]                       # [B, Nq, D]
  cos = jnp.sum(ops.l2_normalize(selected) * jnp.swapaxes(ops.l2_normalize(target), 0, 1), -1)
  return jnp.where(own_k.T >= 0, cos, jnp.nan)


def released_ranks(scores: np.ndarray, query_video: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
  """1-based (text-to-video `[Nq]`, video-to-text `[Nv]`) ranks by the released metrics' rules.

  Text to video: 1 + #{videos scoring above the target} + #{NaN scores in the row}. Video to
  text: NaN -> -inf, each video's score for video b is the max over b's captions, and the
  target's rank is 1 + #{videos b above it}.
  """
  scores = np.asarray(scores, np.float32)
  query_video = np.asarray(query_video, np.int64)
  rows = np.arange(len(query_video))
  target = scores[rows, query_video][:, None]
  t2v = 1 + np.sum(scores > target, 1) + np.sum(np.isnan(scores), 1)
  filled = np.where(np.isnan(scores), -np.inf, scores)
  num_videos = scores.shape[1]
  by_video = np.full((num_videos, num_videos), -np.inf, np.float32)  # [video a, caption's b]
  np.maximum.at(by_video.T, query_video, filled)
  diagonal = by_video[np.arange(num_videos), np.arange(num_videos)][:, None]
  v2t = 1 + np.sum(by_video > diagonal, 1)
  return t2v, v2t


def released_metrics(scores: np.ndarray, query_video: np.ndarray) -> dict[str, float]:
  """R@1/5/10/50/100, SumR, MdR, MnR of both directions under the released rules, as
  `official_leak_*` (`v2t` over videos that have a caption)."""
  t2v, v2t = released_ranks(scores, query_video)
  v2t = v2t[np.isin(np.arange(scores.shape[1]), query_video)]
  out = {**metrics_lib.recalls(t2v, prefix=PREFIX),
         **metrics_lib.rank_statistics(t2v, prefix=PREFIX),
         **metrics_lib.recalls(v2t, prefix=PREFIX + 'v2t_'),
         **metrics_lib.rank_statistics(v2t, prefix=PREFIX + 'v2t_')}
  return out


def evaluate(config: Any, params: Any, data: EvalSplit) -> dict[str, float]:
  """The released evaluation's metrics (`official_leak_*`) of `params` on the split `data`,
  on one device: the queries are encoded once, the gallery a video batch at a time."""
  spec = registry.get_spec(config.model)
  if spec.name != 'tmass':
    raise ValueError(f'config.eval.tmass_official_leak is T-MASS\'s released evaluation; '
                     f'config.model.name={spec.name!r}')
  module = spec.build(config.model)
  video_inputs, query_inputs = spec.inputs(config.model)
  rngs = score_keys(spec, config.eval.get('score_seed', 0))
  apply = lambda method: jax.jit(
      lambda p, *args: module.apply({'params': p}, *args, method=method, rngs=rngs))
  encode_queries, encode_videos = apply('encode_queries'), apply('encode_videos')
  best_samples = apply('best_samples')
  params = jax.device_get(params)

  texts, query_keys, query_video = [], [], []
  for batch in data.query_batches():
    texts.append(np.asarray(encode_queries(params, {k: batch[k] for k in query_inputs})))
    query_keys.append(np.asarray(batch[QUERY_KEY]))
    query_video.append(np.asarray(batch[GROUND_TRUTH_KEY]))
  order = np.argsort(np.concatenate(query_keys), kind='stable')
  texts = np.concatenate(texts)[order]
  query_video = np.concatenate(query_video)[order]
  num_videos = len(data.video_ids)
  slot, own = caption_slots(query_video, num_videos)

  scores = np.full((len(texts), num_videos), np.nan, np.float32)
  for batch in with_video_seeds(data.video_batches(), data.video_ids):
    keys = np.asarray(batch[VIDEO_KEY])
    real = keys >= 0
    stored = encode_videos(params, {k: batch[k] for k in video_inputs})
    _, selected, pooled = best_samples(params, texts, stored)
    chunk = leaky_scores(selected, pooled, slot, own[np.maximum(keys, 0)])
    scores[:, keys[real]] = np.asarray(chunk)[:, real]
  return released_metrics(scores, query_video)


def scores_by_video_slot(scores: np.ndarray, query_video: np.ndarray,
                         num_videos: int) -> np.ndarray:
  """`[Nq, Nv]` scores laid out as the released `sims` `[Nv (query's video), K, Nv]` (NaN for
  the slots a video does not fill): for comparing with the released code's own output."""
  slot, own = caption_slots(query_video, num_videos)
  out = np.full((num_videos, own.shape[1], scores.shape[1]), np.nan, np.float32)
  out[query_video, slot] = scores
  return out


__all__ = ['caption_slots', 'evaluate', 'leaky_scores', 'released_metrics', 'released_ranks',
           'scores_by_video_slot']
