"""The last line of every refusal of the smaller command-line tools names the flag, file or key
at fault (train, evaluate, seeds, index, convert, check and prepare have theirs beside their
other tests)."""

import json
import os
import subprocess
import sys

import support


def _cases(tmp: str) -> list[tuple[str, tuple[str, ...], str]]:
  """(script, args, what the last stderr line must contain)."""
  return [
      ('prvr_jax/tools/summary.py', ('--config=nosuchmodel',),
       '--config=nosuchmodel: no config file nosuchmodel'),
      ('prvr_jax/tools/summary.py', ('--config=gmmformer_v2', '--config.model.bogus=3'),
       'Unknown config key --config.model.bogus'),
      ('prvr_jax/tools/summary.py', ('--config=gmmformer_v2', '--config.model.dropout=abc'),
       'flag --config.model.dropout=abc'),
      ('prvr_jax/tools/summary.py', ('--config=gmmformer_v2', 'extra'),
       "Unexpected arguments: ['extra']"),
      ('prvr_jax/tools/baselines.py', (), 'pass exactly one of --shards and --synthetic'),
      ('prvr_jax/tools/baselines.py', ('--synthetic=huge',), 'flag --synthetic=huge'),
      ('prvr_jax/tools/baselines.py', (f'--shards={tmp}/mine',),
       f'{tmp}/mine/manifest.json does not exist'),
      ('prvr_jax/tools/baselines.py', (f'--shards={tmp}/shards', '--split=val'),
       f'--split=val: {tmp}/shards/manifest.json has the splits []'),
      ('prvr_jax/tools/write_synthetic.py', (), 'Flag --out must have a value'),
      ('prvr_jax/tools/write_synthetic.py', (f'--out={tmp}/new', '--size=huge'),
       'flag --size=huge'),
      ('prvr_jax/tools/write_synthetic.py', (f'--out={tmp}/mine',),
       f'refusing to write shards into {tmp}/mine'),
      ('prvr_jax/tools/write_synthetic.py', (f'--out={tmp}/mine/notes.txt',),
       f'refusing to write shards into {tmp}/mine/notes.txt: it is not a folder'),
      ('prvr_jax/tools/write_synthetic.py', (f'--out={tmp}/taken', '--format=mssl'),
       f'{tmp}/taken/synthetic exists'),
      ('prvr_jax/tools/write_qvhighlights.py', (f'--annotations={tmp}/absent',
                                                f'--features={tmp}', f'--out={tmp}/q1'),
       f'{tmp}/absent/highlight_train_release.jsonl does not exist'),
      ('prvr_jax/tools/write_qvhighlights.py', (f'--annotations={tmp}/qv', f'--features={tmp}',
                                                f'--out={tmp}/q2'),
       f'{tmp}/qv/highlight_train_release.jsonl:1: not a JSON line'),
      ('prvr_jax/tools/write_qvhighlights.py', (f'--annotations={tmp}/qv', f'--features={tmp}',
                                                f'--out={tmp}/mine'),
       f'refusing to write into --out={tmp}/mine: it is not empty'),
      ('prvr_jax/tools/write_text_video.py', ('--dataset=youtube',), 'flag --dataset=youtube'),
      ('prvr_jax/tools/write_text_video.py', (
          '--dataset=msrvtt', f'--annotations={tmp}/absent', '--frame_features=f.h5',
          '--text_features=t.h5', f'--out={tmp}/t1'),
       f'msrvtt annotation folder {tmp}/absent does not exist'),
      ('prvr_jax/tools/write_text_video.py', (
          '--dataset=msrvtt', f'--annotations={tmp}', '--frame_features=f.h5',
          '--text_features=t.h5', f'--out={tmp}/t1', '--splits=train'),
       "--splits='train': expected ours=official pairs"),
  ]


def test_refusals_end_with_the_flag_file_or_key_at_fault(tmp_path):
  """Each tool refuses bad flags, missing or foreign folders and malformed files with a last
  stderr line naming them, and leaves the user's files as they were."""
  support.require_tensorflow()
  tmp = str(tmp_path)
  os.makedirs(tmp_path / 'mine')
  (tmp_path / 'mine' / 'notes.txt').write_text('the user\'s\n')
  os.makedirs(tmp_path / 'taken' / 'synthetic')
  os.makedirs(tmp_path / 'qv')
  (tmp_path / 'qv' / 'highlight_train_release.jsonl').write_text('{not json\n')
  os.makedirs(tmp_path / 'shards')
  manifest = {'format': 'prvr_jax.shards', 'format_version': 1, 'complete': True,
              'splits': {}, 'visual_dim': 8, 'query_dim': 8,
              'preprocessing': {'num_clips': 4, 'max_frames': 8, 'max_query_len': 4}}
  (tmp_path / 'shards' / 'manifest.json').write_text(json.dumps(manifest))
  cases = _cases(tmp)
  procs = support.run_processes([[str(support.REPO / script), *args] for script, args, _ in cases],
                                devices=1, timeout=300)  # all at once
  failures = []
  for (script, args, want), proc in zip(cases, procs):
    lines = proc.stderr.strip().splitlines()
    if proc.returncode == 0 or not lines or want not in lines[-1]:
      failures.append(f'{script} {" ".join(args)} (exit {proc.returncode})\n  last line: '
                      f'{lines[-1] if lines else ""}\n  wanted: {want}')
  assert not failures, '\n'.join(failures)
  assert sorted(os.listdir(tmp_path / 'mine')) == ['notes.txt']
  assert (tmp_path / 'mine' / 'notes.txt').read_text() == 'the user\'s\n'
  assert os.listdir(tmp_path / 'taken' / 'synthetic') == []


def test_the_library_module_run_as_a_program_points_to_the_tool():
  """`python -m prvr_jax.convert` (the library, not the command) converts nothing and exits
  non-zero, its last line naming the command to run."""
  proc = subprocess.run([sys.executable, '-m', 'prvr_jax.convert', '--model=gmmformer'],
                        env=support.subprocess_env(JAX_PLATFORMS='cpu'), capture_output=True,
                        text=True, timeout=120, check=False)
  assert proc.returncode != 0
  last = proc.stderr.strip().splitlines()[-1]
  assert 'python -m prvr_jax.tools.convert --model=gmmformer' in last, proc.stderr[-2000:]
