"""Pieces shared by the GMMFormer-family models: config plumbing, the query branch, scores."""

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from prvr_jax.layers import AttentionPooling, GMMBlock, InputProjection, PositionalEncoding
from prvr_jax.layers.attention import BLOCKS
from prvr_jax.ops import l2_normalize

def module_kwargs(module_cls: type[nn.Module], config_model: Any) -> dict[str, Any]:
  """The fields of `module_cls` taken from `config.model` (missing ones keep their defaults)."""
  names = {f.name for f in dataclasses.fields(module_cls)} - {'parent', 'name'}
  values = {k: config_model[k] for k in names if k in config_model}
  if 'widths' in values:
    values['widths'] = tuple(values['widths'])
  return values


def max_similarity(queries: jax.Array, items: jax.Array, cosine: bool) -> jax.Array:
  """`max_t sim(q, items[b, t])`: queries `[Q, D]`, items `[B, L, D]` -> `[Q, B]`.

  Padded items are included as the official code does (they are zero vectors, similarity 0).
  """
  if cosine:
    queries, items = l2_normalize(queries), l2_normalize(items)
  return jnp.max(jnp.einsum('qd,bld->qbl', queries, items), axis=-1)


def similarity(queries: jax.Array, videos: jax.Array, cosine: bool) -> jax.Array:
  """queries `[Q, D]`, video vectors `[B, D]` -> `[Q, B]`."""
  if cosine:
    queries, videos = l2_normalize(queries), l2_normalize(videos)
  return queries @ videos.T


class QueryEncoder(nn.Module):
  """Token features -> input projection -> positional encoding -> one attention block ->
  attention pooling: `[Q, Lq, Dq], [Q, Lq] -> [Q, D]`."""
  hidden_dim: int
  num_heads: int
  max_query_len: int
  block: str
  dropout: float = 0.0
  input_dropout: float = 0.0

  @nn.compact
  def __call__(self, query_feats: jax.Array, query_mask: jax.Array,
               deterministic: bool = True) -> jax.Array:
    x = InputProjection(self.hidden_dim, self.input_dropout, name='input_proj')(
        query_feats, deterministic)
    x = PositionalEncoding(self.max_query_len, self.input_dropout, name='pos_embed')(
        x, deterministic)
    x = BLOCKS[self.block](self.num_heads, self.dropout, name='encoder')(
        x, key_mask=query_mask, deterministic=deterministic)
    return AttentionPooling(name='pooling')(x, query_mask)


class VideoBranch(nn.Module):
  """Visual features -> input projection -> positional encoding -> `num_blocks` GMMBlocks:
  `[B, L, Dv] -> [B, L, D]`."""
  hidden_dim: int
  num_heads: int
  max_len: int
  widths: tuple[float | None, ...]
  block: str
  num_blocks: int = 1
  window: str = 'gaussian'
  aggregation: str = 'average'
  temperature: float = 1.0
  dropout: float = 0.0
  input_dropout: float = 0.0

  @nn.compact
  def __call__(self, feats: jax.Array, mask: jax.Array | None = None,
               window_length: jax.Array | None = None, query_token: jax.Array | None = None,
               deterministic: bool = True) -> jax.Array:
    x = InputProjection(self.hidden_dim, self.input_dropout, name='input_proj')(
        feats, deterministic)
    x = PositionalEncoding(self.max_len, self.input_dropout, name='pos_embed')(x, deterministic)
    for i in range(self.num_blocks):
      x = GMMBlock(self.widths, self.num_heads, self.dropout, self.block, self.window,
                   self.aggregation, self.temperature, name=f'encoder_{i}')(
                       x, mask, window_length, query_token, deterministic)
    return x


class RetrievalModel(nn.Module):
  """What the GMMFormer-family models share: the query branch, the fused eval score and the
  in-batch similarity matrices for the losses. Subclasses define `encode_videos` and
  `frame_similarity`, and set `self.query` (a `QueryEncoder`) in `setup`."""

  def encode_queries(self, query_feats: jax.Array, query_mask: jax.Array,
                     deterministic: bool = True) -> jax.Array:
    """query_feats `[Q, Lq, Dq]`, query_mask `[Q, Lq]` -> `[Q, D]`."""
    return self.query(query_feats, query_mask, deterministic)

  def frame_similarity(self, queries: jax.Array, videos: dict[str, jax.Array],
                       cosine: bool) -> jax.Array:
    """Frame-level (v1: video-level) branch similarity `[Q, B]`."""
    raise NotImplementedError

  def score(self, queries: jax.Array, videos: dict[str, jax.Array]) -> jax.Array:
    """Eval score `[Q, B]` = clip_score_weight * max-clip cosine + frame_score_weight * frame
    branch cosine."""
    return (self.clip_score_weight * max_similarity(queries, videos['clips'], cosine=True)
            + self.frame_score_weight * self.frame_similarity(queries, videos, cosine=True))

  def __call__(self, batch: dict[str, jax.Array],
               deterministic: bool = True) -> dict[str, jax.Array]:
    """In-batch similarity matrices `[Q, B]` (cosines for the triplet losses, raw dots for
    InfoNCE) and the embeddings the losses need."""
    videos = self.encode_videos(batch['clip_feats'], batch['frame_feats'], batch['frame_mask'],
                                deterministic)
    queries = self.encode_queries(batch['query_feats'], batch['query_mask'], deterministic)
    # A second encoding with its own dropout mask feeds QDL and OM, as in the official code.
    queries_aux = self.encode_queries(batch['query_feats'], batch['query_mask'], deterministic)
    return {
        'clip_scores': max_similarity(queries, videos['clips'], cosine=True),
        'clip_logits': max_similarity(queries, videos['clips'], cosine=False),
        'frame_scores': self.frame_similarity(queries, videos, cosine=True),
        'frame_logits': self.frame_similarity(queries, videos, cosine=False),
        'queries': queries,
        'queries_aux': queries_aux,
        'clips': videos['clips'],
    }
