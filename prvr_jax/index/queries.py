"""Query files for `prvr-index search --queries FILE`.

* `.npz`: the model's query inputs as arrays (`query_feats [Q, L, Dq]` and `query_mask [Q, L]`,
  or `tokens [Q, C]`), optionally `ids [Q]` (strings). Read without pickles.
* `.h5` / `.hdf5`: token features in the official release's format, one dataset per query id
  (`[n_tokens, Dq]`, or `[Dq]` for one sentence feature), truncated to `max_query_len` tokens
  as the data pipeline does, zero-padded with a mask.
* `.txt`: one query text per line (models reading CLIP `tokens`), tokenized with CLIP's BPE.
"""

import os
from typing import Any

import h5py
import numpy as np

from prvr_jax.data import preprocess
from prvr_jax.files import short


def _features(path: str, config_model: Any) -> tuple[dict[str, np.ndarray], list[str]]:
  """An HDF5 file of id -> token features -> (`query_feats`, `query_mask`), ids in file
  order."""
  length, dim = config_model.max_query_len, config_model.query_dim
  try:
    h5 = h5py.File(path, 'r')
  except OSError as e:
    raise ValueError(f'--queries={path}: cannot open as HDF5 ({e}).') from None
  with h5:
    ids = list(h5.keys())
    feats = np.zeros((len(ids), length, dim), np.float32)
    mask = np.zeros((len(ids), length), np.float32)
    for i, query_id in enumerate(ids):
      item = h5[query_id]
      if not isinstance(item, h5py.Dataset):
        raise ValueError(f'--queries={path}: {short(query_id)} is not a dataset.')
      tokens = np.asarray(item[...], np.float32)
      tokens = tokens[None] if tokens.ndim == 1 else tokens
      if tokens.ndim != 2 or tokens.shape[1] != dim or not tokens.shape[0]:
        raise ValueError(f'--queries={path}: query {short(query_id)} has shape {tokens.shape}; '
                         f'the model reads [tokens, {dim}].')
      if not np.isfinite(tokens).all():
        raise ValueError(f'--queries={path}: query {short(query_id)} holds NaN or infinite '
                         'values.')
      tokens = preprocess.truncate_tokens(tokens, length)
      feats[i, :len(tokens)] = tokens
      mask[i, :len(tokens)] = 1
  return {'query_feats': feats, 'query_mask': mask}, ids


def _arrays(path: str, inputs: tuple[str, ...], config_model: Any
            ) -> tuple[dict[str, np.ndarray], list[str]]:
  try:
    with np.load(path, allow_pickle=False) as data:
      arrays = {k: data[k] for k in data.files}
  except ValueError as e:
    raise ValueError(f'--queries={path}: not a readable .npz without pickles ({e}).') from None
  missing = [k for k in inputs if k not in arrays]
  if missing:
    raise ValueError(f'--queries={path} lacks {missing}; model {config_model.name} reads '
                     f'{list(inputs)} (and optional ids).')
  count = len(arrays[inputs[0]])
  for key in inputs:
    if len(arrays[key]) != count:
      raise ValueError(f'--queries={path}: {key} holds {len(arrays[key])} queries, '
                       f'{inputs[0]} {count}.')
  if 'query_feats' in inputs:
    want = (config_model.max_query_len, config_model.query_dim)
    if arrays['query_feats'].shape[1:] != want:
      raise ValueError(f'--queries={path}: query_feats has shape '
                       f'{arrays["query_feats"].shape}; the model reads [Q, {want[0]}, '
                       f'{want[1]}].')
  ids = [str(i) for i in arrays['ids']] if 'ids' in arrays else [str(i) for i in range(count)]
  if len(ids) != count:
    raise ValueError(f'--queries={path}: {len(ids)} ids for {count} queries.')
  return {k: arrays[k] for k in inputs}, ids


def _texts(path: str, config_model: Any) -> tuple[dict[str, np.ndarray], list[str]]:
  from prvr_jax.clip import tokenizer  # pylint: disable=g-import-not-at-top
  with open(path, encoding='utf-8') as f:
    lines = [line.rstrip('\n') for line in f]
  texts = [(i, line) for i, line in enumerate(lines, 1) if line.strip()]
  if not texts:
    raise ValueError(f'--queries={path} holds no query text.')
  tokens = tokenizer.Tokenizer()([t for _, t in texts], config_model.context_length,
                                 truncate=True)
  return {'tokens': tokens}, [f'line {i}' for i, _ in texts]


def read_queries(path: str, query_inputs: tuple[str, ...], config_model: Any
                 ) -> tuple[dict[str, np.ndarray], list[str]]:
  """(the model's query inputs `[Q, ...]`, Q query ids) of a query file."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f'--queries={path} does not exist.')
  suffix = os.path.splitext(path)[1].lower()
  if suffix == '.npz':
    return _arrays(path, query_inputs, config_model)
  if suffix in ('.h5', '.hdf5'):
    if set(query_inputs) != {'query_feats', 'query_mask'}:
      raise ValueError(f'--queries={path}: model {config_model.name} reads {query_inputs}, '
                       'not token features; give a .txt file of query texts.')
    return _features(path, config_model)
  if suffix == '.txt':
    if query_inputs != ('tokens',):
      raise ValueError(f'--queries={path}: model {config_model.name} reads features '
                       f'{query_inputs}, not text; give an .npz or .h5 file of features.')
    return _texts(path, config_model)
  raise ValueError(f'--queries={path}: expected an .npz, .h5/.hdf5 or .txt file.')
