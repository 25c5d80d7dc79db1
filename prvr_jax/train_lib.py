"""Training: state, jitted step, checkpoints, logging and the epoch loop.

`train_and_evaluate(config, workdir)` is what `train.py` runs:

* One `data` mesh over every global device; parameters and optimiser state are
  replicated, batches sharded on their leading axis (`prvr_jax.parallel`).
* State built with `jax.eval_shape` and a jitted init with replicated output
  shardings; one jitted train step with the state donated; per-step randomness
  `fold_in(state.rng, state.step)`; the hard-negative switch is a traced boolean.
* By default the data order does not depend on the host count: every host reads
  the global batch stream and feeds its own block of rows, so 1 device, N devices
  and N hosts see the same global batches (`config.data.host_sharded_reading`
  switches to per-host shard files for large pods).
* Validation every epoch (official R@1/5/10/100/SumR); the best val SumR is
  kept in `<workdir>/best`, the latest state in `<workdir>/checkpoints`;
  early stopping after more than `config.train.patience` epochs without
  improvement (the official rule). At the end the best checkpoint is evaluated
  on the test split -> `<workdir>/test_metrics.json`.
* Checkpoints are Orbax, async and atomic (written to a tmp dir, then renamed)
  with JSON metadata (model fingerprint, epochs done, best SumR, early-stop
  counter). Restarting with the same workdir resumes exactly: the restored
  step fixes the data position and the RNG.
* A non-finite loss stops the run (`NonFiniteLossError`) before that state can
  be saved.

Test hooks (read with defaults, off unless set): `config.train.stop_after_steps`
(save and stop after that global step, as if preempted), and
`config.train.inject_nan_at_step` (the loss at that step becomes NaN).
"""

from collections.abc import Iterator, Mapping
import hashlib
import json
import logging as pylogging
import os
import time
from typing import Any

from absl import logging
from flax import struct
import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
import tqdm

from prvr_jax import convert
from prvr_jax import eval_lib
from prvr_jax import files
from prvr_jax import models
from prvr_jax import optim
from prvr_jax import parallel
from prvr_jax.data import pipeline

LATEST_DIR = 'checkpoints'
BEST_DIR = 'best'
METRICS_FILE = 'metrics.jsonl'
TEST_METRICS_FILE = 'test_metrics.json'
CONFIG_FILE = 'config.json'
TB_DIR = 'tensorboard'


class NonFiniteLossError(FloatingPointError):
  """The training loss became NaN or Inf; the message names the step and the terms."""


class TrainState(struct.PyTreeNode):
  """step: updates done; params: the model's `params` collection; rng: raw PRNG key."""
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array


# ----------------------------------------------------------------------------- model identity


def model_fingerprint(config: ml_collections.ConfigDict) -> dict[str, str]:
  """Model name and a hash of every `config.model` field (guards resuming/evaluating)."""
  fields = json.dumps(config.model.to_dict(), sort_keys=True, default=list)
  return {'model': config.model.name,
          'model_config_hash': hashlib.sha256(fields.encode()).hexdigest()[:16]}


def check_fingerprint(meta: Mapping[str, Any], config: ml_collections.ConfigDict,
                      where: str) -> None:
  """Raises a clear error when checkpoint metadata `meta` is of another model."""
  want = model_fingerprint(config)
  have = {k: meta.get(k) for k in want}
  if have != want:
    raise ValueError(
        f'{where} holds a checkpoint of model {have["model"]!r} (model config hash '
        f'{have["model_config_hash"]}), but the config describes model {want["model"]!r} '
        f'(hash {want["model_config_hash"]}). Use a new --workdir, or the config the '
        f'checkpoint was trained with (saved as {CONFIG_FILE} in its workdir).')


# ----------------------------------------------------------------------------- state and step


def weight_decay_mask(params: Any, model_name: str) -> Any:
  """True where the official BertAdam decays: names without bias / LayerNorm.{weight,bias}."""
  return jax.tree.map(lambda name: not optim.official_no_decay(name),
                      convert.torch_names(params, model_name))


def make_optimizer(config: ml_collections.ConfigDict, total_steps: int
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """The optimiser of `config.optim` for `total_steps` updates, and its lr schedule."""
  mask = None
  if config.optim.name == 'bert_adam':
    mask = weight_decay_mask(models.param_shapes(config.model), config.model.name)
  tx = optim.make_optimizer(config.optim, total_steps, mask)
  schedule = optim.warmup_linear_schedule(config.optim.lr, config.optim.warmup_proportion,
                                          total_steps)
  return tx, schedule


def _init_fn(config: ml_collections.ConfigDict, model: nn.Module,
             tx: optax.GradientTransformation):
  def init(rng: jax.Array) -> TrainState:
    params_rng, train_rng = jax.random.split(rng)
    params = models.init_params(model, config.model, params_rng)
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                      rng=train_rng)
  return init


def abstract_train_state(config: ml_collections.ConfigDict, model: nn.Module,
                         tx: optax.GradientTransformation, mesh: Mesh) -> TrainState:
  """ShapeDtypeStructs (with replicated shardings) of the train state; nothing computed."""
  abstract = jax.eval_shape(_init_fn(config, model, tx), jax.random.PRNGKey(0))
  sharding = parallel.replicated(mesh)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                      abstract)


def create_train_state(config: ml_collections.ConfigDict, model: nn.Module,
                       tx: optax.GradientTransformation, mesh: Mesh) -> TrainState:
  """Fresh state from `config.train.seed`, computed on device already replicated."""
  init = jax.jit(_init_fn(config, model, tx), out_shardings=parallel.replicated(mesh))
  return init(jax.random.PRNGKey(config.train.seed))


def make_train_step(config: ml_collections.ConfigDict, model: nn.Module,
                    tx: optax.GradientTransformation, schedule: optax.Schedule, mesh: Mesh):
  """Jitted `(state, batch, use_hard_negative, nan_at_step) -> (state, metrics)`.

  The state is donated. `use_hard_negative` (bool) and `nan_at_step` (int; the test hook
  `config.train.inject_nan_at_step`, -1 = off) are traced scalars, so neither recompiles.
  metrics: `loss`, every weighted loss term, `lr` (of this update) and `grad_norm`
  (global L2 norm of the gradients before clipping), all replicated scalars.
  Matmuls run at `config.train.matmul_precision` ('float32' or 'bfloat16').
  """
  precision = config.train.matmul_precision

  def step_fn(state: TrainState, batch: dict[str, jax.Array], use_hard_negative: jax.Array,
              nan_at_step: jax.Array):
    with jax.default_matmul_precision(precision):
      return _step(state, batch, use_hard_negative, nan_at_step)

  def _step(state, batch, use_hard_negative, nan_at_step):
    rng = jax.random.fold_in(state.rng, state.step)
    dropout_rng, loss_rng = jax.random.split(rng)
    fault = jnp.where(state.step == nan_at_step, jnp.nan, 1.0)

    def loss_fn(params):
      outputs = model.apply({'params': params}, batch, deterministic=False,
                            rngs={'dropout': dropout_rng})
      loss, terms = models.compute_loss(config, outputs, batch, loss_rng, use_hard_negative)
      return loss * fault, {k: v * fault for k, v in terms.items()}

    (loss, terms), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {'loss': loss, **terms, 'lr': schedule(state.step),
               'grad_norm': optax.global_norm(grads)}
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  replicated = parallel.replicated(mesh)
  return jax.jit(step_fn, out_shardings=(replicated, replicated), donate_argnums=0)


def parameter_overview(params: Any) -> str:
  """Parameter counts per top-level module (and their children) plus the total."""
  rows = []
  for top, sub in params.items():
    rows.append((top, models.count_params(sub)))
    if isinstance(sub, Mapping):
      rows += [(f'  {top}/{name}', models.count_params(leaf)) for name, leaf in sub.items()]
  width = max(len(name) for name, _ in rows)
  lines = [f'{"module":<{width}}  {"params":>12}']
  lines += [f'{name:<{width}}  {count:>12,}' for name, count in rows]
  lines.append(f'{"total":<{width}}  {models.count_params(params):>12,}')
  return '\n'.join(lines)


# ----------------------------------------------------------------------------- checkpoints


def _restore_newest(manager: ocp.CheckpointManager, **items: Any) -> Any:
  """The newest checkpoint of `manager` (its `items` and its JSON `meta`), or None."""
  step = manager.latest_step()
  if step is None:
    return None
  return manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore(), **items))


class Checkpoints:
  """`<workdir>/checkpoints` (latest full states) and `<workdir>/best` (best params).

  Both are Orbax `CheckpointManager`s with async, atomic saves and a JSON `meta`
  item. A best checkpoint is finished before the latest checkpoint of the same step
  starts, so a latest checkpoint never refers to a best one that is missing.
  """

  def __init__(self, workdir: str, keep: int = 1):
    options = dict(create=True, enable_async_checkpointing=True)
    self.latest = ocp.CheckpointManager(
        os.path.join(workdir, LATEST_DIR), item_names=('state', 'meta'),
        options=ocp.CheckpointManagerOptions(max_to_keep=max(keep, 1), **options))
    self.best = ocp.CheckpointManager(
        os.path.join(workdir, BEST_DIR), item_names=('params', 'meta'),
        options=ocp.CheckpointManagerOptions(max_to_keep=1, **options))
    self.workdir = workdir

  @staticmethod
  def read_meta(manager: ocp.CheckpointManager, step: int | None = None
                ) -> dict[str, Any] | None:
    """The JSON metadata of `step` (default: the latest) of `manager`, or None."""
    step = manager.latest_step() if step is None else step
    if step is None:
      return None
    return dict(manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta)

  def check_model(self, config: ml_collections.ConfigDict) -> None:
    for manager in (self.latest, self.best):
      meta = self.read_meta(manager)
      if meta is not None:
        check_fingerprint(meta, config, self.workdir)

  def restore_latest(self, abstract_state: TrainState
                     ) -> tuple[TrainState, dict[str, Any]] | None:
    restored = _restore_newest(self.latest, state=ocp.args.StandardRestore(abstract_state))
    return None if restored is None else (restored.state, dict(restored.meta))

  def restore_best_params(self, abstract_params: Any) -> tuple[Any, dict[str, Any]] | None:
    restored = _restore_newest(self.best, params=ocp.args.StandardRestore(abstract_params))
    return None if restored is None else (restored.params, dict(restored.meta))

  def drop_best_after(self, step: int) -> None:
    """Deletes best checkpoints newer than the resumed step (a run stopped in between
    wrote them; the resumed run will write the same ones again)."""
    for s in self.best.all_steps():
      if s > step:
        self.best.delete(s)

  def save_latest(self, state: TrainState, meta: dict[str, Any]) -> None:
    step = int(meta['step'])
    self.latest.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))

  def save_best(self, params: Any, meta: dict[str, Any]) -> None:
    step = int(meta['step'])
    self.best.save(step, args=ocp.args.Composite(
        params=ocp.args.StandardSave(params), meta=ocp.args.JsonSave(meta)))
    self.best.wait_until_finished()

  def wait(self) -> None:
    self.best.wait_until_finished()
    self.latest.wait_until_finished()

  def close(self) -> None:
    self.best.close()
    self.latest.close()


TORCH_SUFFIXES = ('.ckpt', '.pth', '.pt', '.bin')


def _checkpoint_location(path: str) -> tuple[str, str, int | None]:
  """(workdir, manager dir, step or None = latest) of one of our checkpoint paths.

  Accepts a workdir (its best checkpoint, else its latest), `<workdir>/best` or
  `<workdir>/checkpoints`, or one step folder inside them.
  """
  path = os.path.abspath(path)
  if os.path.isdir(os.path.join(path, BEST_DIR)) or os.path.isdir(os.path.join(path, LATEST_DIR)):
    best = os.path.join(path, BEST_DIR)
    if os.path.isdir(best) and any(d.isdigit() for d in os.listdir(best)):
      return path, best, None
    return path, os.path.join(path, LATEST_DIR), None
  name = os.path.basename(path)
  if name in (BEST_DIR, LATEST_DIR):
    return os.path.dirname(path), path, None
  parent = os.path.dirname(path)
  if name.isdigit() and os.path.basename(parent) in (BEST_DIR, LATEST_DIR):
    return os.path.dirname(parent), parent, int(name)
  raise ValueError(f'{path} is not a checkpoint: expected a train.py workdir, its {BEST_DIR}/ or '
                   f'{LATEST_DIR}/ folder, a step folder inside them, or an official PyTorch '
                   f'checkpoint file ({", ".join(TORCH_SUFFIXES)}).')


def load_params(path: str, config: ml_collections.ConfigDict, mesh: Mesh
                ) -> tuple[Any, dict[str, Any]]:
  """Parameters (replicated on `mesh`) from one of our checkpoints or an official one.

  Args:
    path: a train.py workdir / checkpoint folder (see `_checkpoint_location`), or an
      official PyTorch `best.ckpt` / state_dict file (converted by `prvr_jax.convert`).
    config: the config; its model must be the checkpoint's model.
    mesh: from `parallel.make_mesh()`.

  Returns:
    (params, info) with info `{'source': 'official' | 'prvr_jax', 'path', 'workdir', 'step'}`
    (`workdir` is None for official files).
  """
  model = models.get_model(config.model)
  if os.path.isfile(path):
    if not path.endswith(TORCH_SUFFIXES):
      raise ValueError(f'{path} is a file but not a PyTorch checkpoint '
                       f'({", ".join(TORCH_SUFFIXES)}).')
    state_dict = convert.load_torch_checkpoint(path)
    params = convert.torch_to_params(state_dict, config.model.name, config.model)
    return (parallel.replicate(params, mesh),
            {'source': 'official', 'path': path, 'workdir': None, 'step': None})
  if not os.path.exists(path):
    raise FileNotFoundError(f'--checkpoint={path} does not exist.')
  workdir, directory, step = _checkpoint_location(path)
  manager = ocp.CheckpointManager(directory)
  step = manager.latest_step() if step is None else step
  if step is None or step not in manager.all_steps():
    raise ValueError(f'{directory} holds no complete checkpoint'
                     + (f' at step {step}.' if step is not None else '.'))
  check_fingerprint(Checkpoints.read_meta(manager, step), config, directory)
  if os.path.basename(directory) == BEST_DIR:
    abstract = abstract_train_state(config, model, optax.identity(), mesh).params
    params = manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract))).params
  else:
    tx, _ = make_optimizer(config, total_steps=1)  # the state layout; the schedule is unused
    abstract = abstract_train_state(config, model, tx, mesh)
    params = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract))).state.params
  manager.close()
  return params, {'source': 'prvr_jax', 'path': os.path.join(directory, str(step)),
                  'workdir': workdir, 'step': step}


# ----------------------------------------------------------------------------- logging


class MetricWriter:
  """Scalars to TensorBoard event files and `<workdir>/metrics.jsonl` (process 0 only)."""

  def __init__(self, workdir: str, enabled: bool):
    self.enabled = enabled
    self._jsonl = os.path.join(workdir, METRICS_FILE)
    self._tb = None
    if enabled:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      self._tf = tf
      self._tb = tf.summary.create_file_writer(os.path.join(workdir, TB_DIR))
      self._scalar_meta = tf.compat.v1.SummaryMetadata(
          plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name='scalars'))

  def truncate_after(self, step: int) -> None:
    """Drops jsonl records past `step` (written by a run that is now being resumed) and
    earlier test records (the test split is evaluated again at the end)."""
    if not self.enabled or not os.path.exists(self._jsonl):
      return
    with open(self._jsonl, encoding='utf-8') as f:
      records = [line for line in f if line.strip()]
    kept = [line for line in records
            if json.loads(line)['step'] <= step and json.loads(line)['split'] != 'test']
    with open(self._jsonl, 'w', encoding='utf-8') as f:
      f.writelines(kept)

  def write(self, step: int, split: str, scalars: Mapping[str, float], **extra: Any) -> None:
    if not self.enabled:
      return
    record = {'step': int(step), 'split': split, **extra,
              **{k: float(v) for k, v in scalars.items()}}
    with open(self._jsonl, 'a', encoding='utf-8') as f:
      f.write(json.dumps(record) + '\n')
    with self._tb.as_default():
      for name, value in scalars.items():
        self._tf.summary.write(f'{split}/{name}', self._tf.constant(float(value)), step=step,
                               metadata=self._scalar_meta)
    self._tb.flush()

  def close(self) -> None:
    if self._tb is not None:
      self._tb.close()


def quiet_library_logs() -> None:
  """Hides the INFO chatter of Orbax from the absl log (warnings and errors stay)."""
  class _Filter(pylogging.Filter):
    def filter(self, record: pylogging.LogRecord) -> bool:
      return record.levelno >= pylogging.WARNING or f'{os.sep}orbax{os.sep}' not in record.pathname
  logging.get_absl_handler().addFilter(_Filter())


# ----------------------------------------------------------------------------- data


def open_data(config: ml_collections.ConfigDict, workdir: str) -> pipeline.ShardDataset:
  """`pipeline.resolve_shards`, run by process 0 first (it may generate or prepare data)."""
  if jax.process_index() == 0:
    shards = pipeline.resolve_shards(config, workdir)
  parallel.sync('prvr_jax:open_data')
  if jax.process_index() != 0:
    shards = pipeline.resolve_shards(config, workdir)
  return shards


def _host_sharded_reading(config: ml_collections.ConfigDict) -> bool:
  return bool(config.data.host_sharded_reading)


def steps_per_epoch(config: ml_collections.ConfigDict, shards: pipeline.ShardDataset) -> int:
  """Training steps per epoch: ceil(#train videos / global batch) as the official t_total
  (with host-sharded reading: of the busiest host)."""
  readers = jax.process_count() if _host_sharded_reading(config) else 1
  return pipeline.steps_per_epoch(shards.split(config.data.train_split),
                                  config.train.batch_size, readers)


def train_batches(config: ml_collections.ConfigDict, shards: pipeline.ShardDataset,
                  start_step: int, mesh: Mesh) -> Iterator[dict[str, jax.Array]]:
  """Global training batches (sharded on `data`) from global step `start_step` on.

  By default every process reads the single-host batch stream and feeds its block of
  rows, so the global batches (and their layout) are the same for any number of
  devices and hosts. `config.data.host_sharded_reading=True` instead has each host
  read its own shard files (less I/O on large pods; the batches then depend on the
  host count). `config.data.max_queries_per_batch` counts query slots per host.
  """
  common = dict(global_batch_size=config.train.batch_size, seed=config.train.seed,
                start_step=start_step, shuffle_buffer=config.data.shuffle_buffer)
  slots = config.data.max_queries_per_batch
  if _host_sharded_reading(config):
    it = pipeline.train_iterator(shards, config.data.train_split,
                                 max_queries_per_batch=slots, **common)
    return (parallel.global_batch(b, mesh) for b in it)
  it = pipeline.train_iterator(shards, config.data.train_split, process_index=0,
                               process_count=1, max_queries_per_batch=slots * jax.process_count(),
                               **common)
  return (parallel.shard_global_view(b, mesh) for b in it)


# ----------------------------------------------------------------------------- loop


class _StepLog:
  """Host side of the train steps: finiteness check, running means, logging, progress."""

  def __init__(self, writer: MetricWriter, checkpoints: Checkpoints, log_every: int,
               epoch: int, first_step: int, epoch_end: int, steps_per_epoch: int,
               show: bool):
    self.writer, self.checkpoints, self.log_every = writer, checkpoints, log_every
    self.epoch, self.epoch_end = epoch, epoch_end
    self.window, self.window_steps, self.tick = {}, 0, time.time()
    self.total, self.steps = {}, 0
    self.bar = tqdm.tqdm(total=steps_per_epoch,
                         initial=first_step - (epoch_end - steps_per_epoch),
                         desc=f'epoch {epoch}', disable=not show, dynamic_ncols=True)

  def add(self, step: int, metrics: Mapping[str, jax.Array]) -> None:
    """Records the metrics of the update that produced `step` (blocks until it is done)."""
    values = {k: float(v) for k, v in jax.device_get(dict(metrics)).items()}
    if not np.isfinite(values['loss']):
      terms = ', '.join(f'{k}={v:.6g}' for k, v in values.items())
      last = self.checkpoints.latest.latest_step()
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
    self.bar.set_postfix(loss=f'{values["loss"]:.4f}')
    if step % self.log_every == 0 or step == self.epoch_end:
      now = time.time()
      scalars = {k: v / self.window_steps for k, v in self.window.items()}
      scalars['steps_per_sec'] = self.window_steps / max(now - self.tick, 1e-9)
      self.writer.write(step, 'train', scalars, epoch=self.epoch)
      self.window, self.window_steps, self.tick = {}, 0, now

  def mean_loss(self) -> float:
    return self.total['loss'] / self.steps if self.steps else float('nan')

  def close(self) -> None:
    self.bar.close()


def _batch_size_check(config: ml_collections.ConfigDict) -> None:
  batch_size, devices = config.train.batch_size, jax.device_count()
  if batch_size % devices or batch_size % jax.process_count():
    raise ValueError(f'config.train.batch_size={batch_size} must be a multiple of the '
                     f'{devices} devices ({jax.process_count()} processes).')


def _loggable(metrics: Mapping[str, Any]) -> dict[str, float]:
  return {k: v for k, v in metrics.items() if not k.endswith('_count') and not k.startswith('num_')}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, Any] | None:
  """Trains (or resumes) in `workdir`; returns the test metrics of the best checkpoint
  (None when the `stop_after_steps` test hook stopped the run)."""
  is_main = jax.process_index() == 0
  _batch_size_check(config)
  os.makedirs(workdir, exist_ok=True)
  mesh = parallel.make_mesh()
  model = models.get_model(config.model)
  checkpoints = Checkpoints(workdir, config.train.checkpoint_keep)
  writer = None
  try:
    checkpoints.check_model(config)
    writer = MetricWriter(workdir, is_main)
    if is_main:
      files.write_json(os.path.join(workdir, CONFIG_FILE), config.to_dict())
    shards = open_data(config, workdir)
    num_epochs = config.train.num_epochs
    epoch_steps = steps_per_epoch(config, shards)
    tx, schedule = make_optimizer(config, epoch_steps * num_epochs)
    abstract_state = abstract_train_state(config, model, tx, mesh)
    restored = checkpoints.restore_latest(abstract_state)
    if restored is None:
      state = create_train_state(config, model, tx, mesh)
      meta = {**model_fingerprint(config), 'steps_per_epoch': epoch_steps, 'step': 0,
              'epochs_done': 0, 'best_sumr': -1.0, 'best_epoch': -1, 'es_count': 0,
              'finished': False}
      logging.info('Starting %s in %s.', config.model.name, workdir)
    else:
      state, meta = restored
      if meta['steps_per_epoch'] != epoch_steps:
        raise ValueError(
            f'{workdir} was trained with {meta["steps_per_epoch"]} steps per epoch, this '
            f'config gives {epoch_steps} (config.train.batch_size={config.train.batch_size}); '
            'resume with the original batch size and data, or use a new --workdir.')
      checkpoints.drop_best_after(meta['step'])
      logging.info('Resuming %s in %s from step %d (%d epochs done).', config.model.name,
                   workdir, meta['step'], meta['epochs_done'])
    writer.truncate_after(meta['step'])
    logging.info('Parameters:\n%s', parameter_overview(state.params))
    logging.info('%d devices in %d processes; global batch %d; %d steps per epoch; %d epochs.',
                 jax.device_count(), jax.process_count(), config.train.batch_size, epoch_steps,
                 num_epochs)

    evaluator = eval_lib.Evaluator.from_config(config, model, mesh)
    if not meta['finished']:
      stopped = _train_epochs(config, model, mesh, tx, schedule, state, meta, epoch_steps,
                              shards, evaluator, checkpoints, writer)
      if stopped is None:
        return None
      state, meta = stopped
    checkpoints.wait()

    best = checkpoints.restore_best_params(abstract_state.params)
    if best is None:
      logging.warning('No best checkpoint in %s; testing the latest parameters.', workdir)
      params, best_meta = state.params, meta
    else:
      params, best_meta = best
    test = evaluator.evaluate(params, eval_lib.eval_split(config, shards, 'test'))
    out = {**test.metrics, 'step': best_meta['step'], 'best_epoch': best_meta['best_epoch'],
           'val_sumr': best_meta['best_sumr']}
    if is_main:
      files.write_json(os.path.join(workdir, TEST_METRICS_FILE), out)
    writer.write(meta['step'], 'test', _loggable(test.metrics))
    logging.info('Test, best checkpoint (epoch %d): R@1 %.1f R@5 %.1f R@10 %.1f R@100 %.1f '
                 'SumR %.1f', out['best_epoch'], out['r1'], out['r5'], out['r10'], out['r100'],
                 out['sumr'])
    return out
  finally:
    checkpoints.close()
    if writer is not None:
      writer.close()


def _train_epochs(config: ml_collections.ConfigDict, model: nn.Module, mesh: Mesh,
                  tx: optax.GradientTransformation, schedule: optax.Schedule,
                  state: TrainState, meta: dict[str, Any], epoch_steps: int,
                  shards: pipeline.ShardDataset, evaluator: eval_lib.Evaluator,
                  checkpoints: Checkpoints,
                  writer: MetricWriter) -> tuple[TrainState, dict[str, Any]] | None:
  """The epoch loop from `meta`'s position; returns (state, meta) at the end, or None
  when the `stop_after_steps` hook stopped it."""
  train_step = make_train_step(config, model, tx, schedule, mesh)
  val_data = eval_lib.eval_split(config, shards, 'val')
  stop_after = int(config.train.stop_after_steps)
  nan_at_step = np.int32(config.train.inject_nan_at_step)
  every = int(config.train.checkpoint_every_steps)
  step = int(meta['step'])
  batches = train_batches(config, shards, step, mesh)
  for epoch in range(meta['epochs_done'], config.train.num_epochs):
    use_hard = np.bool_(epoch >= config.loss.hard_negative_start_epoch)
    epoch_end = (epoch + 1) * epoch_steps
    log = _StepLog(writer, checkpoints, max(int(config.train.log_every_steps), 1), epoch, step,
                   epoch_end, epoch_steps, show=jax.process_index() == 0)
    pending = None
    # The host reads step t-1's metrics while step t runs: the NaN check costs no sync.
    while step < epoch_end:
      state, step_metrics = train_step(state, next(batches), use_hard, nan_at_step)
      step += 1
      if pending is not None:
        log.add(*pending)
      pending = (step, step_metrics)
      if step == stop_after or (every and step % every == 0 and step != epoch_end):
        log.add(*pending)
        pending = None
        checkpoints.save_latest(state, {**meta, 'step': step})
        if step == stop_after:
          log.close()
          logging.warning('Stopped after step %d (config.train.stop_after_steps).', step)
          return None
    if pending is not None:
      log.add(*pending)
    log.close()

    val = evaluator.evaluate(state.params, val_data).metrics
    improved = val['sumr'] > meta['best_sumr']
    meta = {**meta, 'step': step, 'epochs_done': epoch + 1,
            'es_count': 0 if improved else meta['es_count'] + 1}
    if improved:
      meta.update(best_sumr=val['sumr'], best_epoch=epoch)
      checkpoints.save_best(state.params, {**meta, 'val': val})
    patience = config.train.patience
    early_stop = patience != -1 and meta['es_count'] > patience
    meta['finished'] = early_stop or epoch + 1 == config.train.num_epochs
    writer.write(step, 'val', {**_loggable(val), 'best_sumr': meta['best_sumr']}, epoch=epoch)
    logging.info('Epoch %d: train loss %.4f | val R@1 %.1f R@5 %.1f R@10 %.1f R@100 %.1f SumR '
                 '%.1f%s | best SumR %.1f (epoch %d)', epoch, log.mean_loss(), val['r1'],
                 val['r5'], val['r10'], val['r100'], val['sumr'], ' (new best)' if improved else '',
                 meta['best_sumr'], meta['best_epoch'])
    checkpoints.save_latest(state, meta)
    if early_stop:
      logging.info('Early stop: val SumR did not improve for %d epochs.', meta['es_count'])
      break
  return state, meta
