"""Query files for `prvr-index search --queries FILE`.

* `.npz`: the model's query inputs as arrays (`query_feats [Q, L, Dq]` and `query_mask [Q, L]`,
  or `tokens [Q, C]`), optionally `ids [Q]` (strings). Read without pickles.
* `.h5` / `.hdf5`: token features in the official release's format, one dataset per query id
  (`[n_tokens, Dq]`, or `[Dq]` for one sentence feature), truncated to `max_query_len` tokens
  as the data pipeline does, zero-padded with a mask; read one query batch at a time.
* `.txt`: one query text per line, searched by text (`prvr_jax.index.text_search`: CLIP's BPE,
  and CLIP's text tower for models reading CLIP sentence features).
"""

import os
from typing import Any

import h5py
import numpy as np

from prvr_jax.files import short


class TokenFeatures:
  """The token features of an HDF5 query file, read when sliced: `rows(start, stop)` ->
  (`query_feats [n, L, Dq]`, `query_mask [n, L]`) of those queries only, truncated to
  `max_query_len` tokens and zero-padded. A release's query file holds every split's
  captions: TVR's 108,965 would be 10 GB as one padded array.

  Each query's shape is checked when the file is opened (from the file's metadata); its
  values (finite) when its rows are read.
  """

  def __init__(self, path: str, config_model: Any):
    self.path = path
    self.length, self.dim = config_model.max_query_len, config_model.query_dim
    self._cached: tuple[int, int, tuple[np.ndarray, np.ndarray]] | None = None
    with self._open() as h5:
      self.ids = list(h5.keys())
      if not self.ids:
        raise ValueError(f'--queries={path} holds no queries (no dataset).')
      for query_id in self.ids:
        item = h5[query_id]
        if not isinstance(item, h5py.Dataset):
          raise ValueError(f'--queries={path}: {short(query_id)} is not a dataset.')
        shape = item.shape if len(item.shape) != 1 else (1,) + item.shape
        if len(shape) != 2 or shape[1] != self.dim or not shape[0]:
          raise ValueError(f'--queries={path}: query {short(query_id)} has shape '
                           f'{item.shape}; the model reads [tokens, {self.dim}].')

  def _open(self) -> h5py.File:
    try:
      return h5py.File(self.path, 'r')
    except OSError as e:
      raise ValueError(f'--queries={self.path}: cannot open as HDF5 ({e}).') from None

  def __len__(self) -> int:
    return len(self.ids)

  def rows(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """(`query_feats`, `query_mask`) of queries `start` to `stop` (the last pair is kept: both
    keys of one batch read the file once)."""
    if self._cached is not None and self._cached[:2] == (start, stop):
      return self._cached[2]
    ids = self.ids[start:stop]
    feats = np.zeros((len(ids), self.length, self.dim), np.float32)
    mask = np.zeros((len(ids), self.length), np.float32)
    with self._open() as h5:
      for i, query_id in enumerate(ids):
        item = h5[query_id]  # only the tokens kept are read
        tokens = np.asarray(item[:self.length] if item.ndim == 2 else item[...][None],
                            np.float32)
        if not np.isfinite(tokens).all():
          raise ValueError(f'--queries={self.path}: query {short(query_id)} holds NaN or '
                           'infinite values.')
        feats[i, :len(tokens)] = tokens
        mask[i, :len(tokens)] = 1
    self._cached = (start, stop, (feats, mask))
    return feats, mask


class _Column:
  """One input (`query_feats` or `query_mask`) of a `TokenFeatures`, sliced as an array's
  leading axis (`column[a:b]`), which is how a search reads its query batches."""

  def __init__(self, source: TokenFeatures, part: int):
    self.source, self.part = source, part

  def __len__(self) -> int:
    return len(self.source)

  def __getitem__(self, rows: slice) -> np.ndarray:
    if not isinstance(rows, slice) or rows.step not in (None, 1):
      raise TypeError(f'Query rows are read in ranges (a:b), not {rows!r}.')
    start, stop, _ = rows.indices(len(self.source))
    return self.source.rows(start, stop)[self.part]


def _features(path: str, config_model: Any) -> tuple[dict[str, Any], list[str]]:
  """An HDF5 file of id -> token features -> (`query_feats`, `query_mask`), each read a range
  of queries at a time (`TokenFeatures`), ids in file order."""
  source = TokenFeatures(path, config_model)
  return {'query_feats': _Column(source, 0), 'query_mask': _Column(source, 1)}, source.ids


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
  for key in inputs:
    if arrays[key].ndim == 0:
      raise ValueError(f'--queries={path}: {key} is a scalar, not an array of queries.')
  count = len(arrays[inputs[0]])
  if not count:
    raise ValueError(f'--queries={path}: {inputs[0]} holds no queries.')
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
  if 'ids' in arrays and arrays['ids'].ndim != 1:
    raise ValueError(f'--queries={path}: ids has shape {arrays["ids"].shape}; expected [Q].')
  ids = [str(i) for i in arrays['ids']] if 'ids' in arrays else [str(i) for i in range(count)]
  if len(ids) != count:
    raise ValueError(f'--queries={path}: {len(ids)} ids for {count} queries.')
  seen = set()
  for query_id in ids:
    if query_id in seen:
      raise ValueError(f'--queries={path}: key ids lists query {short(query_id)} twice.')
    seen.add(query_id)
  _check_values(path, arrays, inputs, ids)
  return {k: arrays[k] for k in inputs}, ids


def _check_values(path: str, arrays: dict[str, np.ndarray], inputs: tuple[str, ...],
                  ids: list[str]) -> None:
  """Refuses a mask of the wrong shape or values, non-finite kept tokens and a query with no
  kept token (all padding), naming the file, the key and the first query at fault."""
  count = len(ids)

  def refuse(key: str, rows: np.ndarray, what: str) -> None:
    first = int(np.flatnonzero(rows)[0])
    raise ValueError(f'--queries={path}: key {key}, query {short(ids[first])} {what} '
                     f'({int(rows.sum())} such queries).')

  if 'query_feats' in inputs:
    feats = arrays['query_feats']
    if not np.issubdtype(feats.dtype, np.number):
      raise ValueError(f'--queries={path}: query_feats has dtype {feats.dtype}; expected '
                       'numbers.')
    kept = np.ones(feats.shape[:2], bool)
    if 'query_mask' in inputs:
      mask = arrays['query_mask']
      if mask.shape != feats.shape[:2]:
        raise ValueError(f'--queries={path}: query_mask has shape {mask.shape}; query_feats '
                         f'{feats.shape} needs [Q, L] = {list(feats.shape[:2])}.')
      if not np.issubdtype(mask.dtype, np.number) and mask.dtype != bool:
        raise ValueError(f'--queries={path}: query_mask has dtype {mask.dtype}; expected 0/1.')
      flat = mask.reshape(count, -1).astype(np.float64)
      bad = ~((flat == 0) | (flat == 1)).all(axis=1)
      if bad.any():
        refuse('query_mask', bad, 'has mask values other than 0 and 1')
      kept = mask.astype(bool)
      if not kept.any(axis=1).all():
        refuse('query_mask', ~kept.any(axis=1), 'is all padding (its mask is all 0)')
    if np.issubdtype(feats.dtype, np.inexact):
      bad = (kept[..., None] & ~np.isfinite(feats)).reshape(count, -1).any(axis=1)
      if bad.any():
        refuse('query_feats', bad, 'holds NaN or infinite values in its kept tokens')
  if 'tokens' in inputs:
    tokens = arrays['tokens']
    if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
      raise ValueError(f'--queries={path}: tokens has shape {tokens.shape} and dtype '
                       f'{tokens.dtype}; expected [Q, context length] integers.')
    empty = ~(tokens != 0).any(axis=1)
    if empty.any():
      refuse('tokens', empty, 'is all padding (every token is 0)')


def read_queries(path: str, query_inputs: tuple[str, ...], config_model: Any
                 ) -> tuple[dict[str, Any], list[str]]:
  """(the model's query inputs `[Q, ...]`, Q query ids) of a query file. Each input is an array,
  or for an HDF5 file a column read a range of queries at a time (`len(x)`, `x[a:b]`), which is
  what `Searcher.search` asks of it."""
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
    raise ValueError(f'--queries={path}: a file of query texts is searched by text '
                     '(prvr_jax.index.text_search.TextSearcher, as prvr-index search does).')
  raise ValueError(f'--queries={path}: expected an .npz, .h5/.hdf5 or .txt file.')
