"""The model registry: `config.model.name` -> `ModelSpec`.

Adding a model is one folder `prvr_jax/models/<name>/` exporting a `SPEC`, plus one line in
`_BUILTIN` below (or `register(spec)` from user code); train, eval and the converter find it
here.
"""

from typing import Any

import flax.linen as nn

from prvr_jax.models import amdnet, clip_zero_shot, dreamprvr, gmmformer, gmmformer_v2
from prvr_jax.models import hlformer, holmes, ms_sl, msc_prvr, protoprvr, ral, tmass
from prvr_jax.models.spec import ModelSpec

_BUILTIN = (gmmformer.SPEC, gmmformer_v2.SPEC, ms_sl.SPEC, amdnet.SPEC, protoprvr.SPEC,
            tmass.SPEC, ral.SPEC, hlformer.SPEC, holmes.SPEC, dreamprvr.SPEC,
            msc_prvr.SPEC, clip_zero_shot.SPEC)
_REGISTRY: dict[str, ModelSpec] = {spec.name: spec for spec in _BUILTIN}


def register(spec: ModelSpec) -> None:
  """Adds a model; its `name` must be new."""
  if spec.name in _REGISTRY:
    raise ValueError(f'a model named {spec.name!r} is already registered')
  _REGISTRY[spec.name] = spec


def unregister(name: str) -> None:
  """Removes a model added with `register` (the built-in ones stay)."""
  if name in {spec.name for spec in _BUILTIN}:
    raise ValueError(f'{name!r} is a built-in model')
  _REGISTRY.pop(name, None)


def names() -> list[str]:
  """Registered model names, sorted."""
  return sorted(_REGISTRY)


def get_spec(name_or_config_model: str | Any) -> ModelSpec:
  """The spec of a model name or of a `config.model` (its `name` field)."""
  name = (name_or_config_model if isinstance(name_or_config_model, str)
          else name_or_config_model['name'])
  if name not in _REGISTRY:
    raise ValueError(f'Unknown model {name!r} (config.model.name); expected one of {names()}')
  return _REGISTRY[name]


def get_model(config_model: Any) -> nn.Module:
  """The Linen module of `config.model`."""
  return get_spec(config_model).build(config_model)
