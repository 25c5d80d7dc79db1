"""prvr_jax: JAX/Flax models for partially relevant video retrieval.

Subpackages: `prvr_jax.layers` (windows, attention blocks, GMMBlock), `prvr_jax.models`
(GMMFormer, GMMFormer v2), `prvr_jax.losses`, `prvr_jax.optim`, `prvr_jax.convert` (official
checkpoints' names; `prvr_jax.torch_file` reads the files), `prvr_jax.data` (release readers, shards, tf.data pipelines, synthetic benchmark).
"""

__version__ = '0.1.0'
