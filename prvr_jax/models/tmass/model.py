"""T-MASS (Wang et al., CVPR 2024): X-Pool pooling plus a stochastic text embedding.

Inputs, `backbone=''` (frozen CLIP features, the release layout of `prvr_jax.data.text_video`):
a video is its `num_frames` sampled CLIP frame features `clip_feats [B, F, D]`, a caption its
CLIP text feature `query_feats [Q, 1, D]` (the projected end-of-text token, not normalised).
`backbone='ViT-B/32'` (or 'ViT-B/16', 'tiny'): CLIP is part of the model and fine-tuned end to
end; a video is `frames [B, F, S, S, 3]` (CLIP-preprocessed pixels), a caption `tokens [Q, C]`.
The CLIP towers' parameters are `visual/...`, `text/...` and `logit_scale`, the tree of
`prvr_jax.clip.CLIP`, so converted CLIP weights drop in (`prvr_jax.clip.weights.into_model`).

  pooled[q, b]  = X-Pool(t_q, frames_b)                                   [Q, B, D]
  S[q, b, f]    = cos(t_q, frames_b[f]);   R[q, b] = exp(S[q, b] W + b)  (W = I at init)
  training:       t_s[q] = t_q + eps_q * R[q, own(q)], one draw per caption and step
  evaluation:     score(q, b) = max_m cos(t_q + eps_{b, m} * R[q, b], pooled[q, b])  (Eq. 10)

with the evaluation noise `noise='per_video'` (the default): a bank per video
(`layers.stochastic_text.video_noise_bank`) shared by every query, so a pair's score does not
depend on the other queries and videos, and the gallery is indexable; or `noise='per_pair'`:
fresh noise per (query, video, sample), as the official code's `rand_like` draws it, keyed by
the video's seed and a hash of the query's input (`stochastic_text.pair_noise`; the query
encoding then carries the key in four extra columns, so it is not for the index). Either way
the score is Eq. 10 for the pair alone (the released evaluation's leak: docs/tmass.md,
`prvr_jax.models.tmass.released`). `num_samples=0` scores with the deterministic text.
"""

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from prvr_jax import clip
from prvr_jax import ops
from prvr_jax.layers import stochastic_text
from prvr_jax.models import batch as batch_lib
from prvr_jax.layers.text_pooling import TextConditionedPooling

# CLIP clamps its logit scale to ln(100); pretrained CLIP sits at that bound.
MAX_LOGIT_SCALE = math.log(100.0)


def frame_similarities(texts: jax.Array, frames: jax.Array) -> jax.Array:
  """Cosines `[Q, B, F]` of texts `[Q, D]` with every frame of frames `[B, F, D]`."""
  return jnp.einsum('qd,bfd->qbf', ops.l2_normalize(texts), ops.l2_normalize(frames))


class TMASS(nn.Module):
  """T-MASS on frozen CLIP features, or with a CLIP backbone trained end to end.

  Attributes:
    hidden_dim: the joint embedding width D (CLIP's 512; the feature dims must equal it).
    num_frames: frames per video F (the radius layer's input width).
    num_heads: X-Pool attention heads (1 as coded).
    dropout: X-Pool's dropout (0.3; DiDeMo 0.4).
    stochastic_prior: 'uniform01' (official default) or 'normal'.
    stochastic_std: the normal prior's std (LSMDC 3e-3).
    num_samples: M samples per pair at evaluation (0: deterministic text).
    noise: evaluation noise, 'per_video' (one bank per video, every query shares it) or
      'per_pair' (fresh per query, video and sample: the official code's draw).
    logit_scale_init: initial log logit scale (pretrained CLIP's ln 100).
    backbone: '' (frozen features), 'ViT-B/32', 'ViT-B/16' or 'tiny' (CLIP trained end to end).
  """
  hidden_dim: int = 512
  num_frames: int = 12
  num_heads: int = 1
  dropout: float = 0.3
  stochastic_prior: str = 'uniform01'
  stochastic_std: float = 1.0
  num_samples: int = 20
  noise: str = 'per_video'
  logit_scale_init: float = MAX_LOGIT_SCALE
  backbone: str = ''

  def setup(self):
    if self.stochastic_prior not in stochastic_text.PRIORS:
      raise ValueError(f'config.model.stochastic_prior={self.stochastic_prior!r}; expected one '
                       f'of {stochastic_text.PRIORS}')
    if self.noise not in stochastic_text.NOISE_MODES:
      raise ValueError(f'config.model.noise={self.noise!r}; expected one of '
                       f'{stochastic_text.NOISE_MODES}')
    self.pool = TextConditionedPooling(self.hidden_dim, self.num_heads, self.dropout)
    self.radius = stochastic_text.SimilarityRadius(self.hidden_dim)
    self.logit_scale = self.param('logit_scale', nn.initializers.constant(self.logit_scale_init),
                                  ())
    if self.backbone:
      config = clip.backbone_config(self.backbone)
      if config.embed_dim != self.hidden_dim:
        raise ValueError(f'config.model.hidden_dim={self.hidden_dim} but the {self.backbone} '
                         f'backbone embeds in {config.embed_dim} dims')
      self.visual = clip.VisionTower(config)
      self.text = clip.TextTower(config)

  def _frames(self, videos: dict[str, jax.Array]) -> jax.Array:
    """`[B, F, D]` frame features of a video batch."""
    if self.backbone:
      pixels = videos['frames']
      features = self.visual(pixels.reshape(-1, *pixels.shape[2:]))
      return features.reshape(*pixels.shape[:2], -1)
    clip_feats = videos['clip_feats']
    if clip_feats.shape[1:] != (self.num_frames, self.hidden_dim):
      raise ValueError(f'T-MASS reads clip_feats [B, {self.num_frames}, {self.hidden_dim}] '
                       f'(config.model.num_frames, hidden_dim), got {clip_feats.shape}')
    return clip_feats

  def encode_videos(self, videos: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """`{'frames': [B, F, D], 'key': [B] int32}`: the key (`video_seed`, a hash of the video
    id) draws the video's noise bank."""
    return {'frames': self._frames(videos), 'key': videos['video_seed'].astype(jnp.int32)}

  def _texts(self, queries: dict[str, jax.Array]) -> jax.Array:
    """`[Q, D]` text features: CLIP's text tower on `tokens`, or the first token of
    `query_feats`."""
    if self.backbone:
      return self.text(queries['tokens'])
    return queries['query_feats'][:, 0]

  @property
  def _keyed_queries(self) -> bool:
    return self.noise == 'per_pair' and self.num_samples > 0

  def encode_queries(self, queries: dict[str, jax.Array]) -> jax.Array:
    """`[Q, D]` text features; with per-pair noise `[Q, D + 4]`: the features and the query's
    noise key (a hash of its tokens or feature, `stochastic_text.row_keys`) in four columns."""
    texts = self._texts(queries)
    if not self._keyed_queries:
      return texts
    source = queries['tokens'] if self.backbone else queries['query_feats']
    columns = stochastic_text.keys_as_columns(stochastic_text.row_keys(source))
    return jnp.concatenate([texts, columns.astype(texts.dtype)], axis=-1)

  def _split(self, encoded: jax.Array) -> tuple[jax.Array, jax.Array | None]:
    """(texts `[Q, D]`, per-pair noise keys `[Q]` or None) of `encode_queries`' output."""
    if not self._keyed_queries:
      return encoded, None
    return (encoded[:, :self.hidden_dim],
            stochastic_text.keys_from_columns(encoded[:, self.hidden_dim:]))

  def score(self, texts: jax.Array, stored: dict[str, jax.Array],
            noise: jax.Array | None = None) -> jax.Array:
    """`[Q, B]` Eq. 10 scores; the noise needs the 'sampling' RNG stream. `noise`
    `[Q, B, M, D]` replaces the drawn noise (e.g. noise the official code recorded)."""
    texts, query_keys = self._split(texts)
    frames = stored['frames']
    pooled = self.pool(texts, frames, deterministic=True)
    if self.num_samples == 0:
      return jnp.einsum('qd,qbd->qb', ops.l2_normalize(texts), ops.l2_normalize(pooled))
    radius = jnp.exp(self.radius(frame_similarities(texts, frames)))
    if noise is None and self.noise == 'per_video':
      bank = stochastic_text.video_noise_bank(self.make_rng('sampling'), stored['key'],
                                              self.num_samples, self.hidden_dim,
                                              self.stochastic_prior, self.stochastic_std)
      return stochastic_text.max_over_samples(texts, radius, pooled, bank)
    return self._best_samples(texts, query_keys, stored['key'], radius, pooled, noise)[0]

  def best_samples(self, texts: jax.Array, stored: dict[str, jax.Array],
                   noise: jax.Array | None = None
                   ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(scores `[Q, B]` as `score`, each pair's best sample `[Q, B, D]`, each video pooled by
    each query `[Q, B, D]`): what the released evaluation keeps of Eq. 10 (`released.py`)."""
    texts, query_keys = self._split(texts)
    frames = stored['frames']
    pooled = self.pool(texts, frames, deterministic=True)
    if self.num_samples == 0:
      samples = jnp.broadcast_to(texts[:, None], pooled.shape)
      return (jnp.sum(ops.l2_normalize(samples) * ops.l2_normalize(pooled), -1), samples,
              pooled)
    radius = jnp.exp(self.radius(frame_similarities(texts, frames)))
    return (*self._best_samples(texts, query_keys, stored['key'], radius, pooled, noise),
            pooled)

  def _best_samples(self, texts, query_keys, video_keys, radius, pooled, noise):
    """(best cosine, best sample) over the M samples of `self.noise` (or `noise`)."""
    if noise is not None:
      noise_of = lambda m: jnp.take(noise, m, axis=2)
    elif self.noise == 'per_video':
      bank = stochastic_text.video_noise_bank(self.make_rng('sampling'), video_keys,
                                              self.num_samples, self.hidden_dim,
                                              self.stochastic_prior, self.stochastic_std)
      noise_of = lambda m: jnp.take(bank, m, axis=1)[None]
    else:
      key = self.make_rng('sampling')
      noise_of = lambda m: stochastic_text.pair_noise(
          key, query_keys, video_keys, m, self.hidden_dim, self.stochastic_prior,
          self.stochastic_std)
    return stochastic_text.best_samples(texts, radius, pooled, noise_of, self.num_samples)

  def __call__(self, batch: dict[str, jax.Array], deterministic: bool = True
               ) -> dict[str, jax.Array]:
    """Deterministic: `{'scores'}` as `score`. Training: the pieces of the loss, `texts [Q, D]`,
    `pooled [Q, B, D]`, `radius [Q, D]` (of each caption with its own video), `stochastic
    [Q, D]` (one draw of the 'sampling' stream) and `logit_scale`."""
    if deterministic:
      encoded = self.encode_queries(batch)
      if self.is_initializing():  # the radius exists even where evaluation does not sample
        self.radius(jnp.zeros((1, self.num_frames), encoded.dtype))
      return {'scores': self.score(encoded, self.encode_videos(batch))}
    texts = self._texts(batch)
    frames = self._frames(batch)
    own_frames = frames[batch['query_video']]
    similarities = jnp.einsum('qd,qfd->qf', ops.l2_normalize(texts), ops.l2_normalize(own_frames))
    radius = jnp.exp(self.radius(similarities))
    noise = stochastic_text.draw_noise(self.make_rng('sampling'), texts.shape,
                                       self.stochastic_prior, self.stochastic_std)
    return {'texts': texts, 'pooled': self.pool(texts, frames, deterministic=False),
            'radius': radius, 'stochastic': texts + noise * radius,
            'logit_scale': self.logit_scale}


def input_keys(config_model: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """(video inputs, query inputs) of `config.model`: pixels and tokens with a backbone."""
  if config_model.get('backbone'):
    return ('frames', 'video_seed'), ('tokens',)
  return ('clip_feats', 'video_seed'), ('query_feats',)


def example_batch(config_model: Any, num_videos: int = 2, queries_per_video: int = 1
                  ) -> dict[str, np.ndarray]:
  """The batch contract's zeros, plus `frames` and `tokens` (each caption one token and its
  end-of-text) with a backbone."""
  batch = batch_lib.example_batch(config_model, num_videos, queries_per_video)
  if config_model.get('backbone'):
    config = clip.backbone_config(config_model.backbone)
    size = config.image_size
    batch['frames'] = np.zeros((num_videos, config_model.num_frames, size, size, 3), np.float32)
    tokens = np.zeros((num_videos * queries_per_video, config.context_length), np.int32)
    tokens[:, 1] = config.vocab_size - 1
    batch['tokens'] = tokens
  return batch

