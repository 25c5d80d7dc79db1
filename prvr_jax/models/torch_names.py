"""Official PyTorch parameter names of the shared building blocks, for the models' name maps.

A model's name map (`ModelSpec.official.names`) is a list of `Leaf`s: one per leaf of our
params tree, with the torch tensor name(s) it comes from. Dense kernels are torch
`weight.T`, LayerNorm `scale`/`bias` are torch `weight`/`bias`, and the K parallel blocks
`attn0..attnK-1` of a GMM block are stacked on the leading axis of `branches`.
`prvr_jax.convert` applies a map in both directions.
"""

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np

from prvr_jax.layers.gmm_block import BRANCHES

Path = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Leaf:
  """One leaf of our params and its official tensor(s).

  `names` has one torch name, or K names stacked on our leading axis (`stacked`); `kind` is
  'copy', 'transpose' (Dense kernel = weight.T), 'reshape' (same elements, another shape) or
  'convert': `convert` takes the torch tensor of shape `torch_shape` to ours (a permutation
  of its elements, as `prvr_jax.clip.weights`' converters; the export inverts it).
  """
  path: Path
  names: tuple[str, ...]
  kind: str = 'copy'
  stacked: bool = False
  convert: Callable[[np.ndarray], np.ndarray] | None = None
  torch_shape: tuple[int, ...] | None = None


def dense(path: Path, name: str, bias: bool = True) -> list[Leaf]:
  """`nn.Linear` `name` as our `nn.Dense` at `path`."""
  leaves = [Leaf(path + ('kernel',), (name + '.weight',), 'transpose')]
  if bias:
    leaves.append(Leaf(path + ('bias',), (name + '.bias',)))
  return leaves


def norm(path: Path, name: str) -> list[Leaf]:
  """`nn.LayerNorm` `name` as our `nn.LayerNorm` at `path`."""
  return [Leaf(path + ('scale',), (name + '.weight',)), Leaf(path + ('bias',), (name + '.bias',))]


def input_projection(path: Path, name: str) -> list[Leaf]:
  """The official `LinearLayer` (LayerNorm, dropout, Linear, ReLU) as `InputProjection`."""
  return norm(path + ('norm',), name + '.LayerNorm') + dense(path + ('dense',), name + '.net.1')


def positional_encoding(path: Path, name: str) -> list[Leaf]:
  """The official `TrainablePositionalEncoding` as `PositionalEncoding`."""
  return ([Leaf(path + ('embedding',), (name + '.position_embeddings.weight',))]
          + norm(path + ('norm',), name + '.LayerNorm'))


def attention_block(path: Path, name: str, version: str) -> list[Leaf]:
  """An official `BertAttention` (v1: `AttentionBlockV1`) or v2 `BertAttention` /
  `BertCrossAttention` (`AttentionBlockV2`)."""
  leaves = []
  for proj in ('query', 'key', 'value'):
    leaves += dense(path + ('attention', proj), f'{name}.self.{proj}')
  if version == 'v1':
    return (leaves + dense(path + ('output',), name + '.output.dense')
            + norm(path + ('norm',), name + '.output.LayerNorm'))
  return (leaves + norm(path + ('norm1',), name + '.norm1')
          + dense(path + ('ffn_in',), name + '.output.layer1')
          + dense(path + ('ffn_out',), name + '.output.layer2')
          + norm(path + ('norm2',), name + '.norm2'))


def gmm_block(path: Path, name: str, version: str, num_branches: int,
              branch: str = 'attn{k}') -> list[Leaf]:
  """v1 `GMMBlock` (branches only) or v2 `DyGMMBlock` (branches + temporal consolidation);
  `branch` names the k-th branch (Holmes's `DyGMMBlock`: 'e_attns.{k}')."""
  leaves = [Leaf(leaf.path, tuple(leaf.names[0].replace('{k}', str(k))
                                  for k in range(num_branches)), leaf.kind, stacked=True)
            for leaf in attention_block(path + (BRANCHES,), f'{name}.{branch}', version)]
  if version == 'v2':
    leaves += (attention_block(path + ('cross',), name + '.ca', 'v2')
               + dense(path + ('mix_hidden',), name + '.layer1')
               + dense(path + ('mix_out',), name + '.layer2'))
  return leaves


def query_encoder(version: str) -> list[Leaf]:
  """The MS-SL lineage's query branch (`QueryEncoder` at `query/`) and its pooling vector."""
  return (input_projection(('query', 'input_proj'), 'query_input_proj')
          + positional_encoding(('query', 'pos_embed'), 'query_pos_embed')
          + attention_block(('query', 'encoder'), 'query_encoder', version)
          + dense(('query', 'pooling', 'score'), 'modular_vector_mapping', bias=False))


def branch_inputs(branch: str) -> list[Leaf]:
  """Input projection and positional encoding of a `VideoBranch` at `clip/` or `frame/`."""
  return (input_projection((branch, 'input_proj'), f'{branch}_input_proj')
          + positional_encoding((branch, 'pos_embed'), f'{branch}_pos_embed'))


def num_branches(params: Any) -> int:
  """K, the leading axis of the stacked GMM-block branches in a params tree (0 if none)."""
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    if any(getattr(k, 'key', None) == BRANCHES for k in path):
      return int(leaf.shape[0])
  return 0


def infer_dims(state_dict: Mapping[str, np.ndarray], model_name: str,
               fields: Mapping[str, tuple[str, int]]) -> dict[str, int]:
  """`config.model` fields read from tensor shapes: field -> (torch name, axis)."""
  out = {}
  for field, (name, axis) in fields.items():
    if name not in state_dict:
      raise ValueError(f'cannot infer the {model_name} config: the state_dict has no {name!r}')
    out[field] = int(np.shape(state_dict[name])[axis])
  return out


def count_gmm_branches(state_dict: Mapping[str, np.ndarray], block_name: str,
                       branch: str = 'attn') -> int:
  """How many `<branch><k>` branches (`attn<k>`; Holmes `e_attns.<k>`) the official GMM block
  `block_name` has."""
  pattern = re.compile(rf'{re.escape(block_name)}\.{re.escape(branch)}(\d+)\.')
  return len({m.group(1) for k in state_dict if (m := pattern.match(k))})


# Dims every MS-SL-lineage checkpoint determines (num_heads cannot be read from shapes).
LINEAGE_DIMS = {
    'visual_dim': ('clip_input_proj.LayerNorm.weight', 0),
    'query_dim': ('query_input_proj.LayerNorm.weight', 0),
    'hidden_dim': ('query_input_proj.net.1.weight', 0),
    'max_query_len': ('query_pos_embed.position_embeddings.weight', 0),
    'max_frames': ('frame_pos_embed.position_embeddings.weight', 0),
}
