"""Training metrics: the metric writer (process 0), and the per-step host log with the
non-finite-loss stop.

`MetricWriter` writes each record twice: one JSON line in `<workdir>/metrics.jsonl` (the
record other tools read, appended whole, torn lines dropped on resume) and TensorBoard scalars
through `tf.summary` in `<workdir>/tensorboard` (tags `<split>/<name>`; what
`clu.metric_writers.SummaryWriter` writes, without its import of TensorBoard's hparams plugin,
which imports Keras). The event files need TensorFlow and TensorBoard; where either cannot be
imported the run writes the JSONL alone and says so once.
"""

from collections.abc import Mapping
import json
import os
import time
from typing import Any, TYPE_CHECKING

import jax
import numpy as np
from absl import logging
import tqdm

from prvr_jax import files
from prvr_jax import runtime

if TYPE_CHECKING:
  # Only a type here: importing orbax (under prvr_jax.checkpoint) would add its memory and
  # import time to `import prvr_jax.train` for users of the step alone.
  from prvr_jax.checkpoint import Checkpoints

METRICS_FILE = 'metrics.jsonl'
# Opens the log line of the first step a training process completes (`StepLog`).
FIRST_STEP_LOG = 'First step of this process:'
TB_DIR = 'tensorboard'


class NonFiniteLossError(FloatingPointError):
  """The training loss became NaN or Inf; the message names the step and the terms."""


class _TensorBoard:
  """Scalars into the TensorBoard event files of a `tf.summary` file writer."""

  def __init__(self, writer: Any, scalar: Any):
    self._writer, self._scalar = writer, scalar

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    with self._writer.as_default():
      for tag, value in scalars.items():
        self._scalar(tag, value, step=step)

  def flush(self) -> None:
    self._writer.flush()

  def close(self) -> None:
    self._writer.close()


def _tensorboard_writer(logdir: str) -> _TensorBoard | None:
  """The TensorBoard writer on `logdir`, or None (with one warning) when TensorFlow or
  TensorBoard (which provides `tf.summary.scalar`) cannot be imported."""
  try:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    scalar = tf.summary.scalar  # TensorBoard's: TensorFlow imports it on first use
  except (ImportError, AttributeError) as e:
    logging.warning('No TensorBoard event files for this run: tf.summary cannot be used '
                    '(%s: %s; it needs tensorflow and tensorboard). Metrics are written to %s '
                    'only.', type(e).__name__, e, METRICS_FILE)
    return None
  # Its summary ops must not take accelerator memory from JAX.
  from prvr_jax.data import frames  # pylint: disable=g-import-not-at-top
  frames.keep_tf_off_accelerators()
  return _TensorBoard(tf.summary.create_file_writer(logdir), scalar)


def _append_line(path: str, line: str) -> None:
  """Appends `line` and a newline in one write call to a file opened O_APPEND, never through a
  planted link: a crash leaves at most a torn last line, which `truncate_after` drops."""
  fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
  with os.fdopen(fd, 'ab') as f:
    f.write((line + '\n').encode('utf-8'))


class MetricWriter:
  """Scalars to `<workdir>/metrics.jsonl` and TensorBoard event files (process 0 only).

  A record is `{'step', 'split', **extra, **scalars}` in the JSONL, and the scalars as
  TensorBoard tags `<split>/<name>` at `step`.
  """

  def __init__(self, workdir: str, enabled: bool):
    self.enabled = enabled
    self._jsonl = os.path.join(workdir, METRICS_FILE)
    self._tb = _tensorboard_writer(os.path.join(workdir, TB_DIR)) if enabled else None

  def truncate_after(self, step: int) -> None:
    """Drops jsonl records past `step` (written by a run that is now being resumed), earlier
    test records (the test split is evaluated again at the end), and lines that are not
    whole records (a crash mid-write), saying so."""
    if not self.enabled or not os.path.exists(self._jsonl):
      return
    kept, torn = [], 0
    with open(self._jsonl, encoding='utf-8', errors='replace') as f:
      for line in f:
        if not line.strip():
          continue
        try:
          record = json.loads(line)
          keep = record['step'] <= step and record['split'] != 'test'
        except (json.JSONDecodeError, KeyError, TypeError):
          torn += 1
          continue
        if keep:
          kept.append(line if line.endswith('\n') else line + '\n')
    if torn:
      logging.warning('%s: dropped %d line(s) that are not whole records (a crash while '
                      'writing them).', self._jsonl, torn)
    files.write_atomic(self._jsonl, lambda f: f.write(''.join(kept).encode('utf-8')))

  def write(self, step: int, split: str, scalars: Mapping[str, float], **extra: Any) -> None:
    """Writes one record; the event file is flushed, so TensorBoard shows it at once."""
    if not self.enabled:
      return
    values = {k: float(v) for k, v in scalars.items()}
    _append_line(self._jsonl, json.dumps({'step': int(step), 'split': split, **extra, **values}))
    if self._tb is not None:
      self._tb.write_scalars(int(step), {f'{split}/{k}': v for k, v in values.items()})
      self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()
      self._tb = None


class StepLog:
  """Host side of one epoch's train steps: finiteness check, running means, logging, progress.

  The first step an epoch's log sees waits for whatever came before it (the compile, the
  input pipeline's warm-up, a restore): `steps_per_sec` and the progress bar's rate and ETA
  count the steps after it, timed from its completion. With `announce_start` (the run's first
  epoch in this process) that completion is logged with the seconds since the process started:
  the start-up a user waits through (`benchmarks/startup.py` reads it). `add` must see a step
  as soon as it completes for the steps that close a logging window (`needs_sync`), so that
  the window's time ends where its last step did, however the backend dispatches.
  """

  def __init__(self, writer: MetricWriter, checkpoints: 'Checkpoints', log_every: int, epoch: int,
               first_step: int, epoch_end: int, steps_per_epoch: int, show: bool,
               announce_start: bool = False):
    self.writer, self.checkpoints, self.log_every = writer, checkpoints, log_every
    self.announce_start = announce_start
    self.epoch, self.epoch_end, self.first_step = epoch, epoch_end, first_step
    self.window, self.window_steps, self.timed_steps, self.tick = {}, 0, 0, None
    self.total, self.steps = {}, 0
    self.bar = tqdm.tqdm(total=steps_per_epoch,
                         initial=first_step - (epoch_end - steps_per_epoch),
                         desc=f'epoch {epoch}', disable=not show, dynamic_ncols=True)

  def needs_sync(self, step: int) -> bool:
    """Whether the update that produced `step` opens the timing or closes a logging window."""
    return step == self.first_step + 1 or step % self.log_every == 0 or step == self.epoch_end

  def add(self, step: int, metrics: Mapping[str, jax.Array]) -> None:
    """Records the metrics of the update that produced `step` (blocks until it is done)."""
    values = {k: float(v) for k, v in jax.device_get(dict(metrics)).items()}
    now = time.time()
    if not np.isfinite(values['loss']):
      terms = ', '.join(f'{k}={v:.6g}' for k, v in values.items())
      last = self.checkpoints.latest_step()
      where = (f'the last good checkpoint (step {last}) in {self.checkpoints.latest.directory} '
               'is intact' if last is not None else 'no checkpoint had been written yet')
      raise NonFiniteLossError(
          f'Non-finite loss at step {step} (epoch {self.epoch}): {terms}. Training stopped '
          f'and this state was not saved; {where}.')
    for k, v in values.items():
      self.window[k] = self.window.get(k, 0.0) + v
      self.total[k] = self.total.get(k, 0.0) + v
    self.window_steps += 1
    self.steps += 1
    self.bar.update(1)
    if self.tick is None:  # the first step: the rates and the ETA start at its completion
      self.tick = now
      if self.announce_start:
        age = runtime.seconds_since_process_start()
        logging.info('%s step %d done%s.', FIRST_STEP_LOG, step,
                     '' if age is None else f', {age:.1f} s after the process started')
      done = self.bar.n
      self.bar.reset()  # restarts tqdm's clock and rate
      self.bar.initial = self.bar.n = self.bar.last_print_n = done
      self.bar.refresh()
    else:
      self.timed_steps += 1
    self.bar.set_postfix(loss=f'{values["loss"]:.4f}')
    if step % self.log_every == 0 or step == self.epoch_end:
      scalars = {k: v / self.window_steps for k, v in self.window.items()}
      if self.timed_steps:
        scalars['steps_per_sec'] = self.timed_steps / max(now - self.tick, 1e-9)
      self.writer.write(step, 'train', scalars, epoch=self.epoch)
      self.window, self.window_steps, self.timed_steps, self.tick = {}, 0, 0, now

  def mean_loss(self) -> float:
    return self.total['loss'] / self.steps if self.steps else float('nan')

  def close(self) -> None:
    self.bar.close()


def loggable(metrics: Mapping[str, Any]) -> dict[str, float]:
  """The scalars worth a TensorBoard curve (no counts)."""
  return {k: v for k, v in metrics.items()
          if not k.endswith('_count') and not k.startswith('num_')}
