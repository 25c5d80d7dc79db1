"""prvr_jax.torch_file: both torch-file readers (with torch and without) read tensors and
plain containers only, check every header first, and never run code from the file."""

import argparse
import collections
import os
import pickle
import struct
import zipfile

import numpy as np
import pytest

import support
from prvr_jax import torch_file

FIXTURES = support.OFFICIAL
NAMES = ('gmmformer', 'gmmformer_v2', 'ms_sl', 'amdnet')


def _ckpt(name):
  return str(FIXTURES / f'{name}_best.ckpt')


@pytest.mark.parametrize('name', NAMES)
def test_torch_free_reader_matches_recorded_values(name):
  """Without torch, the official checkpoint's tensors equal the sums torch recorded."""
  state_dict = torch_file.load_torch_checkpoint(_ckpt(name), use_torch=False)
  fixture = np.load(FIXTURES / f'{name}.npz')
  recorded = {k[len('ckpt_check/'):]: fixture[k] for k in fixture if k.startswith('ckpt_check/')}
  assert set(state_dict) == set(recorded)
  for key, (total, abs_total, first, last) in recorded.items():
    value = state_dict[key]
    assert value.dtype == np.float32
    # float64 sums of the float32 values, in another order than torch's: ~1e-16 of sum |x|,
    # which is the default scale here (the larger expected value), robust to a sum near 0.
    support.assert_close([value.sum(dtype=np.float64), np.abs(value).sum(dtype=np.float64)],
                         [total, abs_total], rtol=1e-12, err_msg=key)
    assert value.ravel()[0] == first and value.ravel()[-1] == last, key


def test_torch_free_reader_reads_the_whole_official_checkpoint():
  ckpt = torch_file.read_torch_zip(_ckpt('gmmformer_v2'))
  assert set(ckpt) == {'config', 'epoch', 'model_val', 'state_dict', 'optimizer'}
  assert ckpt['config']['model_name'] == 'gmmformer_v2' and ckpt['epoch'] == 0
  schedule = ckpt['optimizer']['param_groups'][0]['schedule']
  assert isinstance(schedule, torch_file.OfficialObject) and schedule.warmup == 0.01


@pytest.mark.parametrize('use_torch', [False, True])
def test_ms_sl_checkpoint_config_is_read_as_plain_data(use_torch):
  """MS-SL's checkpoint pickles its config as an `easydict.EasyDict`: both readers restore
  it as an inert OrderedDict (no easydict import, no code run) and find the state_dict under
  'model'."""
  if use_torch:
    pytest.importorskip('torch')
    ckpt = torch_file._torch_load(_ckpt('ms_sl'))  # pylint: disable=protected-access
  else:
    ckpt = torch_file.read_torch_zip(_ckpt('ms_sl'))
  assert set(ckpt) == {'model', 'model_cfg', 'epoch'}
  assert type(ckpt['model_cfg']) is collections.OrderedDict  # pylint: disable=unidiomatic-typecheck
  assert ckpt['model_cfg']['hidden_size'] == 32 and ckpt['model_cfg']['n_heads'] == 4
  assert len(torch_file.load_torch_checkpoint(_ckpt('ms_sl'), use_torch=use_torch)) == 54


@pytest.mark.parametrize('name', NAMES)
def test_torch_and_torch_free_readers_agree(name):
  pytest.importorskip('torch')
  with_torch = torch_file.load_torch_checkpoint(_ckpt(name), use_torch=True)
  without = torch_file.load_torch_checkpoint(_ckpt(name), use_torch=False)
  assert list(with_torch) == list(without)
  for key, value in with_torch.items():
    assert value.dtype == without[key].dtype
    np.testing.assert_array_equal(value, without[key], err_msg=key)


def test_bare_state_dict_files_with_both_readers(tmp_path):
  torch = pytest.importorskip('torch')
  base = torch.arange(24, dtype=torch.float32).reshape(4, 6) / 7
  state = collections.OrderedDict(
      w=base.t(), shared=base[1:3, 2:], half=base.half(), bf16=base.bfloat16(),
      steps=torch.arange(3), flags=base > 1, param=torch.nn.Parameter(base.double()))
  torch.save(state, tmp_path / 'sd.pt')
  with_torch = torch_file.load_torch_checkpoint(str(tmp_path / 'sd.pt'), use_torch=True)
  without = torch_file.load_torch_checkpoint(str(tmp_path / 'sd.pt'), use_torch=False)
  assert list(with_torch) == list(without) == list(state)
  for key, value in with_torch.items():
    assert value.dtype == without[key].dtype, key
    np.testing.assert_array_equal(value, without[key], err_msg=key)
  np.testing.assert_array_equal(without['w'], base.numpy().T)
  assert without['bf16'].dtype == np.float32


class _Exploit:
  def __init__(self, marker):
    self.marker = marker

  def __reduce__(self):
    return os.system, (f'touch {self.marker}',)


def _write_zip(path, pickle_bytes, records=(), compression=zipfile.ZIP_STORED):
  with zipfile.ZipFile(path, 'w', compression=compression) as archive:
    archive.writestr('archive/data.pkl', pickle_bytes)
    archive.writestr('archive/byteorder', 'little')
    for key, data in records:
      archive.writestr(f'archive/data/{key}', data)


def test_malicious_pickle_is_refused(tmp_path):
  marker = tmp_path / 'pwned'
  payload = pickle.dumps({'state_dict': _Exploit(marker)}, protocol=2)
  _write_zip(tmp_path / 'evil.ckpt', payload)
  refused = r'refusing to load global (posix|os|nt)\.system'
  with pytest.raises(pickle.UnpicklingError, match=refused):
    torch_file.load_torch_checkpoint(str(tmp_path / 'evil.ckpt'), use_torch=False)
  assert not marker.exists()
  # A bare pickle is not a torch zip checkpoint and is never unpickled.
  (tmp_path / 'evil.pkl').write_bytes(payload)
  with pytest.raises(ValueError, match='not a torch zip checkpoint'):
    torch_file.read_torch_zip(str(tmp_path / 'evil.pkl'))
  assert not marker.exists()


def _tensor_pickle(storage_type, location, numel, offset, size, stride):
  """Protocol-2 opcodes of `{'w': _rebuild_tensor_v2(storage '0', offset, size, stride)}`."""
  text = lambda s: b'X' + struct.pack('<I', len(s)) + s.encode()
  integer = lambda x: b'K' + bytes([x]) if x < 256 else b'J' + struct.pack('<i', x)
  ints = lambda xs: b'(' + b''.join(integer(x) for x in xs) + b't'
  return (b'\x80\x02}' + text('w')
          + b'ctorch._utils\n_rebuild_tensor_v2\n('
          + b'(' + text('storage') + f'ctorch\n{storage_type}\n'.encode() + text('0')
          + text(location) + integer(numel) + b'tQ'
          + integer(offset) + ints(size) + ints(stride)
          + b'\x89ccollections\nOrderedDict\n)Rt' + b'Rs.')


def _readers():
  """The torch-free reader, and torch's when it is installed."""
  return (False, True) if support.has_torch() else (False,)


def test_a_view_declaring_more_elements_than_its_storage_is_refused(tmp_path):
  """A 600-byte file declaring a 65536 x 65536 zero-stride view of 4 floats would make both
  readers allocate 16 GiB; the headers are checked first."""
  _write_zip(tmp_path / 'bomb.pt', _tensor_pickle('FloatStorage', 'cpu', 4, 0, (65536, 65536),
                                                  (0, 0)),
             [('0', np.zeros(4, np.float32).tobytes())])
  assert os.path.getsize(tmp_path / 'bomb.pt') < 1000
  for use_torch in _readers():
    with pytest.raises(pickle.UnpicklingError,
                       match=r'declares 4294967296 elements but its storage holds 4'):
      torch_file.load_torch_checkpoint(str(tmp_path / 'bomb.pt'), use_torch=use_torch)


def _recorded_zip_reads(monkeypatch) -> list:
  """The names of the zip records read from now on (appended as they are read)."""
  read = []
  original = zipfile.ZipFile.read
  monkeypatch.setattr(zipfile.ZipFile, 'read',
                      lambda self, name, pwd=None: read.append(getattr(name, 'filename', name))
                      or original(self, name, pwd))
  return read


def _refusals(path) -> list[str]:
  """The last line of each reader's refusal of the file at `path`."""
  lines = []
  for use_torch in _readers():
    with pytest.raises(pickle.UnpicklingError) as error:
      torch_file.load_torch_checkpoint(str(path), use_torch=use_torch)
    lines.append(str(error.value).splitlines()[-1])
  return lines


def test_a_record_inflating_beyond_its_header_is_never_inflated(tmp_path, monkeypatch):
  """A small zip whose record (declared 4 floats) inflates to 64 MiB: refused from the zip
  headers, before anything is read."""
  _write_zip(tmp_path / 'zip_bomb.pt', _tensor_pickle('FloatStorage', 'cpu', 4, 0, (4,), (1,)),
             [('0', bytes(64 << 20))], compression=zipfile.ZIP_DEFLATED)
  assert os.path.getsize(tmp_path / 'zip_bomb.pt') < (1 << 20)
  read = _recorded_zip_reads(monkeypatch)
  for use_torch in _readers():
    with pytest.raises(pickle.UnpicklingError,
                       match=r'record archive/data/0 declares 67108864 bytes, expected 16'):
      torch_file.load_torch_checkpoint(str(tmp_path / 'zip_bomb.pt'), use_torch=use_torch)
  assert 'archive/data/0' not in read
  monkeypatch.setattr(torch_file, 'MAX_PICKLE_BYTES', 64)  # an oversized pickle record too
  with pytest.raises(pickle.UnpicklingError, match=r'data.pkl declares \d+ bytes, expected at '
                     r'most 64'):
    torch_file.load_torch_checkpoint(str(tmp_path / 'zip_bomb.pt'), use_torch=False)


def test_refusal_never_advises_unsafe_loading(tmp_path):
  """A checkpoint pickling an object (here argparse's Namespace, common in training scripts'
  checkpoints) is refused with what is supported, never with torch's advice to load with
  weights_only=False."""
  payload = pickle.dumps({'state_dict': {}, 'args': argparse.Namespace(lr=1.0)}, protocol=2)
  _write_zip(tmp_path / 'args.ckpt', payload)
  for use_torch in _readers():
    with pytest.raises(pickle.UnpicklingError, match='never runs code') as e:
      torch_file.load_torch_checkpoint(str(tmp_path / 'args.ckpt'), use_torch=use_torch)
    assert 'argparse.Namespace' in str(e.value) and 'weights_only' not in str(e.value)


def test_torch_free_reader_strides_offsets_bfloat16_and_gpu_locations(tmp_path):
  values = np.arange(8, dtype=np.float32) - 2.5
  # A transposed [3, 2] view at offset 1 of a float32 storage saved on a GPU.
  _write_zip(tmp_path / 'f32.pt', _tensor_pickle('FloatStorage', 'cuda:0', 8, 1, (3, 2), (1, 3)),
             [('0', values.tobytes())])
  got = torch_file.load_torch_checkpoint(str(tmp_path / 'f32.pt'), use_torch=False)['w']
  np.testing.assert_array_equal(got, values[1:7].reshape(2, 3).T)
  # bfloat16 storages are widened to float32 (bf16 = the high half of a float32).
  bf16 = (values.view(np.uint32) >> 16).astype(np.uint16)
  _write_zip(tmp_path / 'bf16.pt', _tensor_pickle('BFloat16Storage', 'cpu', 8, 0, (8,), (1,)),
             [('0', bf16.tobytes())])
  got = torch_file.load_torch_checkpoint(str(tmp_path / 'bf16.pt'), use_torch=False)['w']
  np.testing.assert_array_equal(got, values)  # these values are exact in bfloat16
  # A view running past its storage is refused.
  _write_zip(tmp_path / 'bad.pt', _tensor_pickle('FloatStorage', 'cpu', 8, 4, (3, 2), (1, 3)),
             [('0', values.tobytes())])
  with pytest.raises(pickle.UnpicklingError, match='overruns its storage'):
    torch_file.load_torch_checkpoint(str(tmp_path / 'bad.pt'), use_torch=False)


def _shared_storage_pickle(names, numel):
  """Protocol-2 opcodes of `{name: _rebuild_tensor_v2(storage '0', 0, (numel,), (1,))}` for
  every name: tensors that all view the same whole storage."""
  text = lambda s: b'X' + struct.pack('<I', len(s)) + s.encode()
  integer = lambda x: b'J' + struct.pack('<i', x)
  body = b''
  for name in names:
    body += (text(name) + b'ctorch._utils\n_rebuild_tensor_v2\n('
             + b'(' + text('storage') + b'ctorch\nFloatStorage\n' + text('0') + text('cpu')
             + integer(numel) + b'tQ' + integer(0) + b'(' + integer(numel) + b't('
             + integer(1) + b't' + b'\x89ccollections\nOrderedDict\n)Rt' + b'R')
  return b'\x80\x02}(' + body + b'u.'


def test_tensors_viewing_one_storage_over_and_over_are_refused(tmp_path, monkeypatch):
  """80 tensors on the same 256 KiB storage would be copied 80 times (20 MiB from a 256 KiB
  file): refused before the storage is read, the last line naming the file, the tensor and
  its storage record. Two tensors tied to one storage (shared weights) are read."""
  numel = 1 << 16
  names = [f'layer.{i}.weight' for i in range(80)]
  _write_zip(tmp_path / 'aliased.pt', _shared_storage_pickle(names, numel),
             [('0', np.ones(numel, np.float32).tobytes())])
  read = _recorded_zip_reads(monkeypatch)
  for last in _refusals(tmp_path / 'aliased.pt'):
    assert last.startswith(f'{tmp_path / "aliased.pt"}: tensor layer.2.weight [65536] of '
                           'storage record archive/data/0'), last
    assert 'view the same storage bytes' in last
  assert 'archive/data/0' not in read
  _write_zip(tmp_path / 'tied.pt', _shared_storage_pickle(['a', 'b'], numel),
             [('0', np.arange(numel, dtype=np.float32).tobytes())])
  tied = torch_file.load_torch_checkpoint(str(tmp_path / 'tied.pt'), use_torch=False)
  np.testing.assert_array_equal(tied['a'], np.arange(numel, dtype=np.float32))
  np.testing.assert_array_equal(tied['b'], tied['a'])


def test_storages_inflating_far_beyond_the_file_are_refused(tmp_path, monkeypatch):
  """A 16 KiB file whose (honestly declared) deflated record inflates to 16 MiB: torch never
  compresses its records, so storages beyond twice the file's size are refused unread."""
  numel = 1 << 22
  _write_zip(tmp_path / 'deflated.pt', _tensor_pickle('FloatStorage', 'cpu', numel, 0,
                                                      (numel,), (1,)),
             [('0', bytes(4 * numel))], compression=zipfile.ZIP_DEFLATED)
  assert os.path.getsize(tmp_path / 'deflated.pt') < (1 << 15)
  read = _recorded_zip_reads(monkeypatch)
  for last in _refusals(tmp_path / 'deflated.pt'):
    assert last.startswith(f'{tmp_path / "deflated.pt"}: storage record archive/data/0 takes '
                           'the storages to 16777216 bytes, more than 2 x the file'), last
  assert 'archive/data/0' not in read
