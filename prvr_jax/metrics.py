"""Retrieval metrics of the PRVR protocol: ranks, R@K, SumR, M/V groups.

Official protocol (GMMFormer / GMMFormer v2 / MS-SL validation code): for every
query, sort all videos by descending score; the query's rank is 1 + the position
of its (best) ground-truth video; R@K = 100 * #(rank <= K) / #queries and
SumR = R@1 + R@5 + R@10 + R@100.

Tie rule (ours; the official code uses an unstable argsort, so its ties are
arbitrary): candidates are ordered by descending score and, among equal scores,
by ascending column index. The rank of a ground truth `g` of row `i` is therefore
  1 + #{j : s[i, j] > s[i, g]} + #{j < g : s[i, j] == s[i, g]},
and with several ground truths the smallest of their ranks counts. Non-finite scores (NaN,
+-inf) are rejected rather than ranked: a score matrix holding them is broken, and ranking
it would report numbers that mean nothing (an all-infinite matrix "scores" SumR 333.3).

Dense multi-ground-truth protocol (several verified positives per query; docs/dense_eval.md):
`positive_ranks` ranks every positive under the same tie rule, `multi_positive_metrics` gives
R@K (any positive in the top K), prvr-ea's coverage recall, mAP and binary nDCG@10.
"""

from collections.abc import Sequence

import numpy as np

RECALL_KS = (1, 5, 10, 100)
# Moment-to-video ratio groups of the GMMFormer paper (ActivityNet, Fig. 4):
# M/V in (0, 0.25], (0.25, 0.5], (0.5, 1.0]. MS-SL and AMDNet use
# ((0, 0.2), (0.2, 0.4), (0.4, 1.0)); pass those through `config.eval.mv_groups`.
DEFAULT_MV_GROUPS = ((0.0, 0.25), (0.25, 0.5), (0.5, 1.0))

_ROW_CHUNK = 1024  # rows compared at once: bounds memory to chunk x columns


def ranks(scores: np.ndarray, positives: np.ndarray) -> np.ndarray:
  """Rank (1-based) of the best positive column of each row, under the tie rule.

  Args:
    scores: [N, M] float, higher is better.
    positives: [N, M] bool, at least one True per row.

  Returns:
    [N] int64 ranks in [1, M].
  """
  scores = np.asarray(scores)
  positives = np.asarray(positives, dtype=bool)
  if scores.ndim != 2 or scores.shape != positives.shape:
    raise ValueError(f'scores {scores.shape} and positives {positives.shape} must be '
                     'the same [rows, columns] shape.')
  _reject_non_finite(scores)
  missing = np.flatnonzero(~positives.any(axis=1))
  if missing.size:
    raise ValueError(f'Rows {missing[:10].tolist()} have no ground-truth column.')
  num_cols = scores.shape[1]
  cols = np.arange(num_cols)
  out = np.empty(scores.shape[0], np.int64)
  for start in range(0, scores.shape[0], _ROW_CHUNK):
    s = scores[start:start + _ROW_CHUNK]
    pos = positives[start:start + _ROW_CHUNK]
    # Per row: among the positives, the best one under the tie rule is the one
    # with the highest score and, on equal scores, the lowest column.
    masked = np.where(pos, s, -np.inf)
    best_score = masked.max(axis=1, keepdims=True)
    best_col = np.argmax(pos & (s == best_score), axis=1)[:, None]
    ahead = (s > best_score) | ((s == best_score) & (cols[None, :] < best_col))
    out[start:start + _ROW_CHUNK] = 1 + ahead.sum(axis=1)
  return out


def _reject_non_finite(scores: np.ndarray) -> None:
  """Raises naming the first NaN / infinite score: ranking such a matrix means nothing."""
  bad = ~np.isfinite(scores)
  if bad.any():
    row, col = np.argwhere(bad)[0]
    raise ValueError(f'Score matrix holds {int(bad.sum())} non-finite values (NaN or inf; first '
                     f'at row {row}, column {col}: {scores[row, col]}); cannot rank.')


def positive_ranks(scores: np.ndarray, positives: np.ndarray) -> np.ndarray:
  """Rank (1-based, under the tie rule) of every listed positive column of each row.

  Several positives per row (the dense multi-ground-truth protocol): each positive `p` of row
  `i` gets `1 + #{j : s[i, j] > s[i, p]} + #{j < p : s[i, j] == s[i, p]}`, its position in
  the row sorted by descending score and then ascending column, so the positives of a row
  hold distinct ranks and the smallest equals `ranks`'s.

  Args:
    scores: [N, M] float, higher is better.
    positives: [N, P] int, the positive columns of each row, padded with -1 (at least one
      per row, none twice).

  Returns:
    [N, P] int64 ranks in [1, M], 0 where `positives` is padding.
  """
  scores = np.asarray(scores)
  positives = np.asarray(positives, np.int64)
  if scores.ndim != 2 or positives.ndim != 2 or positives.shape[0] != scores.shape[0]:
    raise ValueError(f'scores {scores.shape} must be [rows, columns] and positives '
                     f'{positives.shape} [rows, positives] with the same rows.')
  num_cols = scores.shape[1]
  if positives.size and (positives.max() >= num_cols or positives.min() < -1):
    raise ValueError(f'positives must be column indices in [0, {num_cols}) or -1 (padding).')
  valid = positives >= 0
  missing = np.flatnonzero(~valid.any(axis=1))
  if missing.size:
    raise ValueError(f'Rows {missing[:10].tolist()} have no positive column.')
  ordered = np.sort(positives, axis=1)
  twice = np.flatnonzero(((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)).any(1))
  if twice.size:
    raise ValueError(f'Rows {twice[:10].tolist()} list a positive column twice.')
  _reject_non_finite(scores)
  # One (row, positive) pair at a time in vectorised chunks: the work is #positives x M
  # comparisons, not a sort of every row.
  pair_rows, slots = np.nonzero(valid)
  pair_cols = positives[pair_rows, slots]
  cols = np.arange(num_cols)
  out = np.zeros(positives.shape, np.int64)
  for start in range(0, pair_rows.size, _ROW_CHUNK):
    rows, col = pair_rows[start:start + _ROW_CHUNK], pair_cols[start:start + _ROW_CHUNK]
    s = scores[rows]
    own = s[np.arange(rows.size), col][:, None]
    ahead = (s > own) | ((s == own) & (cols[None, :] < col[:, None]))
    out[rows, slots[start:start + _ROW_CHUNK]] = 1 + ahead.sum(axis=1)
  return out


def multi_positive_per_query(rank: np.ndarray, ndcg_k: int = 10) -> dict[str, np.ndarray]:
  """Per-row results of `positive_ranks`'s output `rank` ([N, P], 0 = padding).

  Returns {'best_rank' [N] (the best positive's rank), 'num_positives' [N],
  'ap' [N] (average precision over all positives, in [0, 1]), 'ndcg' [N] (binary nDCG@ndcg_k,
  in [0, 1])}. With R_q the ranks of the n_q positives of row q::

    AP_q = (1 / n_q) * sum_{r in R_q} #{r' in R_q : r' <= r} / r
    nDCG@k_q = sum_{r in R_q, r <= k} 1 / log2(r + 1) / sum_{i=1}^{min(n_q, k)} 1 / log2(i + 1)
  """
  rank = np.asarray(rank, np.int64)
  valid = rank > 0
  count = valid.sum(axis=1)
  # The positives of a row in rank order: their position i (1-based) among them is the
  # number of positives ranked at or above them, so precision at each is i / rank.
  ordered = np.sort(np.where(valid, rank, np.iinfo(np.int64).max), axis=1)
  seen = np.arange(1, rank.shape[1] + 1)[None, :]
  present = seen <= count[:, None]
  precision = np.where(present, seen / np.where(present, ordered, 1), 0.0)
  ap = precision.sum(axis=1) / np.maximum(count, 1)
  gains = np.where(valid & (rank <= ndcg_k), 1.0 / np.log2(np.maximum(rank, 1) + 1.0), 0.0)
  gains = gains.sum(axis=1)
  discounts = 1.0 / np.log2(np.arange(2, ndcg_k + 2))
  ideal = np.cumsum(discounts)[np.clip(count, 1, ndcg_k) - 1]
  return {'best_rank': np.where(count > 0, ordered[:, 0], 0), 'num_positives': count,
          'ap': ap, 'ndcg': gains / ideal}


def multi_positive_metrics(rank: np.ndarray, ks: Sequence[int] = RECALL_KS, ndcg_k: int = 10,
                           prefix: str = '') -> dict[str, float]:
  """The dense multi-ground-truth metrics of `positive_ranks`'s output `rank` ([N, P]).

  All in percent, averaged over rows (0s for no rows):
    r<K>: a hit when any positive ranks <= K (R@K with several positives); sumr their sum;
    cov_r<K>: #{positives ranked <= K} / #positives (prvr-ea's macro "coverage" recall);
      cov_sumr their sum;
    map: mean average precision over the positives; ndcg<k>: binary nDCG@k
      (`multi_positive_per_query`);
  and medr / meanr of the best positive's rank, num_queries.
  """
  rank = np.asarray(rank, np.int64)
  per_query = multi_positive_per_query(rank, ndcg_k)
  num = max(rank.shape[0], 1)
  out = recalls(per_query['best_rank'], ks, prefix)
  valid = rank > 0
  count = np.maximum(per_query['num_positives'], 1)
  for k in ks:
    out[f'{prefix}cov_r{k}'] = float(100.0 * np.sum(
        (valid & (rank <= k)).sum(axis=1) / count) / num)
  out[f'{prefix}cov_sumr'] = float(sum(out[f'{prefix}cov_r{k}'] for k in ks))
  out[f'{prefix}map'] = float(100.0 * per_query['ap'].sum() / num)
  out[f'{prefix}ndcg{ndcg_k}'] = float(100.0 * per_query['ndcg'].sum() / num)
  stats = rank_statistics(per_query['best_rank'], prefix)
  out[f'{prefix}medr'], out[f'{prefix}meanr'] = stats[f'{prefix}medr'], stats[f'{prefix}meanr']
  out[f'{prefix}num_queries'] = int(rank.shape[0])
  return out


def recalls(rank: np.ndarray, ks: Sequence[int] = RECALL_KS,
            prefix: str = '') -> dict[str, float]:
  """{'r1': .., 'r5': .., 'r10': .., 'r100': .., 'sumr': ..} in percent.

  R@K = 100 * #(rank <= K) / #rows; SumR = sum over `ks`. Empty input gives 0s.
  """
  rank = np.asarray(rank)
  out = {}
  for k in ks:
    out[f'{prefix}r{k}'] = float(100.0 * np.sum(rank <= k) / max(rank.size, 1))
  out[f'{prefix}sumr'] = float(sum(out[f'{prefix}r{k}'] for k in ks))
  return out


def rank_statistics(rank: np.ndarray, prefix: str = '') -> dict[str, float]:
  """R@50 and the median / mean rank (MdR / MnR, 1-based), the text-video retrieval papers'
  extra columns: {'r50', 'medr', 'meanr'} (NaN ranks for an empty input)."""
  rank = np.asarray(rank)
  empty = rank.size == 0
  return {f'{prefix}r50': float(100.0 * np.sum(rank <= 50) / max(rank.size, 1)),
          f'{prefix}medr': float('nan') if empty else float(np.median(rank)),
          f'{prefix}meanr': float('nan') if empty else float(np.mean(rank))}


def moment_ratio(spans: np.ndarray, durations: np.ndarray) -> np.ndarray:
  """`[N]` moment length / video length in [0, 1]; NaN where unknown.

  The one definition used by data, evaluation and baselines. A moment whose annotated end
  lies past the video's end (annotation noise) counts as the whole video; an inverted span
  counts as length 0.

  Args:
    spans: `[N, 2]` (start, end) in seconds, start < 0 = unknown.
    durations: `[N]` duration of each moment's video in seconds, <= 0 = unknown.
  """
  spans = np.asarray(spans, np.float64).reshape(-1, 2)
  durations = np.asarray(durations, np.float64)
  known = (durations > 0) & (spans[:, 0] >= 0)
  length = np.clip(spans[:, 1] - spans[:, 0], 0, None)
  return np.where(known, np.minimum(length / np.where(known, durations, 1.0), 1.0), np.nan)


def text_to_video_ranks(scores: np.ndarray, query_video: np.ndarray) -> np.ndarray:
  """`[Nq]` rank of each query's ground-truth column (`ranks` with one positive per row)."""
  scores, query_video = _check_scores(scores, query_video)
  return ranks(scores, query_video[:, None] == np.arange(scores.shape[1])[None, :])


def video_to_text_ranks(scores: np.ndarray, query_video: np.ndarray) -> np.ndarray:
  """Rank of each video's best-ranked query among all queries of its column; videos without a
  query are skipped (`[#videos with a query]`)."""
  scores, query_video = _check_scores(scores, query_video)
  positives = query_video[:, None] == np.arange(scores.shape[1])[None, :]
  has_query = positives.any(axis=0)
  return ranks(scores.T[has_query], positives.T[has_query])


def _check_scores(scores: np.ndarray, query_video: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  scores = np.asarray(scores)
  query_video = np.asarray(query_video, np.int64)
  num_queries, num_videos = scores.shape
  if query_video.shape != (num_queries,):
    raise ValueError(f'query_video has shape {query_video.shape}; expected ({num_queries},).')
  if num_queries and (query_video.min() < 0 or query_video.max() >= num_videos):
    raise ValueError(f'query_video indices must lie in [0, {num_videos}).')
  return scores, query_video


def dual_softmax(scores: np.ndarray, temperature: float = 100.0) -> np.ndarray:
  """DSL re-ranking (Cheng et al., 2021) as the T-MASS code applies it: `S * softmax(t * S)`
  over the query axis (rows). Transductive: every score then depends on all the queries."""
  scores = np.asarray(scores, np.float64)
  logits = temperature * scores
  weights = np.exp(logits - logits.max(axis=0, keepdims=True))
  return (scores * weights / weights.sum(axis=0, keepdims=True)).astype(np.float32)


def summarize(t2v_ranks: np.ndarray, v2t_ranks: np.ndarray, num_videos: int,
              moment_ratio: np.ndarray | None = None,
              mv_groups: Sequence[tuple[float, float]] = DEFAULT_MV_GROUPS) -> dict[str, float]:
  """The metrics dict of `retrieval_metrics` from the ranks of both directions."""
  t2v_ranks = np.asarray(t2v_ranks)
  num_queries = len(t2v_ranks)
  out = recalls(t2v_ranks)
  out.update(recalls(v2t_ranks, prefix='v2t_'))
  out.update(rank_statistics(t2v_ranks))
  out.update(rank_statistics(v2t_ranks, prefix='v2t_'))
  out['num_queries'] = num_queries
  out['num_videos'] = num_videos
  if moment_ratio is not None:
    moment_ratio = np.asarray(moment_ratio, np.float64)
    if moment_ratio.shape != (num_queries,):
      raise ValueError(f'moment_ratio has shape {moment_ratio.shape}; expected ({num_queries},).')
    for lo, hi in mv_groups:
      in_group = (moment_ratio > lo) & (moment_ratio <= hi)
      name = f'mv_{lo:g}_{hi:g}'
      out[f'{name}_count'] = int(in_group.sum())
      if in_group.any():
        out[f'{name}_sumr'] = recalls(t2v_ranks[in_group])['sumr']
  return out


def retrieval_metrics(scores: np.ndarray, query_video: np.ndarray,
                      moment_ratio: np.ndarray | None = None,
                      mv_groups: Sequence[tuple[float, float]] = DEFAULT_MV_GROUPS,
                      ) -> dict[str, float]:
  """Text-to-video and video-to-text metrics of a full score matrix.

  Args:
    scores: [Nq, Nv] query-video scores (rows queries, columns videos).
    query_video: [Nq] int, ground-truth column of each query.
    moment_ratio: optional [Nq] float, the query's moment length / video length
      (NaN where unknown; see `moment_ratio`). When given, adds the text-to-video SumR of
      each M/V group `(lo, hi]` as `mv_<lo>_<hi>_sumr` and its query count
      `mv_<lo>_<hi>_count`.
    mv_groups: the `(lo, hi]` groups.

  Returns:
    Flat dict: t2v `r1, r5, r10, r100, sumr` and `r50, medr, meanr`; v2t `v2t_r1, ...,
    v2t_sumr, v2t_r50, v2t_medr, v2t_meanr` (a video's rank is that of its best-ranked query;
    videos without a query are skipped);
    `num_queries`, `num_videos`.
  """
  return summarize(text_to_video_ranks(scores, query_video),
                   video_to_text_ranks(scores, query_video), np.shape(scores)[1],
                   moment_ratio, mv_groups)
