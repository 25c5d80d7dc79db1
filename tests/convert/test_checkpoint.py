"""Our checkpoints are never trusted blindly: damaged, incomplete or non-finite ones are refused
with a message naming their folder; incomplete steps are skipped (set aside when training)."""

import json
import logging
import os
import pathlib
import re
import shutil
import struct
import sys
import zipfile

import jax
import numpy as np
import pytest

from prvr_jax import checkpoint, convert, models, parallel, torch_file, train
import support

SPEC = models.get_spec('gmmformer')


@pytest.fixture(scope='module')
def tiny():
  config = support.load_config('gmmformer', 'tiny')
  mesh = parallel.make_mesh()
  tx, _ = train.make_model_optimizer(config, SPEC, total_steps=10)
  return config, mesh, tx


def _save(workdir, tiny, step, seed=0, scale=1.0):
  """A workdir with one full state (and best params) at `step`; returns the state."""
  config, mesh, tx = tiny
  config = config.copy_and_resolve_references()
  config.train.seed = seed
  state = train.create_train_state(config, SPEC, tx, mesh)
  state = state.replace(params=jax.tree.map(lambda p: p * scale, state.params))
  saved = checkpoint.Checkpoints(str(workdir))
  meta = {**checkpoint.model_fingerprint(config.model, SPEC), 'step': step}
  saved.save_latest(state, meta)
  saved.save_best(state.params, meta)
  saved.close()
  return state


def _largest_file(folder: pathlib.Path) -> pathlib.Path:
  return max((p for p in folder.rglob('*') if p.is_file()), key=lambda p: p.stat().st_size)


def test_arrays_that_differ_from_what_was_saved_are_refused(tiny, tmp_path):
  """Valid Orbax data of other values (what a silent corruption looks like to Orbax) under
  a step's metadata: the recorded sha256 catches it, for full states and parameters."""
  config, mesh, tx = tiny
  _save(tmp_path / 'a', tiny, 5)
  _save(tmp_path / 'b', tiny, 5, seed=1)
  for item, folder in (('state', checkpoint.LATEST_DIR), ('params', checkpoint.BEST_DIR)):
    target = tmp_path / 'a' / folder / '5' / item
    shutil.rmtree(target)
    shutil.copytree(tmp_path / 'b' / folder / '5' / item, target)
  with pytest.raises(checkpoint.CheckpointError, match=r'best/5 is corrupted: the sha256 of '
                     'its params arrays differs'):
    checkpoint.load_params(str(tmp_path / 'a'), config, mesh)
  with pytest.raises(checkpoint.CheckpointError, match=r'checkpoints/5 is corrupted'):
    checkpoint.load_params(str(tmp_path / 'a' / checkpoint.LATEST_DIR), config, mesh)
  reopened = checkpoint.Checkpoints(str(tmp_path / 'a'))
  with pytest.raises(checkpoint.CheckpointError, match=r'checkpoints/5 is corrupted: the sha256 '
                     'of its state arrays'):
    reopened.restore_latest(train.abstract_train_state(config, SPEC, tx, mesh))
  reopened.close()


def test_a_flipped_bit_or_a_missing_array_file_is_refused(tiny, tmp_path):
  config, mesh, _ = tiny
  _save(tmp_path / 'w', tiny, 5)
  data = _largest_file(tmp_path / 'w' / checkpoint.BEST_DIR / '5' / 'params')
  raw = bytearray(data.read_bytes())
  raw[len(raw) // 2] ^= 0x10
  data.write_bytes(bytes(raw))
  step_dir = tmp_path / 'w' / checkpoint.BEST_DIR / '5'
  with pytest.raises(checkpoint.CheckpointError, match=str(step_dir)):
    checkpoint.load_params(str(tmp_path / 'w'), config, mesh)
  data.unlink()
  with pytest.raises(checkpoint.CheckpointError,
                     match=rf'{step_dir} cannot be read .* damaged or incomplete'):
    checkpoint.load_params(str(tmp_path / 'w'), config, mesh)


def test_incomplete_steps_are_skipped_and_set_aside(tiny, tmp_path, caplog):
  """A step folder without its metadata (a save interrupted before Orbax finalised it) is
  never taken as the latest step."""
  config, mesh, tx = tiny
  state = _save(tmp_path / 'w', tiny, 5)
  latest = tmp_path / 'w' / checkpoint.LATEST_DIR
  shutil.copytree(latest / '5', latest / '9')
  shutil.rmtree(latest / '9' / 'meta')
  with caplog.at_level(logging.WARNING):
    params, info = checkpoint.load_params(str(latest), config, mesh)
  assert info['step'] == 5 and 'checkpoints/9 is an incomplete checkpoint' in caplog.text
  with pytest.raises(checkpoint.CheckpointError, match=r'no complete checkpoint at step 9 '
                     r'\(complete steps: \[5\]\)'):
    checkpoint.load_params(str(latest / '9'), config, mesh)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(params),
               jax.device_get(state.params))
  resumed = checkpoint.Checkpoints(str(tmp_path / 'w'))  # what a resumed run opens
  assert sorted(os.listdir(latest)) == ['5', '9.incomplete']
  restored, meta = resumed.restore_latest(train.abstract_train_state(config, SPEC, tx, mesh))
  resumed.close()
  assert meta['step'] == 5 and int(restored.step) == 0


def test_non_finite_parameters_are_refused(tiny, tmp_path):
  config, mesh, _ = tiny
  _save(tmp_path / 'w', tiny, 5, scale=np.inf)
  with pytest.raises(checkpoint.CheckpointError, match=r'best/5: \d+ parameter\(s\) hold NaN '
                     r'or inf values \(first: '):
    checkpoint.load_params(str(tmp_path / 'w'), config, mesh)
  # An official checkpoint with a NaN weight, named by its torch name.
  official = torch_file.load_torch_checkpoint(str(support.OFFICIAL / 'gmmformer_best.ckpt'))
  official['clip_encoder.attn1.self.key.weight'][3, 4] = np.nan
  path = tmp_path / 'nan_best.ckpt'
  _save_state_dict(path, official)
  dims = support.load_config('gmmformer', 'tiny')
  dims.model.update(visual_dim=48, query_dim=40, hidden_dim=32)
  with pytest.raises(checkpoint.CheckpointError, match=r'1 parameter\(s\) hold NaN or inf values '
                     r'\(first: clip_encoder.attn1.self.key.weight, 1 values\)'):
    checkpoint.load_params(str(path), dims, mesh)


def _save_state_dict(path: pathlib.Path, state_dict: dict[str, np.ndarray]) -> None:
  """A torch-format state_dict of float32 tensors: by torch when it is installed (its reader
  wants torch's own records), else a zip of a protocol-2 pickle (a dict of rebuilt tensors)
  and one raw record per tensor."""
  if support.has_torch():
    import torch  # pylint: disable=g-import-not-at-top
    torch.save({k: torch.from_numpy(v) for k, v in state_dict.items()}, path)
    return
  text = lambda s: b'X' + struct.pack('<I', len(s)) + s.encode()
  integer = lambda x: b'J' + struct.pack('<i', x)
  ints = lambda xs: b'(' + b''.join(integer(x) for x in xs) + b't'
  body = b''
  for i, (name, value) in enumerate(state_dict.items()):
    strides = [int(np.prod(value.shape[d + 1:])) for d in range(value.ndim)]
    body += (text(name) + b'ctorch._utils\n_rebuild_tensor_v2\n('
             + b'(' + text('storage') + b'ctorch\nFloatStorage\n' + text(str(i)) + text('cpu')
             + integer(value.size) + b'tQ' + integer(0) + ints(value.shape) + ints(strides)
             + b'\x89ccollections\nOrderedDict\n)Rt' + b'R')
  data = b'\x80\x02}(' + body + b'u.'
  with zipfile.ZipFile(path, 'w') as archive:
    archive.writestr('archive/data.pkl', data)
    archive.writestr('archive/byteorder', 'little')
    for i, value in enumerate(state_dict.values()):
      archive.writestr(f'archive/data/{i}', np.ascontiguousarray(value, np.float32).tobytes())


def test_a_damaged_array_or_metadata_file_is_one_error_naming_the_step_and_file(tiny, tmp_path):
  """A truncated or zeroed TensorStore data file: one CheckpointError whose single line names
  the step folder and the array TensorStore could not read (not Orbax's quoted spec); a
  damaged JSON metadata file is named the same way."""
  config, mesh, _ = tiny
  _save(tmp_path / 'w', tiny, 5)
  step_dir = tmp_path / 'w' / checkpoint.BEST_DIR / '5'
  data = _largest_file(step_dir / 'params')
  raw = data.read_bytes()
  for damaged in (raw[:100], bytes(len(raw))):
    data.write_bytes(damaged)
    with pytest.raises(checkpoint.CheckpointError) as error:
      checkpoint.load_params(str(tmp_path / 'w'), config, mesh)
    message = str(error.value)
    assert '\n' not in message and 'TensorStore({' not in message, message
    assert re.match(rf'{step_dir} cannot be read \(array params/[\w.]+: ValueError: ', message)
    array = re.match(r'.* \(array params/([\w.]+):', message).group(1)
    assert array.replace('.', '/') in {path for path, _ in _param_paths(config)}
    assert message.endswith('the checkpoint is damaged or incomplete. There is no other '
                            'complete step in this folder.')
  # A damaged metadata file: JSON's own error names no file; the message does.
  data.write_bytes(raw)
  (step_dir / 'params' / '_METADATA').write_text('{"tree_metadata": {"garbage')
  with pytest.raises(checkpoint.CheckpointError) as error:
    checkpoint.load_params(str(tmp_path / 'w'), config, mesh)
  assert '\n' not in str(error.value)
  assert str(error.value).startswith(f'{step_dir} cannot be read (JSON file params/_METADATA: '
                                     'JSONDecodeError: ')


def _param_paths(config):
  shapes = SPEC.param_shapes(config.model)
  return [('/'.join(str(k.key) for k in path), leaf)
          for path, leaf in jax.tree_util.tree_leaves_with_path(shapes)]


def test_reading_a_checkpoint_imports_nothing_it_names(tiny, tmp_path, monkeypatch):
  """Handler and value types named in a step's metadata are never imported: a planted module
  on the import path, named there, is not run; the checkpoint reads as before."""
  config, mesh, _ = tiny
  _save(tmp_path / 'w', tiny, 5)
  planted = tmp_path / 'planted'
  planted.mkdir()
  marker = tmp_path / 'ran'
  (planted / 'prvr_planted_handler.py').write_text(
      f'import pathlib\npathlib.Path({str(marker)!r}).write_text("ran")\nclass Evil:\n  pass\n')
  monkeypatch.syspath_prepend(str(planted))
  for folder in (checkpoint.BEST_DIR, checkpoint.LATEST_DIR):
    meta_file = tmp_path / 'w' / folder / '5' / '_CHECKPOINT_METADATA'
    meta = json.loads(meta_file.read_text())
    meta['item_handlers'] = {k: 'prvr_planted_handler.Evil' for k in meta['item_handlers']}
    meta_file.write_text(json.dumps(meta))
  tree = tmp_path / 'w' / checkpoint.BEST_DIR / '5' / 'params' / '_METADATA'
  tree.write_text(tree.read_text().replace('"jax.Array"', '"prvr_planted_handler.Evil"'))
  for path in (tmp_path / 'w', tmp_path / 'w' / checkpoint.LATEST_DIR):
    _, info = checkpoint.load_params(str(path), config, mesh)
    assert info['step'] == 5
  assert not marker.exists() and 'prvr_planted_handler' not in sys.modules
