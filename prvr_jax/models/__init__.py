"""Model registry: `get_model(config.model)`, example inputs and the training objective."""

from typing import Any

import flax.linen as nn
import jax
import numpy as np

from prvr_jax.models.common import module_kwargs
from prvr_jax.models.gmmformer import GMMFormer
from prvr_jax.models.gmmformer_v2 import GMMFormerV2
from prvr_jax.models import objective

MODELS: dict[str, type[nn.Module]] = {'gmmformer': GMMFormer, 'gmmformer_v2': GMMFormerV2}


def get_model(config_model: Any) -> nn.Module:
  """Builds the Linen module named by `config.model.name` from the `config.model` fields."""
  name = config_model['name']
  if name not in MODELS:
    raise ValueError(f'Unknown model {name!r} (config.model.name); expected one of '
                     f'{sorted(MODELS)}')
  return MODELS[name](**module_kwargs(MODELS[name], config_model))


def compute_loss(config: Any, outputs: dict[str, jax.Array], batch: dict[str, jax.Array],
                 rng: jax.Array, use_hard_negative: bool | jax.Array
                 ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Total training loss and its weighted terms for the model named by `config.model.name`."""
  qdl_version = MODELS[config.model.name].qdl_version
  return objective.compute_loss(config, outputs, batch, rng, use_hard_negative, qdl_version)


def example_batch(config_model: Any, num_videos: int = 2,
                  queries_per_video: int = 1) -> dict[str, np.ndarray]:
  """A training batch of zeros with the static shapes of `config.model` (for init / eval_shape)."""
  num_queries = num_videos * queries_per_video
  f32 = np.float32
  return {
      'clip_feats': np.zeros((num_videos, config_model.num_clips, config_model.visual_dim), f32),
      'frame_feats': np.zeros((num_videos, config_model.max_frames, config_model.visual_dim), f32),
      'frame_mask': np.ones((num_videos, config_model.max_frames), f32),
      'video_valid': np.ones((num_videos,), bool),
      'query_feats': np.zeros((num_queries, config_model.max_query_len, config_model.query_dim),
                              f32),
      'query_mask': np.ones((num_queries, config_model.max_query_len), f32),
      'query_valid': np.ones((num_queries,), bool),
      'query_video': np.repeat(np.arange(num_videos, dtype=np.int32), queries_per_video),
  }


def init_params(model: nn.Module, config_model: Any, rng: jax.Array) -> Any:
  """Parameters of `model` for `config.model`'s input dims."""
  return model.init({'params': rng}, example_batch(config_model))['params']


def param_shapes(config_model: Any) -> Any:
  """`jax.ShapeDtypeStruct` tree of the parameters, without computing anything."""
  model = get_model(config_model)
  return jax.eval_shape(lambda rng: init_params(model, config_model, rng), jax.random.key(0))


def count_params(params: Any) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))


__all__ = ['MODELS', 'GMMFormer', 'GMMFormerV2', 'compute_loss', 'count_params',
           'example_batch', 'get_model', 'init_params', 'param_shapes']
