"""The run level: preparing a run's data once, then opening it read-only."""

import os

import ml_collections
import pytest

import support

support.require_tensorflow()

from prvr_jax.data import run_data  # pylint: disable=g-import-not-at-top
from prvr_jax.data import shard_format  # pylint: disable=g-import-not-at-top
from prvr_jax.data import synthetic  # pylint: disable=g-import-not-at-top


def _resolve(config, workdir=None):
  run_data.prepare_run_data(config, workdir)
  return run_data.open_shards(config, workdir)


def test_prepare_run_data_prepares_a_release_once(tmp_path):
  root = synthetic.write_mssl(synthetic.generate(synthetic.SIZES['tiny'], seed=1),
                              str(tmp_path / 'release'))
  config = ml_collections.ConfigDict({
      'data': {'dir': root, 'name': 'synthetic', 'collection': 'synthetic',
               'visual_feature': 'synthetic', 'text_feature': 'roberta', 'train_split': 'train',
               'val_split': 'val', 'test_split': 'test', 'skip_bad_items': False},
      'model': {'visual_dim': 256, 'query_dim': 128, 'num_clips': 32, 'max_frames': 128,
                'max_query_len': 30}})
  workdir = str(tmp_path / 'work')
  shards = _resolve(config, workdir)
  assert shards.dir == os.path.join(workdir, 'shards')
  assert shards.split('train').num_videos == synthetic.SIZES['tiny'].num_videos[0]
  mtime = os.stat(os.path.join(shards.dir, shard_format.MANIFEST)).st_mtime_ns
  config.data.dir = shards.dir  # a shard folder is used as is
  assert _resolve(config).dir == shards.dir
  config.data.dir = root
  _resolve(config, workdir)
  assert os.stat(os.path.join(shards.dir, shard_format.MANIFEST)).st_mtime_ns >= mtime
  config.model.visual_dim = 64
  with pytest.raises(ValueError, match=r'config\.model\.visual_dim=64 but'):
    _resolve(config, workdir)
  config.model.visual_dim = 256
  # The config describing another collection than the shards were prepared from.
  config.data.dir = shards.dir
  config.data.collection = 'tvr'
  with pytest.raises(ValueError, match=r"config\.data\.collection='tvr' but the shards in .* "
                     r"have collection='synthetic'"):
    _resolve(config)
