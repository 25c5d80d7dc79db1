r"""A config over several seeds: one train.py run per seed, then mean ± std of every metric.

  prvr-seeds --config=ms_sl --seeds=3 --workdir=/tmp/ms_sl_seeds [--config.x=y ...] \
      [--parallel=N]

The seeds are `config.train.seed`, +1, ..., +N-1 (`--config.train.seed=S` sets the first);
seed s trains in `<workdir>/seed_<s>` (its output in `<workdir>/seed_<s>.log`), as a train.py
subprocess, one after the other or `--parallel` at a time. Re-running the command resumes: a
seed whose run finished (`test_metrics.json`, and the same config) is not run again, an
interrupted one continues where it stopped.

`<workdir>/seeds.json` and `<workdir>/seeds.md` hold, per split, the mean and the sample
standard deviation (ddof=1) over the seeds of every metric, and each seed's value. `val`: the
validation metrics of each run's selected checkpoint (the best val SumR), from its
`metrics.jsonl`; `test`: its `test_metrics.json`, the test split evaluated once with that
checkpoint. `runs` holds per seed what produced its results (checkpoint step, parameter
sha256, model and config fingerprints, data identity): seeds trained on different data are
refused unless `--allow_mixed_data` (then `mixed_data: true`). See docs/seeds.md.
"""

from collections.abc import Mapping, Sequence
import concurrent.futures
import json
import os
import re
import statistics
import subprocess
import sys
import time
from typing import Any

from absl import flags
from absl import logging
import ml_collections
from ml_collections import config_flags

import prvr_jax
from prvr_jax import config_lib
from prvr_jax import files
from prvr_jax import plots

# The files of a train.py workdir read here (prvr_jax.train.loop.TEST_METRICS_FILE and
# prvr_jax.train.logs.METRICS_FILE; importing prvr_jax.train would load the whole stack).
TEST_METRICS_FILE = 'test_metrics.json'
METRICS_FILE = 'metrics.jsonl'
JSON_FILE = 'seeds.json'
MARKDOWN_FILE = 'seeds.md'
LOCK_FILE = '.seeds.lock'
# What trains each seed unless a train script is given: the `prvr-train` command.
TRAIN_MODULE = 'prvr_jax.tools.train'
STD_NOTE = 'sample standard deviation over seeds (ddof=1)'
SPLIT_TITLES = {'val': 'val: the selected checkpoint (best val SumR) of each seed',
                'test': 'test: the selected checkpoint, evaluated once at the end'}
# Listed first in the tables; the other metrics follow by name, numbers by value (r5 < r10).
PRIMARY_METRICS = ('r1', 'r5', 'r10', 'r100', 'sumr')
# Bookkeeping of a val record, not metrics (test_metrics.json has `step`, `best_epoch` and
# `val_sumr`).
_VAL_BOOKKEEPING = ('split', 'step', 'epoch', 'best_sumr')
_OVERRIDE = re.compile(r'^--?(no)?config\.([^=]+)')


# What each seed's test_metrics.json records of what produced it (`prvr_jax.train.loop`),
# carried into seeds.json per seed.
PROVENANCE_FIELDS = ('step', 'params_sha256', 'model', 'model_config_hash', 'config_sha256',
                     'data')
ALLOW_MIXED_DATA_FLAG = '--allow_mixed_data'


class SeedRunError(RuntimeError):
  """A seed's train.py run failed; the message names the seed and ends with its log."""


def seed_dir(workdir: str, seed: int) -> str:
  return os.path.join(workdir, f'seed_{seed}')


def load_config(config_arg: str, overrides: Sequence[str]) -> ml_collections.ConfigDict:
  """The config of `--config=<config_arg>` with the `--config.key=value` `overrides`, parsed
  as train.py parses them, and validated."""
  argv = ['seeds', f'--config={config_arg}', *overrides]
  config_lib.check_override_flags(argv)
  values = flags.FlagValues()
  config_flags.DEFINE_config_file('config', None, 'Config file[:variant].', flag_values=values,
                                  lock_config=True, sys_argv=argv)
  values(argv)
  config_lib.validate(values.config)
  return values.config


def override_tokens(argv: Sequence[str]) -> list[str]:
  """The `--config.key=value` overrides of a command line, in order (a value may also be the
  next token, as absl allows)."""
  tokens = []
  rest = list(argv[1:])
  while rest:
    token = rest.pop(0)
    if _OVERRIDE.match(token):
      tokens.append(token)
      if '=' not in token and rest and not rest[0].startswith('-'):
        tokens.append(rest.pop(0))
  return tokens


def child_argv(train_script: str | None, config_arg: str, overrides: Sequence[str], seed: int,
               workdir: str) -> list[str]:
  """The training command of one seed (`train_script`, or `TRAIN_MODULE` when None): the
  overrides but the seed's own `train.seed`."""
  program = [train_script] if train_script else ['-m', TRAIN_MODULE]
  argv = [sys.executable, *program, f'--config={config_arg}']
  rest = list(overrides)
  while rest:
    token = rest.pop(0)
    group = [token]
    if '=' not in token and rest and not rest[0].startswith('-'):
      group.append(rest.pop(0))
    match = _OVERRIDE.match(token)
    if not (match and match.group(2) == 'train.seed'):
      argv += group
  return argv + [f'--config.train.seed={seed}', f'--workdir={workdir}']


# ----------------------------------------------------------------------------- results


def _numbers(record: Mapping[str, Any], drop: Sequence[str] = ()) -> dict[str, float]:
  return {k: v for k, v in record.items()
          if k not in drop and isinstance(v, (int, float)) and not isinstance(v, bool)}


def read_seed_results(run_dir: str) -> dict[str, dict[str, float]]:
  """{'val': metrics, 'test': metrics} of a finished train.py workdir: the val record of the
  selected checkpoint's step in `metrics.jsonl` (bookkeeping fields dropped) and every number
  of `test_metrics.json`."""
  test_path = os.path.join(run_dir, TEST_METRICS_FILE)
  with open(test_path, encoding='utf-8') as f:
    test = json.load(f)
  jsonl = os.path.join(run_dir, METRICS_FILE)
  if not os.path.isfile(jsonl):
    raise FileNotFoundError(f'{jsonl} is missing: the val metrics of the run in {run_dir} '
                            'cannot be read.')
  val = None
  for record in plots.read_metrics(jsonl):
    if record['split'] == 'val' and record['step'] == test['step']:
      val = record
  if val is None:
    raise ValueError(f'{jsonl} has no val record at step {test["step"]}, the step of the '
                     f'checkpoint {test_path} was computed with.')
  if val['sumr'] != test['val_sumr']:
    raise ValueError(f'{jsonl} and {test_path} disagree on the val SumR of the selected '
                     f'checkpoint ({val["sumr"]} vs {test["val_sumr"]}).')
  return {'val': _numbers(val, _VAL_BOOKKEEPING), 'test': _numbers(test)}


def _metric_order(names: Sequence[str]) -> list[str]:
  def natural(name):
    return [(1, 0.0, part) if i % 2 == 0 else (0, float(part), '')
            for i, part in enumerate(re.split(r'(\d+(?:\.\d+)?)', name))]
  return ([n for n in PRIMARY_METRICS if n in names]
          + sorted((n for n in names if n not in PRIMARY_METRICS), key=natural))


def aggregate(results: Mapping[int, Mapping[str, Mapping[str, float]]]) -> dict[str, Any]:
  """Mean and sample standard deviation (ddof=1; None for one seed) of every metric per split.

  Args:
    results: seed -> split -> metric -> value; every seed must have the same splits and
      metrics.

  Returns:
    `{'seeds': [sorted seeds], 'std': STD_NOTE, 'splits': {split: {metric: {'mean', 'std',
    'values': [one per seed, in seed order]}}}}`, splits in the order of the first seed's,
    metrics r1, r5, r10, r100, sumr first, then by name.
  """
  seeds = sorted(results)
  if not seeds:
    raise ValueError('No seed results to aggregate.')
  first = results[seeds[0]]
  for seed in seeds[1:]:
    for split in set(first) | set(results[seed]):
      mine, theirs = set(first.get(split, ())), set(results[seed].get(split, ()))
      if mine != theirs:
        raise ValueError(f'Seed {seed} has other {split} metrics than seed {seeds[0]}: '
                         f'{sorted(mine ^ theirs)} in only one of them.')
  splits = {}
  for split, metrics in first.items():
    table = {}
    for name in _metric_order(list(metrics)):
      values = [results[seed][split][name] for seed in seeds]
      table[name] = {'mean': statistics.fmean(values),
                     'std': statistics.stdev(values) if len(values) > 1 else None,
                     'values': values}
    splits[split] = table
  return {'seeds': seeds, 'std': STD_NOTE, 'splits': splits}


def _value(v: float) -> str:
  return str(v) if isinstance(v, int) else f'{v:.2f}'


def format_markdown(summary: Mapping[str, Any], title: str) -> str:
  """`aggregate`'s result as Markdown: one table per split, `mean ± std` and each seed."""
  seeds = summary['seeds']
  lines = [f'# {title}', '',
           f'Mean ± {STD_NOTE}, {len(seeds)} seeds; each run selected its checkpoint on the '
           'validation split only.', '']
  if summary.get('mixed_data'):
    lines += [f'**The seeds trained on different data** ({ALLOW_MIXED_DATA_FLAG}; seeds.json '
              'holds each seed\'s data identity).', '']
  for split, table in summary['splits'].items():
    lines += [f'## {SPLIT_TITLES.get(split, split)}', '',
              '| metric | mean ± std | ' + ' | '.join(f'seed {s}' for s in seeds) + ' |',
              '| --- ' * (2 + len(seeds)) + '|']
    for name, stat in table.items():
      spread = f' ± {stat["std"]:.2f}' if stat['std'] is not None else ' (one seed)'
      lines.append(f'| {name} | {stat["mean"]:.2f}{spread} | '
                   + ' | '.join(_value(v) for v in stat['values']) + ' |')
    lines.append('')
  return '\n'.join(lines)


# ----------------------------------------------------------------------------- runs


def _check_finished_config(run_dir: str, config: ml_collections.ConfigDict, seed: int) -> None:
  """Raises unless the finished run in `run_dir` was trained with `config` at `seed`."""
  # Loads the training stack, only when a finished seed is found.
  from prvr_jax.train import workdir as workdir_lib  # pylint: disable=g-import-not-at-top
  saved = workdir_lib.read_saved_config(run_dir)
  if saved is None:
    raise ValueError(f'{run_dir} has {TEST_METRICS_FILE} but no config.json: not a run of '
                     'train.py; use a new --workdir.')
  expected = config.to_dict()
  expected['train']['seed'] = seed
  breaking, other = workdir_lib.resume_config_changes(saved, expected)
  if breaking or other:
    raise ValueError(f'{run_dir} finished with another configuration '
                     f'({"; ".join(breaking + other)}). Use a new --workdir, or the flags of '
                     f'that run (its config.json).')


def recorded_data(run_dir: str) -> dict[str, Any] | None:
  """The identity of the data the run in `run_dir` trained on: its test_metrics.json's
  `data`, else (a run of an older train.py, or one not finished) the one its newest
  checkpoint recorded; None when it records none."""
  test_path = os.path.join(run_dir, TEST_METRICS_FILE)
  if os.path.isfile(test_path):
    with open(test_path, encoding='utf-8') as f:
      data = json.load(f).get('data')
    if data is not None:
      return data
  # Loads Orbax, only for runs that record their data in their checkpoints alone.
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  from prvr_jax import checkpoint  # pylint: disable=g-import-not-at-top
  for folder, item in ((checkpoint.BEST_DIR, checkpoint.BEST_ITEM),
                       (checkpoint.LATEST_DIR, checkpoint.LATEST_ITEM)):
    directory = os.path.join(run_dir, folder)
    steps = checkpoint.complete_steps(directory, item) if os.path.isdir(directory) else []
    if steps:
      manager = ocp.CheckpointManager(directory)
      try:
        meta = manager.restore(steps[-1], args=ocp.args.Composite(
            meta=ocp.args.JsonRestore())).meta
      finally:
        manager.close()
      return dict(meta).get('data')
  return None


def _data_changes(a: Mapping[str, Any], b: Mapping[str, Any]) -> str:
  return '; '.join(f'{k}: {a.get(k)!r} -> {b.get(k)!r}' for k in sorted(set(a) | set(b))
                   if a.get(k) != b.get(k))


def current_data(config: ml_collections.ConfigDict) -> dict[str, Any] | None:
  """The identity of the data `config.data.dir` gives now where it can be read without
  preparing anything (a shard folder, frame data); None otherwise (a release, prepared into
  each seed's workdir, or the generated synthetic benchmark: compared after training)."""
  if not config.data.dir and config.data.get('source', 'shards') != 'frames':
    return None
  from prvr_jax.data import run_data  # pylint: disable=g-import-not-at-top  (TensorFlow)
  try:
    return run_data.open_run_data(config, None).identity()
  except (ValueError, OSError) as e:  # a release folder; or bad data, which train.py reports
    logging.info('Data identity of config.data.dir=%s not known before training: %s',
                 config.data.dir, e)
    return None


def check_same_data(identities: Mapping[str, Mapping[str, Any] | None],
                    allow_mixed_data: bool) -> bool:
  """Whether the runs named by `identities` (run -> recorded data identity; None: unknown)
  trained on different data; raises naming two of them, what differs and
  `ALLOW_MIXED_DATA_FLAG` unless `allow_mixed_data`."""
  known = [(name, data) for name, data in identities.items() if data is not None]
  for name, data in known[1:]:
    if data != known[0][1]:
      if not allow_mixed_data:
        raise ValueError(
            f'{name} and {known[0][0]} are of different data ({_data_changes(known[0][1], data)})'
            ': averaging them would mix two experiments. Point --config.data.dir to the data '
            f'the finished seeds trained on (their config.json says where it lay), use a new '
            f'--workdir, or pass {ALLOW_MIXED_DATA_FLAG} to aggregate them knowingly.')
      logging.warning('%s and %s are of different data (%s); aggregated '
                      '(%s).', name, known[0][0], _data_changes(known[0][1], data),
                      ALLOW_MIXED_DATA_FLAG)
      return True
  return False


def _provenance(run_dir: str) -> dict[str, Any]:
  with open(os.path.join(run_dir, TEST_METRICS_FILE), encoding='utf-8') as f:
    test = json.load(f)
  return {k: test.get(k) for k in PROVENANCE_FIELDS}


def _run_seed(seed: int, argv: list[str], log_path: str, env: Mapping[str, str]
              ) -> str | None:
  """Runs one seed's train.py, its output appended to `log_path`; None or the failure."""
  start = time.time()
  logging.info('seed %d: training (%s)', seed, log_path)
  with open(log_path, 'ab') as log:
    code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                          check=False).returncode
  if code == 0:
    logging.info('seed %d: done in %.0f s', seed, time.time() - start)
    return None
  with open(log_path, encoding='utf-8', errors='replace') as f:
    tail = ''.join(f.readlines()[-15:])
  return f'seed {seed}: train.py exited with {code}; the end of {log_path}:\n{tail}'


def run_seeds(config_arg: str, overrides: Sequence[str], num_seeds: int, workdir: str,
              parallel: int = 1, train_script: str | None = None,
              env: Mapping[str, str] | None = None,
              allow_mixed_data: bool = False) -> dict[str, Any]:
  """Trains `config_arg` (with `overrides`, as on train.py's command line) over `num_seeds`
  seeds in `workdir`, `parallel` train.py processes at a time, and writes seeds.json and
  seeds.md; returns what seeds.json holds (`aggregate`'s result, the config and overrides,
  `runs`: per seed what produced its results (`PROVENANCE_FIELDS`), and `mixed_data`).

  Seeds trained on different data are refused (`check_same_data`) unless `allow_mixed_data`:
  the data a finished seed recorded is compared with what `config.data.dir` gives now before
  anything trains (where that can be read without preparing, `current_data`), and every
  seed's with the others' before aggregating.

  `train_script`: a train.py to run for each seed; None: `python -m TRAIN_MODULE`.
  `env` is the environment of the train.py processes (default os.environ); with
  `parallel` > 1 they do not preallocate accelerator memory unless `env` says otherwise.
  """
  if num_seeds < 1:
    raise ValueError(f'--seeds={num_seeds} must be at least 1.')
  if parallel < 1:
    raise ValueError(f'--parallel={parallel} must be at least 1.')
  if train_script is not None and not os.path.isfile(train_script):
    raise FileNotFoundError(f'--train_script={train_script} does not exist.')
  if os.path.exists(os.path.join(workdir, METRICS_FILE)):
    raise ValueError(f'--workdir={workdir} is a training run; the seeds need a folder of '
                     'their own.')
  config = load_config(config_arg, overrides)
  first = int(config.train.seed)
  seeds = list(range(first, first + num_seeds))
  env = dict(os.environ if env is None else env)
  if train_script is None:  # the children import the prvr_jax this process imported
    root = os.path.dirname(os.path.dirname(os.path.abspath(prvr_jax.__file__)))
    env['PYTHONPATH'] = os.pathsep.join(filter(None, [root, env.get('PYTHONPATH')]))
  if parallel > 1:
    env.setdefault('XLA_PYTHON_CLIENT_PREALLOCATE', 'false')
  os.makedirs(workdir, exist_ok=True)
  with files.folder_lock(workdir, LOCK_FILE, 'seeds run', '--workdir'):
    todo, finished = [], {}
    for seed in seeds:
      if os.path.isfile(os.path.join(seed_dir(workdir, seed), TEST_METRICS_FILE)):
        _check_finished_config(seed_dir(workdir, seed), config, seed)
        finished[seed_dir(workdir, seed)] = recorded_data(seed_dir(workdir, seed))
        logging.info('seed %d: finished in %s; not run again.', seed, seed_dir(workdir, seed))
      else:
        todo.append(seed)
    if any(data is not None for data in finished.values()):
      now = current_data(config)
      check_same_data({**finished, f'config.data.dir={config.data.dir}': now},
                      allow_mixed_data)

    def run(seed: int) -> str | None:
      argv = child_argv(train_script, config_arg, overrides, seed, seed_dir(workdir, seed))
      return _run_seed(seed, argv, f'{seed_dir(workdir, seed)}.log', env)

    with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
      failed = [(seed, failure) for seed, failure in zip(todo, pool.map(run, todo)) if failure]
    if failed:
      logs = ', '.join(f'{seed_dir(workdir, seed)}.log' for seed, _ in failed)
      raise SeedRunError('\n\n'.join(failure for _, failure in failed)
                         + f'\n\nRun the same command again to resume (failed: {logs}).')
    mixed = check_same_data({seed_dir(workdir, s): recorded_data(seed_dir(workdir, s))
                             for s in seeds}, allow_mixed_data)
    summary = {'config': config_arg, 'overrides': list(overrides),
               **aggregate({s: read_seed_results(seed_dir(workdir, s)) for s in seeds}),
               'runs': {str(s): _provenance(seed_dir(workdir, s)) for s in seeds},
               'mixed_data': mixed}
    title = f'{config_arg} over seeds {", ".join(map(str, seeds))}'
    if overrides:
      title += f' ({" ".join(overrides)})'
    markdown = format_markdown(summary, title)
    files.publish(workdir, {JSON_FILE: files.json_writer(summary),
                            MARKDOWN_FILE: lambda f: f.write(markdown.encode('utf-8'))},
                  marker=JSON_FILE)
  return summary

