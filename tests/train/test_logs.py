"""The metric writer: the same scalars in metrics.jsonl and in TensorBoard event files,
JSONL alone without TensorFlow, nothing on processes other than 0, no write through a link."""

import json
import logging
import os
import sys

import numpy as np
import pytest

from prvr_jax.train import logs

RECORDS = [  # (step, split, scalars, extra)
    (1, 'train', {'loss': 2.5, 'lr': 0.0}, {'epoch': 0}),
    (2, 'train', {'loss': 1.25, 'lr': 3e-4}, {'epoch': 0}),
    (2, 'val', {'r1': 12.5, 'sumr': 100.0 / 3.0}, {'epoch': 0}),
    (2, 'test', {'r1': 7.0, 'sumr': 90.1}, {}),
]


def write_records(workdir: str, enabled: bool = True) -> None:
  writer = logs.MetricWriter(workdir, enabled=enabled)
  for step, split, scalars, extra in RECORDS:
    writer.write(step, split, scalars, **extra)
  writer.close()


def expected_lines() -> list[dict]:
  return [{'step': step, 'split': split, **extra, **scalars}
          for step, split, scalars, extra in RECORDS]


def read_lines(workdir) -> list[dict]:
  return [json.loads(line) for line in (workdir / logs.METRICS_FILE).read_text().splitlines()]


@pytest.fixture
def without_tensorflow(monkeypatch):
  """`import tensorflow` / `import tensorboard` fail, as on an image without them."""
  monkeypatch.setitem(sys.modules, 'tensorflow', None)
  monkeypatch.setitem(sys.modules, 'tensorboard', None)


def test_jsonl_and_tensorboard_hold_the_same_scalars(tmp_path):
  pytest.importorskip('tensorflow')
  event_accumulator = pytest.importorskip(
      'tensorboard.backend.event_processing.event_accumulator')
  from tensorboard.util import tensor_util  # pylint: disable=g-import-not-at-top
  write_records(str(tmp_path))
  assert read_lines(tmp_path) == expected_lines()

  events = event_accumulator.EventAccumulator(
      str(tmp_path / logs.TB_DIR), size_guidance={event_accumulator.TENSORS: 0})
  events.Reload()
  written = {}
  for tag in events.Tags()['tensors']:
    written[tag] = [(e.step, tensor_util.make_ndarray(e.tensor_proto).item())
                    for e in events.Tensors(tag)]
  expected = {}
  for step, split, scalars, _ in RECORDS:
    for name, value in scalars.items():
      # Exact: TensorBoard stores a scalar as float32, the JSONL the float64 it was given.
      expected.setdefault(f'{split}/{name}', []).append((step, float(np.float32(value))))
  assert written == expected


def test_without_tensorflow_the_jsonl_is_written_with_one_warning(tmp_path, caplog,
                                                                 without_tensorflow):
  with caplog.at_level(logging.WARNING):
    write_records(str(tmp_path))
  warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
  assert len(warnings) == 1
  assert 'No TensorBoard event files' in warnings[0].getMessage()
  assert 'tensorflow and tensorboard' in warnings[0].getMessage()
  assert read_lines(tmp_path) == expected_lines()
  assert not (tmp_path / logs.TB_DIR).exists()


def test_only_process_0_writes(tmp_path):
  write_records(str(tmp_path), enabled=False)
  assert os.listdir(tmp_path) == []


def test_a_planted_link_is_not_written_through(tmp_path, without_tensorflow):
  victim = tmp_path / 'victim'
  victim.write_text('precious')
  os.symlink(victim, tmp_path / logs.METRICS_FILE)
  writer = logs.MetricWriter(str(tmp_path), enabled=True)
  with pytest.raises(OSError):
    writer.write(1, 'train', {'loss': 1.0})
  writer.close()
  assert victim.read_text() == 'precious'


class _Writer:
  def __init__(self):
    self.records = []

  def write(self, step, split, scalars, **extra):
    self.records.append((step, split, dict(scalars), extra))


def test_step_rates_and_eta_leave_out_the_first_step(monkeypatch):
  """The first step of an epoch's log (the compile, the pipeline's warm-up) is in the loss
  means, not in `steps_per_sec` nor in the progress bar's rate; a window of that step alone
  states no rate."""
  clock = iter([100.0, 101.0, 103.0, 104.0, 200.0])  # the completions add() sees
  monkeypatch.setattr(logs.time, 'time', lambda: next(clock))
  writer = _Writer()
  log = logs.StepLog(writer, None, log_every=2, epoch=0, first_step=0, epoch_end=4,
                     steps_per_epoch=4, show=True)
  assert [log.needs_sync(s) for s in (1, 2, 3, 4)] == [True, True, False, True]
  for step, loss in zip((1, 2, 3, 4), (4.0, 2.0, 1.0, 3.0)):
    log.add(step, {'loss': np.float32(loss)})
    if step == 1:
      assert log.bar.initial == log.bar.n == log.bar.last_print_n == 1  # the ETA from here
  log.close()
  assert [(r[0], r[2]) for r in writer.records] == [
      (2, {'loss': 3.0, 'steps_per_sec': 1.0}),  # step 2 alone: 100 -> 101
      (4, {'loss': 2.0, 'steps_per_sec': 2 / 3})]  # steps 3 and 4: 101 -> 104
  resumed = logs.StepLog(writer, None, log_every=2, epoch=1, first_step=5, epoch_end=8,
                         steps_per_epoch=4, show=False)
  assert resumed.needs_sync(6)
  resumed.add(6, {'loss': np.float32(1.0)})  # opens the window and the timing: no rate yet
  assert writer.records[-1] == (6, 'train', {'loss': 1.0}, {'epoch': 1})
  resumed.close()


def test_the_first_step_of_a_process_is_announced_with_its_start_up(monkeypatch, caplog):
  """`announce_start` (the run's first epoch in a process) logs the first step's completion
  with the seconds since the process started; the other epochs' logs do not."""
  monkeypatch.setattr(logs.runtime, 'seconds_since_process_start', lambda: 12.34)
  caplog.set_level(logging.INFO)
  for announce in (True, False):
    log = logs.StepLog(_Writer(), None, log_every=2, epoch=0, first_step=4, epoch_end=8,
                       steps_per_epoch=4, show=False, announce_start=announce)
    log.add(5, {'loss': np.float32(1.0)})
    log.add(6, {'loss': np.float32(1.0)})
    log.close()
  lines = [r.getMessage() for r in caplog.records if logs.FIRST_STEP_LOG in r.getMessage()]
  assert lines == [f'{logs.FIRST_STEP_LOG} step 5 done, 12.3 s after the process started.']
