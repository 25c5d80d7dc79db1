r"""Reference rankers: random scores, and mean-pooled features with a ridge map.

The mean-pooled baseline averages a video's frame features and a query's token
features (both preprocessed, as in the shards), centres both by their train-split
means, fits a linear map from the query space to the video space in closed form
(ridge, bias included) on the train split, choosing the ridge strength on the val
split, and ranks videos by cosine similarity.
It sees the whole video at once, so it is weak exactly where PRVR is hard: short
moments in long videos.

  prvr-baselines --shards=DIR            # a shard folder (prvr_jax.tools.baselines)
  prvr-baselines --synthetic=default     # the synthetic benchmark
"""

from collections.abc import Sequence

import numpy as np

from prvr_jax import metrics as metrics_lib
from prvr_jax.data import pipeline

RIDGE_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)
_BATCH = 256


def mean_features(shards: pipeline.ShardDataset, split: str) -> tuple[np.ndarray, np.ndarray]:
  """Mean frame feature per video `[Nv, Dv]` (columns) and mean token per query `[Nq, Dq]` (rows)."""
  s = shards.split(split)
  videos = np.zeros((s.num_videos, shards.visual_dim), np.float64)
  queries = np.zeros((s.num_captions, shards.query_dim), np.float64)
  hosts = dict(process_index=0, process_count=1)
  for b in pipeline.eval_videos(shards, split, global_batch_size=_BATCH, **hosts):
    keep = b['video_index'] >= 0
    mean = (b['frame_feats'] * b['frame_mask'][..., None]).sum(1) / b['frame_mask'].sum(1, keepdims=True).clip(1)
    videos[b['video_index'][keep]] = mean[keep]
  for b in pipeline.eval_queries(shards, split, global_batch_size=_BATCH, **hosts):
    keep = b['query_index'] >= 0
    mean = (b['query_feats'] * b['query_mask'][..., None]).sum(1) / b['query_mask'].sum(1, keepdims=True).clip(1)
    queries[b['query_index'][keep]] = mean[keep]
  return videos, queries


def fit_ridge(x: np.ndarray, y: np.ndarray, l2: float) -> np.ndarray:
  """`W [Dx + 1, Dy]` minimising `|[x, 1] W - y|^2 + l2 N |W|^2` (the bias row unpenalised)."""
  x1 = np.concatenate([x, np.ones((len(x), 1))], axis=1)
  penalty = np.full(x1.shape[1], l2 * len(x))
  penalty[-1] = 0.0
  return np.linalg.solve(x1.T @ x1 + np.diag(penalty), x1.T @ y)


def _unit_rows(x: np.ndarray) -> np.ndarray:
  return x / (np.linalg.norm(x, axis=1, keepdims=True) + 1e-12)


class _Centred:
  """Query and video means centred by the train-split means (without it, the shared
  mean direction of non-negative features dominates every cosine)."""

  def __init__(self, videos: np.ndarray, queries: np.ndarray):
    self.video_mean, self.query_mean = videos.mean(0), queries.mean(0)

  def scores(self, queries: np.ndarray, videos: np.ndarray, w: np.ndarray) -> np.ndarray:
    q = queries - self.query_mean
    mapped = np.concatenate([q, np.ones((len(q), 1))], axis=1) @ w
    return (_unit_rows(mapped) @ _unit_rows(videos - self.video_mean).T).astype(np.float32)


def mean_pooled_scores(shards: pipeline.ShardDataset, eval_split: str = 'test',
                       train_split: str = 'train', val_split: str | None = 'val',
                       l2: float | None = None) -> tuple[np.ndarray, float]:
  """Scores `[Nq, Nv]` of `eval_split` and the ridge strength used.

  `l2=None` picks the best of `RIDGE_GRID` by val SumR (or 1e-3 without a val split).
  """
  videos, queries = mean_features(shards, train_split)
  centred = _Centred(videos, queries)
  targets = videos[pipeline.eval_index(shards, train_split).caption_video_index] - centred.video_mean
  fits = {}

  def fit(strength):
    if strength not in fits:
      fits[strength] = fit_ridge(queries - centred.query_mean, targets, strength)
    return fits[strength]

  if l2 is None:
    if val_split and val_split in shards.splits:
      val_videos, val_queries = mean_features(shards, val_split)
      gt = pipeline.eval_index(shards, val_split).caption_video_index
      l2 = max(RIDGE_GRID, key=lambda a: metrics_lib.retrieval_metrics(
          centred.scores(val_queries, val_videos, fit(a)), gt)['sumr'])
    else:
      l2 = 1e-3
  eval_videos, eval_queries = mean_features(shards, eval_split)
  return centred.scores(eval_queries, eval_videos, fit(l2)), l2


def random_scores(num_queries: int, num_videos: int, seed: int = 0) -> np.ndarray:
  """Uniform random scores `[Nq, Nv]`: the chance level of every metric."""
  return np.random.default_rng(seed).random((num_queries, num_videos), dtype=np.float32)


def evaluate(shards: pipeline.ShardDataset, split: str = 'test',
             mv_groups=metrics_lib.DEFAULT_MV_GROUPS) -> dict[str, dict[str, float]]:
  """Metrics of the random and mean-pooled rankers on `split` (M/V groups when spans are known)."""
  index = pipeline.eval_index(shards, split)
  ratio = index.moment_ratio
  scores, l2 = mean_pooled_scores(shards, split)
  out = {}
  for name, s in (('random', random_scores(len(index.caption_ids), len(index.video_ids))),
                  ('mean_pooled', scores)):
    out[name] = metrics_lib.retrieval_metrics(s, index.caption_video_index, ratio, mv_groups)
  out['mean_pooled']['ridge_l2'] = l2
  return out


def format_table(results: dict[str, dict[str, float]]) -> str:
  """A markdown table of t2v R@K, SumR and the M/V group SumRs."""
  first = next(iter(results.values()))
  groups = [k[:-len('_sumr')] for k in first if k.startswith('mv_') and k.endswith('_sumr')]
  head = ['ranker', 'R@1', 'R@5', 'R@10', 'R@100', 'SumR'] + [
      f'SumR M/V {g[3:].replace("_", "-")} ({first[g + "_count"]})' for g in groups]
  lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
  for name, m in results.items():
    cells = [name] + [f'{m[k]:.1f}' for k in ('r1', 'r5', 'r10', 'r100', 'sumr')]
    cells += [f'{m[g + "_sumr"]:.1f}' for g in groups]
    lines.append('| ' + ' | '.join(cells) + ' |')
  return '\n'.join(lines)

