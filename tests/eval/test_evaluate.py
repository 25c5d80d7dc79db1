"""evaluate.py on official PyTorch checkpoints gives the official scores; eval chunking."""

import json
import pathlib

import jax
import numpy as np
import pytest

import official_release
import support
from support import OFFICIAL, load_config, run_cli

SCORE_RTOL = 1e-5
VARIANTS = ['tvr', 'activitynet', 'charades']
# The (model, variant) runs of evaluate.py: one per distinct evaluation model config among a
# model's variants (`test_cli_cases_cover_every_variant`): GMMFormer v2's temperature is
# 0.09 (tvr) or 0.6, MS-SL's branch weights 0.7 / 0.3 or 0.5 / 0.5 (charades); the other
# variants differ in training settings only. tests/models/test_parity.py checks every
# (model, variant) against the same fixtures in-process.
CLI_CASES = [('gmmformer', 'charades'), ('gmmformer_v2', 'tvr'), ('gmmformer_v2', 'charades'),
             ('ms_sl', 'tvr'), ('ms_sl', 'charades'), ('amdnet', 'charades')]
# Per model: (release layout, extra flags). Our evaluation batches differ from the official
# ones (20 videos, 15 queries; tests/official_release.py) and cross batch boundaries too: the
# configs' 50 videos (v2, MS-SL; 54 test videos = 50 + 4) and 50 queries (all models), AMDNet
# 32 videos. GMMFormer v1 encodes a video differently in another batch (its frame windows
# follow the batch's longest video), so it is evaluated on the official chunks of 20.
RELEASES = {
    'gmmformer': ('token', ['--config.eval.video_batch_size=20']),
    'gmmformer_v2': ('token', []),
    'ms_sl': ('token', []),
    'amdnet': ('clip', ['--config.eval.video_batch_size=32']),
}


def _caption_file_order(folder: pathlib.Path, collection: str
                        ) -> tuple[list[str], list[str]]:
  """Test caption ids in file order and video ids in first-appearance order."""
  lines = (folder / 'TextData' / f'{collection}test.caption.txt').read_text().splitlines()
  cap_ids = [line.split(' ', 1)[0] for line in lines if line.strip()]
  videos = list(dict.fromkeys(c.split('#', 1)[0] for c in cap_ids))
  return cap_ids, videos


@pytest.fixture(scope='module')
def multibatch_release(tmp_path_factory):
  """layout -> (collection folder, digest) of the multi-batch release, written once."""
  root = str(tmp_path_factory.mktemp('multibatch'))
  return {layout: official_release.write(root, layout) for layout in official_release.LAYOUTS}


def _eval_model_config(model, variant):
  """config.model of a variant as the CLI parity test evaluates it (fixture dims, no dropout)."""
  config = load_config(model, variant)
  config.model.update(visual_dim=48, query_dim=40, hidden_dim=32, dropout=0.0,
                      input_dropout=0.0)
  return config.model.to_json(sort_keys=True)


def test_cli_cases_cover_every_variant():
  """Every (model, variant) left out of the CLI runs evaluates with the model config of one
  that runs (dropout aside), so its CLI run would compute the same scores."""
  for model in RELEASES:
    tested = {_eval_model_config(m, v) for m, v in CLI_CASES if m == model}
    assert tested, model
    for variant in VARIANTS:
      assert _eval_model_config(model, variant) in tested, (model, variant)


@pytest.mark.parametrize('model,variant', CLI_CASES)
def test_official_checkpoint_parity_through_cli(model, variant, multibatch_release, tmp_path,
                                                xla_cache):
  """Release folder -> shards -> evaluator (its own batches) with an official checkpoint and
  each dataset variant's config = the official evaluation loop's scores over several batches
  (MS-SL and AMDNet: the minimally repaired official code; tests/fixtures/README.md)."""
  support.require_tensorflow()
  out = tmp_path / 'eval'
  layout, flags = RELEASES[model]
  folder, digest = multibatch_release[layout]
  collection, _, visual_feature, _ = official_release.LAYOUTS[layout]
  official = np.load(OFFICIAL / f'multibatch_{model}.npz')
  assert digest == str(official['release_digest']), (
      'tests/official_release.py wrote another release than the fixture was made from: '
      f'multibatch_{model}.npz release_digest')
  if visual_feature:
    flags = [*flags, f'--config.data.visual_feature={visual_feature}']
  # The fixture's dims (see tests/fixtures/README.md) on the multi-batch release folder.
  run_cli('evaluate.py', f'--config=configs/{model}.py:{variant}', '--config.model.visual_dim=48',
          '--config.model.query_dim=40', '--config.model.hidden_dim=32',
          f'--config.data.dir={folder}', f'--config.data.collection={collection}', *flags,
          f'--checkpoint={OFFICIAL / f"{model}_best.ckpt"}', '--split=test',
          f'--output_dir={out}', cache_dir=xla_cache)
  cap_ids, video_ids = _caption_file_order(pathlib.Path(folder), collection)
  assert list(official['cap_ids']) == cap_ids and list(official['video_ids']) == video_ids
  scores = np.load(out / 'scores.npy')
  assert scores.shape == official[f'{variant}/scores'].shape
  # Fused cosine scores, O(1) (max 0.52-0.66): 1e-5 of the magnitude, as the in-process
  # parity test (test_parity.py) checks the same scores.
  support.assert_close(scores, official[f'{variant}/scores'], rtol=SCORE_RTOL)
  metrics = json.loads((out / 'metrics.json').read_text())
  assert [str(n) for n in official['metric_names']] == ['R1', 'R5', 'R10', 'R100', 'SumR']
  ours = [metrics[k] for k in ('r1', 'r5', 'r10', 'r100', 'sumr')]
  # Equal ranks give equal metrics (percentages of counts, float64). The ranks cannot flip
  # within the score tolerance: where a rank sits at a recall boundary K, the score gap to the
  # neighbour that could cross it exceeds the sum of their tolerances by >= 10x
  # (tests/fixtures/README.md, per model and variant).
  support.assert_close(ours, official[f'{variant}/metrics'], rtol=1e-12)
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
