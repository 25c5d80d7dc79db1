"""Checkpoints of a workdir, and parameters from one of ours or from an official PyTorch file.

Workdir layout (written by `prvr_jax.train`): `checkpoints/<step>` (the latest full train
states), `best/<step>` (the best parameters), each an Orbax checkpoint with a JSON `meta`
item holding the model fingerprint, the training data's identity, the loop position and
the sha256 of the saved arrays; `config.json`, the run's config.

Nothing is trusted blindly: a step folder without its metadata (an interrupted save) is
skipped with a warning (and set aside when training resumes), a checkpoint that cannot be
read is refused with a one-line message naming its step folder and the array TensorStore
could not read, restored arrays must match the sha256 recorded when they were saved (a flipped
bit is caught), and parameters must be finite. Reading runs nothing from the folder: Orbax
reads JSON metadata and TensorStore arrays of the shapes our config gives, through handlers
chosen here (never by name from the checkpoint's metadata).

`load_params` serves evaluation, the training loop's final test and user code: it builds no
optimizer (a full state is restored partially, parameters only) and checks that the
checkpoint holds the configured model.
"""

from collections.abc import Callable, Iterable, Mapping
import hashlib
import itertools
import json
import os
import re
from typing import Any

from absl import logging
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
import ml_collections
import numpy as np
import orbax.checkpoint as ocp

from prvr_jax import config_lib
from prvr_jax import convert
from prvr_jax import parallel
from prvr_jax import torch_file
from prvr_jax.files import short
from prvr_jax.models import registry
from prvr_jax.models.spec import ModelSpec, path_of

LATEST_DIR = 'checkpoints'
BEST_DIR = 'best'
CONFIG_FILE = 'config.json'
TORCH_SUFFIXES = ('.ckpt', '.pth', '.pt', '.bin')
# The array item of a step of `checkpoints/` (a full train state) and of `best/` (parameters).
LATEST_ITEM = 'state'
BEST_ITEM = 'params'
# Orbax writes this file last when it finalises a step folder.
_FINALIZED = '_CHECKPOINT_METADATA'


class CheckpointError(ValueError):
  """A damaged, incomplete or mismatching checkpoint; the message names its folder."""


def model_fingerprint(config_model: ml_collections.ConfigDict, spec: ModelSpec,
                      without: Iterable[str] = ()) -> dict[str, str]:
  """Model name and a hash of every `config_model` field but the `fingerprint_exempt` ones of
  its `spec` (evaluation-only knobs, init-time paths) and `without`, guarding resuming and
  evaluating."""
  exempt = set(spec.fingerprint_exempt) | set(without)
  fields = json.dumps({k: v for k, v in config_model.to_dict().items() if k not in exempt},
                      sort_keys=True, default=list)
  return {'model': config_model.name,
          'model_config_hash': hashlib.sha256(fields.encode()).hexdigest()[:16]}


def _accepted_fingerprints(config_model: ml_collections.ConfigDict, spec: ModelSpec
                           ) -> list[dict[str, str]]:
  """The fingerprint of `config_model`, and those a checkpoint written before some of the
  fields added since (`config_lib.ADDED_FIELDS`, each at its added value) has."""
  added = [k[len('model.'):] for k, v in config_lib.ADDED_FIELDS.items()
           if k.startswith('model.') and config_model.get(k[len('model.'):], None) == v]
  return [model_fingerprint(config_model, spec, without)
          for n in range(len(added) + 1) for without in itertools.combinations(added, n)]


def check_fingerprint(meta: Mapping[str, Any], config: ml_collections.ConfigDict,
                      spec: ModelSpec, where: str) -> None:
  """Raises a clear error when checkpoint metadata `meta` is of another model than
  `config.model` (of `spec`)."""
  want = model_fingerprint(config.model, spec)
  have = {k: meta.get(k) for k in want}
  if have not in _accepted_fingerprints(config.model, spec):
    raise CheckpointError(
        f'{where} holds a checkpoint of model {have["model"]!r} (model config hash '
        f'{have["model_config_hash"]}), but the config describes model {want["model"]!r} '
        f'(hash {want["model_config_hash"]}). Use a new --workdir, or the config the '
        f'checkpoint was trained with (saved as {CONFIG_FILE} in its workdir).')


def abstract_params(config: ml_collections.ConfigDict, spec: ModelSpec, mesh: Mesh) -> Any:
  """ShapeDtypeStructs of the parameters of `spec`'s model (of `config.model`), replicated
  on `mesh`."""
  sharding = parallel.replicated(mesh)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                      spec.param_shapes(config.model))


def _host(x: Any) -> np.ndarray:
  """A leaf on the host; a replicated array of several processes from its local copy."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    if not x.is_fully_replicated:
      raise ValueError('checkpoint checksums are computed on replicated arrays only')
    return np.asarray(x.addressable_data(0))
  return np.asarray(x)


def tree_digest(tree: Any) -> str:
  """sha256 of a pytree's leaves (dtype, shape and bytes, in flattening order)."""
  digest = hashlib.sha256()
  for leaf in jax.tree.leaves(tree):
    array = np.ascontiguousarray(_host(leaf))
    digest.update(f'{array.dtype.str}{array.shape}'.encode())
    digest.update(array.tobytes())
  return digest.hexdigest()


def check_finite(params: Any, where: str) -> None:
  """Raises naming the first parameter that holds NaN or inf values."""
  counts = jax.tree.map(lambda x: jnp.sum(~jnp.isfinite(x)), params)
  bad = [(path_of(path), int(_host(n))) for path, n in jax.tree_util.tree_leaves_with_path(counts)
         if int(_host(n))]
  if bad:
    raise CheckpointError(f'{where}: {len(bad)} parameter(s) hold NaN or inf values (first: '
                          f'{bad[0][0]}, {bad[0][1]} values); refusing to use them.')


# How TensorStore names the array it failed on: the key it read in the checkpoint's database
# ('Error reading "<array>/<chunk>"'), or the array's path in the spec Orbax quotes.
_TENSORSTORE_KEY = re.compile(r'Error (?:reading|writing|opening) "([^"/]+)/')
_TENSORSTORE_PATH = re.compile(r"'path': '([^'/][^']*?)/?'")


def read_error(error: BaseException) -> tuple[str | None, BaseException]:
  """(the array an Orbax / TensorStore read error is about, or None; the error that says why).

  Orbax raises a generic error quoting TensorStore's whole spec, with TensorStore's own error
  (which names the array and the cause) as its cause: that one is returned when the chain
  holds it, else the innermost error."""
  chain = []
  while error is not None and all(error is not seen for seen in chain) and len(chain) < 16:
    chain.append(error)
    error = error.__cause__ or error.__context__
  for candidate in chain:
    match = _TENSORSTORE_KEY.search(str(candidate))
    if match:
      return match.group(1), candidate
  for candidate in chain:
    match = _TENSORSTORE_PATH.search(str(candidate))
    if match:
      return match.group(1), chain[-1]
  return None, chain[-1]


# The JSON files Orbax reads in a step folder, and the largest of them checked for damage.
_ORBAX_JSON_FILES = ('_CHECKPOINT_METADATA', '_METADATA', '_sharding', 'metadata', 'process_0')
_MAX_JSON_CHECK_BYTES = 64 << 20


def _damaged_json(step_dir: str) -> str | None:
  """The first of Orbax's JSON files in `step_dir` that does not parse, or None (what a
  JSONDecodeError, which names no file, was about)."""
  for folder, _, names in sorted(os.walk(step_dir)):
    for name in sorted(set(names) & set(_ORBAX_JSON_FILES)):
      path = os.path.join(folder, name)
      if os.path.getsize(path) > _MAX_JSON_CHECK_BYTES:
        continue
      try:
        with open(path, 'rb') as f:
          json.loads(f.read())
      except ValueError:
        return path
  return None


def _step_folders(directory: str) -> list[int]:
  if not os.path.isdir(directory):
    return []
  return sorted(int(d) for d in os.listdir(directory) if d.isdigit())


def complete_steps(directory: str, item: str) -> list[int]:
  """The steps of a manager folder that Orbax finalised with their `item` and `meta`."""
  def complete(step):
    step_dir = os.path.join(directory, str(step))
    return (os.path.isfile(os.path.join(step_dir, _FINALIZED))
            and os.path.isfile(os.path.join(step_dir, 'meta', 'metadata'))
            and os.path.isdir(os.path.join(step_dir, item)))
  return [s for s in _step_folders(directory) if complete(s)]


class _Store:
  """The steps of one Orbax manager folder, each an `item` and a JSON `meta` item.

  `digests(value)` names the sub-trees whose sha256 a save records in `meta['digests']`.
  With `writable`, incomplete step folders are set aside (renamed `<step>.incomplete`, by
  process 0) so that the run can save that step again.
  """

  def __init__(self, directory: str, item: str, digests: Callable[[Any], dict[str, Any]],
               keep: int = 1, writable: bool = False):
    self.directory, self.item, self._digests = directory, item, digests
    for step in self._incomplete_steps():
      step_dir = os.path.join(directory, str(step))
      if writable and jax.process_index() == 0:
        aside = f'{step_dir}.incomplete'
        logging.warning('%s is an incomplete checkpoint (an interrupted save); it is set '
                        'aside as %s.', step_dir, aside)
        os.replace(step_dir, aside)
      elif not writable:
        logging.warning('%s is an incomplete checkpoint (an interrupted save); skipped.',
                        step_dir)
    if writable:
      parallel.sync(f'prvr_jax:checkpoints:{directory}')  # process 0 set them aside
      options = ocp.CheckpointManagerOptions(max_to_keep=max(keep, 1), create=True,
                                             enable_async_checkpointing=True)
      self.manager = ocp.CheckpointManager(directory, item_names=(item, 'meta'),
                                           options=options)
    else:
      self.manager = ocp.CheckpointManager(directory)

  def _incomplete_steps(self) -> list[int]:
    return sorted(set(_step_folders(self.directory)) - set(self.steps()))

  def steps(self) -> list[int]:
    """The complete steps, oldest first."""
    return complete_steps(self.directory, self.item)

  def latest_step(self) -> int | None:
    steps = self.steps()
    return steps[-1] if steps else None

  def meta(self, step: int) -> dict[str, Any]:
    """The JSON metadata of `step`."""
    return dict(self._restore(step, meta=ocp.args.JsonRestore()).meta)

  def restore(self, step: int, args: Any, part: str | None = None) -> tuple[Any, dict[str, Any]]:
    """(value, meta) of `step`: `args` restore the item; the restored value (or its `part`,
    when `args` restore only that sub-tree) must match the recorded sha256."""
    restored = self._restore(step, meta=ocp.args.JsonRestore(), **{self.item: args})
    meta = dict(restored.meta)
    value = restored[self.item]
    if part is not None:
      value = value[part]
    recorded = meta.get('digests', {}).get(part or self.item)
    step_dir = os.path.join(self.directory, str(step))
    if recorded is None:
      logging.warning('%s records no checksum of its arrays (written by an older version); '
                      'restored unverified.', step_dir)
    elif tree_digest(value) != recorded:
      raise CheckpointError(
          f'{step_dir} is corrupted: the sha256 of its {part or self.item} arrays differs from '
          f'the one recorded when they were saved. {self._alternatives(step)}')
    return value, meta

  def _restore(self, step: int, **items: Any) -> Any:
    step_dir = os.path.join(self.directory, str(step))
    try:
      return self.manager.restore(step, args=ocp.args.Composite(**items))
    except Exception as e:  # pylint: disable=broad-except  (Orbax / TensorStore errors)
      array, error = read_error(e)
      what = f'array {self.item}/{array}: ' if array else ''
      if isinstance(error, json.JSONDecodeError):
        damaged = _damaged_json(step_dir)
        what = f'JSON file {os.path.relpath(damaged, step_dir)}: ' if damaged else ''
      reason = ' '.join(str(error).split(' See full TensorStore details')[0].split())
      raise CheckpointError(
          f'{step_dir} cannot be read ({what}{type(error).__name__}: '
          f'{short(reason, 300, quote=False)}); the checkpoint is damaged or incomplete. '
          f'{self._alternatives(step)}') from None

  def _alternatives(self, step: int) -> str:
    others = [s for s in self.steps() if s != step]
    if others:
      return (f'Other complete steps in {self.directory}: {others}; use one of them '
              f'(delete {step} to resume from an earlier one).')
    return 'There is no other complete step in this folder.'

  def save(self, value: Any, meta: dict[str, Any]) -> None:
    digests = {name: tree_digest(tree) for name, tree in self._digests(value).items()}
    self.manager.save(int(meta['step']), args=ocp.args.Composite(
        **{self.item: ocp.args.StandardSave(value)},
        meta=ocp.args.JsonSave({**meta, 'digests': digests})))

  def delete(self, step: int) -> None:
    self.manager.delete(step)

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.close()


def _latest_store(directory: str, keep: int = 1, writable: bool = False) -> _Store:
  return _Store(directory, LATEST_ITEM, lambda state: {'state': state, 'params': state.params},
                keep, writable)


def _best_store(directory: str, writable: bool = False) -> _Store:
  return _Store(directory, BEST_ITEM, lambda params: {'params': params}, 1, writable)


def _params_only(abstract: Any) -> ocp.args.PyTreeRestore:
  """Restore args reading only `params` of a saved train state."""
  item = {'params': abstract}
  return ocp.args.PyTreeRestore(item=item, partial_restore=True,
                                restore_args=ocp.checkpoint_utils.construct_restore_args(item))


class Checkpoints:
  """`<workdir>/checkpoints` (latest full states) and `<workdir>/best` (best params) of a run.

  Async, atomic Orbax saves with a JSON `meta` item (and the arrays' sha256). A best
  checkpoint is finished before the latest checkpoint of the same step starts, so a latest
  checkpoint never refers to a best one that is missing.
  """

  def __init__(self, workdir: str, keep: int = 1):
    self.workdir = workdir
    self.latest = _latest_store(os.path.join(workdir, LATEST_DIR), keep, writable=True)
    self.best = _best_store(os.path.join(workdir, BEST_DIR), writable=True)

  def latest_meta(self) -> dict[str, Any] | None:
    """The metadata of the newest full state, or None."""
    step = self.latest.latest_step()
    return None if step is None else self.latest.meta(step)

  def check_model(self, config: ml_collections.ConfigDict, spec: ModelSpec) -> None:
    """Raises if the workdir holds checkpoints of another model than `config.model` (of
    `spec`)."""
    for store in (self.latest, self.best):
      step = store.latest_step()
      if step is not None:
        check_fingerprint(store.meta(step), config, spec, self.workdir)

  def restore_latest(self, abstract_state: Any) -> tuple[Any, dict[str, Any]] | None:
    """(state, meta) of the newest full state, or None."""
    step = self.latest.latest_step()
    if step is None:
      return None
    return self.latest.restore(step, ocp.args.StandardRestore(abstract_state))

  def restore_best_params(self, abstract: Any) -> tuple[Any, dict[str, Any]] | None:
    """(params, meta) of the best checkpoint, or None."""
    step = self.best.latest_step()
    if step is None:
      return None
    return self.best.restore(step, ocp.args.StandardRestore(abstract))

  def drop_best_after(self, step: int) -> None:
    """Deletes best checkpoints newer than the resumed step (a run stopped in between wrote
    them; the resumed run will write the same ones again)."""
    for s in self.best.steps():
      if s > step:
        self.best.delete(s)

  def save_latest(self, state: Any, meta: dict[str, Any]) -> None:
    """Saves the train state; written in the background, except on a CPU backend, where that
    write would compete with the next train steps for the same cores and slow them
    (docs/benchmarks.md, "What the defaults rest on")."""
    self.latest.save(state, meta)
    if jax.default_backend() == 'cpu':
      self.latest.wait()

  def save_best(self, params: Any, meta: dict[str, Any]) -> None:
    self.best.save(params, meta)
    self.best.wait()

  def latest_step(self) -> int | None:
    return self.latest.latest_step()

  def wait(self) -> None:
    self.best.wait()
    self.latest.wait()

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
    if complete_steps(best, BEST_ITEM):
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
      `best.ckpt` / state_dict file (read by `prvr_jax.torch_file`, mapped by
      `prvr_jax.convert`).
    config: the config; its model must be the checkpoint's model.
    mesh: from `parallel.make_mesh()`.

  Returns:
    (params, info) with info `{'source': 'official' | 'prvr_jax', 'path', 'workdir', 'step',
    'data'}`: `workdir` is None for official files, `data` the training data's identity
    recorded in our checkpoints (None for official files).
  """
  if os.path.isfile(path):
    if not path.endswith(TORCH_SUFFIXES):
      raise ValueError(f'{path} is a file but not a PyTorch checkpoint '
                       f'({", ".join(TORCH_SUFFIXES)}).')
    state_dict = torch_file.load_torch_checkpoint(path)
    check_finite(state_dict, path)
    params = convert.torch_to_params(state_dict, config.model.name, config.model, source=path)
    return (parallel.replicate(params, mesh),
            {'source': 'official', 'path': path, 'workdir': None, 'step': None, 'data': None})
  if not os.path.exists(path):
    raise FileNotFoundError(f'--checkpoint={path} does not exist.')
  workdir, directory, step = _location(path)
  is_best = os.path.basename(directory) == BEST_DIR
  store = _best_store(directory) if is_best else _latest_store(directory)
  try:
    steps = store.steps()
    step = store.latest_step() if step is None else step
    if step is None or step not in steps:
      raise CheckpointError(f'{directory} holds no complete checkpoint'
                            + (f' at step {step} (complete steps: {steps}).'
                               if step is not None else '.'))
    spec = registry.get_spec(config.model)
    check_fingerprint(store.meta(step), config, spec, directory)
    abstract = abstract_params(config, spec, mesh)
    if is_best:
      params, meta = store.restore(step, ocp.args.StandardRestore(abstract))
    else:
      params, meta = store.restore(step, _params_only(abstract), part='params')
  finally:
    store.close()
  step_dir = os.path.join(directory, str(step))
  check_finite(params, step_dir)
  return params, {'source': 'prvr_jax', 'path': step_dir, 'workdir': workdir, 'step': step,
                  'data': meta.get('data')}
