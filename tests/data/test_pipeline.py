"""tf.data pipelines and device-resident training data: batch contract, host splitting,
determinism/resume, eval coverage, errors."""

import collections
import json
import os
import shutil

import jax
import numpy as np
import pytest

import support
support.require_tensorflow()

from prvr_jax.data import pipeline
from prvr_jax.data import protocol
from prvr_jax.data import resident
from prvr_jax.data import shard_format
from prvr_jax.data import synthetic


@pytest.fixture(scope='module')
def shards(tmp_path_factory):
  return pipeline.open_shards(synthetic.ensure('tiny', str(tmp_path_factory.mktemp('syn'))))


@pytest.fixture(scope='module')
def catalog(shards):
  """Per train video (keyed by its clip features): column and caption token features."""
  videos = {}
  for b in pipeline.eval_videos(shards, 'train', global_batch_size=8, process_index=0,
                                process_count=1):
    for row in np.flatnonzero(b['video_index'] >= 0):
      videos[b['clip_feats'][row].tobytes()] = (int(b['video_index'][row]),
                                                int(b['frame_mask'][row].sum()))
  captions = collections.defaultdict(list)  # column -> [(file row, tokens)]
  for b in pipeline.eval_queries(shards, 'train', global_batch_size=16, process_index=0,
                                 process_count=1):
    for slot in np.flatnonzero(b['query_index'] >= 0):
      captions[int(b['query_video_index'][slot])].append(
          (int(b['query_index'][slot]), b['query_feats'][slot], b['query_mask'][slot]))
  return videos, {k: sorted(v, key=lambda x: x[0]) for k, v in captions.items()}


def _columns(batch, catalog):
  """Column of each valid video of a training batch."""
  videos, _ = catalog
  return [videos[batch['clip_feats'][i].tobytes()][0] for i in np.flatnonzero(batch['video_valid'])]


def _check_train_batch(batch, num_slots, batch_size, shards, catalog):
  """The training-batch contract (docs/design.md) of one numpy batch, item by item against
  the split's own videos and captions (`catalog`)."""
  lq, dq, dv = shards.max_query_len, shards.query_dim, shards.visual_dim
  videos, captions = catalog
  q, b = num_slots, batch_size
  assert {k: (v.shape, v.dtype.name) for k, v in batch.items()} == {
      'clip_feats': ((b, 32, dv), 'float32'), 'frame_feats': ((b, 128, dv), 'float32'),
      'frame_mask': ((b, 128), 'float32'), 'video_valid': ((b,), 'bool'),
      'query_feats': ((q, lq, dq), 'float32'), 'query_mask': ((q, lq), 'float32'),
      'query_valid': ((q,), 'bool'), 'query_video': ((q,), 'int32')}
  valid_q = batch['query_valid']
  # Queries of one video are contiguous, in video order, padding slots last and zero.
  assert (np.diff(batch['query_video'][valid_q]) >= 0).all()
  assert valid_q[:valid_q.sum()].all()
  assert not batch['query_feats'][~valid_q].any() and not batch['query_video'][~valid_q].any()
  for i in range(b):
    if not batch['video_valid'][i]:
      assert not batch['frame_mask'][i].any() and not (batch['query_video'][valid_q] == i).any()
      assert not batch['clip_feats'][i].any() and not batch['frame_feats'][i].any()
      continue
    column, num_frames = videos[batch['clip_feats'][i].tobytes()]
    assert batch['frame_mask'][i].sum() == num_frames
    assert not batch['frame_feats'][i, num_frames:].any()
    mine = np.flatnonzero(valid_q & (batch['query_video'] == i))
    expected = captions[column]  # in caption-file order, as the shards store them
    assert len(mine) == len(expected)
    for slot, (_, tokens, mask) in zip(mine, expected):
      np.testing.assert_array_equal(batch['query_feats'][slot], tokens)
      np.testing.assert_array_equal(batch['query_mask'][slot], mask)


def test_train_batch_contract(shards, catalog):
  it = pipeline.train_iterator(shards, global_batch_size=6, seed=1, num_epochs=1,
                               process_index=0, process_count=1)
  split = shards.split('train')
  assert it.steps_per_epoch == len(it) == -(-split.num_videos // 6)
  assert it.num_query_slots == split.max_queries(6) <= 6 * split.max_captions_per_video
  for batch in it:
    _check_train_batch(batch, it.num_query_slots, 6, shards, catalog)


def _device_data(shards, batch_size, seed):
  return resident.DeviceShardData(shards=shards, batching=protocol.Batching(
      batch_size=batch_size, seed=seed, video_batch_size=8, query_batch_size=8,
      split_names={'train': 'train', 'val': 'val', 'test': 'test'}))


def test_device_resident_batches_keep_the_contract_and_resume_exactly(shards, catalog):
  """`config.data.placement='device'`: the same contract, steps per epoch and query slots as
  the stream; every video once per epoch, reshuffled every epoch; a resumed run replays."""
  split = shards.split('train')
  data = _device_data(shards, 6, seed=1)
  spe = data.steps_per_epoch
  assert spe == pipeline.steps_per_epoch(split, 6)
  mesh = support.data_mesh(1)
  it = data.train_batches(0, mesh)
  batches = [jax.device_get(next(it)) for _ in range(2 * spe)]
  for batch in batches:
    _check_train_batch(batch, split.max_queries(6), 6, shards, catalog)
  epochs = [[c for b in batches[e * spe:(e + 1) * spe] for c in _columns(b, catalog)]
            for e in range(2)]
  assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(split.num_videos))
  assert epochs[0] != epochs[1]
  resumed = data.train_batches(spe - 1, mesh)
  for expected in batches[spe - 1:spe + 1]:
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(next(resumed)), expected)
  other_seed = _device_data(shards, 6, seed=2).train_batches(0, mesh)
  assert _columns(jax.device_get(next(other_seed)), catalog) != _columns(batches[0], catalog)


def test_device_resident_batches_refuse_too_few_query_slots(shards):
  data = _device_data(shards, 6, seed=1)
  data.max_queries_per_batch = 1
  with pytest.raises(ValueError, match='more than config.data.max_queries_per_batch=1'):
    next(data.train_batches(0, support.data_mesh(1)))


def test_two_hosts_see_every_video_once_per_epoch(shards, catalog):
  split = shards.split('train')
  hosts = [pipeline.train_iterator(shards, global_batch_size=4, seed=5, num_epochs=2,
                                   process_index=i, process_count=2) for i in range(2)]
  assert hosts[0].steps_per_epoch == hosts[1].steps_per_epoch == pipeline.steps_per_epoch(
      split, 4, 2)
  assert hosts[0].local_batch_size == 2
  batches = [list(h) for h in hosts]
  assert len(batches[0]) == len(batches[1]) == 2 * hosts[0].steps_per_epoch
  spe = hosts[0].steps_per_epoch
  for epoch in range(2):
    seen = [c for host in batches for b in host[epoch * spe:(epoch + 1) * spe]
            for c in _columns(b, catalog)]
    assert sorted(seen) == list(range(split.num_videos))
  # Each host reads whole files: the hosts' videos are disjoint.
  per_host = [{c for b in host for c in _columns(b, catalog)} for host in batches]
  assert not per_host[0] & per_host[1]


def test_deterministic_and_resumable(shards, catalog):
  def stream(seed, start_step=0, epochs=3):
    it = pipeline.train_iterator(shards, global_batch_size=4, seed=seed, start_step=start_step,
                                 num_epochs=epochs, process_index=0, process_count=1)
    return [_columns(b, catalog) + [float(b['query_feats'].sum())] for b in it]

  full = stream(7)
  spe = pipeline.steps_per_epoch(shards.split('train'), 4)
  assert len(full) == 3 * spe
  assert full == stream(7)
  assert full != stream(8)
  assert full[:spe] != full[spe:2 * spe]  # reshuffled every epoch
  for k in (3, spe, spe + 2):
    assert stream(7, start_step=k) == full[k:]


def test_eval_covers_every_item_once_across_hosts(shards):
  index = pipeline.eval_index(shards, 'test')
  split = shards.split('test')
  cols, rows, lengths = [], [], []
  for i in range(3):
    videos = pipeline.eval_videos(shards, 'test', global_batch_size=6, process_index=i,
                                  process_count=3)
    queries = pipeline.eval_queries(shards, 'test', global_batch_size=9, process_index=i,
                                    process_count=3)
    vb, qb = list(videos), list(queries)
    lengths.append((len(videos), len(queries), len(vb), len(qb)))
    for b in vb:
      pad = b['video_index'] < 0
      assert not b['frame_mask'][pad].any()
      cols += b['video_index'][~pad].tolist()
    for b in qb:
      pad = b['query_index'] < 0
      assert not b['query_mask'][pad].any()
      rows += b['query_index'][~pad].tolist()
      np.testing.assert_array_equal(b['query_video_index'][~pad],
                                    index.caption_video_index[b['query_index'][~pad]])
  assert len(set(lengths)) == 1 and lengths[0][0] == lengths[0][2]
  assert sorted(cols) == list(range(split.num_videos)) == list(range(len(index.video_ids)))
  assert sorted(rows) == list(range(split.num_captions)) == list(range(len(index.caption_ids)))
  ratio = index.moment_ratio
  assert ratio.shape == (split.num_captions,) and ((ratio > 0) & (ratio <= 1)).all()
  # One host streams the videos in first-appearance order.
  single = pipeline.eval_videos(shards, 'test', global_batch_size=5, process_index=0,
                                process_count=1)
  order = np.concatenate([b['video_index'] for b in single])
  np.testing.assert_array_equal(order[:split.num_videos], np.arange(split.num_videos))
  assert (order[split.num_videos:] == -1).all()


def test_corrupted_shard_is_named(shards, tmp_path):
  copy = str(tmp_path / 'copy')
  shutil.copytree(shards.dir, copy)
  bad = pipeline.open_shards(copy).split('train').shards[1].path
  with open(bad, 'r+b') as f:
    f.seek(100)
    byte = f.read(1)
    f.seek(100)
    f.write(bytes([byte[0] ^ 0xFF]))
  corrupted = pipeline.open_shards(copy)  # same size: only the checksum can tell
  with pytest.raises(shard_format.ShardError, match='corrupted') as e:
    pipeline.train_iterator(corrupted, global_batch_size=4, seed=0, process_index=0,
                            process_count=1)
  assert bad in str(e.value)
  with open(bad, 'ab') as f:
    f.write(b'x')
  with pytest.raises(shard_format.ShardError, match='truncated') as e:
    pipeline.open_shards(copy)
  assert bad in str(e.value)


def test_query_overflow_names_the_flag(shards):
  it = pipeline.train_iterator(shards, global_batch_size=4, seed=0, max_queries_per_batch=2,
                               num_epochs=1, process_index=0, process_count=1)
  with pytest.raises(ValueError, match=r'config\.data\.max_queries_per_batch=2'):
    list(it)


def test_hostile_or_malformed_manifests_are_refused(tmp_path):
  out = synthetic.write_shards(synthetic.SIZES['tiny'], str(tmp_path / 'shards'), num_shards=2)
  manifest_path = os.path.join(out, shard_format.MANIFEST)
  with open(manifest_path) as f:
    manifest = json.load(f)
  outside = dict(manifest)
  outside['splits'] = {**manifest['splits'], 'test': {
      **manifest['splits']['test'], 'index': {'file': '../../../etc/passwd', 'sha256': 'x'}}}
  with open(manifest_path, 'w') as f:
    json.dump(outside, f)
  with pytest.raises(shard_format.ShardError, match=r"lists a file outside its folder: "
                     r"'\.\./\.\./\.\./etc/passwd'"):
    pipeline.open_shards(out)
  broken = {k: v for k, v in manifest.items() if k != 'visual_dim'}
  with open(manifest_path, 'w') as f:
    json.dump(broken, f)
  with pytest.raises(shard_format.ShardError,
                     match=r"manifest.json is malformed \(KeyError: 'visual_dim'\)"):
    pipeline.open_shards(out)


def test_placement_device_opens_device_resident_data(shards):
  from prvr_jax.data import run_data  # pylint: disable=g-import-not-at-top
  config = support.load_config('gmmformer', 'tiny')
  config.data.dir = shards.dir
  config.data.placement = 'device'
  data = run_data.open_run_data(config, None)
  assert isinstance(data, resident.DeviceShardData)
  assert data.identity() == shards.identity()
  config.data.source = 'frames'
  with pytest.raises(ValueError, match='set config.data.placement=stream'):
    run_data.open_run_data(config, None)
