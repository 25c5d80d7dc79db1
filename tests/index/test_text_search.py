"""Search by text with spans: a collection of one's own videos (AMDNet's CLIP layout, an
extract manifest, no captions) indexed with `--split=all`, searched by text through a random
tiny CLIP; each hit's span is the best position's time range, equal to the `relevance` curve's
argmax; bad input is refused naming the model or the flag."""

import json
import os
import shutil

from flax.traverse_util import unflatten_dict
import jax
import numpy as np
import pytest

from prvr_jax import checkpoint as checkpoint_lib
from prvr_jax import clip
from prvr_jax import index as index_lib
from prvr_jax.clip import weights as clip_weights
from prvr_jax.data import release
from prvr_jax.index import IndexWriter
from prvr_jax.index import text_search
from prvr_jax.index.build import dequantized_rows
from prvr_jax.models import registry
import support

DIM = 32  # the tiny CLIP's embedding width
QUERY = 'a cat and a dog'
# Video id -> frame rows; 'target' holds the query's CLIP text vector at rows 6-8 of 12.
LENGTHS = {'target': 12, 'short': 5, 'long': 20, 'other': 12, 'plain': 9}
DURATIONS = {'target': 24.0, 'short': 5.0, 'long': 40.0, 'other': 6.0, 'plain': 9.0}


def _vocab(folder):
  """A CLIP BPE vocabulary of 512 byte tokens and a few merges (ids fit the tiny CLIP)."""
  return clip.tokenizer.write_vocab(folder / 'vocab.txt.gz',
                                    ['c a', 'ca t</w>', 'd o', 'do g</w>'])


@pytest.fixture(scope='module')
def collection(tmp_path_factory):
  """(root, vocab, the query's text vector): a collection as prvr-extract writes it."""
  folder = tmp_path_factory.mktemp('text_search')
  vocab = _vocab(folder)
  config, params = clip_weights.load_spec('random:tiny')
  tokens = clip.Tokenizer(vocab)([QUERY], config.context_length, truncate=True)
  text = np.asarray(clip.CLIP(config).apply({'params': params}, tokens,
                                            method='encode_text'))[0]
  rng = np.random.default_rng(0)
  videos = {v: rng.normal(size=(n, DIM)).astype(np.float32) for v, n in LENGTHS.items()}
  videos['target'][6:9] = text
  root = folder / 'videos'
  coll = release.write_release(str(root), 'mine', videos, {}, {}, visual_feature=None,
                               text_feature='clip')
  shutil.rmtree(os.path.join(coll, 'TextData'))  # prvr-extract writes no captions
  manifest = {'format': 'prvr_jax.extract/1', 'backbone': 'tiny', 'embed_dim': DIM, 'fps': 1.0,
              'image_size': 32, 'weights': {'path': 'random:tiny', 'sha256': ''},
              'videos': {v: {'source': f'/videos/{v}.mp4', 'kind': 'file',
                             'duration': DURATIONS[v], 'frames': n, 'rows': n,
                             'thumbnail': f'thumbnails/{v}.jpg'} for v, n in LENGTHS.items()},
              'skipped': {}}
  with open(os.path.join(coll, 'extract_manifest.json'), 'w', encoding='utf-8') as f:
    json.dump(manifest, f)
  return root, vocab, text


def _config(name, variant, root):
  config = support.load_config(name, variant)
  config.data.update(dir=str(root), collection='mine')
  config.eval.video_batch_size = 4
  return config


@pytest.fixture(scope='module')
def zero_shot_index(collection, tmp_path_factory):
  root, _, _ = collection
  config = _config('clip_zero_shot', 'tvr_clip,max', root)
  config.model.update(hidden_dim=DIM, visual_dim=DIM, query_dim=DIM, max_frames=16,
                      num_clips=4)
  out = tmp_path_factory.mktemp('zs') / 'index'
  return index_lib.build_from_checkpoint(config, None, 'all', str(out))


def test_own_videos_indexed_and_searched_by_text_with_spans(collection, zero_shot_index):
  root, vocab, _ = collection
  index = zero_shot_index
  assert sorted(index.ids) == sorted(LENGTHS)
  info = index.manifest['info']
  assert info['split'] == 'all' and info['data']['collection'] == 'mine'
  assert info['queries'] == {'text_feature': 'clip', 'normalize': False, 'max_query_len': 1,
                             'clip_vocab': None}
  # The stored frames are the data layer's rows: 'long' (20 rows) sampled to max_frames=16.
  rows = dequantized_rows(index)
  mask = rows['mask'][index.ids.index('long')]
  assert mask.sum() == 16
  searcher = text_search.TextSearcher(index.path, 'random:tiny', vocab=vocab)
  assert searcher.video_info('target') == {
      'duration': 24.0, 'source': '/videos/target.mp4',
      'thumbnail': os.path.join(str(root), 'mine', 'thumbnails', 'target.jpg')}
  hits = searcher.search([QUERY, 'dog'], k=3)
  assert [len(h) for h in hits] == [3, 3]
  best = hits[0][0]
  assert (best.video, best.rank) == ('target', 1)
  np.testing.assert_allclose(best.score, 1.0, rtol=1e-5)
  # Rows 6-8 of 12 hold the text: the span is their time range.
  assert best.fraction == (6 / 12, 9 / 12)
  np.testing.assert_allclose(best.span, (12.0, 18.0), rtol=1e-9)
  assert best.duration == 24.0
  assert [h.rank for h in hits[1]] == [1, 2, 3]
  assert all(h.span[0] < h.span[1] <= h.duration for q in hits for h in q)


def test_json_lines(collection, zero_shot_index):
  _, vocab, _ = collection
  searcher = text_search.TextSearcher(zero_shot_index.path, 'random:tiny', vocab=vocab)
  hits = searcher.search([QUERY], k=2)[0]
  line = json.loads(json.dumps(text_search.json_record(QUERY, hits, zero_shot_index.id)))
  assert line == {'query': QUERY, 'videos': [h.video for h in hits],
                  'scores': [round(h.score, 6) for h in hits],
                  'spans': [[12.0, 18.0], list(np.round(hits[1].span, 3))],
                  'span_fractions': [[0.5, 0.75], list(np.round(hits[1].fraction, 6))],
                  'durations': [24.0, hits[1].duration], 'index': zero_shot_index.id}
  hits[1].span = hits[1].fraction = None  # a model without spans / an unknown duration
  line = text_search.json_record('line 3', hits, None, text=QUERY)
  assert line['text'] == QUERY and line['spans'][1] is None
  assert line['span_fractions'][1] is None


@pytest.mark.end_to_end
def test_text_search_cli_json_lines(collection, zero_shot_index, tmp_path, xla_cache):
  """prvr-index build --split=all, then search --text: the index and lines of the API."""
  root, vocab, _ = collection
  support.run_cli('prvr_jax/tools/index.py', 'build',
                  f'--config={support.REPO / "configs" / "clip_zero_shot.py"}:tvr_clip,max',
                  f'--config.data.dir={root}', '--config.data.collection=mine', '--split=all',
                  *(f'--config.model.{k}={DIM}' for k in ('hidden_dim', 'visual_dim',
                                                          'query_dim')),
                  '--config.model.max_frames=16', '--config.model.num_clips=4',
                  f'--out={tmp_path / "index"}', cache_dir=xla_cache)
  built = index_lib.open_index(str(tmp_path / 'index'))
  assert built.manifest['params_fingerprint'] == zero_shot_index.manifest['params_fingerprint']
  # The same rows (the CLI's XLA flags may round the normalisation otherwise).
  support.assert_close(dequantized_rows(built)['frames'],
                       dequantized_rows(zero_shot_index)['frames'], rtol=support.f32_rtol(DIM))
  assert built.manifest['info']['videos'] == zero_shot_index.manifest['info']['videos']
  out = tmp_path / 'hits.jsonl'
  support.run_cli('prvr_jax/tools/index.py', 'search', f'--index={built.path}',
                  f'--text={QUERY}', '--text=dog', '--k=2', f'--clip_vocab={vocab}',
                  '--clip_weights=random:tiny',
                  f'--output={out}', cache_dir=xla_cache)
  lines = support.read_jsonl(out)
  assert [line['query'] for line in lines] == [QUERY, 'dog']
  assert set(lines[0]) == {'query', 'videos', 'scores', 'spans', 'span_fractions',
                           'durations', 'index'}
  assert lines[0]['videos'][0] == 'target' and lines[0]['spans'][0] == [12.0, 18.0]
  assert lines[0]['span_fractions'][0] == [0.5, 0.75]
  assert lines[0]['durations'][0] == 24.0 and lines[0]['index'] == built.id


def test_bounded_inputs(collection, zero_shot_index):
  _, vocab, _ = collection
  searcher = text_search.TextSearcher(zero_shot_index.path, 'random:tiny', vocab=vocab)
  for k in (0, len(LENGTHS) + 1):
    with pytest.raises(ValueError, match=f'--k={k}: expected 1 <= k <= {len(LENGTHS)}'):
      searcher.search(['dog'], k=k)
  with pytest.raises(ValueError, match='query #1 is'):
    searcher.search(['dog', '  '], k=1)
  with pytest.raises(ValueError, match='characters; at most'):
    searcher.search(['dog ' * 1000], k=1)
  with pytest.raises(ValueError, match='queries in one search'):
    searcher.search(['dog'] * (text_search.MAX_QUERIES + 1), k=1)
  # A long text is truncated to CLIP's context, as CLIP does.
  assert len(searcher.search(['dog ' * 100], k=1)[0]) == 1
  with pytest.raises(KeyError, match='not in index'):
    searcher.video_info('absent')
  with pytest.raises(ValueError, match='expected random:<backbone>'):
    text_search.TextSearcher(zero_shot_index.path, 'random:huge', vocab=vocab).search(['a'], 1)


@pytest.fixture(scope='module', params=['gmmformer_v2', 'ms_sl'])
def trained_index(collection, tmp_path_factory, request):
  """A model on CLIP features at tiny dims, random parameters, from a 'checkpoint' (GMMFormer
  v2: one clip per span; MS-SL: a multi-scale clip, several)."""
  root, _, _ = collection
  config = _config(request.param, 'tvr_clip', root)
  config.model.update(hidden_dim=DIM, visual_dim=DIM, query_dim=DIM, num_clips=12,
                      max_frames=16)
  params, index = _random_checkpoint_index(config, tmp_path_factory.mktemp('trained'))
  return config, params, index


def _random_checkpoint_index(config, folder):
  """(params, index of every video of the collection): random parameters handed over as a
  checkpoint's (the checkpoint readers have their own tests)."""
  spec = registry.get_spec(config.model)
  params = jax.jit(lambda key: spec.init_params(config.model, key))(jax.random.key(1))
  monkey = pytest.MonkeyPatch()
  monkey.setattr(checkpoint_lib, 'load_params', lambda path, config, mesh: (params, {
      'source': 'prvr_jax', 'path': path, 'workdir': None, 'step': 3, 'data': None}))
  try:
    index = index_lib.build_from_checkpoint(config, str(folder / 'run'), 'all',
                                            str(folder / 'index'))
  finally:
    monkey.undo()
  return params, index


def test_trained_model_span_is_the_relevance_argmax(collection, trained_index):
  root, vocab, _ = collection
  config, params, index = trained_index
  assert index.manifest['info']['queries']['normalize']  # the *_clip variants normalise
  searcher = text_search.TextSearcher(index.path, 'random:tiny', vocab=vocab)
  texts = [QUERY, 'a dog']
  hits = searcher.search(texts, k=len(LENGTHS))
  # Each hit's span against the model's own relevance curve over the video's clips.
  rel = release.Release(str(root), 'mine', None, 'clip', num_clips=12, max_frames=16,
                        videos_only=True)
  split = rel.split(release.ALL_SPLIT)
  spec = registry.get_spec(config.model)
  module = spec.build(config.model)
  queries = searcher.query_inputs_of(texts)
  pairs = [(q, hit) for q, found in enumerate(hits) for hit in found]
  clips = np.zeros((len(pairs), 12, DIM), np.float32)
  frames = np.zeros((len(pairs), 16, DIM), np.float32)
  mask = np.zeros((len(pairs), 16), np.float32)
  for row, (_, hit) in enumerate(pairs):
    clips[row], video_frames = split.video_features(hit.video)
    frames[row, :len(video_frames)], mask[row, :len(video_frames)] = video_frames, 1
  rows = np.array([q for q, _ in pairs])
  curves = jax.jit(lambda p, q, v: module.apply({'params': p}, q, v, method=spec.relevance))(
      params, {k: v[rows] for k, v in queries.items()},
      {'clip_feats': clips, 'frame_feats': frames, 'frame_mask': mask})['clip cosine']
  widths = set()
  for (_, hit), curve in zip(pairs, np.asarray(curves)):
    # The span starts at the curve's argmax and covers positions of the best score only.
    best = int(np.argmax(curve))
    first, end = round(hit.fraction[0] * 12), round(hit.fraction[1] * 12)
    assert first == best and np.all(curve[first:end] >= curve[best] - 1e-5), (hit, curve)
    np.testing.assert_allclose(hit.span, np.array(hit.fraction) * DURATIONS[hit.video])
    widths.add(end - first)
  # GMMFormer v2: one clip each; MS-SL's best multi-scale clips are wider at times.
  assert widths == {1} if spec.name == 'gmmformer_v2' else max(widths) > 1
  for found in hits:
    scores = [hit.score for hit in found]
    assert scores == sorted(scores, reverse=True)


def test_roberta_model_refused_naming_it(trained_index, tmp_path):
  config, params, index = trained_index
  writer = IndexWriter(str(tmp_path / 'roberta'), config.model, params,
                       info={'queries': {'text_feature': 'roberta'}})
  writer.add(unflatten_dict(dequantized_rows(index), sep='/'), list(index.ids))
  writer.close()
  with pytest.raises(ValueError, match=f'model {config.model.name} reads roberta query features'):
    text_search.TextSearcher(str(tmp_path / 'roberta'), 'random:tiny')


def test_bad_extract_manifest_named(tmp_path):
  from prvr_jax.data import collection as collection_lib  # pylint: disable=g-import-not-at-top
  assert collection_lib.read_extract_manifest(str(tmp_path)) is None  # none: a release
  (tmp_path / 'extract_manifest.json').write_text(json.dumps(
      {'format': 'prvr_jax.extract/1', 'videos': {'v': {'duration': 'long'}}}))
  with pytest.raises(release.DataError, match=r'extract_manifest.json: .*(duration|backbone)'):
    collection_lib.read_extract_manifest(str(tmp_path))


def test_all_videos_of_a_release_with_moments(tmp_path):
  """`--split=all` of a release: every video of its feature file (captioned or not), each
  duration from the moments files."""
  from prvr_jax.data import collection as collection_lib  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(1)
  videos = {v: rng.normal(size=(3, 4)).astype(np.float32) for v in ('a', 'b', 'c')}
  with release.ReleaseWriter(str(tmp_path), 'rel', None, 'clip') as writer:
    for video_id, frames in videos.items():
      writer.add_video(video_id, frames)
    writer.write_captions('test', [('a#0', 'a cat'), ('b#0', 'a dog')])
    for cap_id in ('a#0', 'b#0'):
      writer.add_caption_features(cap_id, rng.normal(size=4))
    writer.write_moments('test', [('a#0', 1.0, 2.0, 7.5)])
  rel = release.Release(str(tmp_path), 'rel', None, 'clip', num_clips=2, max_frames=4,
                        videos_only=True)
  split = rel.split(release.ALL_SPLIT)
  assert split.video_ids == ['a', 'b', 'c'] and split.caption_ids == []
  clips, frames = split.video_features('c')
  assert clips.shape == (2, 4) and np.array_equal(frames, videos['c'])
  assert collection_lib.video_info(rel, split.video_ids) == {
      'a': {'duration': 7.5, 'source': None, 'thumbnail': None}}
  with pytest.raises(ValueError, match="split 'test': a videos-only collection"):
    rel.split('test')


def test_cross_dataset_with_all_is_refused(collection, tmp_path):
  """--split=all never compares the collection with the training data: --cross_dataset there
  would be a flag that does nothing, so it is refused by name."""
  root, _, _ = collection
  config = _config('clip_zero_shot', 'tvr_clip,max', root)
  with pytest.raises(ValueError, match='--cross_dataset with --split=all'):
    index_lib.build_from_checkpoint(config, None, 'all', str(tmp_path / 'index'),
                                    cross_dataset=True)
  assert not (tmp_path / 'index').exists()


def test_amdnet_span_is_its_learned_span(collection, tmp_path):
  """AMDNet: each hit's span is the learned span (centre +- width / 2) whose moment the text
  matches best, from the video's rows re-read from the collection; without the collection,
  the best moment-enhanced clip."""
  root, vocab, _ = collection
  config = _config('amdnet', 'tvr_clip', root)
  config.model.update(hidden_dim=DIM, visual_dim=DIM, query_dim=DIM, num_clips=12,
                      max_frames=16)
  params, index = _random_checkpoint_index(config, tmp_path)
  searcher = text_search.TextSearcher(index.path, 'random:tiny', vocab=vocab)
  hits = searcher.search([QUERY], k=len(LENGTHS))[0]
  split = release.Release(str(root), 'mine', None, 'clip', num_clips=12, max_frames=16,
                          normalize=True, videos_only=True).split(release.ALL_SPLIT)
  clips = np.stack([split.video_features(hit.video)[0] for hit in hits])
  queries = {k: np.repeat(v, len(hits), axis=0)
             for k, v in searcher.query_inputs_of([QUERY]).items()}
  module = registry.get_spec(config.model).build(config.model)
  expected = np.asarray(module.apply({'params': params}, queries, {'clip_feats': clips},
                                     method='learned_spans'))
  support.assert_close(np.array([hit.fraction for hit in hits]), expected, 1e-5)
  assert np.all((expected >= 0) & (expected <= 1)) and np.all(expected[:, 1] > expected[:, 0])
  for hit in hits:
    np.testing.assert_allclose(hit.span, np.array(hit.fraction) * DURATIONS[hit.video])
  # The collection gone: the best clip's range, one clip wide.
  moved = tmp_path / 'moved'
  shutil.copytree(root, moved)
  shutil.rmtree(root / 'mine')
  try:
    again = text_search.TextSearcher(index.path, 'random:tiny', vocab=vocab).search(
        [QUERY], k=len(LENGTHS))[0]
  finally:
    shutil.copytree(moved / 'mine', root / 'mine')
  assert [h.video for h in again] == [h.video for h in hits]
  assert all(round((h.fraction[1] - h.fraction[0]) * 12) >= 1 for h in again)
  assert [h.fraction for h in again] != [h.fraction for h in hits]
