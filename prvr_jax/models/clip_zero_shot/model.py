"""Zero-shot CLIP for PRVR: the CLIP text feature against a video's pooled frame embeddings.

Nothing is trained: every parameter is CLIP's (`prvr_jax.clip.weights`), or, on features
already CLIP-embedded, there is only CLIP's logit scale (kept so that the parameter tree is a
part of CLIP's; it scales CLIP's logits and never changes a ranking).

Inputs (`video_input`, `query_input`):
  'features' / 'features': a CLIP feature release (AMDNet's layout, `prvr_jax.data.release`):
    a video is its frame features `frame_feats [B, L, D]` with `frame_mask [B, L]`, a caption
    its sentence vector `query_feats [Q, 1, D]`.
  'frames': CLIP-preprocessed pixels `frames [B, F, S, S, 3]` through CLIP's image tower
    (`backbone`), every frame real.
  'tokens': caption tokens `tokens [Q, C]` through CLIP's text tower.

With frame embeddings `v_f` (`f` over the video's real frames) and text feature `t`, all
L2-normalised (`^`):
  'mean':  score = cos(t, mean_f v_f^)                    (CLIP4Clip's parameter-free meanP)
  'max':   score = max_f cos(t, v_f)                      (the PRVR analogue: the best frame)
  'topk':  score = mean of the `top_k` largest cos(t, v_f)  (all real frames when fewer)
"""

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from prvr_jax import clip
from prvr_jax import ops
from prvr_jax.models import batch as batch_lib

POOLINGS = ('mean', 'max', 'topk')
VIDEO_INPUTS = ('features', 'frames')
QUERY_INPUTS = ('features', 'tokens')
# CLIP's initial log temperature (pretrained CLIP weights bring their own).
LOGIT_SCALE_INIT = float(np.log(1 / 0.07))


def _masked_mean(vectors: jax.Array, mask: jax.Array) -> jax.Array:
  """`[B, L, D]`, `[B, L]` -> `[B, D]`: the mean over each row's real positions."""
  count = jnp.maximum(jnp.sum(mask, axis=1, keepdims=True), 1.0)
  return jnp.sum(vectors * mask[..., None], axis=1) / count


def pool_scores(texts: jax.Array, frames: jax.Array, mask: jax.Array, pooling: str,
                top_k: int = 1) -> jax.Array:
  """`[Q, B]` zero-shot scores of texts `[Q, D]` against frame embeddings `[B, L, D]` with
  `mask [B, L]` (1 = real frame), computed from the raw (unnormalised) embeddings: the
  reference of `ClipZeroShot`'s stored-encoding path."""
  texts = ops.l2_normalize(texts)
  frames = ops.l2_normalize(frames)
  if pooling == 'mean':
    return texts @ ops.l2_normalize(_masked_mean(frames, mask)).T
  return _frame_pooling(jnp.einsum('qd,bld->qbl', texts, frames), mask, pooling, top_k)


def _frame_pooling(cosines: jax.Array, mask: jax.Array, pooling: str, top_k: int
                   ) -> jax.Array:
  """`[Q, B, L]` frame cosines -> `[Q, B]`: their max, or the mean of the `top_k` largest,
  over each video's real frames (`mask [B, L]`)."""
  real = mask[None] > 0
  cosines = jnp.where(real, cosines, -jnp.inf)
  if pooling == 'max':
    return jnp.max(cosines, axis=-1)
  best = jax.lax.top_k(cosines, min(top_k, cosines.shape[-1]))[0]
  taken = jnp.isfinite(best)
  return (jnp.sum(jnp.where(taken, best, 0.0), axis=-1)
          / jnp.maximum(jnp.sum(taken, axis=-1), 1))


class ClipZeroShot(nn.Module):
  """CLIP's towers (or CLIP features) and a parameter-free pooling.

  Attributes:
    pooling: 'mean', 'max' or 'topk' (see the module docstring).
    top_k: frames averaged by 'topk'.
    video_input: 'features' (CLIP frame features) or 'frames' (pixels, CLIP's image tower).
    query_input: 'features' (CLIP sentence vectors) or 'tokens' (CLIP's text tower).
    backbone: the CLIP of the towers ('ViT-B/32', 'ViT-B/16', 'tiny'); '' with features only.
    hidden_dim: the joint space's width D (CLIP's embedding width).
    visual_dim, query_dim: the widths of frame / sentence features (D where they are read).
    num_frames: frames per video with `video_input='frames'`.
    max_frames: frame rows per video with `video_input='features'`.
  """
  pooling: str = 'mean'
  top_k: int = 3
  video_input: str = 'features'
  query_input: str = 'features'
  backbone: str = ''
  hidden_dim: int = 512
  visual_dim: int = 512
  query_dim: int = 512
  num_frames: int = 12
  max_frames: int = 128

  def setup(self):
    for field, value, choices in (('pooling', self.pooling, POOLINGS),
                                  ('video_input', self.video_input, VIDEO_INPUTS),
                                  ('query_input', self.query_input, QUERY_INPUTS)):
      if value not in choices:
        raise ValueError(f'config.model.{field}={value!r}; expected one of {choices}')
    if self.top_k < 1:
      raise ValueError(f'config.model.top_k={self.top_k} must be >= 1')
    uses_tower = 'frames' == self.video_input or 'tokens' == self.query_input
    if uses_tower and not self.backbone:
      raise ValueError(f'config.model.video_input={self.video_input!r}, query_input='
                       f'{self.query_input!r} run a CLIP tower: set config.model.backbone')
    for field, dim, used in (('visual_dim', self.visual_dim, self.video_input == 'features'),
                             ('query_dim', self.query_dim, self.query_input == 'features')):
      if used and dim != self.hidden_dim:
        raise ValueError(f'config.model.{field}={dim} but hidden_dim={self.hidden_dim}: CLIP '
                         'features and the text feature share one joint space')
    if self.backbone:
      config = clip.backbone_config(self.backbone)
      if config.embed_dim != self.hidden_dim:
        raise ValueError(f'config.model.hidden_dim={self.hidden_dim} but the {self.backbone} '
                         f'backbone embeds in {config.embed_dim} dims')
      if self.video_input == 'frames':
        self.visual = clip.VisionTower(config)
      if self.query_input == 'tokens':
        self.text = clip.TextTower(config)
    self.logit_scale = self.param('logit_scale', nn.initializers.constant(LOGIT_SCALE_INIT),
                                  ())

  def frame_embeddings(self, videos: dict[str, jax.Array]) -> tuple[jax.Array, jax.Array]:
    """(raw frame embeddings `[B, L, D]`, mask `[B, L]`) of a video batch."""
    if self.video_input == 'frames':
      pixels = videos['frames']
      features = self.visual(pixels.reshape(-1, *pixels.shape[2:]))
      features = features.reshape(*pixels.shape[:2], -1)
      return features, jnp.ones(features.shape[:2], features.dtype)
    return videos['frame_feats'], videos['frame_mask'].astype(videos['frame_feats'].dtype)

  def encode_videos(self, videos: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """`{'frames': [B, L, D], 'mask': [B, L]}`, L2-normalised frame embeddings (zero rows at
    padding); 'mean' keeps one row per video, the re-normalised mean (L = 1)."""
    frames, mask = self.frame_embeddings(videos)
    frames = ops.l2_normalize(frames) * mask[..., None]
    if self.pooling == 'mean':
      pooled = ops.l2_normalize(_masked_mean(frames, mask))
      return {'frames': pooled[:, None], 'mask': jnp.ones((pooled.shape[0], 1), pooled.dtype)}
    return {'frames': frames, 'mask': mask}

  def encode_queries(self, queries: dict[str, jax.Array]) -> jax.Array:
    """`[Q, D]` L2-normalised text features: CLIP's text tower on `tokens`, or the sentence
    vector `query_feats[:, 0]`."""
    if self.query_input == 'tokens':
      return ops.l2_normalize(self.text(queries['tokens']))
    return ops.l2_normalize(queries['query_feats'][:, 0])

  def score(self, texts: jax.Array, stored: dict[str, jax.Array]) -> jax.Array:
    """`[Q, B]` cosines pooled over the stored frames (the module docstring)."""
    cosines = jnp.einsum('qd,bld->qbl', texts, stored['frames'])
    if self.pooling == 'mean':
      return cosines[..., 0]
    return _frame_pooling(cosines, stored['mask'], self.pooling, self.top_k)

  def relevance(self, queries: dict[str, jax.Array], videos: dict[str, jax.Array]
                ) -> dict[str, jax.Array]:
    """`{'frame cosine': [Q, L]}`: query q's cosine with each frame of video q (NaN at
    padding), whose max is the 'max' score."""
    frames, mask = self.frame_embeddings(videos)
    texts = self.encode_queries(queries)
    cosines = jnp.einsum('qd,qld->ql', texts, ops.l2_normalize(frames))
    return {'frame cosine': jnp.where(mask > 0, cosines, jnp.nan)}

  def __call__(self, batch: dict[str, jax.Array], deterministic: bool = True
               ) -> dict[str, jax.Array]:
    """`{'scores': [Q, B]}` as `score` (there is no training forward)."""
    del deterministic
    return {'scores': self.score(self.encode_queries(batch), self.encode_videos(batch))}


def input_keys(config_model: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """(video inputs, query inputs) of `config.model`."""
  video = (('frames',) if config_model.get('video_input') == 'frames'
           else ('frame_feats', 'frame_mask'))
  query = ('tokens',) if config_model.get('query_input') == 'tokens' else ('query_feats',)
  return video, query


def example_batch(config_model: Any, num_videos: int = 2, queries_per_video: int = 1
                  ) -> dict[str, np.ndarray]:
  """The batch contract's zeros, plus `frames` and `tokens` (one token and its end-of-text)
  where a tower reads them."""
  batch = batch_lib.example_batch(config_model, num_videos, queries_per_video)
  if config_model.get('backbone'):
    config = clip.backbone_config(config_model.backbone)
    if config_model.get('video_input') == 'frames':
      size = config.image_size
      batch['frames'] = np.zeros((num_videos, config_model.num_frames, size, size, 3),
                                 np.float32)
    if config_model.get('query_input') == 'tokens':
      tokens = np.zeros((num_videos * queries_per_video, config.context_length), np.int32)
      tokens[:, 1] = config.vocab_size - 1
      batch['tokens'] = tokens
  return batch
