"""CLIP (OpenAI ViT-B/32, ViT-B/16 and smaller) in Flax Linen: model, tokenizer, weights.

  from prvr_jax.clip import CLIP, Tokenizer
  from prvr_jax.clip import weights
  config, params = weights.load('open_clip_model.safetensors')  # OpenAI/open_clip or HF names
  tokens = Tokenizer()(['a dog catches a frisbee'])             # [1, 77] int32
  text = CLIP(config).apply({'params': params}, tokens, method='encode_text')  # [1, 512]

Parameters (`jax.eval_shape`, equal to open_clip's counts): ViT-B/32 151,277,313; ViT-B/16
149,620,737. See docs/clip.md.

This package imports `model` and `tokenizer` only, which depend on nothing else in prvr_jax.
`weights.load` reads torch files through `prvr_jax.torch_file`, which imports no model either.
"""

from prvr_jax.clip.model import CLIP
from prvr_jax.clip.model import CLIPConfig
from prvr_jax.clip.model import CONFIGS
from prvr_jax.clip.model import backbone_config
from prvr_jax.clip.model import TextTower
from prvr_jax.clip.model import VisionTower
from prvr_jax.clip.model import VIT_B_16
from prvr_jax.clip.model import VIT_B_32
from prvr_jax.clip.tokenizer import default_vocab_path
from prvr_jax.clip.tokenizer import Tokenizer

__all__ = ['CLIP', 'CLIPConfig', 'CONFIGS', 'backbone_config', 'TextTower', 'VIT_B_16', 'VIT_B_32', 'VisionTower',
           'Tokenizer', 'default_vocab_path']
