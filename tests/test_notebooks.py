"""The example notebooks (`examples/*.ipynb`) run cell by cell, so they cannot rot.

No Jupyter needed: a notebook's code cells are executed in order in one fresh namespace, in
the test process (conftest's CPU devices and XLA flags; jax is imported once), from a temporary
working and temp folder. A failing cell fails the test with the notebook's name and the cell's
index among all of its cells, as Jupyter numbers them from 0.
"""

import json
import pathlib
import sys
import tempfile
import traceback

import pytest

import support
from support import REPO

EXAMPLES = REPO / 'examples'
NOTEBOOKS = ('layers_in_your_model.ipynb', 'evaluate_and_look.ipynb', 'your_videos.ipynb')


def code_cells(path: pathlib.Path) -> list[tuple[int, str]]:
  """(index among all cells, source) of each code cell of an nbformat 4 notebook."""
  notebook = json.loads(path.read_text(encoding='utf-8'))
  if notebook.get('nbformat') != 4:
    raise ValueError(f'{path}: nbformat {notebook.get("nbformat")!r}, expected 4')
  return [(i, ''.join(c['source'])) for i, c in enumerate(notebook['cells'])
          if c['cell_type'] == 'code']


def run_notebook(path: pathlib.Path) -> dict:
  """Executes the code cells in one namespace; returns it. Fails naming the cell at fault."""
  namespace = {'__name__': '__main__'}
  try:
    for index, source in code_cells(path):
      try:
        code = compile(source, f'{path.name}, cell {index}', 'exec')
        exec(code, namespace)  # pylint: disable=exec-used
      except Exception:  # pylint: disable=broad-except
        pytest.fail(f'{path.name}: cell {index} failed:\n{traceback.format_exc(limit=-8)}')
  finally:
    if 'matplotlib.pyplot' in sys.modules:  # figures a notebook leaves for Jupyter to show
      sys.modules['matplotlib.pyplot'].close('all')
  return namespace


@pytest.fixture
def sandbox(tmp_path, monkeypatch) -> pathlib.Path:
  """A temporary cwd and `tempfile` folder: what a notebook writes stays in `tmp_path`."""
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
  monkeypatch.setenv('MPLBACKEND', 'Agg')
  return tmp_path


@pytest.mark.parametrize('name', NOTEBOOKS)
def test_committed_without_outputs(name):
  notebook = json.loads((EXAMPLES / name).read_text(encoding='utf-8'))
  assert notebook['nbformat'] == 4 and notebook['nbformat_minor'] >= 4
  for index, c in enumerate(notebook['cells']):
    if c['cell_type'] == 'code':
      assert c['outputs'] == [] and c['execution_count'] is None, f'{name}: cell {index}'


def test_layers_notebook(sandbox):
  namespace = run_notebook(EXAMPLES / 'layers_in_your_model.ipynb')
  history = namespace['history']
  assert history[-1] < 0.5 * history[0]


def test_evaluate_notebook(sandbox, monkeypatch, reference_run):
  # The session's tiny reference run instead of training one more (the notebook's default).
  monkeypatch.setenv('PRVR_JAX_CHECKPOINT', str(reference_run))
  namespace = run_notebook(EXAMPLES / 'evaluate_and_look.ipynb')
  test_metrics = json.loads((reference_run / 'test_metrics.json').read_text())
  assert namespace['result'].metrics['num_queries'] == test_metrics['num_queries']
  assert pathlib.Path(namespace['out_dir']).parent == sandbox


def test_your_videos_notebook(sandbox, monkeypatch):
  """The synthetic default: 12 videos extracted with a random tiny CLIP, indexed zero-shot,
  searched by text with spans inside each video, and the page's API answering as the
  searcher does."""
  support.require_tensorflow()
  pytest.importorskip('av', reason='video files need PyAV: pip install prvr_jax[video]')
  for name in ('PRVR_CLIP_WEIGHTS', 'PRVR_CLIP_VOCAB', 'PRVR_VIDEOS'):
    monkeypatch.delenv(name, raising=False)
  namespace = run_notebook(EXAMPLES / 'your_videos.ipynb')
  assert pathlib.Path(namespace['WORK']).parent == sandbox
  manifest = namespace['manifest']
  assert len(manifest['videos']) == 12 and manifest['skipped'] == {}
  assert manifest['embed_dim'] == 32 and manifest['weights']['path'] == 'random:tiny:0'
  for video in manifest['videos'].values():
    assert video['duration'] == pytest.approx(3.0, abs=1e-3) and video['rows'] == 3
  assert len(namespace['index']) == 12
  found = namespace['found']
  assert [len(hits) for hits in found] == [3, 3]
  for hits in found:
    assert [h.rank for h in hits] == [1, 2, 3]
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    for hit in hits:  # max pooling over 3 one-second rows: a whole second of the video
      duration = manifest['videos'][hit.video]['duration']
      assert hit.duration == pytest.approx(duration)
      assert 0 <= hit.span[0] < hit.span[1] <= duration + 1e-6, hit
      assert hit.span[1] - hit.span[0] >= 1 - 1e-6, hit
  results = namespace['answer']['results']
  assert [(r['rank'], r['video']) for r in results] == [(h.rank, h.video) for h in found[0]]
  for result, hit in zip(results, found[0]):
    assert result['span'] == pytest.approx(list(hit.span))
    assert result['score'] == pytest.approx(hit.score, rel=1e-5, abs=1e-6)
    assert result['video_url'] == f'/video/{hit.video}'
  assert namespace['thumbnail'][:2] == b'\xff\xd8'  # a JPEG


def test_failing_cell_is_named(sandbox, tmp_path):
  notebook = {'nbformat': 4, 'nbformat_minor': 5, 'metadata': {}, 'cells': [
      {'cell_type': 'markdown', 'metadata': {}, 'source': ['# title']},
      {'cell_type': 'code', 'metadata': {}, 'outputs': [], 'execution_count': None,
       'source': ['x = 1\n']},
      {'cell_type': 'code', 'metadata': {}, 'outputs': [], 'execution_count': None,
       'source': ['assert x == 2, "x is not 2"\n']}]}
  path = tmp_path / 'broken.ipynb'
  path.write_text(json.dumps(notebook))
  with pytest.raises(pytest.fail.Exception, match=r'broken.ipynb: cell 2 failed(.|\n)*x is not 2'):
    run_notebook(path)
