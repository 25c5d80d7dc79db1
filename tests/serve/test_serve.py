"""prvr-serve (`prvr_jax.serve`): the JSON API, the bounds, Range requests, what is never
served, and the page driven in headless Chromium; over a fake searcher of fixed hits (and the
real `TextSearcher` where `prvr_jax.index.text_search` imports)."""

import dataclasses
import html.parser
import http.client
import importlib.util
import io
import json
import os
import pathlib
import shutil
import subprocess
import sys
import urllib.parse

import pytest

import support
from prvr_jax import serve

VIDEO_BYTES = bytes(range(256)) * 40  # 10240 bytes, every offset's value known


@dataclasses.dataclass
class FakeHit:
  """The fields of `text_search.Hit`."""
  video: str
  score: float
  rank: int
  span: tuple[float, float] | None
  duration: float | None


class FakeSearcher:
  """Fixed hits (per query text, or the default list); `video_info` from a table; records the
  queries it got."""

  def __init__(self, hits: list[FakeHit], info: dict[str, dict],
               hits_of: dict[str, list[FakeHit]] | None = None):
    self.hits, self.info, self.hits_of, self.queries = hits, info, hits_of or {}, []

  def search(self, texts, k=10):
    self.queries.append((list(texts), k))
    if 'unencodable' in texts:
      raise ValueError('text unencodable: no token')
    return [[dataclasses.replace(h) for h in self.hits_of.get(t, self.hits)[:k]] for t in texts]

  def video_info(self, video_id):
    return dict(self.info[video_id])  # KeyError for an unknown id, as a real index


def _can_write_h264() -> bool:
  if importlib.util.find_spec('av') is None:
    return False
  import av  # pylint: disable=g-import-not-at-top
  return 'libx264' in av.codecs_available


def _write_video(path: pathlib.Path, seconds: int, fps: int = 10) -> None:
  """A small H.264 MP4 (PyAV), a key frame every half second, so that a player can seek."""
  import av  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  with av.open(str(path), 'w') as out:
    stream = out.add_stream('libx264', rate=fps)
    stream.width, stream.height, stream.pix_fmt = 64, 48, 'yuv420p'
    stream.options = {'g': str(fps // 2)}
    for i in range(seconds * fps):
      frame = np.full((48, 64, 3), (3 * i) % 256, np.uint8)
      out.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format='rgb24')))
    out.mux(stream.encode())


def _jpeg(path: pathlib.Path, colour: tuple[int, int, int]) -> None:
  from PIL import Image  # pylint: disable=g-import-not-at-top
  path.parent.mkdir(parents=True, exist_ok=True)
  Image.new('RGB', (64, 36), colour).save(path, 'JPEG')


@pytest.fixture(scope='module')
def site(tmp_path_factory):
  """Folders (index, a collection with thumbnails, allowed videos, an outside folder), the
  fake searcher over them, and a running server; yields (server, searcher, folders)."""
  root = tmp_path_factory.mktemp('serve')
  index = root / 'index'
  index.mkdir()
  (index / 'manifest.json').write_text('{}')
  collection = root / 'collection'
  (collection / 'extract_manifest.json').parent.mkdir()
  (collection / 'extract_manifest.json').write_text('{}')
  videos = root / 'videos'
  outside = root / 'outside'
  for folder in (videos, outside, root / 'frames' / 'v_frames'):
    folder.mkdir(parents=True)
  (videos / 'v_red.mp4').write_bytes(VIDEO_BYTES)
  (outside / 'secret.mp4').write_bytes(b'secret video')
  (outside / 'secret.jpg').write_bytes(b'secret image')
  for name, colour in (('v_red', (200, 30, 30)), ('v_frames', (30, 160, 30)),
                       ('v_outside', (30, 30, 200))):
    _jpeg(collection / 'thumbnails' / f'{name}.jpg', colour)
  # Links from inside the allowed folders out of them.
  os.symlink(outside / 'secret.mp4', videos / 'v_link.mp4')
  os.symlink(outside / 'secret.jpg', collection / 'thumbnails' / 'v_link.jpg')
  os.symlink(outside, videos / 'linked_dir')
  # A thumbnails/ folder not beside an extract manifest is no collection's.
  _jpeg(outside / 'thumbnails' / 'stray.jpg', (0, 0, 0))
  thumbs = collection / 'thumbnails'
  info = {
      'v_red': {'duration': 10.0, 'source': str(videos / 'v_red.mp4'),
                'thumbnail': str(thumbs / 'v_red.jpg')},
      'v_frames': {'duration': 6.0, 'source': str(root / 'frames' / 'v_frames'),
                   'thumbnail': str(thumbs / 'v_frames.jpg')},
      'v_outside': {'duration': 8.0, 'source': str(outside / 'secret.mp4'),
                    'thumbnail': str(thumbs / 'v_outside.jpg')},
      'v_link': {'duration': 4.0, 'source': str(videos / 'v_link.mp4'),
                 'thumbnail': str(thumbs / 'v_link.jpg')},
      'v_linked_dir': {'duration': 4.0, 'source': str(videos / 'linked_dir' / 'secret.mp4'),
                       'thumbnail': str(outside / 'thumbnails' / 'stray.jpg')},
      'v_dotdot': {'duration': 4.0, 'source': str(videos / '..' / 'outside' / 'secret.mp4'),
                   'thumbnail': str(thumbs / '..' / '..' / 'outside' / 'secret.jpg')},
      '../../etc/passwd': {'duration': 1.0, 'source': '/etc/passwd', 'thumbnail': '/etc/passwd'},
  }
  hits = [FakeHit('v_red', 0.91, 1, (2.0, 4.0), 10.0),
          FakeHit('v_frames', 0.52, 2, (0.0, 1.5), None),
          FakeHit('v_outside', 0.25, 3, None, None),
          FakeHit('v_link', 0.125, 4, (1.0, 2.0), 4.0)]
  hits_of = {'gone': [FakeHit('v_gone', 0.5, 1, (1.0, 2.0), None)]}  # no video_info
  if _can_write_h264():  # a video the browser plays
    _write_video(videos / 'v_play.mp4', seconds=8)
    info['v_play'] = {'duration': 8.0, 'source': str(videos / 'v_play.mp4'), 'thumbnail': None}
    hits_of['play'] = [FakeHit('v_play', 0.5, 1, (3.0, 5.0), 8.0)]
  searcher = FakeSearcher(hits, info, hits_of)
  server = serve.make_server(searcher, str(index), [str(videos)], port=0,
                             limits=serve.Limits(max_query_chars=50, max_k=20))
  serve.start_in_thread(server)
  yield server, searcher, {'root': root, 'videos': videos, 'thumbs': thumbs}
  server.shutdown()
  server.server_close()


def _request(server, method: str, target: str, headers=None, body=None):
  """(status, headers, body bytes) of one raw request (the target sent as written)."""
  host, port = server.server_address[:2]
  connection = http.client.HTTPConnection(host, port, timeout=20)
  try:
    connection.putrequest(method, target, skip_host='Host' in (headers or {}),
                          skip_accept_encoding=True)
    for name, value in (headers or {}).items():
      connection.putheader(name, value)
    if body is not None:
      connection.putheader('Content-Length', str(len(body)))
    connection.endheaders(body)
    response = connection.getresponse()
    return response.status, dict(response.getheaders()), response.read()
  finally:
    connection.close()


def _json(server, target: str, **kwargs):
  status, headers, body = _request(server, 'GET', target, **kwargs)
  assert headers['Content-Type'].startswith('application/json'), (target, headers)
  return status, json.loads(body)


def test_search_returns_the_searchers_hits(site):
  server, searcher, _ = site
  status, answer = _json(server, '/api/search?q=' + urllib.parse.quote('  red car ') + '&k=3')
  assert status == 200, answer
  assert searcher.queries[-1] == (['red car'], 3)
  assert answer['query'] == 'red car' and answer['k'] == 3
  assert answer['results'] == [
      {'rank': 1, 'video': 'v_red', 'score': 0.91, 'span': [2.0, 4.0], 'duration': 10.0,
       'thumbnail_url': '/thumb/v_red', 'video_url': '/video/v_red'},
      # A frame folder: a thumbnail, no player; the duration from video_info.
      {'rank': 2, 'video': 'v_frames', 'score': 0.52, 'span': [0.0, 1.5], 'duration': 6.0,
       'thumbnail_url': '/thumb/v_frames', 'video_url': None},
      # Its source lies outside the allowed folders: no player.
      {'rank': 3, 'video': 'v_outside', 'score': 0.25, 'span': None, 'duration': 8.0,
       'thumbnail_url': '/thumb/v_outside', 'video_url': None}]
  _, default = _json(server, '/api/search?q=x')
  assert default['k'] == 10 and len(default['results']) == 4
  # The link out of the allowed folders: neither its video nor its thumbnail.
  assert default['results'][3]['video_url'] is None
  assert default['results'][3]['thumbnail_url'] is None
  # A hit the searcher has no files for: listed, nothing to show.
  assert _json(server, '/api/search?q=gone')[1]['results'] == [
      {'rank': 1, 'video': 'v_gone', 'score': 0.5, 'span': [1.0, 2.0], 'duration': None,
       'thumbnail_url': None, 'video_url': None}]
  # A text the searcher refuses: 400 naming q, with the searcher's reason.
  status, answer = _json(server, '/api/search?q=unencodable')
  assert (status, answer['parameter']) == (400, 'q') and 'no token' in answer['error']
  assert _json(server, '/api/limits') == (
      200, {'max_query_chars': 50, 'default_k': 10, 'max_k': 20})


@pytest.mark.parametrize('target,status,parameter', [
    ('/api/search', 400, 'q'),
    ('/api/search?q=%20%20', 400, 'q'),
    ('/api/search?q=' + 'a' * 51, 400, 'q'),
    ('/api/search?q=%FF%FE', 400, 'q'),
    ('/api/search?q=car&k=0', 400, 'k'),
    ('/api/search?q=car&k=21', 400, 'k'),
    ('/api/search?q=car&k=ten', 400, 'k'),
    ('/api/search?q=car&k=-1', 400, 'k'),
    ('/api/search?q=car&q=bus', 400, 'q'),
    ('/api/search?q=car&kk=3', 400, 'kk'),
    ('/api/search?q=car&' + '&'.join(f'x{i}=1' for i in range(5)), 400, 'query'),
    ('/api/search?q=' + 'a' * 5000, 414, 'url'),
    ('/api/nothing', 404, 'path'),
], ids=lambda value: value[:40] if isinstance(value, str) else None)
def test_bounds_are_refused_naming_the_parameter(site, target, status, parameter):
  server, searcher, _ = site
  searched = len(searcher.queries)
  got, answer = _json(server, target)
  assert (got, answer['parameter']) == (status, parameter), answer
  assert parameter in answer['error'], answer
  assert len(searcher.queries) == searched  # refused before the searcher


def test_methods_bodies_and_hosts_are_refused(site):
  server, _, _ = site
  status, headers, body = _request(server, 'POST', '/api/search?q=car', body=b'{}')
  assert status == 405 and headers['Allow'] == 'GET, HEAD'
  assert json.loads(body)['parameter'] == 'method'
  status, _, body = _request(server, 'GET', '/api/search?q=car', body=b'x' * 10)
  assert status == 413 and json.loads(body)['parameter'] == 'Content-Length'
  # A page of another site that reached this port through DNS rebinding.
  status, _, body = _request(server, 'GET', '/api/search?q=car',
                             headers={'Host': 'evil.example:80'})
  assert status == 400 and 'Host' in json.loads(body)['error']
  status, _, body = _request(server, 'GET', '/api/search?q=car',
                             headers={'Host': f'localhost:{server.server_address[1]}'})
  assert status == 200, body
  # A request line past http.server's own limit: JSON too.
  status, _, body = _request(server, 'GET', '/' + 'a' * 70000)
  assert status == 414 and json.loads(body)['parameter'] == 'request'


def test_range_requests(site):
  server, _, _ = site
  size = len(VIDEO_BYTES)
  status, headers, body = _request(server, 'GET', '/video/v_red')
  assert (status, body) == (200, VIDEO_BYTES)
  assert headers['Accept-Ranges'] == 'bytes' and headers['Content-Type'] == 'video/mp4'
  for header, first, last in (('bytes=10-19', 10, 19), ('bytes=10000-', 10000, size - 1),
                              ('bytes=-5', size - 5, size - 1),
                              ('bytes=10200-99999', 10200, size - 1), ('bytes=0-0', 0, 0)):
    status, headers, body = _request(server, 'GET', '/video/v_red', headers={'Range': header})
    assert status == 206, header
    assert body == VIDEO_BYTES[first:last + 1], header
    assert headers['Content-Range'] == f'bytes {first}-{last}/{size}', header
    assert headers['Content-Length'] == str(last - first + 1), header
  status, headers, body = _request(server, 'GET', '/video/v_red',
                                   headers={'Range': f'bytes={size}-'})
  assert status == 416 and headers['Content-Range'] == f'bytes */{size}'
  assert json.loads(body)['parameter'] == 'Range'
  # Several ranges or another unit: the whole file (RFC 9110 lets a server ignore Range).
  for header in ('bytes=0-1,5-6', 'items=0-1', 'bytes=5-2'):
    status, _, body = _request(server, 'GET', '/video/v_red', headers={'Range': header})
    assert (status, len(body)) == (200, size), header
  status, headers, body = _request(server, 'HEAD', '/video/v_red', headers={'Range': 'bytes=1-2'})
  assert (status, body, headers['Content-Length']) == (206, b'', '2')
  status, headers, body = _request(server, 'GET', '/thumb/v_red')
  assert status == 200 and headers['Content-Type'] == 'image/jpeg'
  assert body[:2] == b'\xff\xd8'


def test_range_header_parsing():
  assert serve.parse_range(None, 100) is None
  assert serve.parse_range('bytes=5-', 100) == (5, 99)
  assert serve.parse_range('bytes=-200', 100) == (0, 99)
  assert serve.parse_range('bytes=' + '9' * 40 + '-', 100) is None  # ignored, not parsed
  with pytest.raises(serve.RequestError, match='Range'):
    serve.parse_range('bytes=-0', 100)
  with pytest.raises(serve.RequestError, match='Range'):
    serve.parse_range('bytes=0-', 0)


@pytest.mark.parametrize('target', [
    '/thumb/..%2F..%2Fetc%2Fpasswd',
    '/video/..%2F..%2Fetc%2Fpasswd',
    '/thumb/../../etc/passwd',
    '/video/%2e%2e%2f%2e%2e%2fetc%2fpasswd',
    '/thumb/v_red%2F..%2F..%2Fetc%2Fpasswd',
    '/thumb/..%5C..%5Cetc%5Cpasswd',
    '/video/v_red%00.jpg',
    '/static/..%2Fserver.py',
    '/static/../server.py',
    '/static/%2Fetc%2Fpasswd',
    '//etc/passwd',
    '/etc/passwd',
    '/video/v_outside',       # its source lies outside the allowed folders
    '/video/v_link',          # a link in an allowed folder to a file outside
    '/thumb/v_link',
    '/video/v_linked_dir',    # a path through a linked folder
    '/thumb/v_linked_dir',    # thumbnails/ of no collection
    '/video/v_dotdot',        # .. in the recorded path
    '/thumb/v_dotdot',
    '/video/v_frames',        # a frame folder is no video
    '/video/nosuchvideo',
])
def test_nothing_outside_the_allowed_folders_is_served(site, target):
  server, _, _ = site
  status, headers, body = _request(server, 'GET', target)
  assert status in (403, 404), (target, status)
  assert headers['Content-Type'].startswith('application/json'), target
  assert b'secret' not in body and b'root:' not in body, target


def test_the_page_and_its_files(site):
  server, _, _ = site
  status, headers, body = _request(server, 'GET', '/')
  assert status == 200 and headers['Content-Type'].startswith('text/html')
  assert "default-src 'self'" in headers['Content-Security-Policy']
  assert b'id="results"' in body and b'/static/app.js' in body
  for name in serve.server.STATIC_FILES:
    status, _, body = _request(server, 'GET', f'/static/{name}')
    assert status == 200 and body, name


def test_cli_refusals_name_the_flag(tmp_path):
  """The refusals before any searcher is built (the last line of stderr names the flag)."""
  for args, expected in (((), '--index required'),
                         ((f'--index={tmp_path}', f'--videos={tmp_path}/absent'),
                          f'--videos={tmp_path}/absent: not a folder')):
    proc = subprocess.run([sys.executable, '-m', 'prvr_jax.tools.serve', *args],
                          cwd=support.REPO, env=support.cli_env(None), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0
    assert expected in proc.stderr.strip().splitlines()[-1], proc.stderr[-2000:]


# -- the page in headless Chromium -----------------------------------------------------------

def _chromium() -> str | None:
  for name in ('chromium', 'chromium-browser', 'google-chrome', 'google-chrome-stable'):
    if path := shutil.which(name):
      return path
  return None


def _run_chromium(browser: str, profile: pathlib.Path, url: str, screenshot: pathlib.Path | None
                  = None) -> str:
  """The DOM of `url` once its scripts and fetches have run (and a screenshot of it), in a
  fresh profile."""
  proc = subprocess.run(
      [browser, '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic',
       '--no-first-run', '--disable-background-networking', '--disable-component-update',
       '--disable-sync', '--disable-extensions', '--mute-audio', '--hide-scrollbars',
       f'--user-data-dir={profile}', '--virtual-time-budget=30000', '--window-size=1000,800',
       '--dump-dom', *([f'--screenshot={screenshot}'] if screenshot else []), url],
      capture_output=True, text=True, timeout=90, env={**os.environ, 'HOME': str(profile)})
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert screenshot is None or screenshot.is_file(), proc.stderr[-3000:]
  return proc.stdout


class _Results(html.parser.HTMLParser):
  """The result rows (data-rank, data-video) and span markers (style) of a dumped DOM."""

  def __init__(self):
    super().__init__()
    self.rows, self.markers, self.thumbs, self.status = [], [], [], None
    self._in_status = False

  def handle_starttag(self, tag, attrs):
    attrs = dict(attrs)
    classes = (attrs.get('class') or '').split()
    if tag == 'li' and 'result' in classes:
      self.rows.append((attrs['data-rank'], attrs['data-video'], 'selected' in classes))
    if 'span-marker' in classes:
      self.markers.append((self.rows[-1][1], attrs['style'], attrs['data-start'],
                           attrs['data-end']))
    if tag == 'img' and 'thumb' in classes:
      self.thumbs.append(attrs.get('src'))
    self._in_status = attrs.get('id') == 'status'

  def handle_endtag(self, tag):
    self._in_status = False

  def handle_data(self, data):
    if self._in_status:
      self.status = (self.status or '') + data


def _colour_pixels(png: bytes, colour: tuple[int, int, int], box: tuple[int, int, int, int]
                   ) -> int:
  """How many pixels of `box` (left, top, right, bottom) are within 12 of `colour`."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from PIL import Image  # pylint: disable=g-import-not-at-top
  pixels = np.asarray(Image.open(io.BytesIO(png)).convert('RGB').crop(box), dtype=np.int16)
  return int((np.abs(pixels - np.array(colour)).max(-1) <= 12).sum())


def test_the_page_in_headless_chromium(site, tmp_path):
  browser = _chromium()
  if browser is None:
    pytest.skip('no Chromium (chromium, chromium-browser or google-chrome on PATH): '
                'apt-get install chromium (.ci/run does) to run the browser test')
  pytest.importorskip('PIL', reason='the screenshot check decodes the PNG with Pillow')
  server, searcher, _ = site
  dom_text = _run_chromium(browser, tmp_path / 'p1', server.url + '?q=red+car&k=3',
                           tmp_path / 'results.png')
  dom = _Results()
  dom.feed(dom_text)
  assert dom.rows == [('1', 'v_red', True), ('2', 'v_frames', False),
                      ('3', 'v_outside', False)], dom_text[-3000:]
  # Spans on the timeline: [2, 4] of 10 s and [0, 1.5] of 6 s; the third's is unknown.
  assert [(v, s, e) for v, _, s, e in dom.markers] == [('v_red', '2', '4'),
                                                        ('v_frames', '0', '1.5')]
  assert dom.markers[0][1].replace(' ', '') == 'left:20%;width:20%;'
  assert dom.markers[1][1].replace(' ', '') == 'left:0%;width:25%;'
  assert dom.thumbs == ['/thumb/v_red', '/thumb/v_frames', '/thumb/v_outside']
  assert dom.status == '3 videos for "red car" (k=3)'
  # The first result is selected, its video set to start at its span.
  assert 'src="/video/v_red#t=2"' in dom_text
  # A refused search shows the server's message and no result.
  dom_text = _run_chromium(browser, tmp_path / 'p2', server.url + '?q=car&k=99',
                           tmp_path / 'refused.png')
  assert 'Refused (400): k=' in dom_text and 'class="result' not in dom_text, dom_text[-3000:]
  # The result list's column (the left half below the header): the rows' backgrounds, the
  # thumbnails' colours and the span markers' orange are drawn with results, not without.
  shots = {name: (tmp_path / f'{name}.png').read_bytes() for name in ('results', 'refused')}
  box = (0, 100, 520, 800)
  for colour, least in (((0xee, 0xf3, 0xfb), 2000), ((0xd6, 0xe4, 0xfa), 2000),
                        ((200, 30, 30), 500), ((30, 160, 30), 500), ((0xe8, 0x59, 0x0c), 50)):
    assert _colour_pixels(shots['results'], colour, box) >= least, colour
    assert _colour_pixels(shots['refused'], colour, box) == 0, colour
  # A video file: the player fetches it (Range requests) and seeks to the span's start.
  if 'v_play' not in searcher.info:
    return  # no PyAV with libx264 to write one (the `video` extra)
  # Headless Chromium's virtual time does not wait for the media pipeline, which on a loaded
  # machine may not have seeked yet when the DOM is taken: up to 3 tries.
  for attempt in range(3):
    dom_text = _run_chromium(browser, tmp_path / f'p3_{attempt}', server.url + '?q=play')
    assert 'src="/video/v_play#t=3"' in dom_text, dom_text[-3000:]
    assert 'data-error' not in dom_text, dom_text[-3000:]
    if 'data-seeked-to=' in dom_text:
      break
  assert 'data-seeked-to="3.00"' in dom_text, dom_text[-3000:]


# -- the real searcher -----------------------------------------------------------------------

REAL_QUERY = 'a cat'
REAL_LENGTHS = {'target': 8, 'other': 6, 'third': 4}  # frame rows per video


@pytest.fixture(scope='module')
def real_index(tmp_path_factory):
  """(index folder, vocabulary, collection folder, videos folder): three videos of random
  CLIP rows as prvr-extract writes them ('target' holds the query's text vector at rows 2-3
  of 8), indexed by zero-shot CLIP (max pooling) through a random tiny CLIP."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from prvr_jax import clip  # pylint: disable=g-import-not-at-top
  from prvr_jax import index as index_lib  # pylint: disable=g-import-not-at-top
  from prvr_jax.clip import weights as clip_weights  # pylint: disable=g-import-not-at-top
  from prvr_jax.data import release  # pylint: disable=g-import-not-at-top
  folder = tmp_path_factory.mktemp('serve_real')
  # byte tokens and one merge: ids the tiny CLIP embeds
  vocab = pathlib.Path(clip.tokenizer.write_vocab(folder / 'vocab.txt.gz', ['c a', 'ca t</w>']))
  config, params = clip_weights.load_spec('random:tiny')
  tokens = clip.Tokenizer(str(vocab))([REAL_QUERY], config.context_length, truncate=True)
  text = np.asarray(clip.CLIP(config).apply({'params': params}, tokens,
                                            method='encode_text'))[0]
  rng = np.random.default_rng(0)
  rows = {v: rng.normal(size=(n, text.shape[0])).astype(np.float32)
          for v, n in REAL_LENGTHS.items()}
  rows['target'][2:4] = text
  collection = release.write_release(str(folder / 'root'), 'mine', rows, {}, {},
                                     visual_feature=None, text_feature='clip')
  shutil.rmtree(os.path.join(collection, 'TextData'))  # prvr-extract writes no captions
  videos = folder / 'videos'
  videos.mkdir()
  (videos / 'target.mp4').write_bytes(VIDEO_BYTES)
  for name in REAL_LENGTHS:
    _jpeg(pathlib.Path(collection) / 'thumbnails' / f'{name}.jpg', (200, 30, 30))
  manifest = {'format': 'prvr_jax.extract/1', 'backbone': 'tiny',
              'embed_dim': int(text.shape[0]), 'fps': 1.0, 'image_size': 32,
              'weights': {'path': 'random:tiny', 'sha256': ''}, 'skipped': {},
              'videos': {v: {'source': str(videos / f'{v}.mp4') if v == 'target'
                             else str(folder / 'elsewhere' / f'{v}.mp4'),
                             'kind': 'file', 'duration': 2.0 * n, 'frames': n, 'rows': n,
                             'thumbnail': f'thumbnails/{v}.jpg'}
                         for v, n in REAL_LENGTHS.items()}}
  with open(os.path.join(collection, 'extract_manifest.json'), 'w', encoding='utf-8') as f:
    json.dump(manifest, f)
  model_config = support.load_config('clip_zero_shot', 'tvr_clip,max')
  model_config.data.update(dir=str(folder / 'root'), collection='mine')
  model_config.eval.video_batch_size = 4
  dim = int(text.shape[0])
  model_config.model.update(hidden_dim=dim, visual_dim=dim, query_dim=dim, max_frames=8,
                            num_clips=4)
  built = index_lib.build_from_checkpoint(model_config, None, 'all', str(folder / 'index'))
  return built.path, str(vocab), collection, str(videos)


def test_the_real_text_searcher_through_the_api(real_index):
  """The API answers what `TextSearcher.search` answers (spans in seconds included), serves
  the collection's thumbnails and the video under --videos, and no source elsewhere."""
  from prvr_jax.index import text_search  # pylint: disable=g-import-not-at-top
  index_dir, vocab, _, videos = real_index
  searcher = text_search.TextSearcher(index_dir, 'random:tiny', vocab=vocab)
  server = serve.make_server(searcher, index_dir, [videos], port=0)
  serve.start_in_thread(server)
  try:
    expected, = searcher.search([REAL_QUERY], 3)
    # k above the index's 3 videos: all 3 (the page does not know the index's size).
    status, answer = _json(server, '/api/search?q=' + urllib.parse.quote(REAL_QUERY) + '&k=10')
    assert status == 200, answer
    assert answer['k'] == 3
    assert [(r['rank'], r['video']) for r in answer['results']] == [
        (h.rank, h.video) for h in expected]
    best = answer['results'][0]
    assert best['video'] == 'target'
    assert best['span'] == pytest.approx([4.0, 8.0])  # rows 2-3 of 8, 2 s a row
    assert best['duration'] == 16.0
    for result, hit in zip(answer['results'], expected):
      assert result['score'] == pytest.approx(hit.score, rel=1e-5, abs=1e-6)
      assert result['thumbnail_url'] == '/thumb/' + hit.video
      assert result['video_url'] == ('/video/target' if hit.video == 'target' else None)
      status, _, body = _request(server, 'GET', result['thumbnail_url'])
      assert status == 200 and body[:2] == b'\xff\xd8'
    status, _, body = _request(server, 'GET', '/video/target', headers={'Range': 'bytes=5-9'})
    assert (status, body) == (206, VIDEO_BYTES[5:10])
    assert _request(server, 'GET', '/video/other')[0] == 404
    assert _request(server, 'GET', '/thumb/not_indexed')[0] == 404
  finally:
    server.shutdown()
    server.server_close()
