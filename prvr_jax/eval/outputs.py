"""What an evaluation of a checkpoint or an index leaves: a checkpoint loaded with its data and
checked against it, then metrics.json and scores.npy, and dense_queries.jsonl under the dense
protocol (`prvr-evaluate`, `index.evaluate_index`)."""

from collections.abc import Mapping
import dataclasses
import hashlib
import io
import json
import os
from typing import Any

from absl import logging
import jax

from prvr_jax import checkpoint
from prvr_jax import config_lib
from prvr_jax import files
from prvr_jax import parallel
from prvr_jax.eval.evaluator import EvalResult
from prvr_jax.models import registry


METRICS_FILE = 'metrics.json'
SCORES_FILE = 'scores.npy'
DENSE_FILE = 'dense_queries.jsonl'
LOCK_FILE = '.evaluate.lock'


def write_outputs(output_dir: str, result: EvalResult, info: Mapping[str, Any]) -> None:
  """`<output_dir>/metrics.json` (metrics, `info`, `timings`: the seconds of each phase of the
  evaluation, and the sha256 of the scores file) and
  `<output_dir>/scores.npy`, published together (`files.publish`: metrics.json last, so a
  metrics.json always describes the scores.npy beside it). Under the dense protocol also
  `<output_dir>/dense_queries.jsonl` (one line per dense query: `DenseResult.records`),
  published with them; metrics.json then names the dense files read (`dense_files`, with
  their sha256) and the sha256 of dense_queries.jsonl."""
  scores = io.BytesIO()
  files.npy_writer(result.scores)(scores)
  scores = scores.getvalue()
  metrics = {**result.metrics, **info, 'timings': dict(result.timings),
             'scores_sha256': hashlib.sha256(scores).hexdigest()}
  written = {SCORES_FILE: lambda f: f.write(scores)}
  if result.dense is not None:
    dense = ''.join(json.dumps(r, sort_keys=True) + '\n' for r in result.dense.records())
    dense = dense.encode('utf-8')
    metrics.update(dense_files=dict(result.dense.targets.files),
                   dense_queries_sha256=hashlib.sha256(dense).hexdigest())
    written[DENSE_FILE] = lambda f: f.write(dense)
  written[METRICS_FILE] = files.json_writer(metrics)
  os.makedirs(output_dir, exist_ok=True)
  # Two evaluations publishing into one folder at once could pair one's metrics with the
  # other's scores.
  with files.folder_lock(output_dir, LOCK_FILE, 'evaluation writing its outputs',
                         '--output_dir'):
    files.publish(output_dir, written, marker=METRICS_FILE)


def check_data(trained_on: Mapping[str, Any] | None, evaluated_on: Mapping[str, Any],
               split_name: str, checkpoint_path: str, cross_dataset: bool) -> bool:
  """Whether this is a cross-dataset evaluation: `split_name` of the evaluation data is not
  the split of that name the checkpoint's run had (its recorded data identity). Raises for
  one unless `cross_dataset`. Official checkpoints record no identity (False)."""
  if trained_on is None:
    return False
  same = (all(trained_on.get(k) == evaluated_on.get(k)
              for k in ('collection', 'visual_feature', 'text_feature'))
          and trained_on.get('splits', {}).get(split_name)
          == evaluated_on['splits'].get(split_name))
  if not same and not cross_dataset:
    raise ValueError(
        f'{checkpoint_path} was trained with other data than the evaluation data: split '
        f'{split_name!r} of collection {trained_on.get("collection")!r} (shards '
        f'{trained_on.get("splits", {}).get(split_name)}) then, collection '
        f'{evaluated_on.get("collection")!r} (shards {evaluated_on["splits"].get(split_name)}) '
        'now. Point config.data.dir to the data the model was trained with, or pass '
        '--cross_dataset to evaluate on other data on purpose (the outputs then say so).')
  return not same


def load_split(config: Any, split: str, workdir: str, trained_on: Mapping[str, Any] | None,
               source_path: str, cross_dataset: bool = False) -> dict[str, Any]:
  """The data of an evaluation or an index of `split`, prepared where needed in `workdir`
  (`run_data.prepare_run_data`) and checked against the data `trained_on` of the checkpoint or
  index at `source_path` (`check_data`): {'shards', 'data' (the split's `EvalSplit`),
  'evaluated_on' (the data identity), 'cross'}. The one loader of `evaluate.py --checkpoint`,
  `--index` and `prvr-index build`."""
  from prvr_jax.data import run_data  # pylint: disable=g-import-not-at-top  (TensorFlow)
  # Synthetic data / prepared shards are found again in the training workdir.
  run_data.prepare_run_data(config, workdir)
  shards = run_data.open_run_data(config, workdir)
  split_name = config.data.get(f'{split}_split', split)
  evaluated_on = shards.identity()
  cross = check_data(trained_on, evaluated_on, split_name, source_path, cross_dataset)
  if cross:
    logging.warning('Cross-dataset: %s was trained on other data than split %r of %s.',
                    source_path, split_name, shards.dir)
  data = shards.eval_split(split)
  if config.eval.get('protocol', 'single') == 'dense':
    data = dataclasses.replace(data, dense=dense_targets(config, data, shards.dir, split_name))
  return dict(shards=shards, data=data, evaluated_on=evaluated_on, cross=cross)


def dense_targets(config: Any, data: Any, data_dir: str, split_name: str) -> Any:
  """The dense multi-ground-truth targets of `data` (an `EvalSplit` of split `split_name`):
  the dense files `dense_gt.locate` finds for `config` (`data_dir`: the run's data folder),
  read, checked and aligned with the split's keys (`dense_gt`; docs/dense_eval.md)."""
  from prvr_jax.data import dense_gt  # pylint: disable=g-import-not-at-top
  dense = dense_gt.read(*dense_gt.locate(config, data_dir))
  logging.info('Dense evaluation: %d queries, %d candidate videos from %s.',
               len(dense.query_ids), len(dense.video_ids), dense.gt_path)
  return dense_gt.align(dense, data.caption_ids, data.video_ids, split_name)


def load_checkpoint_and_data(config: Any, checkpoint_path: str, split: str, fallback_dir: str,
                             cross_dataset: bool = False) -> dict[str, Any]:
  """What evaluating or indexing `split` with a checkpoint needs: {'mesh', 'params', 'info'
  (`checkpoint.load_params`)} and `load_split`'s entries. Data is looked for in the
  checkpoint's workdir, else `fallback_dir`."""
  mesh = parallel.make_mesh()
  params, info = checkpoint.load_params(checkpoint_path, config, mesh)
  # The parameters evaluated, as the checkpoint recorded them when saved (`tree_digest`).
  info = {**info, 'params_sha256': checkpoint.tree_digest(params)}
  return dict(mesh=mesh, params=params, info=info,
              **load_split(config, split, info['workdir'] or fallback_dir, info['data'],
                           checkpoint_path, cross_dataset))


def load_pretrained_and_data(config: Any, split: str, workdir: str,
                             cross_dataset: bool = False) -> dict[str, Any]:
  """`load_checkpoint_and_data` for a model with nothing to train (`ModelSpec.pretrained`):
  its parameters from the config (e.g. `config.model.clip_weights`), the split's data prepared
  in `workdir`. info: source 'pretrained', path the weights file (None: none read)."""
  spec = registry.get_spec(config.model)
  if spec.trainable:
    raise ValueError(f'config.model.name={spec.name!r} is a trained model: pass --checkpoint '
                     '(or --index).')
  mesh = parallel.make_mesh()
  params = spec.pretrained(config)
  info = {'source': 'pretrained', 'path': config.model.get('clip_weights') or None,
          'workdir': None, 'step': None, 'data': None,
          'params_sha256': checkpoint.tree_digest(params)}
  return dict(mesh=mesh, params=parallel.replicate(params, mesh), info=info,
              **load_split(config, split, workdir, None, info['path'] or spec.name,
                           cross_dataset))


def load_params_and_data(config: Any, checkpoint_path: str | None, split: str,
                         fallback_dir: str, cross_dataset: bool = False) -> dict[str, Any]:
  """`load_checkpoint_and_data`, or without a checkpoint `load_pretrained_and_data` (data in
  `fallback_dir`)."""
  if checkpoint_path is None:
    return load_pretrained_and_data(config, split, fallback_dir, cross_dataset)
  return load_checkpoint_and_data(config, checkpoint_path, split, fallback_dir, cross_dataset)


def default_output_dir(info: Mapping[str, Any], checkpoint_path: str, split: str) -> str:
  """`<workdir>/eval_<split>` for our checkpoints, `<file without suffix>_eval_<split>` for
  official files."""
  if info.get('workdir'):
    return os.path.join(info['workdir'], f'eval_{split}')
  return f'{os.path.splitext(checkpoint_path)[0]}_eval_{split}'


def check_output_dir(output_dir: str | None) -> None:
  """Refuses an `--output_dir` that is a file."""
  if output_dir is not None and os.path.exists(output_dir) and not os.path.isdir(output_dir):
    raise ValueError(f'--output_dir={output_dir} is a file, not a folder.')


def provenance(config: Any, info: Mapping[str, Any], evaluated_on: Mapping[str, Any]
               ) -> dict[str, Any]:
  """What an evaluation's numbers come from: `checkpoint` (its path), `checkpoint_source`,
  `checkpoint_step` (None for an official file), `params_sha256` (None where the caller did
  not record it), `model` and `model_config_hash` (`checkpoint.model_fingerprint`),
  `config_sha256`, `data` (the identity of the data evaluated on) and `trained_on`."""
  return {'checkpoint': info['path'], 'checkpoint_source': info['source'],
          'checkpoint_step': info.get('step'), 'params_sha256': info.get('params_sha256'),
          **checkpoint.model_fingerprint(config.model, registry.get_spec(config.model)),
          'config_sha256': config_lib.config_fingerprint(config), 'data': evaluated_on,
          'trained_on': info['data']}


def finish(config: Any, result: EvalResult, output_dir: str, split: str,
           info: Mapping[str, Any], evaluated_on: Mapping[str, Any], cross: bool,
           source: str) -> None:
  """Writes the outputs on process 0 (`write_outputs`) and logs the headline metrics.

  metrics.json names what produced the numbers (`provenance`): the checkpoint (path, step,
  sha256 of the parameters evaluated), the model fingerprint and `config_lib.config_fingerprint`
  of the config, the data evaluated on and the data the checkpoint was trained on."""
  if jax.process_index() == 0:
    write_outputs(output_dir, result, {'split': split, **provenance(config, info, evaluated_on),
                                       'cross_dataset': cross})
  logging.info('%s on %s: R@1 %.1f R@5 %.1f R@10 %.1f R@100 %.1f SumR %.1f -> %s',
               source, split,
               *(result.metrics[k] for k in ('r1', 'r5', 'r10', 'r100', 'sumr')), output_dir)
  if result.dense is not None:
    logging.info('%s on %s, dense (%d queries): R@1 %.1f R@5 %.1f R@10 %.1f R@100 %.1f SumR '
                 '%.1f mAP %.1f nDCG@10 %.1f', source, split, result.metrics['dense_num_queries'],
                 *(result.metrics[f'dense_{k}'] for k in ('r1', 'r5', 'r10', 'r100', 'sumr',
                                                          'map', 'ndcg10')))
