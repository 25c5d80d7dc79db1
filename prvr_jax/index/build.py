"""Building an index from a model and a split, and handing an index to the evaluator.

  index = build_index(config, params, data.eval_split('test'), '/idx/tvr_test',
                      dtype='int8')
  gallery = evaluation_gallery(index, evaluator, split)   # Evaluator.evaluate(..., gallery=)
"""

from collections.abc import Mapping
import os
from typing import Any

from absl import logging
from flax.traverse_util import unflatten_dict
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from prvr_jax import checkpoint as checkpoint_lib
from prvr_jax import config_lib
from prvr_jax import files
from prvr_jax import parallel
from prvr_jax.data import collection
from prvr_jax.data.release import ALL_SPLIT
from prvr_jax.eval import outputs
from prvr_jax.eval.evaluator import EvalResult, Evaluator, Gallery, Phases, len_or_none
from prvr_jax.eval.splits import EvalSplit
from prvr_jax.files import short
from prvr_jax.index.store import Index, IndexFormatError, IndexWriter, dequantize, open_index
from prvr_jax.models import registry


def build_index(config: ml_collections.ConfigDict, params: Any, data: EvalSplit, out_dir: str,
                dtype: str = 'float32', shard_videos: int = 100_000, overwrite: bool = False,
                mesh: Any = None, info: Mapping[str, Any] | None = None,
                phases: Phases | None = None) -> Index:
  """Encodes every video of `data` with `config.model` and writes the index, `shard_videos`
  videos per shard. Process 0 writes; every process returns the index.

  The videos are encoded by the evaluator's own gallery encoder (`Evaluator.encode_batches`:
  batches of `config.eval.video_batch_size` sharded over the mesh, a bounded number in flight),
  so an index holds what `evaluate.py` would score, and costs the same to encode; the host
  writes one batch while the devices encode the next. `phases` (default: a new one) records
  the phase's seconds (`encode_videos`, writing included) and shows its progress bar.
  """
  mesh = mesh if mesh is not None else parallel.make_mesh()
  evaluator = Evaluator.from_config(config, mesh)
  phases = phases if phases is not None else Phases(evaluator.progress)
  writer = None
  if jax.process_index() == 0:
    writer = IndexWriter(out_dir, config.model, params, dtype=dtype, shard_videos=shard_videos,
                         overwrite=overwrite, info=info)
  with phases('encode_videos') as bar:
    batches = evaluator.video_batches(data)  # opens the shards: in the phase
    bar.reset(total=len_or_none(batches))
    for encodings, keys in evaluator.encode_batches(params, batches, bar):
      host = parallel.to_host(encodings)
      del encodings
      real = keys >= 0
      if writer is not None:
        writer.add(jax.tree.map(lambda x: np.asarray(x)[real], host),
                   [data.video_ids[k] for k in keys[real]])
    if writer is not None:
      writer.close()
  parallel.sync('index_written')
  return open_index(out_dir)


def dequantized_rows(index: Index) -> dict[str, np.ndarray]:
  """Every stored leaf of the whole index as float32 (int leaves as stored), in row order."""
  out = {}
  for leaf, desc in index.leaves.items():
    parts = [shard.arrays[leaf] for shard in index.shards]
    kind = 'float32' if desc['exact'] else index.dtype
    out[leaf] = np.concatenate([np.asarray(dequantize(
        jnp.asarray(np.asarray(p['values'])),
        jnp.asarray(np.asarray(p['scale'])) if 'scale' in p else None, kind)) for p in parts])
  return out


def evaluation_gallery(index: Index, evaluator: Evaluator, data: EvalSplit) -> Gallery:
  """The evaluator's gallery from an index holding exactly the split's videos (any order)."""
  keys_of = {video_id: key for key, video_id in enumerate(data.video_ids)}
  missing = [v for v in data.video_ids if v not in set(index.ids)]
  extra = [v for v in index.ids if v not in keys_of]
  if missing or extra:
    raise IndexFormatError(
        f'{index.path} does not hold the videos of the evaluation split: '
        f'{len(missing)} of its {len(data.video_ids)} videos are missing (first: '
        f'{short(missing[:3])}), {len(extra)} others are indexed (first: {short(extra[:3])}). '
        'Build the index from this split.')
  keys = np.array([keys_of[v] for v in index.ids], np.int64)
  rows = parallel.round_up(len(keys), evaluator.mesh.size)
  encodings = parallel.shard_global_view(unflatten_dict(dequantized_rows(index), sep='/'),
                                         evaluator.mesh, rows)
  padded = parallel.pad_rows(keys, rows, value=-1)
  return Gallery(encodings, padded, parallel.shard_global_view(padded, evaluator.mesh, rows))


def build_from_checkpoint(config: ml_collections.ConfigDict, checkpoint_path: str | None,
                          split: str,
                          out_dir: str, dtype: str = 'float32', shard_videos: int = 100_000,
                          overwrite: bool = False, cross_dataset: bool = False) -> Index:
  """`build_index` of `split` with a checkpoint (ours or official), found as evaluate.py finds
  it; the manifest records the checkpoint, its workdir and the data identities, so that
  `evaluate.py --index` checks the data as `--checkpoint` would. `checkpoint_path` None: a
  model with nothing to train (zero-shot CLIP), its weights from its config
  (`outputs.load_pretrained_and_data`)."""
  config_lib.validate(config)
  check_not_an_input(out_dir, {'--checkpoint': checkpoint_path,
                               '--config.data.dir': config.data.get('dir'),
                               '--config.model.clip_weights': config.model.get('clip_weights')})
  if split == ALL_SPLIT:
    if cross_dataset:
      raise ValueError(f'--cross_dataset with --split={ALL_SPLIT}: every video of a collection is '
                       'indexed as it is, never checked against the training data; drop '
                       '--cross_dataset.')
    return build_collection(config, checkpoint_path, out_dir, dtype, shard_videos, overwrite)
  loaded = outputs.load_params_and_data(config, checkpoint_path, split, out_dir + '_data',
                                        cross_dataset)
  info = loaded['info']
  return build_index(config, loaded['params'], loaded['data'], out_dir, dtype=dtype,
                     shard_videos=shard_videos, overwrite=overwrite, mesh=loaded['mesh'],
                     info={**_checkpoint_info(info, checkpoint_path),
                           'split': split, 'data': loaded['evaluated_on'],
                           'cross_dataset': loaded['cross'],
                           'queries': collection.query_layout(config),
                           'videos': _split_video_info(loaded, split)})


def _checkpoint_info(info: Mapping[str, Any], checkpoint_path: str | None) -> dict[str, Any]:
  """What an index records of the parameters it was built with."""
  return {'checkpoint': info['path'], 'checkpoint_source': info['source'],
          'checkpoint_arg': os.path.abspath(checkpoint_path) if checkpoint_path else None,
          'step': info.get('step'), 'workdir': info['workdir'], 'trained_on': info['data']}


def _split_video_info(loaded: Mapping[str, Any], split: str) -> dict[str, dict[str, Any]]:
  """The durations of a prepared split's videos where its moments give them (`video_info`
  entries; none for data without moments)."""
  shards = getattr(loaded['shards'], 'shards', None)
  batching = getattr(loaded['shards'], 'batching', None)
  if shards is None or batching is None:
    return {}
  from prvr_jax.data import pipeline  # pylint: disable=g-import-not-at-top  (TensorFlow)
  index = pipeline.eval_index(shards, batching.split(split))
  durations = {}
  for column, duration in zip(index.caption_video_index, index.durations):
    if duration > 0:
      durations[index.video_ids[int(column)]] = float(duration)
  return collection.split_video_info(durations)


def build_collection(config: ml_collections.ConfigDict, checkpoint_path: str | None,
                     out_dir: str, dtype: str = 'float32', shard_videos: int = 100_000,
                     overwrite: bool = False) -> Index:
  """`build_index` of every video of the collection `config.data.dir` (`--split=all`),
  captions or none (`prvr_jax.data.collection.all_videos`: users' own videos extracted by
  prvr-extract, or all of a release's): parameters from `checkpoint_path` (None: a model with
  nothing to train, from its config). The manifest's info records the data's identity, the
  query layout text search reads (`queries`) and each video's duration, source and thumbnail
  (`videos`, where known)."""
  config_lib.validate(config)
  check_not_an_input(out_dir, {'--checkpoint': checkpoint_path,
                               '--config.data.dir': config.data.get('dir'),
                               '--config.model.clip_weights': config.model.get('clip_weights')})
  spec = registry.get_spec(config.model)
  mesh = parallel.make_mesh()
  if checkpoint_path is None:
    if spec.trainable:
      raise ValueError(f'config.model.name={spec.name!r} is a trained model: pass --checkpoint.')
    params = parallel.replicate(spec.pretrained(config), mesh)
    info = {'source': 'pretrained', 'path': config.model.get('clip_weights') or None,
            'workdir': None, 'step': None, 'data': None}
  else:
    params, info = checkpoint_lib.load_params(checkpoint_path, config, mesh)
  data, videos, identity = collection.all_videos(config)
  return build_index(config, params, data, out_dir, dtype=dtype, shard_videos=shard_videos,
                     overwrite=overwrite, mesh=mesh,
                     info={**_checkpoint_info(info, checkpoint_path), 'split': ALL_SPLIT,
                           'data': identity, 'cross_dataset': False,
                           'queries': collection.query_layout(config), 'videos': videos})


def check_not_an_input(out: str, inputs: Mapping[str, str | None], flag: str = '--out'
                       ) -> None:
  """Refuses an output that is one of the inputs (flag -> path) or a folder holding one:
  writing (or overwriting) it would destroy what is read."""
  for name, path in inputs.items():
    if path and files.inside(path, out):
      same = os.path.realpath(path) == os.path.realpath(out)
      raise ValueError(f'{flag}={out} is {"" if same else "a folder holding "}the '
                       f'input {name}={path}; choose another {flag}.')


def _current_step(checkpoint_arg: str) -> int | None:
  """The step `--checkpoint=checkpoint_arg` would load now (None when it cannot be told
  cheaply, e.g. the run folder is gone), from the finalised step folders only."""
  location = checkpoint_lib._location  # pylint: disable=protected-access
  try:
    _, directory, step = location(checkpoint_arg)
  except (ValueError, OSError):
    return None
  if step is not None:
    return step
  item = (checkpoint_lib.BEST_ITEM if os.path.basename(directory) == checkpoint_lib.BEST_DIR
          else checkpoint_lib.LATEST_ITEM)
  steps = checkpoint_lib.complete_steps(directory, item) if os.path.isdir(directory) else []
  return max(steps) if steps else None


def check_pairing(index: Index, config: ml_collections.ConfigDict,
                  checkpoint_path: str | None, mesh: Any, allow_stale: bool) -> None:
  """Refuses an index whose parameters are not those of `checkpoint_path` (its step or the
  parameters' fingerprint differ) or, without one, not those its recorded checkpoint argument
  (a run folder) gives now; `allow_stale` (--allow_stale_index) accepts it knowingly."""
  built = index.manifest.get('info', {})
  have_step, have_print = built.get('step'), index.manifest.get('params_fingerprint')
  differs = []
  if checkpoint_path is not None:
    params, info = checkpoint_lib.load_params(checkpoint_path, config, mesh)
    now = checkpoint_lib.tree_digest(params)
    if info.get('step') != have_step:
      differs.append(f'step {have_step} (index) vs {info.get("step")} (--checkpoint)')
    if have_print is None:
      differs.append('the index records no parameter fingerprint')
    elif now != have_print:
      differs.append(f'parameter fingerprint {have_print[:12]} (index) vs {now[:12]} '
                     '(--checkpoint)')
    against = f'--checkpoint={checkpoint_path}'
  elif built.get('checkpoint_source') == 'prvr_jax' and built.get('checkpoint_arg'):
    now_step = _current_step(built['checkpoint_arg'])
    if now_step is not None and have_step is not None and now_step != have_step:
      differs.append(f'step {have_step} (index) vs {now_step} ({built["checkpoint_arg"]} now)')
    against = f'its checkpoint {built["checkpoint_arg"]}'
  if differs and not allow_stale:
    raise ValueError(f'--index={index.path} is stale against {against}: '
                     f'{"; ".join(differs)}. Rebuild the index (prvr-index build --overwrite), '
                     'or pass --allow_stale_index to evaluate its own parameters knowingly.')
  if differs:
    logging.warning('Evaluating stale index %s (%s): --allow_stale_index.', index.path,
                    '; '.join(differs))


def evaluate_index(config: ml_collections.ConfigDict, index_dir: str, split: str = 'test',
                   output_dir: str | None = None, cross_dataset: bool = False,
                   checkpoint_path: str | None = None, allow_stale: bool = False
                   ) -> EvalResult:
  """`evaluate.py --index`: evaluates `split` on the stored videos of an index of it (its
  model and parameters; nothing is re-encoded), checks the data as `--checkpoint` would (the
  index records its checkpoint's training data), refuses a stale index (`check_pairing`:
  against `checkpoint_path` when given, else against what its recorded run gives now, unless
  `allow_stale`), and writes the outputs to `output_dir` (default `<index>_eval_<split>`);
  metrics.json names the index and its provenance (`Index.provenance`, key 'index')."""
  config_lib.validate(config)
  outputs.check_output_dir(output_dir)
  index = open_index(index_dir, config, verify=True)
  built = index.manifest['info']
  info = {'source': 'index', 'path': index.path, 'workdir': built.get('workdir'),
          'data': built.get('trained_on')}
  output_dir = output_dir or f'{index.path}_eval_{split}'
  target, folder = os.path.realpath(output_dir), os.path.realpath(index.path)
  if target == folder or target.startswith(folder + os.sep):
    raise ValueError(f'--output_dir={output_dir} lies in the index folder --index={index_dir}; '
                     'choose another --output_dir.')
  mesh = parallel.make_mesh()
  check_pairing(index, config, checkpoint_path, mesh, allow_stale)
  loaded = outputs.load_split(config, split, info['workdir'] or output_dir, info['data'],
                              index.path, cross_dataset)
  data, evaluated_on, cross = loaded['data'], loaded['evaluated_on'], loaded['cross']
  evaluator = Evaluator.from_config(config, mesh)
  phases = Phases(evaluator.progress)
  with phases('load_gallery'):
    gallery = evaluation_gallery(index, evaluator, data)
  result = evaluator.evaluate(parallel.replicate(index.params(), mesh), data, gallery=gallery,
                              phases=phases)
  result.timings['total'] += result.timings['load_gallery']
  if jax.process_index() == 0:
    outputs.write_outputs(output_dir, result, {
        'split': split, 'checkpoint': info['path'], 'checkpoint_source': info['source'],
        'model': config.model.name, 'data': evaluated_on, 'trained_on': info['data'],
        'cross_dataset': cross, 'index': index.provenance()})
  logging.info('%s (id %s, checkpoint %s step %s) on %s: R@1 %.1f R@5 %.1f R@10 %.1f R@100 %.1f '
               'SumR %.1f -> %s', index.path, index.id, built.get('checkpoint'),
               built.get('step'), split,
               *(result.metrics[k] for k in ('r1', 'r5', 'r10', 'r100', 'sumr')), output_dir)
  return result
