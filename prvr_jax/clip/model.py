"""CLIP (Radford et al., 2021) in Flax Linen: the ViT image tower and the causal text tower.

The architecture of OpenAI's released ViT models as open_clip builds them: pre-LayerNorm
residual blocks (LayerNorm eps 1e-5, QuickGELU MLP of 4x width), a patch convolution without
bias, a class token, learned positional embeddings; the image feature is the class token after
`ln_post` times `proj`, the text feature the EOT token (the largest token id) after `ln_final`
times `text_projection`. Features come back unnormalised; `logit_scale` is the learned *log*
temperature (logits = exp(logit_scale) * cosine).

Parameters (`jax.eval_shape`, equal to open_clip's `sum(p.numel())` for the same models):
ViT-B/32 (open_clip 'ViT-B-32-quickgelu') 151,277,313; ViT-B/16 ('ViT-B-16-quickgelu')
149,620,737.

Parameter tree of `CLIP` (N = tower's layer index; `{query,key,value}/kernel [W, H, W/H]`,
`out/kernel [H, W/H, W]`, Dense kernels are the transposed torch weights):

  visual/patch_embed/kernel [P, P, 3, Wv]     visual.conv1.weight [Wv, 3, P, P]
  visual/class_embedding [Wv]                 visual.class_embedding
  visual/positional_embedding [G*G+1, Wv]     visual.positional_embedding
  visual/ln_pre/{scale,bias}                  visual.ln_pre.{weight,bias}
  visual/transformer/resblocks_N/...          visual.transformer.resblocks.N....
  visual/ln_post/{scale,bias}                 visual.ln_post.{weight,bias}
  visual/proj/kernel [Wv, E]                  visual.proj [Wv, E]
  text/token_embedding/embedding [V, Wt]      token_embedding.weight
  text/positional_embedding [C, Wt]           positional_embedding
  text/transformer/resblocks_N/...            transformer.resblocks.N....
  text/ln_final/{scale,bias}                  ln_final.{weight,bias}
  text/text_projection/kernel [Wt, E]         text_projection [Wt, E]
  logit_scale []                              logit_scale

  a block: ln_1, attn/{query,key,value,out}, ln_2, c_fc, c_proj  (torch ln_1,
  attn.in_proj_* split in three, attn.out_proj, ln_2, mlp.c_fc, mlp.c_proj)

`prvr_jax.clip.weights` reads OpenAI / open_clip and Hugging Face checkpoints into this tree.
"""

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

# torch.nn.LayerNorm's default, which the released weights were trained with.
LAYER_NORM_EPS = 1e-5
# The RGB normalisation the OpenAI weights expect: images in [0, 1] (bicubic resize of the
# short side to `image_size`, centre crop), then (x - IMAGE_MEAN) / IMAGE_STD per channel.
IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)
IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclasses.dataclass(frozen=True)
class CLIPConfig:
  """Sizes of a CLIP ViT model.

  Attributes:
    embed_dim: width E of the joint image-text space.
    image_size: input side in pixels (square images).
    patch_size: side P of a patch; `image_size // patch_size` patches per side.
    vision_width, vision_layers, vision_heads: the image transformer.
    context_length: C, the most tokens a caption may have (positional embeddings).
    vocab_size: V, the token vocabulary (49,408 for the OpenAI BPE).
    text_width, text_layers, text_heads: the text transformer.
    quick_gelu: `x * sigmoid(1.702 x)` in the MLPs, as the OpenAI weights were trained with
      (open_clip's `-quickgelu` models); False for the exact GELU.
    mlp_ratio: MLP hidden width over the transformer width.
  """
  embed_dim: int
  image_size: int
  patch_size: int
  vision_width: int
  vision_layers: int
  vision_heads: int
  context_length: int
  vocab_size: int
  text_width: int
  text_layers: int
  text_heads: int
  quick_gelu: bool = True
  mlp_ratio: int = 4

  def __post_init__(self):
    if self.image_size % self.patch_size:
      raise ValueError(f'image_size {self.image_size} is not a multiple of patch_size '
                       f'{self.patch_size}')
    for width, heads, tower in ((self.vision_width, self.vision_heads, 'vision'),
                                (self.text_width, self.text_heads, 'text')):
      if width % heads:
        raise ValueError(f'{tower}_width {width} is not a multiple of {tower}_heads {heads}')

  @property
  def grid_size(self) -> int:
    """Patches per image side."""
    return self.image_size // self.patch_size


VIT_B_32 = CLIPConfig(embed_dim=512, image_size=224, patch_size=32, vision_width=768,
                      vision_layers=12, vision_heads=12, context_length=77, vocab_size=49408,
                      text_width=512, text_layers=12, text_heads=8)
VIT_B_16 = dataclasses.replace(VIT_B_32, patch_size=16)
CONFIGS = {'ViT-B/32': VIT_B_32, 'ViT-B/16': VIT_B_16}
# A few-thousand-parameter CLIP for tests and smoke runs of models with a CLIP backbone.
TINY = CLIPConfig(embed_dim=32, image_size=32, patch_size=16, vision_width=32, vision_layers=1,
                  vision_heads=2, context_length=16, vocab_size=1024, text_width=32, text_layers=1,
                  text_heads=2)


def backbone_config(name: str) -> CLIPConfig:
  """The CLIP config of a model's `config.model.backbone`: a key of `CONFIGS` or 'tiny'."""
  if name == 'tiny':
    return TINY
  if name not in CONFIGS:
    raise ValueError(f"config.model.backbone={name!r}; expected one of {sorted(CONFIGS)}, "
                     "'tiny', or '' (frozen features)")
  return CONFIGS[name]


def quick_gelu(x: jax.Array) -> jax.Array:
  return x * jax.nn.sigmoid(1.702 * x)


def _layer_norm(name: str, dtype: Any) -> nn.LayerNorm:
  # Statistics in float32 also for a bfloat16 `dtype`; the variance as torch computes it,
  # E[(x - E[x])^2], not E[x^2] - E[x]^2, which cancels where |mean| >> std.
  return nn.LayerNorm(epsilon=LAYER_NORM_EPS, dtype=dtype, use_fast_variance=False, name=name)


class ResidualAttentionBlock(nn.Module):
  """x + attn(ln_1(x)), then x + c_proj(act(c_fc(ln_2(x)))). [N, L, W] -> [N, L, W].

  Initialised as OpenAI initialises its text transformer (attention std W^-0.5, output
  projections W^-0.5 (2 layers)^-0.5, c_fc (2W)^-0.5, zero biases).
  """
  width: int
  heads: int
  layers: int
  quick_gelu: bool = True
  mlp_ratio: int = 4
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    normal = nn.initializers.normal
    proj_std = self.width ** -0.5 * (2 * self.layers) ** -0.5
    y = _layer_norm('ln_1', self.dtype)(x)
    y = nn.MultiHeadDotProductAttention(
        num_heads=self.heads, dtype=self.dtype, kernel_init=normal(self.width ** -0.5),
        out_kernel_init=normal(proj_std), force_fp32_for_softmax=True, name='attn')(
            y, mask=mask)
    x = x + y
    y = _layer_norm('ln_2', self.dtype)(x)
    y = nn.Dense(self.mlp_ratio * self.width, dtype=self.dtype,
                 kernel_init=normal((2 * self.width) ** -0.5), name='c_fc')(y)
    y = quick_gelu(y) if self.quick_gelu else nn.gelu(y, approximate=False)
    y = nn.Dense(self.width, dtype=self.dtype, kernel_init=normal(proj_std), name='c_proj')(y)
    return x + y


class Transformer(nn.Module):
  """`layers` residual attention blocks `resblocks_0..`. [N, L, W] -> [N, L, W]."""
  width: int
  layers: int
  heads: int
  quick_gelu: bool = True
  mlp_ratio: int = 4
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    for i in range(self.layers):
      x = ResidualAttentionBlock(self.width, self.heads, self.layers, self.quick_gelu,
                                 self.mlp_ratio, self.dtype, name=f'resblocks_{i}')(x, mask)
    return x


class VisionTower(nn.Module):
  """The ViT image encoder: `[N, H, W, 3]` CLIP-normalised NHWC images -> `[N, E]`.

  Returns the class token after `ln_post`, projected by `proj`; not normalised.
  """
  config: CLIPConfig
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, images: jax.Array) -> jax.Array:
    cfg = self.config
    if images.ndim != 4 or images.shape[1:] != (cfg.image_size, cfg.image_size, 3):
      raise ValueError(f'VisionTower expects images [N, {cfg.image_size}, {cfg.image_size}, 3] '
                       f'(NHWC), got {images.shape}')
    width = cfg.vision_width
    scale = width ** -0.5
    x = nn.Conv(width, (cfg.patch_size, cfg.patch_size), strides=cfg.patch_size,
                padding='VALID', use_bias=False, dtype=self.dtype, name='patch_embed')(images)
    x = x.reshape(x.shape[0], -1, width)  # patches in row-major order, as torch's flatten(2)
    class_embedding = self.param('class_embedding', nn.initializers.normal(scale), (width,))
    positional_embedding = self.param('positional_embedding', nn.initializers.normal(scale),
                                      (cfg.grid_size ** 2 + 1, width))
    cls = jnp.broadcast_to(class_embedding.astype(x.dtype), (x.shape[0], 1, width))
    x = jnp.concatenate([cls, x], axis=1) + positional_embedding.astype(x.dtype)
    x = _layer_norm('ln_pre', self.dtype)(x)
    x = Transformer(width, cfg.vision_layers, cfg.vision_heads, cfg.quick_gelu, cfg.mlp_ratio,
                    self.dtype, name='transformer')(x)
    x = _layer_norm('ln_post', self.dtype)(x[:, 0])
    return nn.Dense(cfg.embed_dim, use_bias=False, dtype=self.dtype,
                    kernel_init=nn.initializers.normal(scale), name='proj')(x)


class TextTower(nn.Module):
  """The causal text encoder: `[N, L]` int32 tokens, `L <= context_length` -> `[N, E]`.

  Returns the features at each row's EOT token -- the position of its largest token id, as
  OpenAI CLIP pools -- after `ln_final`, projected by `text_projection`; not normalised.
  Tokens after the EOT (padding) do not change the result (causal mask), so rows may be cut
  to any length that keeps their EOT.
  """
  config: CLIPConfig
  dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, tokens: jax.Array) -> jax.Array:
    cfg = self.config
    if tokens.ndim != 2 or tokens.shape[1] > cfg.context_length:
      raise ValueError(f'TextTower expects tokens [N, L] with L <= {cfg.context_length}, got '
                       f'{tokens.shape}')
    width = cfg.text_width
    x = nn.Embed(cfg.vocab_size, width, dtype=self.dtype,
                 embedding_init=nn.initializers.normal(0.02), name='token_embedding')(tokens)
    positional_embedding = self.param('positional_embedding', nn.initializers.normal(0.01),
                                      (cfg.context_length, width))
    x = x + positional_embedding[:tokens.shape[1]].astype(x.dtype)
    x = Transformer(width, cfg.text_layers, cfg.text_heads, cfg.quick_gelu, cfg.mlp_ratio,
                    self.dtype, name='transformer')(x, nn.make_causal_mask(tokens))
    x = _layer_norm('ln_final', self.dtype)(x)
    eot = jnp.argmax(tokens, axis=-1)
    x = jnp.take_along_axis(x, eot[:, None, None], axis=1)[:, 0]
    return nn.Dense(cfg.embed_dim, use_bias=False, dtype=self.dtype,
                    kernel_init=nn.initializers.normal(width ** -0.5),
                    name='text_projection')(x)


class CLIP(nn.Module):
  """Both towers and the learned log temperature.

  `encode_image(images [N, H, W, 3]) -> [N, E]`, `encode_text(tokens [M, L]) -> [M, E]`
  (both unnormalised), `__call__(images, tokens) -> (image_features, text_features,
  logit_scale)` with `logit_scale` the scalar parameter itself, in log space (initialised to
  log(1 / 0.07); CLIP's logits are `exp(logit_scale) * cosine`).
  """
  config: CLIPConfig
  dtype: Any = jnp.float32

  def setup(self):
    self.visual = VisionTower(self.config, self.dtype)
    self.text = TextTower(self.config, self.dtype)
    self.logit_scale = self.param('logit_scale', nn.initializers.constant(math.log(1 / 0.07)),
                                  ())

  def encode_image(self, images: jax.Array) -> jax.Array:
    return self.visual(images)

  def encode_text(self, tokens: jax.Array) -> jax.Array:
    return self.text(tokens)

  def __call__(self, images: jax.Array, tokens: jax.Array
               ) -> tuple[jax.Array, jax.Array, jax.Array]:
    return self.encode_image(images), self.encode_text(tokens), self.logit_scale


def example_inputs(config: CLIPConfig, batch: int = 1) -> tuple[jax.Array, jax.Array]:
  """Zero images `[batch, S, S, 3]` float32 and tokens `[batch, C]` int32, for `init` and
  `jax.eval_shape`."""
  return (jnp.zeros((batch, config.image_size, config.image_size, 3), jnp.float32),
          jnp.zeros((batch, config.context_length), jnp.int32))


def param_shapes(config: CLIPConfig) -> Any:
  """The `CLIP(config)` parameter tree as `jax.ShapeDtypeStruct`s (`jax.eval_shape`, nothing
  allocated)."""
  variables = jax.eval_shape(CLIP(config).init, jax.random.key(0), *example_inputs(config))
  return variables['params']
