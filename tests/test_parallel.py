"""prvr_jax.parallel in one process: host rows are padded and split over the mesh they are
given (not over every device JAX has: a CPU mesh on a GPU machine, or a sub-mesh)."""

import numpy as np
import pytest

import support
from prvr_jax import parallel


def _local_batch(videos: int, queries: int) -> dict[str, np.ndarray]:
  return {'clip_feats': np.arange(videos * 3, dtype=np.float32).reshape(videos, 3),
          'video_valid': np.ones(videos, bool),
          'query_feats': np.arange(queries, dtype=np.float32)[:, None] + 10,
          'query_valid': np.ones(queries, bool),
          'query_video': np.arange(queries, dtype=np.int32) % videos}


@pytest.mark.parametrize('devices', [1, 2])
def test_rows_are_padded_to_the_devices_of_the_mesh(devices):
  mesh = support.data_mesh(devices)
  view = parallel.shard_global_view({'x': np.arange(5.0)}, mesh)['x']
  assert set(view.sharding.device_set) == set(mesh.devices.flat)
  np.testing.assert_array_equal(parallel.to_host(view), [0, 1, 2, 3, 4, 0][:5 + (devices - 1)])
  batch = parallel.to_host(parallel.global_batch(_local_batch(videos=2, queries=3), mesh))
  np.testing.assert_array_equal(batch['clip_feats'], np.arange(6.0).reshape(2, 3))
  np.testing.assert_array_equal(batch['query_valid'], [1, 1, 1, 0][:3 + (devices - 1)])
  np.testing.assert_array_equal(batch['query_video'], [0, 1, 0, 0][:3 + (devices - 1)])


def test_rows_that_do_not_split_over_the_mesh_are_refused():
  mesh = support.data_mesh(2)
  with pytest.raises(ValueError, match='holds 3 videos, not a multiple of the 2 local devices; '
                     r'make config.train.batch_size a multiple of 2'):
    parallel.global_batch(_local_batch(videos=3, queries=3), mesh)
  with pytest.raises(ValueError, match='5 rows do not split over 2 devices'):
    parallel.shard_global_view({'x': np.arange(5.0)}, mesh, rows=5)
