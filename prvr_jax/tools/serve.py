r"""A local web page to search an index by text (`prvr-serve`, or `python -m
prvr_jax.tools.serve`); docs/serve.md.

  # The page at http://127.0.0.1:8000/ over a text-searchable index; the videos under
  # /data/my_videos play from the matched span:
  prvr-serve --index=/idx/my_videos --videos=/data/my_videos
  # Any free port (the URL is printed), CLIP's text tower from a local weights file:
  prvr-serve --index=/idx/my_videos --port=0 --clip_weights=/data/clip/ViT-B-32.pt

Only the index folder, the collection's thumbnails and the --videos folders are ever served
(a video's source elsewhere shows its thumbnail, no player). Binds 127.0.0.1 unless --host
says otherwise. Ctrl-C stops it.
"""

import os

from absl import app
from absl import flags

from prvr_jax import runtime

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The server's flags and `runtime.define_flags`'s."""
  flags.DEFINE_string('index', None, 'The index folder (built by `prvr-index build`).')
  flags.DEFINE_multi_string(
      'videos', [], 'A folder whose video files may be served (repeat for several); a video '
      'whose source lies elsewhere gets no player.')
  flags.DEFINE_string('host', '127.0.0.1', 'The address to bind (127.0.0.1: this machine '
                      'only).')
  flags.DEFINE_integer('port', 8000, 'The port (0: any free one; the URL is printed).')
  flags.DEFINE_string('clip_weights', None, 'CLIP\'s weights for models reading CLIP sentence '
                      'features (default: the index\'s config.model.clip_weights).')
  flags.DEFINE_string('clip_vocab', None, 'CLIP\'s BPE vocabulary (default: the index data\'s, '
                      'else PRVR_CLIP_VOCAB or open_clip\'s).')
  flags.DEFINE_bool('verify', False, 'Check every index file\'s full sha256 at start.')
  flags.DEFINE_integer('max_k', 100, 'The largest k a search may ask for.')
  flags.DEFINE_integer('default_k', 10, 'The k of a search that names none.')
  flags.DEFINE_integer('max_query_chars', 500, 'The longest query text, in characters.')
  runtime.define_flags()


def _main(argv: list[str]) -> None:
  del argv
  from prvr_jax import serve  # pylint: disable=g-import-not-at-top
  if FLAGS.index is None:
    raise app.UsageError('--index required.')
  if not 0 <= FLAGS.port <= 65535:
    raise app.UsageError(f'--port={FLAGS.port}: must lie in 0..65535.')
  try:
    limits = serve.Limits(max_query_chars=FLAGS.max_query_chars, default_k=FLAGS.default_k,
                          max_k=FLAGS.max_k)
    folders = serve.ServedFolders.make(FLAGS.index, FLAGS.videos)
  except ValueError as e:
    raise app.UsageError(str(e)) from e
  runtime.start()
  # The searcher (and with it JAX and the model) only here: the library takes any searcher.
  from prvr_jax.index import text_search  # pylint: disable=g-import-not-at-top
  vocab = {'vocab': FLAGS.clip_vocab} if FLAGS.clip_vocab else {}
  try:
    searcher = text_search.TextSearcher(FLAGS.index, clip_weights=FLAGS.clip_weights,
                                        verify=FLAGS.verify, **vocab)
  except ValueError as e:  # a model text search cannot serve, a damaged index: named in e
    raise app.UsageError(str(e)) from e
  try:
    server = serve.PrvrServer(searcher, folders, FLAGS.host, FLAGS.port, limits)
  except OSError as e:
    raise app.UsageError(f'--host={FLAGS.host} --port={FLAGS.port}: cannot bind ({e}).') from e
  print(f'prvr-serve: {os.path.abspath(FLAGS.index)} at {server.url} (Ctrl-C stops)',
        flush=True)
  try:
    server.serve_forever()
  except KeyboardInterrupt:
    pass
  finally:
    server.server_close()


def main() -> None:
  """The `prvr-serve` command."""
  define_flags()
  runtime.run(_main, huge_pages=False)


if __name__ == '__main__':
  main()
