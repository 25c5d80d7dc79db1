"""Models: one folder per model (module, objective, official names) and the registry.

  spec = prvr_jax.models.get_spec(config.model)   # ModelSpec
  module = spec.build(config.model)               # Linen module: encode_videos, encode_queries,
                                                  # score, __call__ (training forward)
  loss, metrics = spec.objective(module, params, batch, rngs, ctx)

See `prvr_jax.models.spec` for the contract and docs/design.md for adding a model.
"""

from prvr_jax.models.amdnet import AMDNet
from prvr_jax.models.batch import example_batch, random_batch
from prvr_jax.models.gmmformer import GMMFormer
from prvr_jax.models.gmmformer_v2 import GMMFormerV2
from prvr_jax.models.ms_sl import MSSL
from prvr_jax.models.protoprvr import ProtoPRVR
from prvr_jax.models.registry import get_model, get_spec, names, register, unregister
from prvr_jax.models.spec import LossContext, ModelSpec, OfficialCheckpoint, count_params
from prvr_jax.models.tmass import TMASS

__all__ = ['AMDNet', 'GMMFormer', 'GMMFormerV2', 'LossContext', 'MSSL', 'ModelSpec',
           'OfficialCheckpoint', 'ProtoPRVR', 'TMASS',
           'count_params', 'example_batch', 'get_model', 'get_spec', 'names', 'random_batch',
           'register', 'unregister']
