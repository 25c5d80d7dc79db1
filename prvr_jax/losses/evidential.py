"""Holmes's evidential (Dirichlet) losses: inter-video EDL per branch and combined, the label
calibration after warmup, and the intra-video EDL against the partial-transport labels.

A score row `s` (one query against K candidates) gives evidence `e = exp(tanh(s) / tau)`, a
Dirichlet `alpha = e + 1` of strength `S = sum alpha` and uncertainty `u = K / S`. The loss of
a label row `y` is the expected squared error under the Dirichlet (no KL regulariser, as in
the official code):

  sum_k (y_k - alpha_k / S)^2 + alpha_k (S - alpha_k) / (S^2 (S + 1)).

Padding is masked everywhere: padded videos are no candidates (K counts the real ones) and
padded queries add nothing to the means. Formulas and parity: docs/holmes.md.
"""

import jax
import jax.numpy as jnp

from prvr_jax.losses.masking import upcast


def evidence(scores: jax.Array, tau: float) -> jax.Array:
  """`exp(tanh(scores) / tau)`, the official evidence of a score."""
  return jnp.exp(jnp.tanh(upcast(scores)) / tau)


def dirichlet_risk(labels: jax.Array, alpha: jax.Array, mask: jax.Array) -> jax.Array:
  """Per row: `sum_k (y_k - alpha_k / S)^2 + alpha_k (S - alpha_k) / (S^2 (S + 1))` over the
  candidates with `mask` 1 (`labels`, `alpha`, `mask` `[..., K]`) -> `[...]`."""
  alpha = alpha * mask
  strength = jnp.sum(alpha, axis=-1, keepdims=True)
  error = jnp.sum(((labels - alpha / strength) * mask) ** 2, axis=-1)
  variance = jnp.sum(alpha * (strength - alpha) / (strength * strength * (strength + 1)),
                     axis=-1)
  return error + variance


def combine_dirichlets(alpha1: jax.Array, alpha2: jax.Array, mask: jax.Array) -> jax.Array:
  """Dempster-Shafer combination of two Dirichlets over the masked candidates (official
  `DS_Combin_two`): beliefs `b = (alpha - 1) / S`, uncertainties `u = K / S`, conflict
  `C = sum_{i != j} b1_i b2_j`; `b = (b1 b2 + b1 u2 + b2 u1) / (1 - C)`,
  `u = u1 u2 / (1 - C)`. Returns the combined evidence `b K / u` `[Q, K]` (0 off the mask)."""
  count = jnp.sum(mask, axis=-1, keepdims=True)

  def belief_uncertainty(alpha):
    strength = jnp.sum(alpha * mask, axis=-1, keepdims=True)
    return (alpha - 1) * mask / strength, count / strength

  b1, u1 = belief_uncertainty(alpha1)
  b2, u2 = belief_uncertainty(alpha2)
  conflict = (jnp.sum(b1, -1, keepdims=True) * jnp.sum(b2, -1, keepdims=True)
              - jnp.sum(b1 * b2, -1, keepdims=True))
  belief = (b1 * b2 + b1 * u2 + b2 * u1) / (1 - conflict)
  uncertainty = u1 * u2 / (1 - conflict)
  return belief * (count / uncertainty)


def lower_median(values: jax.Array, mask: jax.Array) -> jax.Array:
  """`torch.median` of the masked entries of a vector: the lower middle value."""
  count = jnp.sum(mask.astype(jnp.int32))
  ordered = jnp.sort(jnp.where(mask, values, jnp.inf))
  return ordered[jnp.maximum(count - 1, 0) // 2]


def pair_division(scores: jax.Array, alpha: jax.Array, own: jax.Array, query_valid: jax.Array,
                  video_mask: jax.Array, beta: float) -> tuple[jax.Array, jax.Array]:
  """The official `pair_division` as masks `[Q]`: (consistent, inconsistent) queries.

  Correct queries rank their own video first. Uncertain: `K / S` above
  `min(max over correct queries, 1 - beta)` (neither set). Of the certain ones, consistent:
  own-video score `>= max(min over correct queries, beta)`, else inconsistent; consistent
  queries whose expected entropy `sum p (psi(S + 1) - psi(alpha + 1))` is above the lower
  median over all queries move to inconsistent. Without correct queries the thresholds are
  `1 - beta` and `beta`.

  Args:
    scores: `[Q, B]` cosine scores; alpha: `[Q, B]` their Dirichlet parameters.
    own: `[Q, B]` one-hot of each query's video; query_valid: `[Q]`; video_mask: `[1, B]` or
      `[Q, B]`, 1 on real videos.
    beta: official `division_beta`.
  """
  valid = query_valid.astype(bool)
  masked_scores = jnp.where(video_mask > 0, scores, -jnp.inf)
  predicted = jnp.argmax(masked_scores, axis=1)
  correct = valid & (predicted == jnp.argmax(own, axis=1))
  consensus = jnp.sum(scores * own, axis=1)
  alpha = alpha * video_mask
  strength = jnp.sum(alpha, axis=1)
  uncertainty = jnp.sum(video_mask * jnp.ones_like(alpha), axis=1) / strength
  any_correct = jnp.any(correct)
  max_uncertainty = jnp.where(
      any_correct, jnp.minimum(jnp.max(jnp.where(correct, uncertainty, -jnp.inf)), 1 - beta),
      1 - beta)
  min_consensus = jnp.where(
      any_correct, jnp.maximum(jnp.min(jnp.where(correct, consensus, jnp.inf)), beta), beta)
  certain = valid & ~(uncertainty > max_uncertainty)
  consistent = certain & (consensus >= min_consensus)
  inconsistent = certain & (consensus < min_consensus)
  probs = alpha / strength[:, None]
  digamma = jax.scipy.special.digamma
  entropy = jnp.sum(
      jnp.where(video_mask > 0,
                probs * (digamma(strength + 1)[:, None] - digamma(alpha + 1)), 0.0), axis=1)
  high = consistent & (entropy > lower_median(entropy, valid))
  return consistent & ~high, inconsistent | high


def calibrated_labels(frame_scores: jax.Array, clip_scores: jax.Array, frame_alpha: jax.Array,
                      clip_alpha: jax.Array, own: jax.Array, query_valid: jax.Array,
                      video_mask: jax.Array, division_beta: float, smooth_beta: float
                      ) -> jax.Array:
  """The official post-warmup labels `[Q, B]`: one-hot, except for the ambiguous queries
  (consistent in one branch and inconsistent in the other, or inconsistent in both), whose
  labels become `(1 - smooth_beta) y + smooth_beta (p_frame + p_clip) / 2` with `p` the
  softmax of the branch's scores over the real videos (no gradient)."""
  frame_c, frame_n = pair_division(frame_scores, frame_alpha, own, query_valid, video_mask,
                                   division_beta)
  clip_c, clip_n = pair_division(clip_scores, clip_alpha, own, query_valid, video_mask,
                                 division_beta)
  ambiguous = (frame_c & clip_n) | (frame_n & clip_c) | (frame_n & clip_n)
  probs = lambda s: jax.lax.stop_gradient(
      jax.nn.softmax(jnp.where(video_mask > 0, upcast(s), -jnp.inf), axis=1))
  keep = (1 - smooth_beta) * own
  smoothed = 0.5 * ((keep + smooth_beta * probs(frame_scores))
                    + (keep + smooth_beta * probs(clip_scores)))
  return jnp.where(ambiguous[:, None], smoothed, own)


def inter_video_edl(frame_scores: jax.Array, clip_scores: jax.Array, query_video: jax.Array,
                    query_valid: jax.Array, video_valid: jax.Array, tau: float,
                    calibrate: jax.Array | bool, division_beta: float, smooth_beta: float
                    ) -> dict[str, jax.Array]:
  """Holmes's three inter-video EDL terms of the cosine scores `[Q, B]`, each the mean over
  the valid queries of `dirichlet_risk`: 'frame', 'clip' and 'combined' (the evidence of
  `combine_dirichlets`). Labels: one-hot, or `calibrated_labels` where `calibrate` (a traced
  bool: the epoch is past the warmup) holds."""
  num_videos = frame_scores.shape[1]
  own = jax.nn.one_hot(query_video, num_videos, dtype=jnp.float32)
  video_mask = video_valid.astype(jnp.float32)[None, :]
  frame_alpha = evidence(frame_scores, tau) + 1
  clip_alpha = evidence(clip_scores, tau) + 1
  labels = jnp.where(calibrate,
                     calibrated_labels(frame_scores, clip_scores, frame_alpha, clip_alpha, own,
                                       query_valid, video_mask, division_beta, smooth_beta),
                     own)
  combined_alpha = combine_dirichlets(frame_alpha, clip_alpha, video_mask) + 1
  weights = query_valid.astype(jnp.float32)
  mean = lambda risk: jnp.sum(risk * weights) / jnp.maximum(weights.sum(), 1.0)
  return {name: mean(dirichlet_risk(labels, alpha, video_mask))
          for name, alpha in (('frame', frame_alpha), ('clip', clip_alpha),
                              ('combined', combined_alpha))}


def degree_of_conflict(frame_scores: jax.Array, clip_scores: jax.Array,
                       query_valid: jax.Array, video_valid: jax.Array, tau: float) -> jax.Array:
  """The official `multisrc/` `get_dc_loss` of the two branches' Dirichlets (cosine scores
  `[Q, B]`, evidence `exp(tanh(s) / tau)`): per query the distance of their expected
  probabilities times both certainties, `sum_k |p_frame,k - p_clip,k| (1 - u_frame)
  (1 - u_clip)` with `p = alpha / S`, `u = K / S` over the real videos; mean over the valid
  queries. (The official sum over ordered view pairs of half the L1 distance, divided by
  V - 1, is this for V = 2 views.)"""
  video_mask = video_valid.astype(jnp.float32)[None, :]
  count = jnp.sum(video_mask)

  def opinion(scores):
    alpha = (evidence(scores, tau) + 1) * video_mask
    strength = jnp.sum(alpha, axis=-1)
    return alpha / strength[:, None], 1 - count / strength

  (p_frame, c_frame), (p_clip, c_clip) = opinion(frame_scores), opinion(clip_scores)
  conflict = jnp.sum(jnp.abs(p_frame - p_clip), axis=-1) * c_frame * c_clip
  weights = query_valid.astype(jnp.float32)
  return jnp.sum(conflict * weights) / jnp.maximum(weights.sum(), 1.0)


def intra_video_edl(similarity: jax.Array, labels: jax.Array, query_mask: jax.Array,
                    tau: float) -> jax.Array:
  """The official `MaskedEDLLoss`: `dirichlet_risk` of each query's row over its video's clips
  (`similarity`, `labels` `[B, Q, C]`, evidence `exp(tanh(sim) / tau)`), averaged over the
  video's real queries (`query_mask [B, Q]`), then over the videos that have any."""
  alpha = evidence(similarity, tau) + 1
  risk = dirichlet_risk(labels, alpha, jnp.ones_like(alpha))  # [B, Q]
  mask = query_mask.astype(jnp.float32)
  count = jnp.sum(mask, axis=1)
  per_video = jnp.sum(risk * mask, axis=1) / jnp.maximum(count, 1e-8)
  has_queries = (count > 0).astype(jnp.float32)
  return jnp.sum(per_video * has_queries) / jnp.maximum(has_queries.sum(), 1.0)
