"""The pictures (prvr_jax.plots): each PNG is written, decodes, has the stated pixel size and
is not blank; `ModelSpec.relevance` of every model that names one: its shape, its padding and
its tie to the model's own score; the reference run's pictures (`config.train.plots`); `evaluate.py --plots` is checked by
tests/train/test_train.py::test_evaluate_cli_on_workdir."""

import importlib.util
import sys

import jax
import numpy as np
import pytest

from prvr_jax import models, plots
from prvr_jax.models import registry
import support

needs_matplotlib = pytest.mark.skipif(importlib.util.find_spec('matplotlib') is None,
                                      reason=f'matplotlib is not installed ({plots.INSTALL_HINT})')

FRAME_LENGTHS = (128, 70, 5)   # video q is query q's; the first has no padded frame
QUERY_LENGTHS = (30, 7, 3)


@needs_matplotlib
def test_training_curves_of_the_reference_run(reference_run, tmp_path):
  # config.train.plots: the run drew every picture into its workdir at the end.
  for name in support.PICTURES:
    support.assert_png(reference_run / f'{name}.png', name)
  written = plots.write_training_plots(str(reference_run), str(tmp_path))
  assert list(written) == ['training_curves']
  support.assert_png(written['training_curves'], 'training_curves')
  # A line cut by a crash is skipped; a workdir without metrics is named.
  torn = tmp_path / 'torn'
  torn.mkdir()
  lines = (reference_run / plots.METRICS_FILE).read_text().splitlines()
  (torn / plots.METRICS_FILE).write_text('\n'.join(lines) + '\n{"step": 9, "spl')
  assert len(plots.read_metrics(str(torn / plots.METRICS_FILE))) == len(lines)
  with pytest.raises(FileNotFoundError, match=str(tmp_path / 'none')):
    plots.write_training_plots(str(tmp_path / 'none'))


@needs_matplotlib
def test_evaluation_pictures_from_arrays(tmp_path):
  rng = np.random.default_rng(0)
  num_queries, num_videos = 30, 10
  scores = rng.normal(size=(num_queries, num_videos)).astype(np.float32)
  ground_truth = np.arange(num_queries) % num_videos
  ranks = rng.integers(1, num_videos + 1, num_queries)
  ratio = np.where(np.arange(num_queries) % 7 == 0, np.nan, rng.uniform(0, 1, num_queries))
  path = plots.recall_by_moment_ratio(ranks, ratio, ((0, 0.25), (0.25, 0.5), (0.5, 1)),
                                      str(tmp_path / 'recall.png'))
  support.assert_png(path, 'recall_by_moment_ratio')
  path = plots.similarity_heatmap(scores, np.arange(12), ground_truth[:12],
                                  str(tmp_path / 'heatmap.png'),
                                  [f'q{i}' for i in range(num_queries)],
                                  [f'v{i}' for i in range(num_videos)], ranks)
  support.assert_png(path, 'similarity_heatmap')
  examples = [plots.RelevanceExample('with a moment', {'a': rng.normal(size=32),
                                                       'b': np.r_[rng.normal(size=70),
                                                                  np.full(58, np.nan)]},
                                     span=(3.0, 9.5), duration=20.0),
              plots.RelevanceExample('no moment known', {'a': rng.normal(size=32)})]
  path = plots.moment_relevance(examples, str(tmp_path / 'relevance.png'))
  support.assert_png(path, 'moment_relevance')
  with pytest.raises(ValueError, match='ranks'):
    plots.recall_by_moment_ratio(ranks[:3], ratio, (), str(tmp_path / 'bad.png'))


def test_missing_matplotlib_names_the_extra(monkeypatch, tmp_path):
  monkeypatch.setitem(sys.modules, 'matplotlib', None)  # `import matplotlib` then fails
  with pytest.raises(ImportError, match=r"pip install 'prvr_jax\[plots\]'"):
    plots.recall_by_moment_ratio(np.ones(2), np.ones(2), (), str(tmp_path / 'x.png'))


# Each model's scores that its relevance maxima give (per row q, the pair (q, video q)):
# (config.model overrides, scores from the relevance curves, rows where the identity holds).
_CLIP_ONLY = {'clip_score_weight': 1.0, 'frame_score_weight': 0.0}
IDENTITIES = {
    'amdnet': ({}, lambda c, m: np.nanmax(c['clip cosine'], 1), slice(None)),
    'gmmformer': (_CLIP_ONLY, lambda c, m: np.nanmax(c['clip cosine'], 1), slice(None)),
    'ms_sl': (_CLIP_ONLY, lambda c, m: np.nanmax(c['clip cosine'], 1), slice(None)),
    # S_f is a max over the stored frames, padded ones (cosine 0) included: without padding
    # (video 0) it is the max of the real frames'.
    'gmmformer_v2': ({}, lambda c, m: (m.clip_score_weight * np.nanmax(c['clip cosine'], 1)
                                       + m.frame_score_weight * np.nanmax(c['frame cosine'], 1)),
                     slice(0, 1)),
}
IDENTITIES['dreamprvr'] = IDENTITIES['gmmformer_v2']  # the same stored sets and fusion
# Zero-shot CLIP's 'max' score is the max of its frame cosines over the real frames.
IDENTITIES['clip_zero_shot'] = ({'pooling': 'max'},
                                lambda c, m: np.nanmax(c['frame cosine'], 1), slice(None))


@pytest.mark.parametrize('name', [n for n in registry.names()
                                  if registry.get_spec(n).relevance is not None])
def test_relevance_shapes_and_scores(name):
  spec = registry.get_spec(name)
  config = support.load_config(name, 'tiny')
  overrides, expected_scores, rows = IDENTITIES.get(name, ({}, None, None))
  config.model.update(overrides)
  module = spec.build(config.model)
  batch = models.random_batch(config.model, np.random.default_rng(0), FRAME_LENGTHS,
                              QUERY_LENGTHS)
  videos = {k: batch[k] for k in spec.inputs(config.model)[0]}
  queries = {k: batch[k] for k in spec.inputs(config.model)[1]}

  # Any parameters tie relevance to score; random ones spare compiling the initialisation.
  rng = np.random.default_rng(1)
  params = jax.tree.map(lambda s: (0.3 * rng.normal(size=s.shape)).astype(s.dtype),
                        spec.param_shapes(config.model))

  @jax.jit
  def run(params):  # one program: relevance and the scores of every pair
    variables = {'params': params}
    encoded = module.apply(variables, queries, method='encode_queries')
    stored = module.apply(variables, videos, method='encode_videos')
    return (module.apply(variables, queries, videos, method=spec.relevance),
            module.apply(variables, encoded, stored, method='score'))

  curves, scores = jax.device_get(run(params))
  assert curves, name
  real_frames = batch['frame_mask'] > 0
  for curve_name, curve in curves.items():
    assert curve.ndim == 2 and curve.shape[0] == len(QUERY_LENGTHS), (curve_name, curve.shape)
    if curve.shape[1] == config.model.max_frames:  # frame curves: NaN exactly at padding
      assert np.array_equal(np.isfinite(curve), real_frames), curve_name
    else:
      assert curve.shape[1] == config.model.num_clips and np.isfinite(curve).all(), curve_name
  if expected_scores is not None:
    # O(1) cosines through a few layers of width <= 32, scored in another batching.
    support.assert_close(expected_scores(curves, config.model)[rows], np.diag(scores)[rows],
                         rtol=support.f32_rtol(config.model.hidden_dim, ops=8))
  if name == 'protoprvr':  # attention of the scoring prototype: each curve sums to 1
    for curve in curves.values():
      support.assert_close(np.nansum(curve, axis=1), np.ones(len(QUERY_LENGTHS)),
                           rtol=support.f32_rtol(config.model.max_frames, ops=2))
