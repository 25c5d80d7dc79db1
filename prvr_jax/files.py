"""Safe files for data preparation, training and evaluation, and short error messages.

* Writes: every output is written to a new, uniquely named temporary file in its folder
  (created exclusively, so nothing planted there is followed or overwritten) and then renamed
  over its name. A rename replaces a symbolic link planted at that name instead of writing
  through it, and a reader sees the old file or the new one, never half of one. `publish`
  extends this to several files that belong together.
* `folder_lock`: one process at a time in a folder (a workdir, a shard folder, an evaluation's
  output folder), the second refused with a message naming the first.
* `short`, `listing`: ids, lines and lists echoed in messages, cut to a readable length.
"""

from collections.abc import Callable, Iterator, Mapping, Sequence
import contextlib
import datetime
import errno
import fcntl
import hashlib
import json
import os
import socket
import sys
import tempfile
from typing import Any, BinaryIO

import numpy as np

# Longest text of a value echoed in an error message (ids, lines, lists).
MESSAGE_VALUE_CHARS = 80


def sha256_file(path: str, progress: Callable[[int], Any] | None = None) -> str:
  """The sha256 hex digest of a file's bytes, read in 4 MiB blocks; `progress(n)` after each."""
  digest = hashlib.sha256()
  with open(path, 'rb') as f:
    for block in iter(lambda: f.read(1 << 22), b''):
      digest.update(block)
      if progress is not None:
        progress(len(block))
  return digest.hexdigest()


def inside(path: str, folder: str) -> bool:
  """Whether `path` is `folder` or lies under it, both resolved (`os.path.realpath`: a link
  is judged by where it leads)."""
  path, folder = os.path.realpath(path), os.path.realpath(folder)
  return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def short(value: Any, limit: int = MESSAGE_VALUE_CHARS, quote: bool = True) -> str:
  """`repr(value)` (`str` without `quote`) cut to about `limit` characters, saying how long it
  was."""
  text = repr(value) if quote else str(value)
  if len(text) <= limit:
    return text
  return f'{text[:limit]}... ({len(text)} characters)'


def listing(items: Sequence[str], indent: str = '  ', limit: int = 10,
            line_chars: int = 500) -> str:
  """Message lines of `items`, each cut to `line_chars` (room for a path and a cut id), at most
  `limit` of them (then '... and N more')."""
  lines = [indent + short(item, line_chars, quote=False) for item in items[:limit]]
  if len(items) > limit:
    lines.append(f'{indent}... and {len(items) - limit} more')
  return '\n'.join(lines)


Writer = Callable[[BinaryIO], Any]


def read_json(path: str, error: type[Exception] = ValueError) -> Any:
  """The JSON value of the file `path`; `error('<path> is not valid JSON (...)')` if it is not
  (bad syntax or not UTF-8)."""
  try:
    with open(path, 'rb') as f:
      return json.load(f)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise error(f'{path} is not valid JSON ({e}).') from None


def json_writer(obj: Any) -> Writer:
  """Writes `obj` as indented JSON with sorted keys."""
  return lambda f: f.write((json.dumps(obj, indent=2, sort_keys=True) + '\n').encode('utf-8'))


def npy_writer(array: np.ndarray) -> Writer:
  """Writes `array` in .npy format (no pickles)."""
  return lambda f: np.save(f, array, allow_pickle=False)


def _write_temporary(path: str, write: Writer, sync: bool = True) -> str:
  """A new file beside `path` (created exclusively) holding what `write(f)` wrote, flushed to
  disk unless not `sync`; returns its name. Nothing is left behind on failure."""
  folder, name = os.path.split(os.path.abspath(path))
  fd, tmp = tempfile.mkstemp(prefix=f'.{name}.', suffix='.tmp', dir=folder)
  try:
    with os.fdopen(fd, 'wb') as f:
      write(f)
      f.flush()
      if sync:
        os.fsync(f.fileno())
  except BaseException:
    os.unlink(tmp)
    raise
  return tmp


def write_atomic(path: str, write: Writer) -> None:
  """Replaces `path` with what `write(f)` writes, atomically and never through a link."""
  publish(os.path.dirname(os.path.abspath(path)), {os.path.basename(path): write},
          marker=os.path.basename(path))


def write_json(path: str, obj: Any) -> None:
  """Writes `obj` as JSON to `path` atomically."""
  write_atomic(path, json_writer(obj))


def publish(folder: str, outputs: Mapping[str, Writer], marker: str, sync: bool = True) -> None:
  """Writes the files `outputs` (name -> writer) of `folder` so that they appear together or
  not at all.

  All are written to temporary files first; then the old `marker` file (one of `outputs`,
  the file readers treat as "the result is complete") is removed, the others are renamed
  into place, and `marker` last. An interruption leaves either the old complete set, or a
  set without `marker`, or the new complete set. A single output simply replaces its file.
  `sync=False` skips the fsync of each file (scratch outputs: faster, not crash-durable).
  """
  if marker not in outputs:
    raise ValueError(f'marker {marker!r} is not one of the outputs {sorted(outputs)}')
  os.makedirs(folder, exist_ok=True)
  temporary = {}
  try:
    for name, write in outputs.items():
      temporary[name] = _write_temporary(os.path.join(folder, name), write, sync)
    if len(outputs) > 1:
      with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(folder, marker))
    for name in sorted(outputs, key=lambda n: n == marker):
      os.replace(temporary[name], os.path.join(folder, name))
      del temporary[name]
  finally:
    for tmp in temporary.values():
      with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)


class FolderBusyError(RuntimeError):
  """Another process holds a folder's lock; the message names it."""


def utc_now() -> str:
  """The current UTC time, ISO 8601 to the second."""
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')


@contextlib.contextmanager
def folder_lock(folder: str, name: str, what: str, flag: str,
                error: type[FolderBusyError] = FolderBusyError) -> Iterator[None]:
  """Holds `<folder>/<name>` exclusively (an advisory flock) for the duration.

  The lock file records the holder (pid, host, start time, command); a second holder (`what`,
  e.g. 'training run') is refused with `error` naming the first and suggesting another
  `flag`. A link planted at the lock's name is not followed.
  """
  path = os.path.join(folder, name)
  fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      if e.errno not in (errno.EAGAIN, errno.EACCES):
        raise
      holder = os.pread(fd, 4096, 0).decode(errors='replace').strip() or 'unknown'
      raise error(f'{folder} is in use by another {what} ({short(holder, 300, quote=False)}). '
                  f'Wait for it to end, stop it, or use another {flag}.') from None
    holder = json.dumps({'pid': os.getpid(), 'host': socket.gethostname(),
                         'started': utc_now(), 'command': ' '.join(sys.argv)})
    os.ftruncate(fd, 0)
    os.pwrite(fd, holder.encode(), 0)
    yield
  finally:
    os.close(fd)  # releases the lock
