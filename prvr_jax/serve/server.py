"""The local web server of `prvr-serve`: a page, a JSON search API, thumbnails and videos.

Written against any searcher with `search(texts, k) -> list[list[Hit]]` and
`video_info(video_id) -> {'duration', 'source', 'thumbnail'}` (`prvr_jax.index.text_search`'s
`TextSearcher`, or a test's fake), so that it needs no model to be tested.

What is served, and nothing else (docs/serve.md):

* `GET /` and `GET /static/<name>`: the page, from this package's `static/` folder (only the
  files listed in `STATIC_FILES`).
* `GET /api/search?q=TEXT&k=N`: the top-k videos of one query as JSON; `GET /api/limits`: the
  bounds (`Limits`) the page reads.
* `GET /thumb/<video id>` and `GET /video/<video id>` (with HTTP Range): a file reached only
  through the searcher's `video_info` of that id, and only when its real path (symbolic links
  resolved) lies in an allowed folder (`ServedFolders`). No request names a path.

Every refusal is JSON `{"error": message, "parameter": name}` with a 4xx status, the message
naming the parameter at fault.
"""

from collections.abc import Iterable, Sequence
import dataclasses
import http
import http.server
import importlib.resources
import json
import math
import mimetypes
import os
import re
import socket
import socketserver
import threading
from typing import Any, Protocol
import urllib.parse

from prvr_jax import files

# The page's files (package data, setup.cfg) -> content type.
STATIC_FILES = {'index.html': 'text/html; charset=utf-8',
                'app.js': 'text/javascript; charset=utf-8',
                'style.css': 'text/css; charset=utf-8'}
# Thumbnails are images; anything else at a thumbnail path is not served.
_IMAGE_TYPES = {'.jpg': 'image/jpeg', '.jpeg': 'image/jpeg', '.png': 'image/png',
                '.webp': 'image/webp', '.gif': 'image/gif'}
_VIDEO_TYPES = {'.mp4': 'video/mp4', '.m4v': 'video/mp4', '.webm': 'video/webm',
                '.ogv': 'video/ogg', '.ogg': 'video/ogg', '.mov': 'video/quicktime',
                '.mkv': 'video/x-matroska', '.avi': 'video/x-msvideo'}
_CHUNK = 1 << 16
_SECURITY_HEADERS = (
    ('X-Content-Type-Options', 'nosniff'),
    ('Referrer-Policy', 'no-referrer'),
    ('Content-Security-Policy', "default-src 'self'; img-src 'self'; media-src 'self'; "
     "object-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"))
_LOOPBACK_NAMES = ('127.0.0.1', 'localhost', '::1', '[::1]')


class Searcher(Protocol):
  """What the server needs of a searcher (CONTEXT: `prvr_jax.index.text_search`)."""

  def search(self, texts: Sequence[str], k: int = 10) -> list[list[Any]]:
    """Per text, hits with `.video`, `.score`, `.rank`, `.span`, `.duration`."""

  def video_info(self, video_id: str) -> dict[str, Any]:
    """{'duration', 'source', 'thumbnail'}: absolute paths or None; raises on unknown ids."""


@dataclasses.dataclass(frozen=True)
class Limits:
  """The bounds of every request; larger asks are refused (400/413/414) naming the parameter."""
  max_query_chars: int = 500   # characters of `q`
  default_k: int = 10
  max_k: int = 100
  max_url_chars: int = 4096    # the request target, query string included
  max_id_chars: int = 512      # a video id in /thumb/ and /video/
  timeout_s: float = 60.0      # a client idle this long is dropped

  def __post_init__(self):
    if not 1 <= self.default_k <= self.max_k:
      raise ValueError(f'default_k={self.default_k}: must lie in 1..max_k={self.max_k}')
    for name in ('max_query_chars', 'max_url_chars', 'max_id_chars'):
      if getattr(self, name) < 1:
        raise ValueError(f'{name}={getattr(self, name)}: must be at least 1')


def _real_dir(path: str) -> str:
  return os.path.realpath(os.path.abspath(path))


@dataclasses.dataclass(frozen=True)
class ServedFolders:
  """The folders whose files may be served: the index folder, `--videos` folders, and a
  collection's `thumbnails/` folder (a folder of that name beside an `extract_manifest.json`,
  the layout `prvr-extract` writes) for thumbnails only. Paths are compared after
  `os.path.realpath`, so a symbolic link out of them is refused."""
  index_dir: str
  video_dirs: tuple[str, ...] = ()

  @classmethod
  def make(cls, index_dir: str, video_dirs: Iterable[str] = ()) -> 'ServedFolders':
    """Real paths of existing folders; raises ValueError naming a missing one."""
    for flag, folder in [('index', index_dir), *(('videos', d) for d in video_dirs)]:
      if not os.path.isdir(folder):
        raise ValueError(f'--{flag}={folder}: not a folder')
    return cls(_real_dir(index_dir), tuple(_real_dir(d) for d in video_dirs))

  def _roots(self) -> tuple[str, ...]:
    return (self.index_dir, *self.video_dirs)

  def video(self, path: str | None) -> str | None:
    """The real path of a servable video file at `path`, else None."""
    if not path:
      return None
    real = os.path.realpath(path)
    if not any(files.inside(real, root) for root in self._roots()) or not os.path.isfile(real):
      return None
    return real if os.path.splitext(real)[1].lower() in _VIDEO_TYPES else None

  def thumbnail(self, path: str | None) -> str | None:
    """The real path of a servable image at `path`, else None."""
    if not path:
      return None
    real = os.path.realpath(path)
    if os.path.splitext(real)[1].lower() not in _IMAGE_TYPES or not os.path.isfile(real):
      return None
    if any(files.inside(real, root) for root in self._roots()):
      return real
    folder = os.path.dirname(real)
    collection = os.path.dirname(folder)
    if (os.path.basename(folder) == 'thumbnails'
        and os.path.isfile(os.path.join(collection, 'extract_manifest.json'))):
      return real
    return None


class RequestError(Exception):
  """A refused request: HTTP status, message, the parameter at fault."""

  def __init__(self, status: int, message: str, parameter: str,
               headers: Sequence[tuple[str, str]] = ()):
    super().__init__(message)
    self.status = status
    self.parameter = parameter
    self.headers = tuple(headers)


def _finite(value: Any) -> float | None:
  if value is None:
    return None
  value = float(value)
  return round(value, 6) if math.isfinite(value) else None


def _span(span: Any) -> list[float] | None:
  if span is None:
    return None
  start, end = (_finite(s) for s in span)
  return None if start is None or end is None else [start, end]


class PrvrServer(http.server.ThreadingHTTPServer):
  """A `ThreadingHTTPServer` over one searcher; `url` is where it listens."""

  daemon_threads = True

  def __init__(self, searcher: Searcher, folders: ServedFolders, host: str = '127.0.0.1',
               port: int = 0, limits: Limits = Limits()):
    if ':' in host:
      self.address_family = socket.AF_INET6
    super().__init__((host, port), _Handler)
    self.searcher = searcher
    self.folders = folders
    self.limits = limits
    self._search_lock = threading.Lock()  # one search at a time: the model's device
    self.loopback_only = host in _LOOPBACK_NAMES

  def server_bind(self):
    """Binds without `HTTPServer`'s reverse DNS look-up of the host."""
    socketserver.TCPServer.server_bind(self)
    self.server_name, self.server_port = self.server_address[:2]

  @property
  def url(self) -> str:
    host, port = self.server_address[:2]
    host = f'[{host}]' if ':' in host else host
    return f'http://{host}:{port}/'

  def video_files(self, video_id: str) -> dict[str, Any]:
    """{'duration', 'thumbnail', 'video'} of one id: the real paths the server may serve (None:
    none), resolved at every request (a link changed since is seen); raises RequestError 404
    for an id the searcher does not know."""
    try:
      info = self.searcher.video_info(video_id)
    except (LookupError, ValueError) as e:
      raise RequestError(404, f'video id {video_id!r}: not in the index ({e})', 'video') from e
    return {'duration': _finite(info.get('duration')),
            'thumbnail': self.folders.thumbnail(info.get('thumbnail')),
            'video': self.folders.video(info.get('source'))}

  def search(self, query: str, k: int) -> dict[str, Any]:
    """The JSON answer of `GET /api/search`; `k` at most the index's size where the searcher
    has an `index` (`TextSearcher.index`), as a page asks for k without knowing it."""
    index = getattr(self.searcher, 'index', None)
    if index is not None:
      k = min(k, len(index))
    with self._search_lock:
      try:
        hits, = self.searcher.search([query], k)
      except ValueError as e:  # a text the searcher cannot encode
        raise RequestError(400, f'q={query[:80]!r}: refused by the searcher ({e})', 'q') from e
    results = []
    for hit in hits:
      try:
        media = self.video_files(hit.video)
      except RequestError:  # a hit without recorded files: listed, nothing to show
        media = {'duration': None, 'thumbnail': None, 'video': None}
      quoted = urllib.parse.quote(hit.video, safe='')
      duration = _finite(hit.duration) if hit.duration is not None else media['duration']
      results.append({'rank': int(hit.rank), 'video': hit.video, 'score': _finite(hit.score),
                      'span': _span(hit.span), 'duration': duration,
                      'thumbnail_url': f'/thumb/{quoted}' if media['thumbnail'] else None,
                      'video_url': f'/video/{quoted}' if media['video'] else None})
    return {'query': query, 'k': k, 'results': results}


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
  """The inclusive byte range [first, last] of a single-range `Range: bytes=...` header, None
  for no header or one this server ignores (several ranges, another unit, bad syntax: the whole
  file is sent, as RFC 9110 allows); raises RequestError 416 when it lies outside the file."""
  if not header:
    return None
  match = re.fullmatch(r'\s*bytes\s*=\s*(\d{0,18})\s*-\s*(\d{0,18})\s*', header)
  if not match or not any(match.groups()):
    return None
  first, last = match.groups()
  if not first:  # the last N bytes
    count = int(last)
    if count == 0 or size == 0:
      raise RequestError(416, f'Range {header!r}: outside the file of {size} bytes', 'Range',
                         (('Content-Range', f'bytes */{size}'),))
    return max(size - count, 0), size - 1
  first = int(first)
  if last and int(last) < first:
    return None  # last before first: not a valid range, ignored
  if first >= size:
    raise RequestError(416, f'Range {header!r}: outside the file of {size} bytes', 'Range',
                       (('Content-Range', f'bytes */{size}'),))
  last = size - 1 if not last else min(int(last), size - 1)
  return first, last


class _Handler(http.server.BaseHTTPRequestHandler):
  """One request: routes GET/HEAD, refuses every other method."""

  server: PrvrServer
  server_version = 'prvr-serve'
  sys_version = ''
  protocol_version = 'HTTP/1.1'
  _started = False  # whether the current answer's status line went out

  def setup(self):
    self.timeout = self.server.limits.timeout_s
    super().setup()

  def log_message(self, format, *args):  # pylint: disable=redefined-builtin
    del format, args  # quiet: the tests and the terminal need no access log

  # -- responses ---------------------------------------------------------------------------

  def _headers(self, status: int, content_type: str, length: int,
               extra: Sequence[tuple[str, str]] = ()) -> None:
    self._started = True
    self.send_response(status)
    self.send_header('Content-Type', content_type)
    self.send_header('Content-Length', str(length))
    for name, value in (*_SECURITY_HEADERS, *extra):
      self.send_header(name, value)
    self.end_headers()

  def _send_bytes(self, status: int, body: bytes, content_type: str,
                  extra: Sequence[tuple[str, str]] = ()) -> None:
    self._headers(status, content_type, len(body), extra)
    if self.command != 'HEAD':
      self.wfile.write(body)

  def _send_json(self, status: int, value: Any) -> None:
    body = json.dumps(value, ensure_ascii=False).encode('utf-8')
    self._send_bytes(status, body, 'application/json; charset=utf-8',
                     (('Cache-Control', 'no-store'),))

  def _refuse(self, error: RequestError) -> None:
    extra = error.headers
    if error.status == 405:
      extra += (('Allow', 'GET, HEAD'),)
    self.close_connection = True
    body = json.dumps({'error': str(error), 'parameter': error.parameter}).encode('utf-8')
    self._send_bytes(error.status, body, 'application/json; charset=utf-8',
                     (*extra, ('Connection', 'close')))

  def send_error(self, code, message=None, explain=None):
    """The base class's own refusals (a request line too long, bad syntax) as JSON."""
    del explain
    self.close_connection = True
    try:
      phrase = message or http.HTTPStatus(code).phrase
      self._refuse(RequestError(code, f'request: {phrase}', 'request'))
    except OSError:
      pass

  def _send_file(self, path: str, content_type: str) -> None:
    """A file with single-range support (a browser's <video> seeks with Range requests)."""
    with open(path, 'rb') as f:
      size = os.fstat(f.fileno()).st_size
      byte_range = parse_range(self.headers.get('Range'), size)
      extra = [('Accept-Ranges', 'bytes'), ('Cache-Control', 'private, max-age=300')]
      if byte_range is None:
        first, last, status = 0, size - 1, 200
      else:
        (first, last), status = byte_range, 206
        extra.append(('Content-Range', f'bytes {first}-{last}/{size}'))
      self._headers(status, content_type, last - first + 1, extra)
      if self.command == 'HEAD':
        return
      f.seek(first)
      left = last - first + 1
      while left > 0:
        chunk = f.read(min(_CHUNK, left))
        if not chunk:  # the file shrank: the length sent is wrong, the connection ends
          self.close_connection = True
          break
        self.wfile.write(chunk)
        left -= len(chunk)

  # -- routes ------------------------------------------------------------------------------

  def _check_request(self) -> None:
    limits = self.server.limits
    if len(self.path) > limits.max_url_chars:
      raise RequestError(414, f'url: {len(self.path)} characters, at most '
                         f'{limits.max_url_chars}', 'url')
    length = self.headers.get('Content-Length')
    if self.headers.get('Transfer-Encoding') or (length and length.strip() != '0'):
      raise RequestError(413, f'request body (Content-Length {length}): this server takes '
                         'none', 'Content-Length')
    if self.server.loopback_only:  # a page of another site reached through DNS rebinding
      hosts = self.headers.get_all('Host') or ['']
      host = hosts[0].strip()
      name = host.rsplit(':', 1)[0] if not host.endswith(']') else host
      if len(hosts) != 1 or name not in _LOOPBACK_NAMES:
        raise RequestError(400, f'Host {host!r}: this server answers one Host header, '
                           '127.0.0.1 / localhost only', 'Host')

  def _route(self) -> None:
    self._check_request()
    url = urllib.parse.urlsplit(self.path)
    path = url.path
    if path in ('/', '/index.html'):
      return self._static('index.html')
    if path.startswith('/static/'):
      return self._static(urllib.parse.unquote(path[len('/static/'):]))
    if path == '/api/search':
      return self._api_search(url.query)
    if path == '/api/limits':
      limits = self.server.limits
      return self._send_json(200, {'max_query_chars': limits.max_query_chars,
                                   'default_k': limits.default_k, 'max_k': limits.max_k})
    for prefix, kind in (('/thumb/', 'thumbnail'), ('/video/', 'video')):
      if path.startswith(prefix):
        return self._video_file(path[len(prefix):], kind)
    raise RequestError(404, f'path {path!r}: not served (/, /api/search, /thumb/<id>, '
                       '/video/<id>)', 'path')

  def _static(self, name: str) -> None:
    if name not in STATIC_FILES:
      raise RequestError(404, f'static file {name!r}: not one of the page\'s files', 'path')
    body = importlib.resources.files(__package__).joinpath('static', name).read_bytes()
    self._send_bytes(200, body, STATIC_FILES[name], (('Cache-Control', 'no-cache'),))

  def _api_search(self, query_string: str) -> None:
    limits = self.server.limits
    try:
      params = urllib.parse.parse_qs(query_string, keep_blank_values=True, strict_parsing=False,
                                     errors='strict', max_num_fields=4)
    except UnicodeDecodeError as e:
      raise RequestError(400, f'query string: not UTF-8 ({e})', 'q') from e
    except ValueError as e:
      raise RequestError(400, f'query string: too many parameters ({e}); takes q and k',
                         'query') from e
    unknown = sorted(set(params) - {'q', 'k'})
    if unknown:
      raise RequestError(400, f'parameter {unknown[0]!r}: unknown (takes q and k)', unknown[0])
    for name, values in params.items():
      if len(values) > 1:
        raise RequestError(400, f'parameter {name!r}: given {len(values)} times', name)
    query = params.get('q', [''])[0].strip()
    if not query:
      raise RequestError(400, 'q: empty; give the text to search for (?q=...)', 'q')
    if len(query) > limits.max_query_chars:
      raise RequestError(400, f'q: {len(query)} characters, at most {limits.max_query_chars}',
                         'q')
    k_text = params.get('k', [str(limits.default_k)])[0].strip()
    if not re.fullmatch(r'\d{1,9}', k_text) or not 1 <= int(k_text) <= limits.max_k:
      raise RequestError(400, f'k={k_text[:20]!r}: must be an integer in 1..{limits.max_k}', 'k')
    self._send_json(200, self.server.search(query, int(k_text)))

  def _video_file(self, quoted_id: str, kind: str) -> None:
    try:
      video_id = urllib.parse.unquote(quoted_id, errors='strict')
    except UnicodeDecodeError as e:
      raise RequestError(400, f'video id {quoted_id[:80]!r}: not UTF-8', 'video') from e
    if len(video_id) > self.server.limits.max_id_chars:
      raise RequestError(400, f'video id of {len(video_id)} characters: at most '
                         f'{self.server.limits.max_id_chars}', 'video')
    if not video_id or '/' in video_id or '\\' in video_id or '\0' in video_id:
      raise RequestError(404, f'video id {video_id[:80]!r}: no such video', 'video')
    path = self.server.video_files(video_id)[kind]
    if path is None:
      raise RequestError(404, f'video id {video_id!r}: no {kind} is served (none recorded, '
                         'or it lies outside the index, thumbnail and --videos folders)',
                         'video')
    types = _IMAGE_TYPES if kind == 'thumbnail' else _VIDEO_TYPES
    content_type = types.get(os.path.splitext(path)[1].lower()) or (
        mimetypes.guess_type(path)[0] or 'application/octet-stream')
    self._send_file(path, content_type)

  def _handle(self) -> None:
    self._started = False
    try:
      self._route()
    except (BrokenPipeError, ConnectionResetError):
      self.close_connection = True  # the browser dropped a video fetch: nothing to answer
    except Exception as e:  # pylint: disable=broad-except
      if self._started:  # mid-answer: a second status line would corrupt it
        self.close_connection = True
        return
      if not isinstance(e, RequestError):
        e = RequestError(500, f'{type(e).__name__}: {e}', 'server')
      self._refuse(e)

  def do_GET(self):  # pylint: disable=invalid-name
    self._handle()

  def do_HEAD(self):  # pylint: disable=invalid-name
    self._handle()

  def _not_allowed(self):
    self._refuse(RequestError(405, f'method {self.command}: only GET and HEAD', 'method'))

  do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed


def make_server(searcher: Searcher, index_dir: str, video_dirs: Iterable[str] = (),
                host: str = '127.0.0.1', port: int = 0, limits: Limits = Limits()
                ) -> PrvrServer:
  """A server bound to `host:port` (port 0: any free one; `server.url` says which) that
  serves `searcher`'s results, files only from `index_dir`, `video_dirs` and collections'
  thumbnail folders (`ServedFolders`). Run it with `serve_forever()` (or
  `start_in_thread`); stop it with `shutdown()` then `server_close()`."""
  return PrvrServer(searcher, ServedFolders.make(index_dir, video_dirs), host, port, limits)


def start_in_thread(server: PrvrServer) -> threading.Thread:
  """`server.serve_forever()` in a daemon thread (tests, notebooks)."""
  thread = threading.Thread(target=server.serve_forever, name='prvr-serve', daemon=True)
  thread.start()
  return thread
