"""The run directory: one run at a time, and what a resumed run may change.

* `lock(workdir)`: an exclusive lock (`<workdir>/.lock`, `files.folder_lock`) held by a run's
  process 0; a second run on the same workdir is refused with a message naming the first.
* `resume_config_changes(saved, config)`: the fields a resumed run changes, split into
  those that make an exact resume impossible (the model, the data stream: always refused)
  and the others (accepted with `--allow_config_change`).
* `record_config(workdir, config, changes)`: `config.json` (the current config) plus one line
  per start in `config_history.jsonl`.
"""

from collections.abc import Mapping
import contextlib
import json
import os
from typing import Any

from prvr_jax import config_lib
from prvr_jax import files
from prvr_jax.checkpoint import BEST_DIR, CONFIG_FILE, LATEST_DIR
from prvr_jax.config_lib import flat_items

LOCK_FILE = '.lock'
CONFIG_HISTORY_FILE = 'config_history.jsonl'

# Fields that fix the model or the order and content of the training batches: a resumed run
# that changes them cannot continue the run it resumes (prefix match on dotted keys).
EXACT_RESUME_FIELDS = (
    'model.', 'data.name', 'data.collection', 'data.visual_feature', 'data.text_feature',
    'data.synthetic_size', 'data.synthetic_seed', 'data.train_split', 'data.shuffle_buffer',
    'data.host_sharded_reading', 'data.skip_bad_items', 'data.max_queries_per_batch',
    'data.placement', 'data.frame_map', 'data.normalize',
    'train.batch_size', 'train.seed')
ADDED_FIELDS = config_lib.ADDED_FIELDS
# Fields that change nothing the run computes (where data lies, logging, checkpoint cadence).
OPERATIONAL_FIELDS = config_lib.OPERATIONAL_FIELDS


class WorkdirBusyError(files.FolderBusyError):
  """Another run holds the workdir's lock."""


# Files a workdir holds from its first run on; one of them marks a folder as a workdir.
_WORKDIR_MARKERS = (CONFIG_FILE, LATEST_DIR, BEST_DIR, LOCK_FILE)


def check_is_workdir(workdir: str) -> None:
  """Raises unless `workdir` is new, empty, or a workdir of ours (a careless --workdir=$HOME
  must not fill a folder of other files with checkpoints and logs)."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ValueError(f'--workdir={workdir} is a file, not a folder.')
  if (os.path.isdir(workdir) and os.listdir(workdir)
      and not any(os.path.exists(os.path.join(workdir, m)) for m in _WORKDIR_MARKERS)):
    raise ValueError(f'--workdir={workdir} is a non-empty folder that is not a training '
                     f'workdir (it has none of {", ".join(_WORKDIR_MARKERS)}); choose a new or '
                     'empty folder.')


def lock(workdir: str, enabled: bool = True) -> contextlib.AbstractContextManager:
  """Holds `<workdir>/.lock` for the run (`files.folder_lock`); a no-op when not `enabled`."""
  if not enabled:
    return contextlib.nullcontext()
  return files.folder_lock(workdir, LOCK_FILE, 'training run', '--workdir', WorkdirBusyError)


def _as_json(tree: Mapping[str, Any]) -> dict[str, Any]:
  """The config as JSON would store it (tuples become lists), for comparisons."""
  return json.loads(json.dumps(tree))


def read_saved_config(workdir: str) -> dict[str, Any] | None:
  """The `config.json` of a workdir, or None."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.isfile(path):
    return None
  with open(path, encoding='utf-8') as f:
    return json.load(f)


def resume_config_changes(saved: Mapping[str, Any], config: Mapping[str, Any]
                          ) -> tuple[list[str], list[str]]:
  """(changes an exact resume cannot absorb, other changes), each 'key: old -> new'."""
  new = flat_items(_as_json(config))
  old = {**{k: v for k, v in ADDED_FIELDS.items() if k in new}, **flat_items(_as_json(saved))}
  breaking, other = [], []
  for key in sorted(set(old) | set(new)):
    if old.get(key, '<absent>') == new.get(key, '<absent>') or key.startswith(
        OPERATIONAL_FIELDS):
      continue
    change = f'{key}: {old.get(key, "<absent>")!r} -> {new.get(key, "<absent>")!r}'
    (breaking if key.startswith(EXACT_RESUME_FIELDS) else other).append(change)
  return breaking, other


def record_config(workdir: str, config: Mapping[str, Any], step: int,
                  changes: list[str]) -> None:
  """Writes `config.json` and appends a line (time, step, changes, config) to the history."""
  config = _as_json(config)
  files.write_json(os.path.join(workdir, CONFIG_FILE), config)
  line = json.dumps({'time': files.utc_now(), 'step': step, 'changes': changes, 'config': config})
  with open(os.path.join(workdir, CONFIG_HISTORY_FILE), 'a', encoding='utf-8') as f:
    f.write(line + '\n')
