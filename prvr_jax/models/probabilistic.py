"""RAL's probabilistic embeddings and their losses as a plug-in for the set-scoring models
(docs/ral.md, "The probabilistic plug-in").

`ProbabilisticPlugin` is a mixin a Linen model lists among its bases to opt in
(`TwoBranchModel` does, so MS-SL, GMMFormer, GMMFormer v2 and HLFormer have it; RAL, a
GMMFormer v2, has it always on). It adds the fields `probabilistic` (the switch, off by
default: no parameters, outputs or terms are added), `num_samples` and `support_slots`, and:

* `probabilistic_heads()` for `setup` (as `self.prob`; parameters under `prob_video` and
  `prob_text`, the tree the official RAL names map to);
* `gaussians(...)`: in training, a Gaussian of each video from its encoded frames and one of
  its query support set from its queries' token encodings (`prvr_jax.layers.probabilistic`);
* `probabilistic_terms(outputs, batch, config.loss)`: L_PM and L_DA times their weights
  `proxy_matching` and `distribution_alignment` (`prvr_jax.losses.ral`), which
  `two_branch.make_objective` adds whenever the training forward returns `gaussians`.

The model provides `hidden_dim`, `self.prob = self.probabilistic_heads()` in `setup`, and in
its training forward the encoded frames (`probabilistic_frames`) and the query tokens before
pooling. Evaluation (`encode_videos`, `encode_queries`, `score`) never reads the heads.
"""

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from prvr_jax.layers.probabilistic import ProbabilisticEmbedding, masked_mean_pool
from prvr_jax.layers.probabilistic import normalized_mean_pool, support_set
from prvr_jax.losses import ral
from prvr_jax.models.spec import Batch

# The two weighted terms (`config.loss` keys of the same names).
TERMS = ('proxy_matching', 'distribution_alignment')
# The rng stream the samples are drawn from in training.
SAMPLE_STREAM = 'sample'


class ProbabilisticPlugin(nn.Module):
  """RAL's Gaussian heads as a plug-in: fields and methods (see the module docstring).

  Attributes:
    probabilistic: in training, a Gaussian of each video (its encoded frames) and of its
      query support set (its queries' token encodings), and the terms L_PM and L_DA.
    num_samples: K, samples per Gaussian (RAL's 6).
    support_slots: queries per video in its support set (RAL's 26; more are dropped).
  """
  probabilistic: bool = False
  num_samples: int = 6
  support_slots: int = 26

  def probabilistic_heads(self) -> dict[str, nn.Module]:
    """The heads (for `setup`, as `self.prob`): a `ProbabilisticEmbedding` for 'video' and one
    for 'text'; none when the plug-in is off (the parameter tree is then unchanged)."""
    if not self.probabilistic:
      return {}
    if self.num_samples < 1:
      raise ValueError(f'the probabilistic plug-in needs at least one sample per Gaussian: '
                       f'--config.model.num_samples={self.num_samples}')
    return {m: ProbabilisticEmbedding(self.hidden_dim, self.num_samples)
            for m in ('video', 'text')}

  def probabilistic_frames(self, videos: Mapping[str, jax.Array], batch: Batch
                           ) -> tuple[jax.Array, jax.Array]:
    """(encoded frames `[B, L, D]`, frame mask `[B, L]`) the video Gaussian reads, from the
    training encodings `videos`: their `frames` and the batch's `frame_mask` by default."""
    return videos['frames'], batch['frame_mask']

  def wants_gaussians(self, deterministic: bool) -> bool:
    """Whether the training forward computes `gaussians`: plug-in on, and training or
    initializing (the heads' parameters are made then)."""
    return self.probabilistic and (not deterministic or self.is_initializing())

  def gaussians(self, frames: jax.Array, frame_mask: jax.Array, tokens: jax.Array,
                token_mask: jax.Array, batch: Batch,
                noise: Mapping[str, jax.Array] | None = None
                ) -> dict[str, dict[str, jax.Array]]:
    """The two Gaussians of each video: 'video' (its frames) and 'text' (its query support
    set), each {'mean', 'logsigma', 'samples' `[B, K, D]`}.

    Args:
      frames: `[B, L, D]` encoded frames; padded ones are zeroed here (the heads' attention
        pools see every position, as RAL's official heads do, padding as zero vectors).
      frame_mask: `[B, L]`.
      tokens: `[Q, Lq, D]` per-token query encodings; `token_mask` `[Q, Lq]`.
      batch: its `query_video` and `query_valid` build the support sets.
      noise: {'video', 'text'} standard normal `[B, K, D]`; without it the samples draw from
        the 'sample' rng stream (zeros when initializing without one).
    """
    frame_mask = frame_mask.astype(frames.dtype)
    frames = frames * frame_mask[..., None]
    support, support_mask = support_set(tokens, token_mask, batch['query_video'],
                                        batch['query_valid'], frames.shape[0],
                                        self.support_slots)
    noise = dict(noise or {})
    if self.is_initializing() and not self.has_rng(SAMPLE_STREAM):
      shape = (frames.shape[0], self.num_samples, self.hidden_dim)
      noise = {k: noise.get(k, jnp.zeros(shape, frames.dtype)) for k in ('video', 'text')}
    return {'video': self.prob['video'](normalized_mean_pool(frames, frame_mask), frames,
                                        eps=noise.get('video')),
            'text': self.prob['text'](masked_mean_pool(support, support_mask), support,
                                      eps=noise.get('text'))}

  def probabilistic_outputs(self, videos: Mapping[str, jax.Array], tokens: jax.Array | None,
                            batch: Batch, deterministic: bool) -> dict[str, Any]:
    """{'gaussians': ...} of the training encodings `videos` and the query `tokens` when
    `wants_gaussians`, else {}."""
    if not self.wants_gaussians(deterministic):
      return {}
    frames, frame_mask = self.probabilistic_frames(videos, batch)
    return {'gaussians': self.gaussians(frames, frame_mask, tokens,
                                        batch['query_mask'].astype(tokens.dtype), batch)}


def probabilistic_terms(outputs: Mapping[str, Any], batch: Batch, cfg: Any
                        ) -> dict[str, jax.Array]:
  """'proxy_matching' and 'distribution_alignment' of `outputs['gaussians']`, weighted by
  `config.loss.proxy_matching` / `config.loss.distribution_alignment` (RAL's 4e-3 / 2.5e-4;
  a weight of 0 leaves its term out), padding videos left out."""
  missing = [k for k in TERMS if k not in cfg]
  if missing:
    raise ValueError(f'the probabilistic plug-in needs config.loss.{missing[0]} (its weight; '
                     f'RAL\'s {ral.PROXY_MATCHING_WEIGHT} / '
                     f'{ral.DISTRIBUTION_ALIGNMENT_WEIGHT})')
  video, text = outputs['gaussians']['video'], outputs['gaussians']['text']
  weighted = ral.ral_loss(video['samples'], video['logsigma'], text['samples'],
                          text['logsigma'], batch['video_valid'],
                          proxy_matching_weight=cfg.proxy_matching,
                          distribution_alignment_weight=cfg.distribution_alignment)
  return {k: v for k, v in weighted.items() if cfg[k]}
