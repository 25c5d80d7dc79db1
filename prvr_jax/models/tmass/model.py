"""T-MASS (Wang et al., CVPR 2024): X-Pool pooling plus a stochastic text embedding.

Inputs (frozen CLIP features, the release layout of `prvr_jax.data.text_video`): a video is its
`num_frames` sampled CLIP frame features `clip_feats [B, F, D]`, a caption its CLIP text
feature `query_feats [Q, 1, D]` (the projected end-of-text token, not normalised).

  pooled[q, b]  = X-Pool(t_q, frames_b)                                   [Q, B, D]
  S[q, b, f]    = cos(t_q, frames_b[f]);   R[q, b] = exp(S[q, b] W + b)  (W = I at init)
  training:       t_s[q] = t_q + eps_q * R[q, own(q)], one draw per caption and step
  evaluation:     score(q, b) = max_m cos(t_q + eps_{b, m} * R[q, b], pooled[q, b])  (Eq. 10)

with the evaluation noise a per-video bank (`layers.stochastic_text.video_noise_bank`), so a
pair's score does not depend on the other queries and videos (the released evaluation's
leak, docs/tmass.md). `num_samples=0` scores with the deterministic text.
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp

from prvr_jax import ops
from prvr_jax.layers import stochastic_text
from prvr_jax.layers.text_pooling import TextConditionedPooling

# CLIP clamps its logit scale to ln(100); pretrained CLIP sits at that bound.
MAX_LOGIT_SCALE = math.log(100.0)


def frame_similarities(texts: jax.Array, frames: jax.Array) -> jax.Array:
  """Cosines `[Q, B, F]` of texts `[Q, D]` with every frame of frames `[B, F, D]`."""
  return jnp.einsum('qd,bfd->qbf', ops.l2_normalize(texts), ops.l2_normalize(frames))


class TMASS(nn.Module):
  """T-MASS on frozen CLIP features.

  Attributes:
    hidden_dim: the joint embedding width D (CLIP's 512; the feature dims must equal it).
    num_frames: frames per video F (the radius layer's input width).
    num_heads: X-Pool attention heads (1 as coded).
    dropout: X-Pool's dropout (0.3; DiDeMo 0.4).
    stochastic_prior: 'uniform01' (official default) or 'normal'.
    stochastic_std: the normal prior's std (LSMDC 3e-3).
    num_samples: M samples per pair at evaluation (0: deterministic text).
    logit_scale_init: initial log logit scale (pretrained CLIP's ln 100).
  """
  hidden_dim: int = 512
  num_frames: int = 12
  num_heads: int = 1
  dropout: float = 0.3
  stochastic_prior: str = 'uniform01'
  stochastic_std: float = 1.0
  num_samples: int = 20
  logit_scale_init: float = MAX_LOGIT_SCALE

  def setup(self):
    if self.stochastic_prior not in stochastic_text.PRIORS:
      raise ValueError(f'config.model.stochastic_prior={self.stochastic_prior!r}; expected one '
                       f'of {stochastic_text.PRIORS}')
    self.pool = TextConditionedPooling(self.hidden_dim, self.num_heads, self.dropout)
    self.radius = stochastic_text.SimilarityRadius(self.hidden_dim)
    self.logit_scale = self.param('logit_scale', nn.initializers.constant(self.logit_scale_init),
                                  ())

  def _frames(self, clip_feats: jax.Array) -> jax.Array:
    if clip_feats.shape[1:] != (self.num_frames, self.hidden_dim):
      raise ValueError(f'T-MASS reads clip_feats [B, {self.num_frames}, {self.hidden_dim}] '
                       f'(config.model.num_frames, hidden_dim), got {clip_feats.shape}')
    return clip_feats

  def encode_videos(self, videos: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """`{'frames': [B, F, D], 'key': [B] int32}`: the key (`video_seed`, a hash of the video
    id) draws the video's noise bank."""
    return {'frames': self._frames(videos['clip_feats']),
            'key': videos['video_seed'].astype(jnp.int32)}

  def encode_queries(self, queries: dict[str, jax.Array]) -> jax.Array:
    """`[Q, D]` text features (the first token of `query_feats`)."""
    return queries['query_feats'][:, 0]

  def score(self, texts: jax.Array, stored: dict[str, jax.Array]) -> jax.Array:
    """`[Q, B]` Eq. 10 scores; the noise needs the 'sampling' RNG stream."""
    frames = stored['frames']
    pooled = self.pool(texts, frames, deterministic=True)
    if self.num_samples == 0:
      return jnp.einsum('qd,qbd->qb', ops.l2_normalize(texts), ops.l2_normalize(pooled))
    radius = jnp.exp(self.radius(frame_similarities(texts, frames)))
    noise = stochastic_text.video_noise_bank(self.make_rng('sampling'), stored['key'],
                                             self.num_samples, self.hidden_dim,
                                             self.stochastic_prior, self.stochastic_std)
    return stochastic_text.max_over_samples(texts, radius, pooled, noise)

  def __call__(self, batch: dict[str, jax.Array], deterministic: bool = True
               ) -> dict[str, jax.Array]:
    """Deterministic: `{'scores'}` as `score`. Training: the pieces of the loss, `texts [Q, D]`,
    `pooled [Q, B, D]`, `radius [Q, D]` (of each caption with its own video), `stochastic
    [Q, D]` (one draw of the 'sampling' stream) and `logit_scale`."""
    texts = self.encode_queries(batch)
    if deterministic:
      return {'scores': self.score(texts, self.encode_videos(batch))}
    frames = self._frames(batch['clip_feats'])
    own_frames = frames[batch['query_video']]
    similarities = jnp.einsum('qd,qfd->qf', ops.l2_normalize(texts), ops.l2_normalize(own_frames))
    radius = jnp.exp(self.radius(similarities))
    noise = stochastic_text.draw_noise(self.make_rng('sampling'), texts.shape,
                                       self.stochastic_prior, self.stochastic_std)
    return {'texts': texts, 'pooled': self.pool(texts, frames, deterministic=False),
            'radius': radius, 'stochastic': texts + noise * radius,
            'logit_scale': self.logit_scale}
