"""The `config.model` fields the feature models share, declared once, and the config
defaults derived from a model's fields.

A model module lists `SharedFields` among its bases (AMDNet, and the two-branch models through
`TwoBranchModel`); a config file takes its model section from the module
(`config_fields(AMDNet)`) instead of repeating the names and defaults.
"""

import dataclasses
from typing import Any

import flax.linen as nn

# Fields every config variant sets itself (the official recipes differ per dataset), so a
# config's shared model section leaves them out.
PER_VARIANT = ('dropout', 'input_dropout')


class SharedFields(nn.Module):
  """The fields the feature models share (the official defaults; the config's `model` section
  sets them). A model may redeclare one to change its default (AMDNet's `max_query_len`).

  Attributes:
    hidden_dim: D, the width of the encodings.
    num_heads: attention heads.
    max_query_len: query tokens (padded), and the query branch's learned positions.
    max_frames: frames per video (padded), and the video branches' learned positions.
    num_clips: clip features per video.
    dropout: attention dropout.
    input_dropout: projection / positional-encoding dropout.
  """
  hidden_dim: int = 384
  num_heads: int = 4
  max_query_len: int = 30
  max_frames: int = 128
  num_clips: int = 32
  dropout: float = 0.2
  input_dropout: float = 0.2


def module_fields(module: type[nn.Module]) -> dict[str, Any]:
  """A Linen module class's fields -> their defaults (`dataclasses.MISSING` where none), Flax's
  own `parent` and `name` left out: the `config.model` fields the module reads."""
  return {f.name: f.default for f in dataclasses.fields(module)
          if f.name not in ('parent', 'name')}


def config_fields(module: type[nn.Module], exclude: tuple[str, ...] = PER_VARIANT
                  ) -> dict[str, Any]:
  """The `config.model` defaults a config file takes from `module`: its fields with their
  defaults, but `exclude` (the fields each variant sets)."""
  return {k: v for k, v in module_fields(module).items() if k not in exclude}
