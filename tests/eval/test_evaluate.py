"""evaluate.py on official PyTorch checkpoints gives the official scores; eval chunking."""

import json

import jax
import numpy as np
import pytest

import support
from support import OFFICIAL, load_config, run_cli

RELEASE = OFFICIAL / 'tiny_release'
SCORE_RTOL = 1e-5
# Per model: (release folder, collection, extra flags). AMDNet reads the tiny CLIP release.
RELEASES = {
    'gmmformer': (RELEASE, 'tiny', ['--config.data.visual_feature=i3d_tiny']),
    'gmmformer_v2': (RELEASE, 'tiny', ['--config.data.visual_feature=i3d_tiny']),
    'ms_sl': (RELEASE, 'tiny', ['--config.data.visual_feature=i3d_tiny']),
    'amdnet': (OFFICIAL / 'tiny_clip_release', 'tinyclip', []),
}


def _caption_file_order(split: str, release=RELEASE, collection='tiny'
                        ) -> tuple[list[str], list[str]]:
  """Caption ids in file order and video ids in first-appearance order."""
  lines = (release / collection / 'TextData' / f'{collection}{split}.caption.txt'
           ).read_text().splitlines()
  cap_ids = [line.split(' ', 1)[0] for line in lines if line.strip()]
  videos = list(dict.fromkeys(c.split('#', 1)[0] for c in cap_ids))
  return cap_ids, videos


@pytest.mark.parametrize('model', list(RELEASES))
def test_official_checkpoint_parity_through_cli(model, tmp_path, xla_cache):
  """Release folder -> shards -> evaluator with an official checkpoint = the official
  validation's scores (MS-SL and AMDNet: the minimally repaired official code)."""
  support.require_tensorflow()
  out = tmp_path / 'eval'
  release, collection, flags = RELEASES[model]
  # The fixture's dims (see tests/fixtures/README.md) on the tiny release folder.
  run_cli('evaluate.py', f'--config=configs/{model}.py:tiny', '--config.model.visual_dim=48',
          '--config.model.query_dim=40', '--config.model.hidden_dim=32',
          f'--config.data.dir={release}', f'--config.data.collection={collection}',
          # The fixtures' train and test splits share videos (see their README).
          '--config.data.allow_split_overlap=True', *flags,
          '--config.eval.video_batch_size=100', '--config.eval.query_batch_size=50',
          f'--checkpoint={OFFICIAL / f"{model}_best.ckpt"}', '--split=test',
          f'--output_dir={out}', cache_dir=xla_cache)
  official = np.load(OFFICIAL / f'tiny_scores_{model}.npz')
  cap_ids, video_ids = _caption_file_order('test', release, collection)
  assert list(official['cap_ids']) == cap_ids and list(official['video_ids']) == video_ids
  scores = np.load(out / 'scores.npy')
  assert scores.shape == official['scores'].shape
  # Fused cosine scores, O(1) (max 0.45 / 0.61): 1e-5 of the magnitude, as the in-process
  # parity test (test_parity.py) checks the same scores.
  support.assert_close(scores, official['scores'], rtol=SCORE_RTOL)
  metrics = json.loads((out / 'metrics.json').read_text())
  if 'metric_names' in official:
    assert [str(n) for n in official['metric_names']] == ['R1', 'R5', 'R10', 'R100', 'SumR']
  ours = [metrics[k] for k in ('r1', 'r5', 'r10', 'r100', 'sumr')]
  # Equal ranks give equal metrics (percentages of counts, float64). The ranks cannot flip
  # within the score tolerance: where a rank sits at a recall boundary K, the score gap to the
  # neighbour that could cross it exceeds the sum of their tolerances by >= 250x (v1) and
  # >= 52x (v2) (tests/fixtures/official/tiny_scores_*.npz, rtol 1e-5).
  support.assert_close(ours, official['metrics'], rtol=1e-12)
  assert metrics['checkpoint_source'] == 'official' and metrics['split'] == 'test'
  # What produced the numbers: an official file has no step nor recorded training data.
  assert metrics['checkpoint_step'] is None and metrics['trained_on'] is None
  assert len(metrics['params_sha256']) == 64 and metrics['model'] == model
  assert len(metrics['config_sha256']) == 16 and 'test' in metrics['data']['splits']
  assert 'v2t_sumr' in metrics


def _video_batches(frame_counts, chunk, dims):
  """Global-view eval video batches of `chunk` consecutive videos with the given lengths."""
  rng = np.random.default_rng(0)
  lc, lf, dv = dims
  batches = []
  for start in range(0, len(frame_counts), chunk):
    counts = frame_counts[start:start + chunk]
    mask = (np.arange(lf)[None] < np.asarray(counts)[:, None]).astype(np.float32)
    batches.append({
        'clip_feats': rng.normal(size=(len(counts), lc, dv)).astype(np.float32),
        'frame_feats': rng.normal(size=(len(counts), lf, dv)).astype(np.float32) * mask[..., None],
        'frame_mask': mask,
        'video_index': np.arange(start, start + len(counts))})
  return batches


def test_v1_chunks_are_the_official_batches():
  """GMMFormer's frame windows follow each chunk's longest video; the padding rows added
  to fill the devices do not change it; chunks must be consecutive columns."""
  from prvr_jax import models, parallel  # pylint: disable=g-import-not-at-top
  from prvr_jax.eval import Evaluator  # pylint: disable=g-import-not-at-top
  config = load_config('gmmformer', 'tiny')
  config.model.visual_dim, config.model.hidden_dim = 16, 16
  spec = models.get_spec(config.model)
  model = spec.build(config.model)
  # Larger weights than the init so that attention logits, hence the windows, matter.
  params = jax.jit(lambda key: jax.tree.map(
      lambda x: 8 * x, spec.init_params(config.model, key)))(jax.random.PRNGKey(0))
  dims = (config.model.num_clips, config.model.max_frames, config.model.visual_dim)
  batches = _video_batches([5, 40, 12, 7, 90, 3], chunk=3, dims=dims)
  encode = jax.jit(lambda videos: model.apply({'params': params}, videos,
                                              method='encode_videos'))
  evaluator = Evaluator(config.model, parallel.make_mesh(), video_batch_size=3,
                        query_batch_size=4)
  gallery = evaluator.encode_gallery(params, batches)
  videos, columns = jax.device_get(gallery.encodings), gallery.keys
  for batch in batches:
    expected = encode({k: batch[k] for k in ('clip_feats', 'frame_feats', 'frame_mask')})
    rows = np.flatnonzero(np.isin(columns, batch['video_index']))
    for key in ('clips', 'video'):
      # The same encoder on the same inputs, padded to another batch size and sharded: the
      # rounding differs between programs (and CPU kinds). Values of magnitude ~8-13 (weights
      # x 8); reductions over <= 128 frames, ~4 chained ops.
      support.assert_close(np.asarray(videos[key])[rows], expected[key],
                           rtol=support.f32_rtol(128, ops=4), err_msg=key)
  # The same videos in one batch get other windows (the longest is 90 frames, not 40).
  together = encode({k: np.concatenate([b[k] for b in batches])
                     for k in ('clip_feats', 'frame_feats', 'frame_mask')})
  first = np.flatnonzero(np.isin(columns, batches[0]['video_index']))
  chunked = np.asarray(videos['video'])[first]
  # Far above the tolerance just used (5e-5 of the magnitude).
  assert np.abs(together['video'][:3] - chunked).max() > 1e-2 * np.abs(chunked).max()
  with pytest.raises(ValueError, match='consecutive chunks of 3 videos'):
    evaluator.encode_gallery(params, batches[::-1])
