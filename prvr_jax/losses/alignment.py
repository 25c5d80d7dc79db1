"""MSC-PRVR's cross-branch video alignment (CBVA), adaptive form, as coded officially.

Per video: the frames of the frame branch are contrasted with the segments of the clip branch
that hold them (frame -> segment), and each segment with its frames (segment -> frame), each
side against a detached other side. The segments are the clip tokens, merged further
(`layers.token_merge.merge_bipartite`, cosine of the input clip features) down to fewer
segments the more alike the video's input clips are (`intra_video_redundancy`): a video whose
clips all look alike is aligned against 5 segments, a diverse one against its 32 clips.
"""

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from prvr_jax.layers.token_merge import merge_bipartite
from prvr_jax.ops import l2_normalize

# Official cascade (32 clips -> 20 -> 12 -> 8 -> 5) and the redundancy levels that pick its
# stage: redundancy >= 0.2 -> 20 segments, >= 0.4 -> 12, >= 0.6 -> 8, >= 0.8 -> 5.
TARGETS = (20, 12, 8, 5)
THRESHOLDS = (0.2, 0.4, 0.6, 0.8)


def intra_video_redundancy(clips: jax.Array, threshold: float) -> jax.Array:
  """`clips [K, D]` -> the fraction of ordered pairs (i != j) joined by a chain of clips whose
  consecutive cosines exceed `threshold` (the transitive closure of that graph)."""
  num = clips.shape[0]
  unit = l2_normalize(clips)
  reach = (unit @ unit.T) > threshold
  steps = max(1, (num - 1).bit_length())
  for _ in range(steps):  # paths of length <= 2^steps >= num - 1: the closure
    reach = reach | ((reach.astype(jnp.float32) @ reach.astype(jnp.float32)) > 0)
  off_diagonal = reach & ~jnp.eye(num, dtype=bool)
  return jnp.sum(off_diagonal) / (1e-9 + num * (num - 1))


def _alignment(frames: jax.Array, segments: jax.Array, labels: jax.Array) -> jax.Array:
  """Frame -> segment plus segment -> frame contrast of one video: `frames [L, D]`,
  `segments [S, D]`, `labels [L]` (each frame's segment)."""
  positive = labels[:, None] == jnp.arange(segments.shape[0])[None, :]  # [L, S]
  negative = ~positive

  def means(similarity, axis, eps):
    """Mean over the other axis of -log(pos / (pos + neg + eps)), pos / neg the mean of
    exp(similarity - max) over the positives / negatives along `axis`. log(pos) is taken as a
    log-sum-exp, so a positive far below the maximum gives a large finite loss, not inf (the
    stages `one_video` computes but does not select must not turn the gradient into NaN)."""
    shifted = similarity - jax.lax.stop_gradient(jnp.max(similarity, axis=axis, keepdims=True))
    log_pos = (jax.nn.logsumexp(shifted, axis=axis, b=positive.astype(shifted.dtype))
               - jnp.log(jnp.sum(positive, axis) + 1e-8))
    neg = (jnp.sum(jnp.where(negative, jnp.exp(shifted), 0.0), axis)
           / (jnp.sum(negative, axis) + 1e-8))
    return jnp.mean(jnp.log(jnp.exp(log_pos) + neg + eps) - log_pos)

  to_segments = means(frames @ jax.lax.stop_gradient(segments).T, 1, 1e-8)
  to_frames = means(jax.lax.stop_gradient(frames) @ segments.T, 0, 0.0)
  return to_segments + to_frames


def alignment_stages(frames: jax.Array, clips: jax.Array, labels: jax.Array,
                     clip_inputs: jax.Array, sizes: jax.Array,
                     targets: Sequence[int] = TARGETS) -> jax.Array:
  """One video's alignment loss at every stage of the cascade: `[1 + len(targets)]`, against
  its K clips, then merged to each of `targets` (the arguments as `cross_branch_alignment`'s,
  without the batch axis)."""
  losses = [_alignment(frames, clips, labels)]
  segments, metric, weight = clips, clip_inputs, sizes
  for target in targets:
    segments, metric, weight, labels = merge_bipartite(segments, metric, weight, labels, target)
    losses.append(_alignment(frames, segments, labels))
  return jnp.stack(losses)


def cross_branch_alignment(frames: jax.Array, clips: jax.Array, labels: jax.Array,
                           clip_inputs: jax.Array, sizes: jax.Array, valid: jax.Array,
                           threshold: float | jax.Array, targets: Sequence[int] = TARGETS,
                           thresholds: Sequence[float] = THRESHOLDS) -> jax.Array:
  """Adaptive CBVA, mean over the valid videos.

  Args:
    frames: `[B, L, D]` frame-branch encodings (projected).
    clips: `[B, K, D]` clip-branch encodings (projected).
    labels: `[B, L]` int, each frame's clip.
    clip_inputs: `[B, K, Dv]` the clip branch's input features (the merge metric and the
      redundancy).
    sizes: `[B, K]` frames per clip.
    valid: `[B]` real videos.
    threshold: the cosine above which two input clips count as alike (`sim_thr`).
    targets: the merge cascade after the K clips; one stage per entry of `thresholds`.
    thresholds: redundancy levels; at or above the i-th, the cascade runs to `targets[i]`.
  """
  if len(targets) != len(thresholds):
    raise ValueError(f'{len(targets)} merge targets for {len(thresholds)} redundancy levels '
                     '(config.loss.cbva_targets / cbva_thresholds)')
  counts = (clips.shape[1],) + tuple(targets)
  if any(n % 2 or not n // 2 <= m < n for n, m in zip(counts[:-1], counts[1:])):
    raise ValueError(f'config.loss.cbva_targets={tuple(targets)}: each stage merges an even '
                     f'count of segments into at least half of them, from the {counts[0]} clips')

  def one_video(frames, clips, labels, clip_inputs, sizes):
    redundancy = intra_video_redundancy(clip_inputs, threshold)
    stage = sum((redundancy >= t).astype(jnp.int32) for t in thresholds)
    return alignment_stages(frames, clips, labels, clip_inputs, sizes, targets)[stage]

  per_video = jax.vmap(one_video)(frames, clips, labels, clip_inputs, sizes)
  return jnp.sum(jnp.where(valid, per_video, 0.0)) / jnp.maximum(jnp.sum(valid), 1)
