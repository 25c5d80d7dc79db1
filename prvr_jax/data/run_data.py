"""A run's data: prepared once at the run level, then opened read-only through `RunData`.

  run_data.prepare_run_data(config, workdir)     # may generate or prepare; process 0 first
  data = run_data.open_run_data(config, workdir)  # reads only (`protocol.RunData`)

`config.data.dir` is a shard folder (with manifest.json) or a release folder, prepared once
into `<workdir>/shards`; empty, with `config.data.name == 'synthetic'`, the synthetic
benchmark is generated into `<workdir>/synthetic`. Frame data (`config.data.source='frames'`)
needs no preparation. Readers below this module never write (docs/data_pipeline.md).
"""

import json
import os
from typing import Any

import jax

from prvr_jax import files
from prvr_jax import parallel
from prvr_jax.data import check
from prvr_jax.data import frame_data
from prvr_jax.data import pipeline
from prvr_jax.data import prepare
from prvr_jax.data import protocol
from prvr_jax.data import resident
from prvr_jax.data import shard_format
from prvr_jax.data import synthetic


def _is_release(path: str) -> bool:
  if os.path.isdir(os.path.join(path, 'TextData')):
    return True
  return any(os.path.isdir(os.path.join(path, d, 'TextData'))
             for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))


def _from_frames(config: Any) -> bool:
  return config.data.get('source', 'shards') == 'frames'


def _synthetic(config: Any, workdir: str) -> dict[str, Any]:
  """The synthetic benchmark `config.data` names, generated under `<workdir>/synthetic`."""
  data = config.data
  return dict(size=data.get('synthetic_size', 'default'),
              out_dir=os.path.join(workdir, 'synthetic'), seed=data.get('synthetic_seed', 0),
              text_feature=data.get('text_feature', 'roberta'))


def shard_dir(config: Any, workdir: str | None = None) -> str:
  """The shard folder of `config.data` (see the module docstring); raises naming the flag
  when there is none."""
  data = config.data
  path = data.dir
  if not path:
    if data.get('name') != 'synthetic':
      raise ValueError('config.data.dir is empty: set it to a shard or release folder')
    if not workdir:
      raise ValueError('the synthetic benchmark needs a workdir to be generated into')
    return synthetic.shard_dir_of(**_synthetic(config, workdir))
  if not os.path.isdir(path):
    raise FileNotFoundError(f'config.data.dir={path} does not exist')
  if os.path.isfile(os.path.join(path, shard_format.MANIFEST)):
    return path
  if not _is_release(path):
    raise ValueError(f'config.data.dir={path} holds neither {shard_format.MANIFEST} (shards) '
                     'nor a release layout (TextData/, FeatureData/)')
  if not workdir:
    raise ValueError(f'config.data.dir={path} is a release folder: a workdir is needed to '
                     'prepare its shards in (or prepare them with `prvr-prepare`)')
  return os.path.join(workdir, 'shards')


def _prepare(config: Any, workdir: str | None) -> None:
  data = config.data
  path = shard_dir(config, workdir)
  if not data.dir:
    synthetic.ensure(**_synthetic(config, workdir))
  elif path != data.dir:
    source_file = os.path.join(path, 'source.json')
    source = {'release_dir': os.path.abspath(data.dir)}
    if os.path.isfile(source_file):
      with open(source_file, encoding='utf-8') as f:
        if json.load(f) != source:
          raise ValueError(f'{path} holds shards of another release ({source_file}); '
                           'use another workdir')
    prepare.prepare_from_config(config, path)
    files.write_json(source_file, source)


def prepare_run_data(config: Any, workdir: str | None) -> None:
  """Generates or prepares the shards `open_run_data` reads, where needed, on every process
  of a run, process 0 first (the others then find what it wrote on a shared filesystem, or
  write their own copy). Frame data needs nothing."""
  if _from_frames(config):
    return
  if jax.process_index() == 0:
    _prepare(config, workdir)
  parallel.sync('prvr_jax:prepare_run_data')
  if jax.process_index() != 0:
    _prepare(config, workdir)


def open_shards(config: Any, workdir: str | None = None) -> pipeline.ShardDataset:
  """The prepared shards of `config.data` (`prepare_run_data` first), checked against the
  config (`check.check_shards`)."""
  shards = pipeline.open_shards(shard_dir(config, workdir))
  check.check_shards(shards, config)
  return shards


def open_run_data(config: Any, workdir: str | None) -> protocol.RunData:
  """The run's data behind the `protocol.RunData` protocol; writes nothing (call
  `prepare_run_data` first)."""
  batching = protocol.Batching.from_config(config)
  data = config.data
  device = data.get('placement', 'stream') == 'device'
  if device and (_from_frames(config) or data.get('train_pairs')):
    raise ValueError('config.data.placement=device holds a shard folder\'s training videos; '
                     'frame data (config.data.source=frames) and feature pairs '
                     '(config.data.train_pairs) are streamed: set config.data.placement=stream')
  if _from_frames(config):
    return frame_data.open_frame_data(config, batching)
  reading = dict(shards=open_shards(config, workdir), batching=batching,
                 shuffle_buffer=data.shuffle_buffer,
                 max_queries_per_batch=data.max_queries_per_batch,
                 host_sharded_reading=data.host_sharded_reading)
  if data.get('train_pairs'):
    return protocol.FeaturePairData(**reading, release_dir=data.dir, collection=data.collection)
  if device:
    return resident.DeviceShardData(**reading)
  if data.get('query_tokens'):
    return _with_caption_tokens(config, protocol.ShardData(**reading))
  return protocol.ShardData(**reading)


def _with_caption_tokens(config: Any, shards: protocol.RunData) -> protocol.RunData:
  """`shards` whose evaluation queries also hold their captions' CLIP tokens
  (`config.data.query_tokens`), read from the release folder `config.data.dir`."""
  from prvr_jax import clip  # pylint: disable=g-import-not-at-top
  from prvr_jax.data import caption_tokens  # pylint: disable=g-import-not-at-top
  data = config.data
  if not data.dir or not _is_release(data.dir):
    raise ValueError('config.data.query_tokens tokenises the caption files of a release: '
                     f'config.data.dir={data.dir!r} must be the release folder (TextData/)')
  tokenizer = clip.Tokenizer(data.get('clip_vocab') or None)
  context = clip.backbone_config(config.model.backbone).context_length
  return caption_tokens.CaptionTokenData(
      shards, data.dir, data.collection,
      lambda texts: tokenizer(texts, context_length=context, truncate=True))
