"""Search an index by text, with each hit's best-matching span in seconds.

  searcher = TextSearcher('/idx/my_videos', clip_weights='/data/clip/ViT-B-32.safetensors')
  hits = searcher.search(['a man opens the fridge'], k=10)[0]   # best first
  hits[0].video, hits[0].score, hits[0].span                     # span: (start, end) seconds
  searcher.video_info(hits[0].video)   # {'duration', 'source', 'thumbnail'} (None: unknown)

Texts become the model's query inputs as its data would hold them:

* models reading CLIP `tokens` (T-MASS, clip_zero_shot `text_tower`): CLIP's BPE, truncated to
  the context length; the model's own text tower encodes them.
* models reading CLIP sentence features (the `*_clip` variants, AMDNet, clip_zero_shot on a
  release, MSC-PRVR on AMDNet's layout: `text_feature='clip'`): CLIP's text tower
  (`clip_weights`: a weights file `prvr_jax.clip.weights.load` reads, or
  `random:<backbone>[:<seed>]`, e.g. `random:tiny`, a randomly initialised CLIP for tests)
  gives one sentence vector per text, L2-normalised where the index's data normalised its
  query features, put as the one token of `query_feats [Q, max_query_len, Dq]` with its
  `query_mask`.

Models whose queries are token features of another encoder (RoBERTa: `text_feature` 'roberta',
or per-token CLIP features 'clip_text', MSC-PRVR's own files) are refused: no text encoder of
theirs is here. Then the model's `encode_queries` and exact search (`Searcher`).

Spans (`span_fractions`): for models whose score is a max over positions covering the video
evenly (`ModelSpec.relevance`), from the stored rows of each hit, exactly the curve
`relevance` gives (tests/index/test_text_search.py):

* clip_zero_shot (`max`, `topk`): the stored frames, cosine per real frame; `mean` has none.
* GMMFormer, GMMFormer v2, HLFormer, Holmes, DreamPRVR: the clip cosine (`relevance`'s 'clip
  cosine').
* AMDNet (`ModelSpec.learned_spans`): the learned span (centre +- width / 2) whose moment the
  text matches best, computed from the hits' input rows re-read from the indexed collection
  (an index of every video of a collection, `--split=all`, whose folder is still there); else,
  as for the models above, its best moment-enhanced clip.
* MS-SL: its best multi-scale clip, whose range of clips is the span (`relevance`'s
  per-position curve is that clip's cosine at each position it covers).
* others (ProtoPRVR, RAL, T-MASS, MSC-PRVR): None.

Position i of n real positions covers [i/n, (i+1)/n] of the video; the span is the best
position's range, widened over the neighbouring positions that score the same (within
`SPAN_TIE_ATOL`), times the duration the index recorded (None when unknown).
"""

from collections.abc import Sequence
import dataclasses
import functools
from typing import Any

from flax.traverse_util import unflatten_dict
import jax
import jax.numpy as jnp
import numpy as np

from prvr_jax.index.search import Searcher
from prvr_jax.index.store import Index, dequantize, open_index
from prvr_jax.models.spec import position_scores

MAX_QUERIES = 1024        # texts per `search` call
MAX_TEXT_CHARS = 2000     # characters per text (its tokens are truncated as CLIP does)
SPAN_TIE_ATOL = 1e-6      # positions within this of the best one widen the span
# Text features whose queries text search can make (a CLIP sentence vector per caption).
SENTENCE_FEATURES = ('clip',)


@dataclasses.dataclass
class Hit:
  """One ranked video of a text query.

  Attributes:
    video: video id.
    score: the model's score.
    rank: 1-based.
    span: best-matching span in seconds (None: the model has none, or the duration is
      unknown).
    duration: video duration in seconds (None: unknown).
    fraction: the span as fractions of the video (None: the model has none).
  """
  video: str
  score: float
  rank: int
  span: tuple[float, float] | None
  duration: float | None
  fraction: tuple[float, float] | None = None


def _fractions(curves: np.ndarray, real: np.ndarray) -> list[tuple[float, float] | None]:
  """Each row's span as fractions: the best real position, widened over its neighbours that
  score within `SPAN_TIE_ATOL` of it (`curves [N, T]`, `real [N, T]` bool, a prefix)."""
  out = []
  for curve, mask in zip(curves, real):
    n = int(mask.sum())
    if n == 0:
      out.append(None)
      continue
    values = curve[:n]
    best = int(np.argmax(values))
    close = values >= values[best] - SPAN_TIE_ATOL
    first, last = best, best
    while first > 0 and close[first - 1]:
      first -= 1
    while last < n - 1 and close[last + 1]:
      last += 1
    out.append((first / n, (last + 1) / n))
  return out


class TextSearcher:
  """Text queries against one index, with spans (the module docstring).

  Args:
    index_dir: the index folder.
    clip_weights: CLIP's weights for models reading CLIP sentence features (default: the
      index's `config.model.clip_weights`); a file or 'random:<backbone>'.
    verify: check every index file's full sha256 when opening.
    vocab: CLIP's BPE vocabulary file (default: the one the index's data named, else
      `prvr_jax.clip.default_vocab_path`).
    query_batch_size: queries encoded and scored together.
  """

  def __init__(self, index_dir: str, clip_weights: str | None = None, verify: bool = False,
               *, vocab: str | None = None, query_batch_size: int = 64, mesh: Any = None):
    self.index: Index = open_index(index_dir, verify=verify)
    self.spec = self.index.spec
    config_model = self.index.config_model
    self.query_inputs = self.spec.inputs(config_model)[1]
    info = self.index.manifest.get('info', {})
    self._videos = info.get('videos') or {}
    layout = dict(info.get('queries') or {})
    self._vocab = vocab or layout.get('clip_vocab') or None
    if self.query_inputs == ('tokens',):
      self._mode = 'tokens'
    else:
      text_feature = layout.get('text_feature', (info.get('data') or {}).get('text_feature'))
      if text_feature not in SENTENCE_FEATURES:
        raise ValueError(
            f'--index={index_dir}: model {self.spec.name} reads '
            f'{text_feature or "unrecorded"} query features (text_feature={text_feature!r}: '
            'token features of a text encoder, e.g. RoBERTa, that prvr_jax does not hold), '
            'not CLIP sentence features; text search needs a model on CLIP features (a '
            '*_clip config, AMDNet, clip_zero_shot) or on CLIP tokens.')
      self._mode = 'sentence'
      self._normalize = bool(layout.get('normalize', False))
      self._clip_weights = clip_weights or config_model.get('clip_weights') or None
      if not self._clip_weights:
        raise ValueError(f'--index={index_dir}: model {self.spec.name} reads CLIP sentence '
                         'features: pass --clip_weights (a CLIP weights file, or '
                         'random:tiny for a random test CLIP).')
    self.searcher = Searcher(self.index, mesh, query_batch_size=query_batch_size)
    self._span_curves = _span_function(self.index, self.searcher)

  # ----------------------------------------------------------------------------- queries

  @functools.cached_property
  def _tokenizer(self) -> Any:
    from prvr_jax import clip  # pylint: disable=g-import-not-at-top
    return clip.Tokenizer(self._vocab)

  @functools.cached_property
  def _clip(self) -> tuple[Any, Any, Any]:
    """(CLIPConfig, params, jitted encode_text) for sentence features."""
    from prvr_jax import clip  # pylint: disable=g-import-not-at-top
    from prvr_jax.clip import weights  # pylint: disable=g-import-not-at-top
    config, params = weights.load_spec(self._clip_weights)
    dim = self.index.config_model.get('query_dim')
    if dim is not None and config.embed_dim != dim:
      raise ValueError(f'--clip_weights={self._clip_weights}: CLIP embeds text in '
                       f'{config.embed_dim} dims, model {self.spec.name} of {self.index.path} '
                       f'reads {dim}-d query features (config.model.query_dim).')
    encode = jax.jit(lambda p, t: clip.CLIP(config).apply({'params': p}, t,
                                                          method='encode_text'))
    return config, params, encode

  def _context_length(self) -> int:
    from prvr_jax import clip  # pylint: disable=g-import-not-at-top
    if self._mode == 'sentence':
      return self._clip[0].context_length
    config_model = self.index.config_model
    return (config_model.get('context_length')
            or clip.backbone_config(config_model.backbone).context_length)

  def _tokens(self, texts: Sequence[str], vocab_size: int | None) -> np.ndarray:
    tokens = self._tokenizer(list(texts), self._context_length(), truncate=True)
    if vocab_size is not None and int(tokens.max()) >= vocab_size:
      raise ValueError(f'CLIP\'s vocabulary ({self._tokenizer.vocab_size} tokens) does not fit '
                       f'the text tower of {vocab_size} tokens: pass the vocabulary the CLIP '
                       'weights were trained with (--clip_vocab / PRVR_CLIP_VOCAB).')
    return tokens

  def query_inputs_of(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
    """The model's query inputs `[Q, ...]` of `texts` (checked: `check_texts`)."""
    texts = check_texts(texts)
    if self._mode == 'tokens':
      from prvr_jax import clip  # pylint: disable=g-import-not-at-top
      backbone = self.index.config_model.get('backbone')
      size = clip.backbone_config(backbone).vocab_size if backbone else None
      return {'tokens': self._tokens(texts, size)}
    config, params, encode = self._clip
    vectors = np.asarray(encode(params, self._tokens(texts, config.vocab_size)), np.float32)
    if self._normalize:
      from prvr_jax.data import preprocess  # pylint: disable=g-import-not-at-top
      vectors = preprocess.l2_normalize(vectors).astype(np.float32)
    length = self.index.config_model.get('max_query_len', 1)
    feats = np.zeros((len(texts), length, vectors.shape[1]), np.float32)
    feats[:, 0] = vectors
    mask = np.zeros((len(texts), length), np.float32)
    mask[:, 0] = 1
    return {k: v for k, v in (('query_feats', feats), ('query_mask', mask))
            if k in self.query_inputs}

  # ----------------------------------------------------------------------------- search

  def check_k(self, k: int) -> int:
    """`k`, or ValueError naming --k unless 1 <= k <= the index's size."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= len(
        self.index):
      raise ValueError(f'--k={k}: expected 1 <= k <= {len(self.index)}, the videos of index '
                       f'{self.index.path}.')
    return int(k)

  def search(self, texts: Sequence[str], k: int = 10) -> list[list[Hit]]:
    """The top `k` videos of each text, best first, with spans (the module docstring)."""
    k = self.check_k(k)
    queries = self.query_inputs_of(texts)
    result = self.searcher.search(queries, k=k)
    fractions = self.span_fractions(queries, result.rows)
    out = []
    for q, (ids, scores) in enumerate(zip(result.ids, result.scores)):
      hits = []
      for r, (video, score) in enumerate(zip(ids, scores)):
        duration = self.video_info(video)['duration']
        fraction = fractions[q][r] if fractions is not None else None
        span = (None if fraction is None or duration is None
                else (fraction[0] * duration, fraction[1] * duration))
        hits.append(Hit(video, float(score), r + 1, span, duration, fraction))
      out.append(hits)
    return out

  def span_fractions(self, queries: dict[str, np.ndarray], rows: np.ndarray
                     ) -> list[list[tuple[float, float] | None]] | None:
    """Each found row's span as fractions of its video (`rows [Q, k]`), or None for a
    model without spans."""
    if self._span_curves is None:
      return None
    encoded = self.searcher.encode_queries(queries)
    starts = np.array([first for first, _ in self.index.rows()] + [len(self.index)])
    gathered = self.searcher._gather(rows, starts)  # pylint: disable=protected-access
    q, k = rows.shape
    dtype = self.index.dtype
    stored = unflatten_dict({
        name: np.asarray(dequantize(
            jnp.asarray(parts['values'].reshape((q * k,) + parts['values'].shape[2:])),
            (jnp.asarray(parts['scale'].reshape((q * k,) + parts['scale'].shape[2:]))
             if 'scale' in parts else None),
            'float32' if self.index.leaves[name]['exact'] else dtype))
        for name, parts in gathered.items()}, sep='/')
    repeated = jax.tree.map(lambda x: np.repeat(np.asarray(x), k, axis=0), encoded)
    fractions = self._span_curves(repeated, stored)
    if self.spec.learned_spans is not None and self._recorded_videos is not None:
      fractions = self._learned_spans(queries, rows)
    return [[fractions[i * k + j] if rows[i, j] >= 0 else None for j in range(k)]
            for i in range(q)]

  @functools.cached_property
  def _recorded_videos(self) -> Any:
    """The indexed collection's videos-only split (`collection.open_recorded`), for a model
    with learned spans; None where the index does not lead to it (then the best position)."""
    from prvr_jax.data import collection  # pylint: disable=g-import-not-at-top
    return collection.open_recorded((self.index.manifest.get('info') or {}).get('data') or {})

  def _learned_spans(self, queries: dict[str, np.ndarray], rows: np.ndarray
                     ) -> list[tuple[float, float]]:
    """`spec.learned_spans` of each query with each found video (`rows [Q, k]`), from the
    videos' input rows re-read from the collection: `Q * k` (start, end) fractions."""
    from prvr_jax.data import collection  # pylint: disable=g-import-not-at-top
    q, k = rows.shape
    ids = self.index.ids
    videos = collection.video_batch(self._recorded_videos,
                                    [ids[max(int(r), 0)] for r in rows.ravel()], q * k)
    video_inputs = self.spec.inputs(self.index.config_model)[0]
    repeated = {name: np.repeat(np.asarray(x), k, axis=0) for name, x in queries.items()}
    spans = np.asarray(self._learned_span_fn(
        self.searcher.params, repeated, {n: videos[n] for n in video_inputs}))
    return [(float(a), float(b)) for a, b in spans]

  @functools.cached_property
  def _learned_span_fn(self) -> Any:
    module = self.spec.build(self.index.config_model)
    return jax.jit(lambda p, queries, videos: module.apply(
        {'params': p}, queries, videos, method=self.spec.learned_spans))

  def video_info(self, video_id: str) -> dict[str, Any]:
    """{'duration', 'source', 'thumbnail'} of an indexed video, as its index recorded them
    (seconds, absolute paths; None where unknown); KeyError for a video not indexed."""
    if video_id not in self._ids:
      raise KeyError(f'video {video_id!r} is not in index {self.index.path}')
    entry = self._videos.get(video_id) or {}
    return {k: entry.get(k) for k in ('duration', 'source', 'thumbnail')}

  @functools.cached_property
  def _ids(self) -> frozenset[str]:
    return frozenset(self.index.ids)


def json_record(query: str, hits: Sequence[Hit], index_id: str | None,
                text: str | None = None) -> dict[str, Any]:
  """The JSON line of one query of `prvr-index search --text` / `--queries=FILE.txt`:
  {"query", ("text": a file line's text,) "videos", "scores", "spans" ([start, end] seconds
  or null), "span_fractions" ([a, b] of the video or null), "durations" (seconds or null),
  "index": the index's id}."""
  record: dict[str, Any] = {'query': query}
  if text is not None and text != query:
    record['text'] = text
  record.update({
      'videos': [h.video for h in hits], 'scores': [round(h.score, 6) for h in hits],
      'spans': [None if h.span is None else [round(x, 3) for x in h.span] for h in hits],
      'span_fractions': [None if h.fraction is None else [round(x, 6) for x in h.fraction]
                         for h in hits],
      'durations': [h.duration for h in hits], 'index': index_id})
  return record


def check_texts(texts: Sequence[str] | str) -> list[str]:
  """`texts` as a list (one string: one query), or ValueError naming the query at fault:
  at most `MAX_QUERIES` non-empty strings of at most `MAX_TEXT_CHARS` characters."""
  if isinstance(texts, str):
    texts = [texts]
  texts = list(texts)
  if not texts:
    raise ValueError('--text: no query text given.')
  if len(texts) > MAX_QUERIES:
    raise ValueError(f'--text: {len(texts)} queries in one search; at most {MAX_QUERIES}.')
  for i, text in enumerate(texts):
    if not isinstance(text, str) or not text.strip():
      raise ValueError(f'--text: query #{i} is {text!r}, not a non-empty text.')
    if len(text) > MAX_TEXT_CHARS:
      raise ValueError(f'--text: query #{i} has {len(text)} characters; at most '
                       f'{MAX_TEXT_CHARS} (CLIP reads its first 77 tokens).')
  return texts


# ----------------------------------------------------------------------------- spans


def _span_function(index: Index, searcher: Searcher) -> Any:
  """(encoded queries `[N, ...]`, stored rows `[N, ...]`) -> N span fractions (or None), for
  the index's model; None for a model without spans (the module docstring)."""
  spec, config_model = index.spec, index.config_model
  leaves = index.leaves
  if spec.relevance is None:
    return None
  if spec.name == 'clip_zero_shot':
    if config_model.get('pooling') == 'mean':
      return None

    @jax.jit
    def frame_curves(encoded, stored):
      return jnp.einsum('nd,nld->nl', encoded, stored['frames'])

    return lambda encoded, stored: _fractions(
        np.asarray(frame_curves(encoded, stored)), np.asarray(stored['mask']) > 0)
  if 'clips' not in leaves:
    return None  # e.g. ProtoPRVR: its prototypes' attention is not stored
  module = spec.build(config_model)
  params = searcher.params
  num_clips = leaves['clips']['shape'][0]

  @jax.jit
  def clip_curves(params, encoded, stored):
    sets = module.apply({'params': params}, stored, method='clip_set') if hasattr(
        module, 'clip_set') else stored['clips']
    return position_scores(encoded, sets)

  def fractions(encoded, stored):
    if not isinstance(encoded, (np.ndarray, jax.Array)) or encoded.ndim != 2:
      return [None] * len(jax.tree.leaves(stored)[0])
    curves = np.asarray(clip_curves(params, encoded, stored))
    if curves.shape[1] == num_clips:
      return _fractions(curves, np.ones(curves.shape, bool))
    # Multi-scale clips (MS-SL): the best one's range of clips.
    from prvr_jax.layers.multiscale import averaging_matrix  # pylint: disable=g-import-not-at-top
    covers = averaging_matrix(num_clips) > 0  # [P, Lc]
    if covers.shape[0] != curves.shape[1]:
      return [None] * len(curves)
    out = []
    for best in np.argmax(curves, axis=1):
      where = np.flatnonzero(covers[best])
      out.append((float(where[0] / num_clips), float((where[-1] + 1) / num_clips)))
    return out

  return fractions
