r"""The synthetic PRVR benchmark: long untrimmed videos with planted moments (docs/synthetic.md).

A shared latent world holds concept atoms, background scenes and function words. Each video
is a smooth random walk around one scene with 1-3 planted moments (a span blending into
`normalize(concept_a + concept_b)`, log-uniform in `moment_ratio` of the video) and
distractor moments from a small shared pool; frames are `relu(W_v h + noise)`, query tokens
come from a moment's concepts through `tanh(W_q ...)`, mixed with function words, word noise
and a sentence context. True spans are recorded. Written through the release layout
(`write_mssl`; AMDNet's CLIP layout with sentence vectors for `text_feature='clip'`) and
prepared into shards (`write_shards`, `ensure`); everything is a function of (size, seed,
text feature). Concept pairs recur across videos, so a query's content is planted in other
videos too: the shard folder and the release layout also hold the test split's dense files
(`dense_ground_truth`, `write_dense`; docs/dense_eval.md).
"""

from collections.abc import Callable
import dataclasses
import json
import logging
import os
import shutil
import tempfile

import numpy as np

from prvr_jax.data import preprocess
from prvr_jax.data import release as release_lib
from prvr_jax.data import shard_format

_log = logging.getLogger(__name__)

COLLECTION = 'synthetic'
VISUAL_FEATURE = 'synthetic'
# 3: the shard folder also holds the test split's dense ground truth (features unchanged).
GENERATOR_VERSION = 3
DENSE_SPLIT = 'test'  # the split the dense ground truth describes
_SPLITS = ('train', 'val', 'test')
_AR = 0.9  # background AR(1) coefficient per frame


@dataclasses.dataclass(frozen=True)
class Spec:
  """Sizes and difficulty knobs of a synthetic benchmark."""
  num_videos: tuple[int, int, int]               # train, val, test
  visual_dim: int = 256
  query_dim: int = 128
  latent_dim: int = 48
  num_concepts: int = 48                         # few: concept pairs recur across videos
  num_scenes: int = 24
  num_function_words: int = 40
  num_distractors: int = 24                      # shared pool of never-queried moments
  frames: tuple[int, int] = (40, 200)            # raw feature rows per video
  seconds_per_frame: float = 1.5
  moments_per_video: tuple[int, int] = (1, 3)
  distractors_per_video: tuple[int, int] = (1, 3)
  queries_per_video: tuple[int, int] = (1, 6)
  moment_ratio: tuple[float, float] = (0.04, 0.9)  # log-uniform moment/video length
  query_tokens: tuple[int, int] = (6, 36)
  content_word_prob: float = 0.35
  moment_strength: float = 0.8                   # moment latent scale vs background
  clutter: float = 0.9                           # background latent scale
  background_drift: float = 0.6                  # scale of the background's walk
  frame_noise: float = 0.8
  word_noise: float = 1.0
  sentence_context: float = 0.3
  # True: a CLIP-like joint space, frames `W_v h + noise` and query tokens `W_v h` (one linear
  # projection, no nonlinearity), so raw cosines between text and frames are meaningful.
  joint_space: bool = False
  num_clips: int = preprocess.NUM_CLIPS           # the shards' clip and frame lengths
  max_frames: int = preprocess.MAX_FRAMES

  def __post_init__(self):
    if len(self.num_videos) != 3 or min(self.num_videos) < 1:
      raise ValueError(f'num_videos needs (train, val, test) counts >= 1, got {self.num_videos}')
    for name in ('frames', 'moments_per_video', 'distractors_per_video', 'queries_per_video',
                 'moment_ratio', 'query_tokens'):
      lo, hi = getattr(self, name)
      if not 0 <= lo <= hi:
        raise ValueError(f'{name}={(lo, hi)} must be an ordered non-negative range')
    if self.frames[0] < 1 or self.moments_per_video[0] < 1 or self.queries_per_video[0] < 1:
      raise ValueError('every video needs at least one frame, moment and query')
    if not (0 < self.moment_ratio[0] and self.moment_ratio[1] <= 1):
      raise ValueError(f'moment_ratio={self.moment_ratio} must lie in (0, 1]')
    if self.joint_space and self.visual_dim != self.query_dim:
      raise ValueError(f'a joint space needs visual_dim == query_dim, got {self.visual_dim} '
                       f'and {self.query_dim}')


SIZES = {
    # Both sizes have the dims of `config_lib.SYNTHETIC_DIMS` (the configs' model dims).
    'tiny': Spec(num_videos=(24, 8, 12), latent_dim=16, num_concepts=24, num_scenes=6,
                 num_function_words=12, num_distractors=6, frames=(12, 160)),
    'default': Spec(num_videos=(1200, 200, 400)),
    # Text-video retrieval (T-MASS): 12 frames and one caption per video in a joint space; the
    # caption names one of the video's 2-3 events.
    'text_video': Spec(num_videos=(1600, 200, 500), visual_dim=128, query_dim=128,
                       frames=(12, 12), moments_per_video=(2, 3), distractors_per_video=(0, 1),
                       queries_per_video=(1, 1), moment_ratio=(0.15, 0.4), joint_space=True,
                       num_clips=12, max_frames=12),
    'text_video_tiny': Spec(num_videos=(24, 8, 12), visual_dim=32, query_dim=32, latent_dim=16,
                            num_concepts=24, num_scenes=6, num_function_words=12,
                            num_distractors=6, frames=(12, 12), moments_per_video=(2, 3),
                            distractors_per_video=(0, 1), queries_per_video=(1, 1),
                            moment_ratio=(0.15, 0.4), joint_space=True, num_clips=12,
                            max_frames=12),
}


@dataclasses.dataclass
class SplitData:
  """One generated split, in release form, with the content of its queries and videos."""
  videos: dict[str, np.ndarray]                       # video_id -> [T, Dv] raw frames
  captions: list[tuple[str, str]]                     # (cap_id, text), caption-file order
  caption_features: dict[str, np.ndarray]             # cap_id -> [n, Dq] raw tokens
  moments: dict[str, tuple[float, float, float]]      # cap_id -> (start, end, duration) s
  # cap_id -> the query's concept pair (ascending).
  query_concepts: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
  # video_id -> the concept pairs that fill at least one of its frames at full weight.
  video_concepts: dict[str, set[tuple[int, int]]] = dataclasses.field(default_factory=dict)


def _unit(x: np.ndarray) -> np.ndarray:
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


class _World:
  """The latent vocabulary and the two modality projections shared by every split."""

  def __init__(self, spec: Spec, rng: np.random.Generator):
    d = spec.latent_dim
    self.concepts = _unit(rng.normal(size=(spec.num_concepts, d)))
    self.scenes = _unit(rng.normal(size=(spec.num_scenes, d)))
    self.function_words = _unit(rng.normal(size=(spec.num_function_words, d)))
    self.distractors = rng.choice(spec.num_concepts, size=(spec.num_distractors, 2))
    # Unit-variance projections: a unit latent maps to unit-scale pre-activations.
    self.w_visual = rng.normal(size=(d, spec.visual_dim))
    self.b_visual = rng.normal(size=spec.visual_dim) * 0.3
    self.w_query = rng.normal(size=(d, spec.query_dim))


def _span(rng: np.random.Generator, spec: Spec, num_frames: int) -> tuple[int, int]:
  lo, hi = np.log(spec.moment_ratio)
  length = int(np.clip(round(np.exp(rng.uniform(lo, hi)) * num_frames), 1, num_frames))
  start = int(rng.integers(0, num_frames - length + 1))
  return start, start + length


def _free_span(rng: np.random.Generator, spec: Spec, num_frames: int,
               taken: list[tuple[int, int]], tries: int = 8) -> tuple[int, int] | None:
  """A span overlapping none of `taken` (None after `tries` draws), so recorded spans stay true."""
  for _ in range(tries):
    start, end = _span(rng, spec, num_frames)
    if all(end <= s or start >= e for s, e in taken):
      return start, end
  return None


def _plant(latent: np.ndarray, content: np.ndarray, span: tuple[int, int], strength: float) -> None:
  """Blends `content` into frames [start, end) with soft one-frame edges."""
  start, end = span
  weight = np.ones(end - start)
  if end - start > 2:
    weight[[0, -1]] = 0.5
  latent[start:end] = (1 - weight[:, None]) * latent[start:end] + weight[:, None] * strength * content


def _label(labels: list[tuple[int, int] | None], pair: np.ndarray, span: tuple[int, int]
           ) -> None:
  """Records which concept pair `_plant` put on each frame at full weight (None: a blend)."""
  start, end = span
  labels[start:end] = [tuple(sorted(int(c) for c in pair))] * (end - start)
  if end - start > 2:
    labels[start] = labels[end - 1] = None


def _video(rng: np.random.Generator, spec: Spec, world: _World):
  """Frame latents `[T, latent_dim]`, the planted moments `[(concept pair, span)]` and the
  concept pairs filling at least one frame at full weight (moments, intact distractors)."""
  num_frames = int(rng.integers(spec.frames[0], spec.frames[1] + 1))
  scene = world.scenes[rng.integers(len(world.scenes))]
  # A stationary AR(1) walk around the scene: smooth, never-queried background.
  eps = rng.normal(size=(num_frames, spec.latent_dim)) / np.sqrt(spec.latent_dim)
  gain = np.sqrt(1 - _AR**2)
  # Imported here: a slow import that only generating data needs, not every reader's start.
  import scipy.signal  # pylint: disable=g-import-not-at-top
  walk, _ = scipy.signal.lfilter([gain], [1, -_AR], eps, axis=0, zi=(1 - gain) * eps[:1])
  latent = spec.clutter * (scene + spec.background_drift * walk)
  labels = [None] * num_frames
  for _ in range(int(rng.integers(spec.distractors_per_video[0], spec.distractors_per_video[1] + 1))):
    pair = world.distractors[rng.integers(len(world.distractors))]
    span = _span(rng, spec, num_frames)
    _plant(latent, _unit(world.concepts[pair].sum(0)), span, spec.moment_strength)
    _label(labels, pair, span)
  # Moments are planted after (over) the distractors and never overlap each other; a
  # moment that finds no free room is left out (long first moments leave fewer).
  moments = []
  for _ in range(int(rng.integers(spec.moments_per_video[0], spec.moments_per_video[1] + 1))):
    pair = rng.choice(len(world.concepts), size=2, replace=False)
    span = _free_span(rng, spec, num_frames, [m[1] for m in moments])
    if span is None:
      break
    _plant(latent, _unit(world.concepts[pair].sum(0)), span, spec.moment_strength)
    _label(labels, pair, span)
    moments.append((pair, span))
  return latent, moments, {label for label in labels if label is not None}


def _query(rng: np.random.Generator, spec: Spec, world: _World, pair: np.ndarray):
  """Token latents `[n, latent_dim]` and a readable caption for a moment's concept pair."""
  n = int(rng.integers(spec.query_tokens[0], spec.query_tokens[1] + 1))
  content = rng.random(n) < spec.content_word_prob
  content[rng.choice(n, size=2, replace=False)] = True  # both concepts are always named
  words = np.where(content, rng.choice(pair, size=n), -1 - rng.integers(spec.num_function_words, size=n))
  first = np.flatnonzero(content)
  words[first[:2]] = pair
  latent = np.where(content[:, None], world.concepts[np.maximum(words, 0)],
                    world.function_words[np.maximum(-1 - words, 0)])
  latent = latent + rng.normal(size=latent.shape) * spec.word_noise / np.sqrt(spec.latent_dim)
  latent = (1 - spec.sentence_context) * latent + spec.sentence_context * latent.mean(0)
  text = ' '.join(f'c{w}' if w >= 0 else f'f{-1 - w}' for w in words)
  return latent, text


def _project(latents: list[np.ndarray], fn) -> list[np.ndarray]:
  """`fn` applied to all latents at once (one large matmul), split back per item."""
  out = fn(np.concatenate(latents)).astype(np.float32)
  return np.split(out, np.cumsum([len(x) for x in latents])[:-1])


def generate(spec: Spec, seed: int = 0) -> dict[str, SplitData]:
  """Generates every split (deterministic in `(spec, seed)`)."""
  world = _World(spec, np.random.default_rng([seed, 0]))
  out = {}
  for split_index, (name, count) in enumerate(zip(_SPLITS, spec.num_videos)):
    rng = np.random.default_rng([seed, 1 + split_index])
    data = SplitData({}, [], {}, {})
    for v in range(count):
      video_id = f'{name}{v:05d}'
      latent, moments, content = _video(rng, spec, world)
      data.videos[video_id] = latent
      data.video_concepts[video_id] = content
      duration = len(latent) * spec.seconds_per_frame
      num_queries = int(rng.integers(spec.queries_per_video[0], spec.queries_per_video[1] + 1))
      # Every moment gets a query before any gets a second one.
      targets = [moments[i % len(moments)] for i in rng.permutation(num_queries)]
      for q, (pair, (start, end)) in enumerate(targets):
        cap_id = f'{video_id}#{q}'
        tokens, text = _query(rng, spec, world, pair)
        data.captions.append((cap_id, text))
        data.caption_features[cap_id] = tokens
        data.moments[cap_id] = (start * spec.seconds_per_frame, end * spec.seconds_per_frame, duration)
        data.query_concepts[cap_id] = tuple(sorted(int(c) for c in pair))
    w_visual = world.w_visual.astype(np.float32)
    noise = lambda n: rng.standard_normal((n, spec.visual_dim), np.float32) * spec.frame_noise
    if spec.joint_space:
      frames = _project(list(data.videos.values()),
                        lambda h: h.astype(np.float32) @ w_visual + noise(len(h)))
      tokens = _project(list(data.caption_features.values()), lambda h: h @ world.w_visual)
    else:
      frames = _project(list(data.videos.values()), lambda h: np.maximum(
          h.astype(np.float32) @ w_visual + world.b_visual + noise(len(h)), 0))
      tokens = _project(list(data.caption_features.values()), lambda h: np.tanh(h @ world.w_query))
    data.videos = dict(zip(data.videos, frames))
    data.caption_features = dict(zip(data.caption_features, tokens))
    # Caption files are not grouped by video (the order the eval pipeline must restore).
    order = rng.permutation(len(data.captions))
    data.captions = [data.captions[i] for i in order]
    out[name] = data
  return out


def dense_ground_truth(split: SplitData) -> list[tuple[str, list[str]]]:
  """`[(cap_id, positive video ids)]` in caption-file order: every video whose frames hold the
  query's concept pair at full weight (a planted moment, or a distractor of the same pair that
  no moment covers entirely) is a positive; the query's own video first, the others in video
  order. Honest by construction: the query's content is planted in each of them."""
  holders: dict[tuple[int, int], list[str]] = {}
  for video_id, content in split.video_concepts.items():
    for pair in content:
      holders.setdefault(pair, []).append(video_id)
  out = []
  for cap_id, _ in split.captions:
    own = release_lib.video_id_of(cap_id)
    videos = holders.get(split.query_concepts[cap_id], [])
    if own not in videos:  # a query's moment is never overwritten (moments do not overlap)
      raise AssertionError(f'synthetic: query {cap_id} has lost its moment')
    out.append((cap_id, [own] + [v for v in videos if v != own]))
  return out


def write_dense(split: SplitData, folder: str) -> tuple[str, str]:
  """Writes `split`'s dense multi-ground-truth files into `folder` in prvr-ea's layout
  (`syntheticdenseval.caption.txt`: the split's captions; `syntheticdenseval.gt.jsonl`: one
  `{"query_id", "caption", "gt_video_ids"}` line per query, `dense_ground_truth`); returns
  (caption file, ground-truth file)."""
  from prvr_jax.data import dense_gt  # pylint: disable=g-import-not-at-top
  stem = os.path.join(folder, dense_gt.default_stem(COLLECTION))
  caption_path, gt_path = stem + dense_gt.CAPTION_SUFFIX, stem + dense_gt.GT_SUFFIX
  release_lib.write_captions(caption_path, split.captions)
  text = dict(split.captions)
  with open(gt_path, 'w', encoding='utf-8') as f:
    for cap_id, videos in dense_ground_truth(split):
      f.write(json.dumps({'query_id': cap_id, 'caption': text[cap_id], 'gt_video_ids': videos})
              + '\n')
  return caption_path, gt_path


def write_mssl(data: dict[str, SplitData] | Callable[[], dict[str, SplitData]], root: str,
               text_feature: str = 'roberta') -> str:
  """Writes the release layout under `root` (MS-SL's, or AMDNet's CLIP layout with sentence
  vectors for `text_feature='clip'`) with moment spans and the test split's dense ground truth
  (`write_dense`); returns the collection folder. `data`
  may be the function that generates it, called once the folder is known to be new (a refusal
  then costs no generation)."""
  with release_lib.ReleaseWriter(root, COLLECTION, VISUAL_FEATURE, text_feature) as writer:
    if callable(data):
      data = data()
    for split in data.values():
      for video_id, frames in split.videos.items():
        writer.add_video(video_id, frames)
      for cap_id, tokens in split.caption_features.items():
        # The CLIP layout's sentence vector `[Dq]`: the mean of the query's tokens.
        writer.add_caption_features(
            cap_id, tokens.mean(axis=0, dtype=np.float32) if text_feature == 'clip' else tokens)
    for name, split in data.items():
      writer.write_captions(name, split.captions)
      # Six significant digits, the benchmark's precision.
      writer.write_moments(name, ((c, *(float(f'{t:.6g}') for t in split.moments[c]))
                                  for c, _ in split.captions))
  write_dense(data[DENSE_SPLIT], writer.collection_dir)  # prvr-ea's place: the collection folder
  return writer.collection_dir


def write_shards(spec: Spec, out_dir: str, seed: int = 0, num_shards: int = 0,
                 text_feature: str = 'roberta') -> str:
  """Generates the benchmark and writes its shard folder `out_dir` (sentence vectors, one
  query token, for `text_feature='clip'`) with the test split's dense ground truth
  (`write_dense`); returns it."""
  from prvr_jax.data import prepare  # pylint: disable=g-import-not-at-top
  if text_feature not in release_lib.TEXT_FEATURES:
    raise ValueError(f'config.data.text_feature must be one of {release_lib.TEXT_FEATURES}, '
                     f'got {text_feature!r}')
  clip = text_feature == 'clip'
  # A new folder beside out_dir (removed at the end): never one of the user's.
  parent, name = os.path.split(os.path.abspath(out_dir))
  os.makedirs(parent, exist_ok=True)
  release_root = tempfile.mkdtemp(prefix=f'.{name}.release-', dir=parent)
  try:
    prepare.check_out(release_root, out_dir)  # before generating
    data = generate(spec, seed)
    write_mssl(data, release_root, text_feature)
    prepare.prepare_shards(release_root, out_dir, collection=COLLECTION,
                           visual_feature=None if clip else VISUAL_FEATURE,
                           text_feature=text_feature, splits=_SPLITS,
                           max_query_len=1 if clip else preprocess.MAX_QUERY_LEN,
                           num_clips=spec.num_clips, max_frames=spec.max_frames,
                           visual_dim=spec.visual_dim, query_dim=spec.query_dim,
                           num_shards=num_shards)
    write_dense(data[DENSE_SPLIT], out_dir)
  finally:
    shutil.rmtree(release_root, ignore_errors=True)
  return out_dir


def shard_dir_of(size: str | Spec, out_dir: str, seed: int = 0, text_feature: str = 'roberta'
                 ) -> str:
  """`<out_dir>/<size>-seed<seed>` (`-<text_feature>` appended unless 'roberta'): where
  `ensure` puts the benchmark `(size, seed, text_feature)`."""
  name = size if isinstance(size, str) else 'custom'
  suffix = '' if text_feature == 'roberta' else f'-{text_feature}'
  return os.path.join(out_dir, f'{name}-seed{seed}{suffix}')


def _generated_here(shard_dir: str, stamp_path: str) -> bool:
  """Whether `shard_dir` is one `ensure` may replace: empty, stamped by it, or a shard folder
  of this benchmark (`prepare`'s manifest: a generation killed before its stamp)."""
  if os.path.islink(shard_dir) or not os.path.isdir(shard_dir):
    return False
  if not os.listdir(shard_dir):
    return True
  found = []
  for path in (stamp_path, os.path.join(shard_dir, shard_format.MANIFEST)):
    try:
      with open(path, encoding='utf-8') as f:
        found.append(json.load(f))
    except (OSError, ValueError):
      found.append(None)
  stamp, manifest = (x if isinstance(x, dict) else {} for x in found)
  settings = manifest.get('preprocessing')
  return 'generator_version' in stamp or (
      manifest.get('format') == shard_format.FORMAT and isinstance(settings, dict)
      and settings.get('collection') == COLLECTION)


def ensure(size: str | Spec, out_dir: str, seed: int = 0, text_feature: str = 'roberta') -> str:
  """The shard folder (`shard_dir_of`) of the benchmark `(size, seed, text_feature)`, generated
  once: a folder stamped with the same generator version, spec, seed and text feature is kept."""
  if not isinstance(size, Spec) and size not in SIZES:
    raise ValueError(f'unknown synthetic size {size!r}; expected one of {sorted(SIZES)} '
                     '(config.data.synthetic_size)')
  spec = size if isinstance(size, Spec) else SIZES[size]
  shard_dir = shard_dir_of(size, out_dir, seed, text_feature)
  stamp_path = os.path.join(shard_dir, 'synthetic.json')
  stamp = {'generator_version': GENERATOR_VERSION, 'seed': seed,
           'spec': dataclasses.asdict(spec)}
  if text_feature != 'roberta':
    stamp['text_feature'] = text_feature
  if os.path.isfile(stamp_path):
    with open(stamp_path, encoding='utf-8') as f:
      if json.load(f) == json.loads(json.dumps(stamp)):
        return shard_dir
  if os.path.lexists(shard_dir):
    if not _generated_here(shard_dir, stamp_path):
      raise FileExistsError(
          f'{shard_dir} exists but holds no synthetic benchmark (no synthetic.json or shard '
          f'{shard_format.MANIFEST}); move it away, or choose another folder for the benchmark')
    shutil.rmtree(shard_dir)
  _log.info('generating the synthetic benchmark into %s', shard_dir)
  write_shards(spec, shard_dir, seed, text_feature=text_feature)
  with open(stamp_path, 'w', encoding='utf-8') as f:
    json.dump(stamp, f, indent=1)
  return shard_dir
