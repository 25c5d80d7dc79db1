"""A retrieval index for every registered model: encode a gallery once, search it exactly.

  index = build_index(config, params, data.eval_split('test'), '/idx', dtype='int8')
  searcher = Searcher(open_index('/idx'))
  result = searcher.search({'query_feats': ..., 'query_mask': ...}, k=100)

Command line: `prvr-index {build,search,info}` (docs/index.md).
"""

from prvr_jax.index.build import build_from_checkpoint, build_index, evaluate_index
from prvr_jax.index.build import evaluation_gallery
from prvr_jax.index.search import SearchResult, Searcher
from prvr_jax.index.store import STORAGE_DTYPES, Index, IndexFormatError, IndexWriter
from prvr_jax.index.store import open_index

__all__ = ['Index', 'IndexFormatError', 'IndexWriter', 'STORAGE_DTYPES', 'SearchResult',
           'Searcher', 'build_from_checkpoint', 'build_index', 'evaluate_index', 'evaluation_gallery', 'open_index']
