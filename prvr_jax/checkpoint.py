"""Checkpoints of a workdir, and parameters from one of ours or from an official PyTorch file.

Workdir layout (written by `prvr_jax.train`): `checkpoints/<step>` (the latest full train
states), `best/<step>` (the best parameters), each an Orbax checkpoint with a JSON `meta`
item holding the model fingerprint and the loop position; `config.json`, the run's config.

`load_params` serves evaluation, the training loop's final test and user code: it builds no
optimizer (a full state is restored partially, parameters only) and checks that the
checkpoint holds the configured model.
"""

from collections.abc import Mapping
import hashlib
import json
import logging as pylogging
import os
from typing import Any

from absl import logging
import jax
from jax.sharding import Mesh
import ml_collections
import orbax.checkpoint as ocp

from prvr_jax import convert
from prvr_jax import parallel
from prvr_jax.models import registry

LATEST_DIR = 'checkpoints'
BEST_DIR = 'best'
CONFIG_FILE = 'config.json'
TORCH_SUFFIXES = ('.ckpt', '.pth', '.pt', '.bin')


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


def abstract_params(config: ml_collections.ConfigDict, mesh: Mesh) -> Any:
  """ShapeDtypeStructs of the model's parameters, replicated on `mesh`."""
  sharding = parallel.replicated(mesh)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                      registry.get_spec(config.model).param_shapes(config.model))


def _read_meta(manager: ocp.CheckpointManager, step: int | None = None) -> dict[str, Any] | None:
  """The JSON metadata of `step` (default: the latest) of `manager`, or None."""
  step = manager.latest_step() if step is None else step
  if step is None:
    return None
  return dict(manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta)


def _restore_newest(manager: ocp.CheckpointManager, **items: Any) -> Any:
  """The newest checkpoint of `manager` (its `items` and its JSON `meta`), or None."""
  step = manager.latest_step()
  if step is None:
    return None
  return manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore(), **items))


def _params_only(abstract: Any) -> ocp.args.PyTreeRestore:
  """Restore args reading only `params` of a saved train state."""
  item = {'params': abstract}
  return ocp.args.PyTreeRestore(item=item, partial_restore=True,
                                restore_args=ocp.checkpoint_utils.construct_restore_args(item))


class Checkpoints:
  """`<workdir>/checkpoints` (latest full states) and `<workdir>/best` (best params).

  Both are Orbax `CheckpointManager`s with async, atomic saves and a JSON `meta` item. A best
  checkpoint is finished before the latest checkpoint of the same step starts, so a latest
  checkpoint never refers to a best one that is missing.
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

  def check_model(self, config: ml_collections.ConfigDict) -> None:
    """Raises if the workdir holds checkpoints of another model."""
    for manager in (self.latest, self.best):
      meta = _read_meta(manager)
      if meta is not None:
        check_fingerprint(meta, config, self.workdir)

  def restore_latest(self, abstract_state: Any) -> tuple[Any, dict[str, Any]] | None:
    """(state, meta) of the newest full state, or None."""
    restored = _restore_newest(self.latest, state=ocp.args.StandardRestore(abstract_state))
    return None if restored is None else (restored.state, dict(restored.meta))

  def restore_best_params(self, abstract: Any) -> tuple[Any, dict[str, Any]] | None:
    """(params, meta) of the best checkpoint, or None."""
    restored = _restore_newest(self.best, params=ocp.args.StandardRestore(abstract))
    return None if restored is None else (restored.params, dict(restored.meta))

  def drop_best_after(self, step: int) -> None:
    """Deletes best checkpoints newer than the resumed step (a run stopped in between wrote
    them; the resumed run will write the same ones again)."""
    for s in self.best.all_steps():
      if s > step:
        self.best.delete(s)

  def save_latest(self, state: Any, meta: dict[str, Any]) -> None:
    self.latest.save(int(meta['step']), args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))

  def save_best(self, params: Any, meta: dict[str, Any]) -> None:
    self.best.save(int(meta['step']), args=ocp.args.Composite(
        params=ocp.args.StandardSave(params), meta=ocp.args.JsonSave(meta)))
    self.best.wait_until_finished()

  def latest_step(self) -> int | None:
    return self.latest.latest_step()

  def wait(self) -> None:
    self.best.wait_until_finished()
    self.latest.wait_until_finished()

  def close(self) -> None:
    self.best.close()
    self.latest.close()


def _location(path: str) -> tuple[str, str, int | None]:
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
    path: a train.py workdir / checkpoint folder (see `_location`), or an official PyTorch
      `best.ckpt` / state_dict file (converted by `prvr_jax.convert`).
    config: the config; its model must be the checkpoint's model.
    mesh: from `parallel.make_mesh()`.

  Returns:
    (params, info) with info `{'source': 'official' | 'prvr_jax', 'path', 'workdir', 'step'}`
    (`workdir` is None for official files).
  """
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
  workdir, directory, step = _location(path)
  manager = ocp.CheckpointManager(directory)
  try:
    step = manager.latest_step() if step is None else step
    if step is None or step not in manager.all_steps():
      raise ValueError(f'{directory} holds no complete checkpoint'
                       + (f' at step {step}.' if step is not None else '.'))
    check_fingerprint(_read_meta(manager, step), config, directory)
    abstract = abstract_params(config, mesh)
    if os.path.basename(directory) == BEST_DIR:
      args = ocp.args.Composite(params=ocp.args.StandardRestore(abstract))
      params = manager.restore(step, args=args).params
    else:
      params = manager.restore(step, args=ocp.args.Composite(
          state=_params_only(abstract))).state['params']
  finally:
    manager.close()
  return params, {'source': 'prvr_jax', 'path': os.path.join(directory, str(step)),
                  'workdir': workdir, 'step': step}


def quiet_library_logs() -> None:
  """Hides the INFO chatter of Orbax from the absl log (warnings and errors stay)."""
  class _Filter(pylogging.Filter):
    def filter(self, record: pylogging.LogRecord) -> bool:
      return record.levelno >= pylogging.WARNING or f'{os.sep}orbax{os.sep}' not in record.pathname
  logging.get_absl_handler().addFilter(_Filter())
