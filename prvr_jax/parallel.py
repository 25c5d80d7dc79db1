"""Devices, hosts and shardings: one `data` mesh axis over every global device.

Parameters and optimiser state are replicated; batches are sharded on their
leading axis. Each process feeds its own slice of the global batch
(`global_batch`), so process p owns rows [p * B_local, (p + 1) * B_local).
No pmap: everything runs through `jax.jit` with shardings.
"""

from collections.abc import Mapping
from typing import Any

from absl import flags
from absl import logging
import jax
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import numpy as np

DATA_AXIS = 'data'
# Batch keys sized by the number of query slots (the rest are sized by videos).
QUERY_KEYS = ('query_feats', 'query_mask', 'query_valid', 'query_video')


def define_distributed_flags() -> None:
  """Defines the multi-process flags of train.py and evaluate.py."""
  flags.DEFINE_string('coordinator_address', None, 'host:port of process 0 (multi-process runs).')
  flags.DEFINE_integer('num_processes', None, 'Number of processes.')
  flags.DEFINE_integer('process_id', None, 'Index of this process.')
  flags.DEFINE_bool('multihost', False, 'Initialise jax.distributed from the detected cluster.')


def initialize_distributed_from_flags() -> bool:
  """`maybe_initialize_distributed` with the flags of `define_distributed_flags`."""
  args = flags.FLAGS
  return maybe_initialize_distributed(args.coordinator_address, args.num_processes,
                                      args.process_id, args.multihost)


def maybe_initialize_distributed(coordinator_address: str | None = None,
                                 num_processes: int | None = None,
                                 process_id: int | None = None,
                                 multihost: bool = False) -> bool:
  """Starts `jax.distributed` when asked to; returns whether it did.

  Explicit flags (all three together) win; `multihost=True` alone lets JAX
  detect the cluster (TPU pod, SLURM, Open MPI, ...). With neither, the run is
  single-process. Must run before anything touches a JAX backend. CPU
  collectives go through gloo (the only multi-process CPU implementation).
  """
  explicit = (coordinator_address, num_processes, process_id)
  if any(v is not None for v in explicit):
    if any(v is None for v in explicit):
      raise ValueError(
          '--coordinator_address, --num_processes and --process_id must be given '
          f'together (got {coordinator_address!r}, {num_processes!r}, {process_id!r}).')
    if not 0 <= process_id < num_processes:
      raise ValueError(f'--process_id={process_id} must lie in '
                       f'[0, --num_processes={num_processes}).')
  elif not multihost:
    return False
  jax.config.update('jax_cpu_collectives_implementation', 'gloo')
  if coordinator_address is not None:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
  else:
    jax.distributed.initialize()
  logging.info('jax.distributed: process %d of %d, %d local / %d global devices.',
               jax.process_index(), jax.process_count(), jax.local_device_count(),
               jax.device_count())
  return True


def make_mesh() -> Mesh:
  """1-D mesh `('data',)` over all global devices, grouped by process.

  Grouping by process makes each process's devices hold one contiguous block
  of the batch, which `jax.make_array_from_process_local_data` relies on.
  """
  devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
  return Mesh(np.asarray(devices), (DATA_AXIS,))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def sharded(mesh: Mesh) -> NamedSharding:
  """Leading axis split over `data`, the rest replicated."""
  return NamedSharding(mesh, P(DATA_AXIS))


def pad_rows(x: np.ndarray, size: int, value: Any = 0) -> np.ndarray:
  """Pads the leading axis of `x` to `size` rows with `value`."""
  if x.shape[0] == size:
    return x
  if x.shape[0] > size:
    raise ValueError(f'Cannot pad {x.shape[0]} rows down to {size}.')
  pad = np.full((size - x.shape[0],) + x.shape[1:], value, dtype=x.dtype)
  return np.concatenate([x, pad], axis=0)


def round_up(n: int, multiple: int) -> int:
  """The smallest multiple of `multiple` that is >= n."""
  return -(-n // multiple) * multiple


def global_batch(local_batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """Per-process training batch -> global arrays sharded on `data`.

  `query_video` indexes videos of this process's batch; it is shifted by
  `process_index * B_local` so that it indexes the global batch. Query slots
  are padded (`query_valid=False`) to a multiple of the mesh's devices on this process.

  Args:
    local_batch: the batch contract's training dict for this process.
    mesh: from `make_mesh()`.

  Returns:
    The same keys as global `jax.Array`s, leading axis sharded on `data`.
  """
  batch = {k: np.asarray(v) for k, v in local_batch.items()}
  multiple = len(mesh.local_devices)
  num_videos = batch['clip_feats'].shape[0]
  if num_videos % multiple:
    raise ValueError(
        f'The per-process batch holds {num_videos} videos, not a multiple of the '
        f'{multiple} local devices; make config.train.batch_size a multiple of '
        f'{mesh.size} (the devices of the mesh, over all processes).')
  if 'query_video' in batch:
    batch['query_video'] = (batch['query_video'].astype(np.int32)
                            + np.int32(jax.process_index() * num_videos))
    num_queries = batch['query_video'].shape[0]
    padded = round_up(num_queries, multiple)
    for key in QUERY_KEYS:
      if key in batch:
        batch[key] = pad_rows(batch[key], padded)
  return shard_local(batch, mesh)


def shard_local(tree: Any, mesh: Mesh) -> Any:
  """Each leaf: this process's rows -> a global array sharded on `data` (rows of all
  processes concatenated in process order). Leading dims must be multiples of the mesh's
  devices on this process."""
  sharding = sharded(mesh)
  return jax.tree.map(
      lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), tree)


def shard_global_view(tree: Any, mesh: Mesh, rows: int | None = None) -> Any:
  """A batch every process holds in full -> global arrays sharded on `data`.

  Each leaf is zero-padded along its leading axis to `rows` (default: the next multiple
  of the mesh's device count) and each process contributes its contiguous block, so the
  global array is the same for any number of processes. Zero padding marks padded
  items invalid (`*_valid=False`, masks 0).
  """
  count = jax.process_count()

  def block(x):
    x = np.asarray(x)
    size = rows if rows is not None else round_up(x.shape[0], mesh.size)
    if size % mesh.size:
      raise ValueError(f'{size} rows do not split over {mesh.size} devices.')
    per_process = size // count
    start = jax.process_index() * per_process
    return pad_rows(x, size)[start:start + per_process]

  return shard_local(jax.tree.map(block, tree), mesh)


def replicate(tree: Any, mesh: Mesh) -> Any:
  """Host arrays (the same on every process) -> global arrays replicated on `mesh`."""
  sharding = replicated(mesh)
  return jax.tree.map(
      lambda x: jax.make_array_from_callback(np.shape(x), sharding,
                                             lambda index: np.asarray(x)[index]), tree)


def to_host(tree: Any) -> Any:
  """Global arrays -> full numpy arrays on every process (an all-gather across hosts)."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  return multihost_utils.process_allgather(tree, tiled=True)


def sync(name: str) -> None:
  """Barrier across processes (no-op with one process)."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)
