"""T-MASS end to end through train.py's loop: CLIP (the tiny stand-in) fine-tuned on frame
folders and tokenised captions (`config.data.source='frames'`), then evaluated."""

import json
import os

import h5py
import jax
import numpy as np
import pytest

import support
tf = support.require_tensorflow()

from prvr_jax import checkpoint, models, parallel, train
from prvr_jax.clip import tokenizer
from prvr_jax.data import text_video
from prvr_jax.data import text_video_features
from prvr_jax.data.release import DataError
from prvr_jax.data import protocol

# A hand-made BPE vocabulary: 512 byte tokens, these merges, SOT, EOT (ids < 1024 = the tiny
# CLIP's vocabulary).
MERGES = ['c a', 'ca t</w>', 'd o', 'do g</w>']


def _dataset(root):
  """An MSR-VTT-shaped dataset: 2 training videos (4 captions), 2 test videos, 3 frames each."""
  anno, frames = root / 'anno', root / 'frames'
  os.makedirs(anno)
  (anno / 'MSRVTT_train.9k.csv').write_text('video_id\nvideo3\nvideo1\n')
  (anno / 'MSRVTT_JSFUSION_test.csv').write_text(
      'key,vid_key,video_id,sentence\nret0,msr9,video9,a dog running\nret1,msr8,video8,a cat\n')
  sentences = [{'caption': c, 'video_id': v, 'sen_id': i} for i, (c, v) in enumerate(
      [('a cat', 'video1'), ('a dog', 'video3'), ('the cat sits', 'video1'),
       ('dog runs', 'video3')])]
  (anno / 'MSRVTT_data.json').write_text(json.dumps({'videos': [], 'sentences': sentences}))
  rng = np.random.default_rng(0)
  for video in ('video1', 'video3', 'video8', 'video9'):
    os.makedirs(frames / video)
    for i in range(3):
      image = rng.integers(0, 256, size=(40, 48, 3), dtype=np.uint8)
      (frames / video / f'{i:03d}.png').write_bytes(tf.io.encode_png(image).numpy())
  return str(anno), str(frames), tokenizer.write_vocab(root / 'vocab.txt.gz', MERGES)


@pytest.mark.slow
@pytest.mark.filterwarnings('ignore::DeprecationWarning')
def test_training_on_frames_fine_tunes_clip_and_evaluates(tmp_path):
  annotations, frames, vocab = _dataset(tmp_path)
  config = support.load_config('tmass', 'tiny')
  config.model.update(backbone='tiny', num_frames=3)
  config.data.update(source='frames', collection='msrvtt', annotations=annotations,
                     frames_dir=frames, clip_vocab=vocab)
  config.train.update(batch_size=2, num_epochs=1)
  config.eval.update(video_batch_size=2, query_batch_size=2)
  workdir = str(tmp_path / 'run')
  # The cheap data check runs first: a 2-video MSR-VTT is not the published release.
  with pytest.raises(DataError, match=r'MSRVTT_train.9k.csv.*2 videos and 4 captions.*9,000'):
    train.train_and_evaluate(config, workdir)
  config.data.check_published = False  # a subset: compared with no catalogue entry
  out = train.train_and_evaluate(config, workdir)
  # CLIP is fine-tuned: both towers moved from their initialisation (at the backbone lr).
  spec = models.get_spec(config.model)
  params_rng, _ = jax.random.split(jax.random.PRNGKey(config.train.seed))
  initial = jax.jit(lambda k: spec.init_params(config.model, k))(params_rng)
  trained, _ = checkpoint.load_params(workdir, config, parallel.make_mesh())
  for tower in ('visual', 'text'):
    moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()),
                         trained[tower], initial[tower])
    assert max(jax.tree.leaves(moved)) > 0, tower
  assert out['num_queries'] == 2 and out['num_videos'] == 2
  assert out['r1'] in (0.0, 50.0, 100.0) and np.isfinite(out['meanr'])
  with open(os.path.join(workdir, 'test_metrics.json')) as f:
    assert json.load(f)['sumr'] == out['sumr']
  # Two steps of one epoch ran on (frames, tokens) pairs: 4 captions / batch 2.
  with open(os.path.join(workdir, 'metrics.jsonl')) as f:
    steps = [json.loads(line) for line in f if '"train"' in line]
  assert steps and all(np.isfinite(s['loss']) for s in steps)


def test_feature_release_trains_on_caption_pairs(tmp_path):
  """`config.data.train_pairs`: one (video, caption) pair per caption, row i caption i with its
  own video, as the official loader (not the PRVR video-with-all-captions batches)."""
  annotations, _, _ = _dataset(tmp_path)
  splits = text_video.read_splits('msrvtt', annotations)
  rng = np.random.default_rng(1)
  frames = {v: rng.normal(size=(12, 32)).astype(np.float32)
            for v in ('video1', 'video3', 'video8', 'video9')}
  texts = {c: rng.normal(size=32).astype(np.float32) for s in splits.values()
           for c in s.caption_ids}
  for name, arrays in (('frames.h5', frames), ('text.h5', texts)):
    with h5py.File(tmp_path / name, 'w') as f:
      for k, x in arrays.items():
        f.create_dataset(k, data=x)
  text_video_features.write_feature_release(
      splits, tmp_path / 'frames.h5', tmp_path / 'text.h5', tmp_path / 'release', 'msrvtt', dim=32)
  config = support.load_config('tmass', 'tiny')
  config.data.update(dir=str(tmp_path / 'release'), collection='msrvtt', train_pairs=True)
  config.train.update(batch_size=2)
  data = protocol.FeaturePairData(None, protocol.Batching.from_config(config),
                                  release_dir=config.data.dir, collection='msrvtt')
  batches = data.train_batches(1, parallel.make_mesh())
  seen = []
  for _ in range(3):  # steps 1..3: the rest of epoch 0 and epoch 1
    batch = jax.device_get(next(batches))
    np.testing.assert_array_equal(batch['query_video'], [0, 1])
    assert batch['query_valid'].all()
    for row in range(2):
      caption = [c for c, t in texts.items() if np.array_equal(t, batch['query_feats'][row, 0])]
      video = splits['train'].captions[splits['train'].caption_ids.index(caption[0])][1]
      np.testing.assert_array_equal(batch['clip_feats'][row], frames[video])
      seen.append(caption[0])
  assert sorted(seen[2:]) == sorted(splits['train'].caption_ids)  # epoch 1: each caption once
