"""prvr_jax: JAX/Flax models for partially relevant video retrieval.

Subpackages: `prvr_jax.layers` (windows, attention blocks, GMMBlock), `prvr_jax.models`
(GMMFormer, GMMFormer v2), `prvr_jax.losses`, `prvr_jax.optim`, `prvr_jax.convert` (official
checkpoints), `prvr_jax.data` (release readers, shards, tf.data pipelines, synthetic benchmark).
"""

import importlib
from typing import Any, Callable

__version__ = '0.1.0'


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
  """A module `__getattr__` that imports `exports[name]` (a submodule of `package`) on first
  access of `name`: entry points whose data readers need TensorFlow stay out of the package's
  import, so that the models, losses, evaluator and train step work without it."""
  def getattr_(name: str) -> Any:
    if name not in exports:
      raise AttributeError(f'module {package!r} has no attribute {name!r}')
    return getattr(importlib.import_module(f'{package}.{exports[name]}'), name)
  return getattr_
