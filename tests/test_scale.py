"""`benchmarks/scale.py` at a tiny fraction: every phase runs, and the table states each."""

import json

import pytest

from prvr_jax.layers import multiscale
import support


@pytest.mark.end_to_end
def test_scale_benchmark_runs_every_phase_at_a_tiny_fraction(tmp_path):
  support.require_tensorflow()
  work, output = tmp_path / 'work', tmp_path / 'scale.json'
  work.mkdir()
  # The benchmark itself leaves the catalogue's published sizes out below a fraction of 1.
  sets = ('train.batch_size=4', 'model.hidden_dim=16', 'eval.video_batch_size=4')
  proc = support.run_cli(
      'benchmarks/scale.py', '--fraction=0.0005', '--config=configs/ms_sl.py:tvr',
      '--also=configs/gmmformer.py:tvr', '--train_steps=1', *(f'--set={s}' for s in sets),
      f'--workdir={work}', '--disk_probe_mb=16', f'--output={output}', cache_dir=None)
  report = json.loads(output.read_text())
  phases = {p['phase']: p for p in report['phases']}
  assert list(phases) == ['generate', 'prepare', 'train', 'evaluate', 'train (gmmformer)',
                          'evaluate (gmmformer)', 'index build', 'index search']
  assert all(p['wall_s'] > 0 and p['peak_rss_mb'] > 0 for p in phases.values())
  assert all(phases[p]['bytes'] > 0 for p in ('generate', 'prepare', 'train', 'index build'))
  assert phases['prepare']['floor_s'] > 0
  assert report['test'] == {'videos': 2, 'captions': 10}  # the least a split gets, 5 captions
  # The matching: every caption against every vector the model matches it with, MS-SL's 528
  # multi-scale clips and its frames (whatever it stores); the evaluation's floor counts the
  # encoders too (XLA's count).
  config = support.load_config('ms_sl', 'tvr')
  vectors = multiscale.num_proposals(config.model.num_clips) + config.model.max_frames
  for name in ('evaluate', 'evaluate (gmmformer)'):
    gflop = phases[name]['gflop']
    assert min(gflop[k] for k in ('encode_videos', 'encode_queries', 'score')) > 0
    assert phases[name]['floor_s'] > phases[name]['matching_floor_s'] > 0
    assert set(phases[name]['timings']) >= {'encode_videos', 'encode_queries', 'score', 'rank'}
  assert phases['evaluate']['gflop']['matching'] == 2 * 10 * 2 * vectors * 16 / 1e9
  for phase in phases:
    assert f'| {phase} |' in proc.stdout
  assert not list(work.iterdir())  # it removed what it wrote, and only that
