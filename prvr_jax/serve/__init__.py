"""A local web page to look at text-search results: `prvr-serve --index DIR` (docs/serve.md).

  server = make_server(searcher, index_dir, video_dirs=['/data/my_videos'], port=0)
  start_in_thread(server)   # or server.serve_forever()
  print(server.url)

`searcher`: anything with `search(texts, k)` and `video_info(video_id)`, as
`prvr_jax.index.text_search.TextSearcher`. Standard library only.
"""

from prvr_jax.serve.server import Limits, PrvrServer, RequestError, Searcher, ServedFolders
from prvr_jax.serve.server import make_server, parse_range, start_in_thread

__all__ = ['Limits', 'PrvrServer', 'RequestError', 'Searcher', 'ServedFolders', 'make_server',
           'parse_range', 'start_in_thread']
