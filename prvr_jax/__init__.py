"""prvr_jax: JAX/Flax models for partially relevant video retrieval.

Subpackages: `prvr_jax.layers` (plain Flax building blocks: windows, attention blocks,
GMMBlock), `prvr_jax.kernels` (the CPU-tuned kernels that stand in for some of them, by policy),
`prvr_jax.models` (one folder per model, the registry of `ModelSpec`s), `prvr_jax.losses`,
`prvr_jax.optim`, `prvr_jax.data` (one module per source, the release writer, the validator,
shards, `RunData`), `prvr_jax.train`, `prvr_jax.eval`, `prvr_jax.index`, `prvr_jax.clip`,
`prvr_jax.convert` (official checkpoints' names; `prvr_jax.torch_file` reads the files),
`prvr_jax.runtime` (start-up) and `prvr_jax.tools` (the `prvr-*` command-line programs).
"""

__version__ = '0.1.0'
