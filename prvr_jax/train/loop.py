"""`train_and_evaluate(config, workdir)`, what `train.py` runs.

* One `data` mesh over every global device; parameters and optimiser state are replicated,
  batches sharded on their leading axis (`prvr_jax.parallel`).
* State built with `jax.eval_shape` and a jitted init with replicated output shardings; one
  jitted train step with the state donated (`prvr_jax.train.step`).
* By default the data order does not depend on the host count: every host reads the global
  batch stream and feeds its own block of rows, so 1 device, N devices and N hosts see the
  same global batches (`config.data.host_sharded_reading` switches to per-host shard files).
* Validation every epoch (official R@1/5/10/100/SumR); the best val SumR is kept in
  `<workdir>/best`, the latest state in `<workdir>/checkpoints`; early stopping after more
  than `config.train.patience` epochs without improvement (the official rule). At the end
  the best checkpoint is evaluated on the test split -> `<workdir>/test_metrics.json`.
* Checkpoints are Orbax, async and atomic, with JSON metadata (model fingerprint, epochs
  done, best SumR, early-stop counter). Restarting with the same workdir resumes exactly:
  the restored step fixes the data position and the RNG. `config.train.stop_after_steps`
  saves and stops after that global step (a time-boxed job; run again to continue).
* A non-finite loss stops the run (`NonFiniteLossError`) before that state can be saved.
* A finished run resumed with more epochs (`--config.train.num_epochs`, and a patience that
  lets it go on) trains them; resumed unchanged it does nothing and says where its results
  are; changed otherwise (but for test-only `eval.*` fields) it is refused, saying how to
  extend it or to start a new run: config.json never records settings no epoch was trained
  with (`_resume_plan`).
* `test_metrics.json` records what produced it: the best checkpoint's step and parameter
  sha256, the model fingerprint, `config_lib.config_fingerprint` and the data identity.
"""

from collections.abc import Iterator
from concurrent import futures
import itertools
import json
import os
from typing import Any

from absl import logging
import jax
from jax.sharding import Mesh
import ml_collections
import numpy as np
import optax

from prvr_jax import checkpoint
from prvr_jax import config_lib
from prvr_jax import files
from prvr_jax import parallel
from prvr_jax import plots
from prvr_jax import summary
from prvr_jax.data import check as data_check
from prvr_jax.data import protocol
from prvr_jax.data import run_data
from prvr_jax.eval import Evaluator
from prvr_jax.models import registry
from prvr_jax.models.spec import ModelSpec
from prvr_jax.train import data as train_data
from prvr_jax.train import logs
from prvr_jax.train import workdir as workdir_lib
from prvr_jax.train.state import TrainState, abstract_train_state, create_train_state
from prvr_jax.train.state import make_model_optimizer
from prvr_jax.train.step import compile_ahead, make_train_step

TEST_METRICS_FILE = 'test_metrics.json'


def _check_batch_size(config: ml_collections.ConfigDict) -> None:
  batch_size, devices = config.train.batch_size, jax.device_count()
  if batch_size % devices or batch_size % jax.process_count():
    raise ValueError(f'config.train.batch_size={batch_size} must be a multiple of the '
                     f'{devices} devices ({jax.process_count()} processes).')


def check_trainable(config: ml_collections.ConfigDict) -> None:
  """Refuses a model with nothing to train (`ModelSpec.pretrained`, zero-shot CLIP), before
  any workdir is made, saying how to evaluate it instead."""
  spec = registry.get_spec(config.model)
  if not spec.trainable:
    raise ValueError(
        f'config.model.name={spec.name!r} has no parameters to train (its weights are '
        'pretrained, e.g. config.model.clip_weights): nothing to train. Evaluate it with '
        f'evaluate.py --config=<the same config> --output_dir=<a folder> (no --checkpoint).')


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                       allow_config_change: bool = False) -> dict[str, Any] | None:
  """Trains (or resumes) in `workdir`; returns the test metrics of the best checkpoint
  (None when `config.train.stop_after_steps` stopped the run).

  Process 0 holds the workdir's lock for the whole run. A resumed run must keep the fields
  an exact resume depends on (`workdir.EXACT_RESUME_FIELDS`) and the training data; other
  changed fields need `allow_config_change` and are recorded in `config_history.jsonl`.
  """
  check_trainable(config)
  config_lib.validate(config)
  _check_batch_size(config)
  if config.train.get('plots', False):
    plots.require_matplotlib()
  workdir_lib.check_is_workdir(workdir)
  os.makedirs(workdir, exist_ok=True)
  with workdir_lib.lock(workdir, enabled=jax.process_index() == 0):
    return _train_and_evaluate(config, workdir, allow_config_change)


def _check_resume_config(config: ml_collections.ConfigDict, meta: dict[str, Any],
                         workdir: str, allow_config_change: bool) -> list[str]:
  """The accepted config changes of a resumed run against the config that wrote the resumed
  checkpoint (`meta['config']`; older checkpoints: `config.json`); raises for the others."""
  saved = meta.get('config') or workdir_lib.read_saved_config(workdir)
  if saved is None:
    return []
  breaking, other = workdir_lib.resume_config_changes(saved, config.to_dict())
  if breaking:
    raise ValueError(
        f'{workdir} holds a run with another configuration, and these changes make resuming '
        f'it exactly impossible: {"; ".join(breaking)}. Use a new --workdir, or resume with '
        f'the original values (the run\'s config is {workdir}/{checkpoint.CONFIG_FILE}).')
  if other and not allow_config_change:
    raise ValueError(
        f'Resuming {workdir} with a changed configuration: {"; ".join(other)}. Pass '
        '--allow_config_change to resume with these values (recorded in '
        f'{workdir_lib.CONFIG_HISTORY_FILE}), or resume with the original ones.')
  if other:
    logging.warning('Resuming %s with changed settings: %s', workdir, '; '.join(other))
  return other


def _check_resume_data(meta: dict[str, Any], identity: dict[str, Any], workdir: str) -> None:
  """Raises when the data differs from the data the resumed run trained on."""
  recorded = meta.get('data')
  if recorded is None:
    logging.warning('%s records no identity of its training data (an older version); '
                    'resuming unchecked.', workdir)
    return
  if recorded != identity:
    changes = [f'{k}: {recorded.get(k)!r} -> {identity.get(k)!r}'
               for k in sorted(set(recorded) | set(identity)) if recorded.get(k) != identity.get(k)]
    raise ValueError(f'{workdir} was trained on other data than config.data.dir gives now '
                     f'({"; ".join(changes)}); resume on the original data, or use a new '
                     '--workdir.')


# Fields a finished run may change and be tested again with (what the final test computes);
# any other change to a finished run would train nothing under it and is refused.
_TEST_ONLY_FIELDS = ('eval.', 'data.test_split')


def _resume_plan(config: ml_collections.ConfigDict, meta: dict[str, Any], workdir: str,
                 changes: list[str]) -> str:
  """What resuming the run of `meta` with `config` does: 'train' (epochs are left: an
  unfinished run, or a finished one that `config` extends), 'test' (nothing to train: test
  the best checkpoint again) or 'done' (a finished run resumed unchanged whose test metrics
  are there: nothing to do). Raises for a resume that would record settings no epoch was
  trained with: fewer epochs than trained, or a finished run changed but not extended."""
  done, num_epochs = int(meta['epochs_done']), int(config.train.num_epochs)
  if num_epochs < done:
    raise ValueError(
        f'{workdir} has trained {done} epochs: --config.train.num_epochs={num_epochs} would '
        f'record fewer epochs than were trained. Resume with --config.train.num_epochs >= '
        f'{done}, or start a new run with a new --workdir.')
  patience = int(config.train.patience)
  stops_early = patience != -1 and meta['es_count'] > patience
  if not stops_early and done < num_epochs:
    if meta['finished']:
      logging.warning('%s finished after %d epochs; extending it to %d epochs '
                      '(--config.train.num_epochs).', workdir, done, num_epochs)
    return 'train'
  if not meta['finished']:  # ends here under the new bounds: test it
    return 'test'
  why, how = _finished_note(config, meta)
  untrained = [c for c in changes if not c.startswith(_TEST_ONLY_FIELDS)]
  if untrained:
    raise ValueError(f'{workdir} holds a finished run ({why}), so these changes would train '
                     f'nothing: {"; ".join(untrained)}. {how}')
  if (not changes and not config.train.get('plots', False)
      and os.path.isfile(os.path.join(workdir, TEST_METRICS_FILE))):
    return 'done'
  logging.info('%s holds a finished run (%s); nothing to train: testing its best checkpoint '
               'again.', workdir, why)
  return 'test'


def _finished_note(config: ml_collections.ConfigDict, meta: dict[str, Any]) -> tuple[str, str]:
  """(why the run of `meta` is finished under `config`, how to train it further)."""
  done, patience = int(meta['epochs_done']), int(config.train.patience)
  stops_early = patience != -1 and meta['es_count'] > patience
  why = (f'it stopped early after {done} epochs (val SumR did not improve for '
         f'{meta["es_count"]} epochs, more than --config.train.patience={patience})'
         if stops_early else f'it trained all {done} epochs')
  how = (f'To train more epochs, resume with --config.train.num_epochs above {done}'
         + (f' and --config.train.patience of {meta["es_count"]} or more, or -1' if stops_early
            else '') + ' (and --allow_config_change); for a run with other settings use a new '
         '--workdir.')
  return why, how


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str,
                        allow_config_change: bool) -> dict[str, Any] | None:
  is_main = jax.process_index() == 0
  mesh = parallel.make_mesh()
  spec = registry.get_spec(config.model)
  checkpoints = checkpoint.Checkpoints(workdir, config.train.checkpoint_keep)
  writer = None
  try:
    checkpoints.check_model(config, spec)
    latest_meta = checkpoints.latest_meta()
    changes = (_check_resume_config(config, latest_meta, workdir, allow_config_change)
               if latest_meta is not None else [])
    plan = (_resume_plan(config, latest_meta, workdir, changes)
            if latest_meta is not None else 'train')
    # Every process: the check is read-only, and one process raising alone would leave the
    # others waiting in prepare_run_data's barrier.
    data_check.check_before_run(config)
    run_data.prepare_run_data(config, workdir)
    shards = run_data.open_run_data(config, workdir)
    if plan == 'done':  # a finished run resumed unchanged, on its own data: nothing to do
      _check_resume_data(latest_meta, shards.identity(), workdir)
      test_file = os.path.join(workdir, TEST_METRICS_FILE)
      with open(test_file, encoding='utf-8') as f:
        recorded = json.load(f)
      if recorded.get('step') == checkpoints.best.latest_step():
        why, how = _finished_note(config, latest_meta)
        logging.warning('%s holds a finished run (%s); nothing to train, and its test metrics '
                        'are in %s. %s', workdir, why, test_file, how)
        return recorded
      logging.warning('%s is not of the best checkpoint (step %s); testing it again.',
                      test_file, recorded.get('step'))
      plan = 'test'
    writer = logs.MetricWriter(workdir, is_main)
    num_epochs = config.train.num_epochs
    train_data.check_matching_bound(config, shards)
    epoch_steps = shards.steps_per_epoch
    tx, schedule = make_model_optimizer(config, spec, epoch_steps * num_epochs)
    abstract_state = abstract_train_state(config, spec, tx, mesh)
    restored = checkpoints.restore_latest(abstract_state)
    ahead = None
    if restored is None:
      if plan == 'train':  # the step compiles while the state is made
        ahead = _start_steps(config, spec, mesh, tx, schedule, abstract_state, 0, shards)
      state = create_train_state(config, spec, tx, mesh)
      meta = {**checkpoint.model_fingerprint(config.model, spec), 'data': shards.identity(),
              'steps_per_epoch': epoch_steps, 'step': 0, 'epochs_done': 0, 'best_sumr': -1.0,
              'best_epoch': -1, 'es_count': 0, 'finished': False}
      logging.info('Starting %s in %s.', spec.name, workdir)
    else:
      state, meta = restored
      meta.pop('digests', None)
      _check_resume_data(meta, shards.identity(), workdir)
      if meta['steps_per_epoch'] != epoch_steps:
        raise ValueError(
            f'{workdir} was trained with {meta["steps_per_epoch"]} steps per epoch, this '
            f'config gives {epoch_steps} (config.train.batch_size={config.train.batch_size}); '
            'resume with the original batch size and data, or use a new --workdir.')
      checkpoints.drop_best_after(meta['step'])
      meta['finished'] = plan != 'train'  # a finished run that `config` extends reopens
      logging.info('Resuming %s in %s from step %d (%d epochs done).', spec.name, workdir,
                   meta['step'], meta['epochs_done'])
    # Only a run that is going ahead records its config: a refused resume leaves the workdir
    # as it was.
    if is_main:
      workdir_lib.record_config(workdir, config.to_dict(), checkpoints.latest_step() or 0,
                                changes)
    writer.truncate_after(meta['step'])
    meta['config'] = config.to_dict()
    logging.info('Parameters:\n%s', summary.format_table(state.params, depth=2))
    logging.info('%d devices in %d processes; global batch %d; %d steps per epoch; %d epochs.',
                 jax.device_count(), jax.process_count(), config.train.batch_size, epoch_steps,
                 num_epochs)

    if plan == 'train' and ahead is None:
      ahead = _start_steps(config, spec, mesh, tx, schedule, state, meta['step'], shards)
    evaluator = Evaluator.from_config(config, mesh)
    if plan == 'train':
      stopped = _train_epochs(config, *ahead, state, meta, epoch_steps, shards, evaluator,
                              checkpoints, writer)
      if stopped is None:
        return None
      state, meta = stopped
    checkpoints.wait()

    best = checkpoints.restore_best_params(abstract_state.params)
    if best is None:
      logging.warning('No best checkpoint in %s; testing the latest parameters.', workdir)
      params, best_meta = state.params, meta
    else:
      params, best_meta = best
    test_data = shards.eval_split('test')
    test = evaluator.evaluate(params, test_data)
    # What produced these numbers: the checkpoint's step and parameters, the settings and the
    # data (`seeds` compares them across seeds).
    out = {**test.metrics, 'step': best_meta['step'], 'best_epoch': best_meta['best_epoch'],
           'val_sumr': best_meta['best_sumr'], 'params_sha256': checkpoint.tree_digest(params),
           **checkpoint.model_fingerprint(config.model, spec),
           'config_sha256': config_lib.config_fingerprint(config), 'data': shards.identity()}
    if is_main:
      files.write_json(os.path.join(workdir, TEST_METRICS_FILE), out)
    writer.write(meta['step'], 'test', logs.loggable(test.metrics))
    logging.info('Test, best checkpoint (epoch %d): R@1 %.1f R@5 %.1f R@10 %.1f R@100 %.1f '
                 'SumR %.1f', out['best_epoch'], out['r1'], out['r5'], out['r10'], out['r100'],
                 out['sumr'])
    if config.train.get('plots', False):  # every process: the pictures gather the params
      plots.write_plots(config, params, shards, 'test', test_data, test, workdir, workdir)
    return out
  finally:
    checkpoints.close()
    if writer is not None:
      writer.close()


def _start_steps(config: ml_collections.ConfigDict, spec: ModelSpec, mesh: Mesh,
                 tx: optax.GradientTransformation, schedule: optax.Schedule, state: Any,
                 step: int, shards: protocol.RunData
                 ) -> tuple[futures.Future, Iterator[dict[str, jax.Array]]]:
  """The training batches from global step `step` (their first one read) and the train step
  compiling for them and `state` (a train state, or its `abstract_train_state`) in the
  background (`step.compile_ahead`)."""
  batches = shards.train_batches(step, mesh)
  first = next(batches)
  compiled = compile_ahead(make_train_step(config, spec, tx, schedule, mesh), state, first,
                           np.int32(0))
  return compiled, itertools.chain([first], batches)


def _train_epochs(config: ml_collections.ConfigDict, compiled_step: futures.Future,
                  batches: Iterator[dict[str, jax.Array]], state: TrainState,
                  meta: dict[str, Any], epoch_steps: int, shards: protocol.RunData,
                  evaluator: Evaluator, checkpoints: checkpoint.Checkpoints,
                  writer: logs.MetricWriter) -> tuple[TrainState, dict[str, Any]] | None:
  """The epoch loop from `meta`'s position, with the train step `compiled_step` will give and
  the `batches` from that position; returns (state, meta) at the end, or None when
  `config.train.stop_after_steps` stopped it."""
  val_data = shards.eval_split('val')
  stop_after = int(config.train.stop_after_steps)
  every = int(config.train.checkpoint_every_steps)
  step = int(meta['step'])
  train_step = compiled_step.result()
  first_epoch = meta['epochs_done']
  for epoch in range(first_epoch, config.train.num_epochs):
    epoch_end = (epoch + 1) * epoch_steps
    log = logs.StepLog(writer, checkpoints, max(int(config.train.log_every_steps), 1), epoch,
                       step, epoch_end, epoch_steps, show=jax.process_index() == 0,
                       announce_start=epoch == first_epoch)
    pending = None
    # The host reads step t-1's metrics while step t runs: the NaN check costs no sync. Steps
    # that are saved, or that open the timing or close a logging window, are read at once.
    while step < epoch_end:
      state, step_metrics = train_step(state, next(batches), np.int32(epoch))
      step += 1
      if pending is not None:
        log.add(*pending)
      pending = (step, step_metrics)
      save = step == stop_after or (every and step % every == 0 and step != epoch_end)
      if save or log.needs_sync(step):
        log.add(*pending)
        pending = None
      if save:
        checkpoints.save_latest(state, {**meta, 'step': step})
        if step == stop_after:
          log.close()
          logging.warning('Stopped after step %d (config.train.stop_after_steps).', step)
          return None
    if pending is not None:
      log.add(*pending)
    log.close()

    val = evaluator.evaluate(state.params, val_data).metrics
    improved = val['sumr'] > meta['best_sumr']
    meta = {**meta, 'step': step, 'epochs_done': epoch + 1,
            'es_count': 0 if improved else meta['es_count'] + 1}
    if improved:
      meta.update(best_sumr=val['sumr'], best_epoch=epoch)
      checkpoints.save_best(state.params, {**meta, 'val': val})
    patience = config.train.patience
    early_stop = patience != -1 and meta['es_count'] > patience
    meta['finished'] = early_stop or epoch + 1 == config.train.num_epochs
    writer.write(step, 'val', {**logs.loggable(val), 'best_sumr': meta['best_sumr']},
                 epoch=epoch)
    logging.info('Epoch %d: train loss %.4f | val R@1 %.1f R@5 %.1f R@10 %.1f R@100 %.1f SumR '
                 '%.1f%s | best SumR %.1f (epoch %d)', epoch, log.mean_loss(), val['r1'],
                 val['r5'], val['r10'], val['r100'], val['sumr'], ' (new best)' if improved else '',
                 meta['best_sumr'], meta['best_epoch'])
    checkpoints.save_latest(state, meta)
    if early_stop:
      logging.info('Early stop: val SumR did not improve for %d epochs.', meta['es_count'])
      break
  return state, meta
