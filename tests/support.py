"""Helpers of the test suite: float comparisons whose tolerances scale with the values compared,
config loading, and running the CLIs in subprocesses (with their own device counts).

float32 results differ in their last bits between CPU kinds (AVX2, AVX-512, AMX: other vector
widths, other oneDNN / Eigen / XLA tilings, FMA or not) and GPUs, because the terms of every
reduction are summed in another order. Those differences are relative to the magnitude of the
values, so a bare absolute tolerance that passes for values of magnitude 1 fails for values of
magnitude 10. See docs/testing.md.
"""

import atexit
import contextlib
import importlib.util
import json
import math
import os
import pathlib
import select
import signal
import socket
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = REPO / 'tests' / 'fixtures'
OFFICIAL = FIXTURES / 'official'

# XLA:CPU flags of every test process and CLI subprocess: the suite compiles hundreds of
# programs and runs each a few times, so compile time is most of its time. LLVM at -O0 and the
# classic elemental emitters instead of the MLIR fusion emitters, whose per-fusion pass
# pipelines cost most of a compile at -O0, compile the suite's programs in about half the time;
# results agree with the default flags to float rounding, which every tolerance here allows.
# No effect on other backends.
FAST_COMPILE_FLAGS = ('--xla_backend_optimization_level=0', '--xla_cpu_use_fusion_emitters=false')

F32_EPS = float(np.finfo(np.float32).eps)  # 2**-23 ~ 1.19e-7


def f32_rtol(reduction_length: int, ops: int = 1) -> float:
  """A relative tolerance for float32 results: `10 * ops * sqrt(reduction_length) * F32_EPS`.

  Each of `ops` chained reductions of `reduction_length` terms (a matmul's contraction, a
  softmax or LayerNorm over an axis, a mean) may round differently on another CPU kind or on
  GPU; the rounding error of a sum of n terms grows like sqrt(n) * eps relative to the
  operands' magnitude. The factor 10 is a safety margin. Elementwise-only results use
  `reduction_length=1`.
  """
  return 10 * ops * math.sqrt(reduction_length) * F32_EPS


def assert_close(actual, expected, rtol: float, *, scale=None, err_msg: str = '') -> None:
  """Asserts equal shapes and `|actual - expected| <= rtol * (|expected| + scale)` elementwise.

  `scale` is the magnitude of the values compared, a scalar. By default it is `max|expected|`
  over the whole (finite part of the) array, so entries near 0 -- produced by cancellation, or
  a softmax's small weights -- are held to `rtol` of the array's magnitude rather than to a
  relative error of their own, which rounding cannot meet. Pass `scale` when the magnitude of
  the rounding error is set by something else (the operands of a difference, the terms of a
  sum, a learning rate). Only when `scale` is not passed and `expected` is all zero (or empty)
  is `scale` taken as 1.0: then `|actual| <= rtol` is required. An explicit `scale=0` makes the
  check purely relative.
  """
  actual = np.asarray(actual, np.float64)
  expected = np.asarray(expected, np.float64)
  assert actual.shape == expected.shape, f'{err_msg} shapes {actual.shape} != {expected.shape}'
  if scale is None:
    finite = np.abs(expected[np.isfinite(expected)])
    scale = float(finite.max()) if finite.size else 0.0
    if scale == 0.0:
      scale = 1.0
  np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * float(scale),
                             err_msg=err_msg)


def all_equations(jaxpr) -> Any:
  """Every equation of a jaxpr, those of its sub-jaxprs (jit, custom_vjp, lax.map, ...) too."""
  import jax
  for eqn in jaxpr.eqns:
    yield eqn
    for param in eqn.params.values():
      for sub in param if isinstance(param, (list, tuple)) else (param,):
        if isinstance(sub, jax.extend.core.ClosedJaxpr):
          yield from all_equations(sub.jaxpr)
        elif isinstance(sub, jax.extend.core.Jaxpr):
          yield from all_equations(sub)


def leading_axis_sums(equations, axis_size: int) -> list:
  """The `reduce_sum` equations among `equations` that sum over a leading axis of `axis_size`
  (a GMMBlock's branch axis: XLA's CPU backend runs such a sum slowly)."""
  return [e for e in equations if e.primitive.name == 'reduce_sum' and 0 in e.params['axes']
          and e.invars[0].aval.shape[0] == axis_size]


def data_mesh(num_devices: int):
  """A `('data',)` mesh of the first `num_devices` devices of one platform, for the
  data-parallel tests (1 device against 2): the default backend's where it has two or more,
  else the CPU's (tests/conftest.py provides 2), as on a one-GPU machine."""
  import jax
  from jax.sharding import Mesh
  devices = jax.devices()
  if len(devices) < 2:
    devices = jax.devices('cpu')
  return Mesh(np.array(devices[:num_devices]), ('data',))


def cpu_program(fn, *args) -> str:
  """The text of `jax.jit(fn)` compiled by XLA:CPU for `args`, whatever the default backend:
  the tests that read how XLA:CPU compiled something read it here on a GPU machine too."""
  import jax
  args = jax.device_put(args, jax.devices('cpu')[0])
  return jax.jit(fn).lower(*args).compile().as_text()


def has_torch() -> bool:
  """Whether torch is installed (the torch-reader tests run only then)."""
  return importlib.util.find_spec('torch') is not None


# The tiny RoBERTa-layout release the data checks write (tests/data): visual and query feature
# widths, frames per video, captions per split.
TINY_RELEASE = (6, 5, {'v0': 3, 'v1': 5, 'v2': 4, 'v3': 2}, {
    'train': [('v0#0', 'a man walks'), ('v0#1', 'he sits'), ('v1#0', 'a dog runs')],
    'val': [('v2#0', 'a car'), ('v3#0', 'rain')],
    'test': [('v2#0', 'a car'), ('v3#0', 'rain')],
})


# ----------------------------------------------------------------------------- configs


def load_config_module(name_or_path: str) -> Any:
  """The module of `configs/<name>.py`, or of a config file path."""
  path = pathlib.Path(name_or_path)
  if path.suffix != '.py':
    path = REPO / 'configs' / f'{name_or_path}.py'
  spec = importlib.util.spec_from_file_location(f'config_{path.stem}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_config(name_or_path: str, variant: str | None = None) -> Any:
  """`get_config(variant)` of `configs/<name>.py`, or of a config file path."""
  return load_config_module(name_or_path).get_config(variant)


# ----------------------------------------------------------------------------- subprocesses


def require_tensorflow():
  """Skips the calling test module where TensorFlow is missing (a bare JAX GPU image): the
  data layer (TFRecord shards, tf.data pipelines, the TFDS builder) needs it. Returns `tf`."""
  return pytest.importorskip(
      'tensorflow', reason='the data layer needs TensorFlow: pip install tensorflow-cpu '
      '(setup.cfg installs it)')


def subprocess_env(**overrides: str) -> dict[str, str]:
  """This process's environment with the repo and `tests/` first on `PYTHONPATH` (a
  subprocess imports this checkout's `prvr_jax` however it is installed, and keeps any path
  the caller set), then `overrides`."""
  path = os.pathsep.join([str(REPO), str(REPO / 'tests'), os.environ.get('PYTHONPATH', '')])
  return {**os.environ, 'PYTHONPATH': path, **overrides}


def cli_env(cache_dir: pathlib.Path | None, devices: int = 1) -> dict[str, str]:
  """The environment of a CLI subprocess: `devices` CPU devices, the repo on the path, a
  persistent compilation cache at `cache_dir` (None: none), and the huge-page malloc setting
  that the CLI would otherwise restart itself to get (so it imports jax once, not twice)."""
  from prvr_jax.runtime import host_memory  # pylint: disable=g-import-not-at-top
  env = subprocess_env()
  env = host_memory.huge_page_environ(env) or env
  env['XLA_FLAGS'] = ' '.join((f'--xla_force_host_platform_device_count={devices}',
                               *FAST_COMPILE_FLAGS))
  env['JAX_PLATFORMS'] = 'cpu'
  env['TF_CPP_MIN_LOG_LEVEL'] = '2'
  env['JAX_COMPILATION_CACHE_DIR'] = ''  # train.py/evaluate.py: off, not the user's default
  if cache_dir is not None:
    env['JAX_COMPILATION_CACHE_DIR'] = str(cache_dir)
    env['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0'
  return env


def run_cli(script: str, *args: str, cache_dir: pathlib.Path | None, devices: int = 1,
            check: bool = True, timeout: int = 600, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess:
  """Runs `python <repo>/<script> args...` (`env`: added to `cli_env`'s), forked from the
  preloaded launcher where it can be (`preloaded_cli.py`); raises with its stderr when it fails
  and `check`."""
  argv = [str(REPO / script), *args]
  proc, = _run_all([argv], {**cli_env(cache_dir, devices), **(env or {})}, timeout)
  if check and proc.returncode:
    raise AssertionError(f'{script} {" ".join(args)} failed ({proc.returncode}):\n'
                         f'{proc.stderr[-6000:]}')
  return proc


def run_processes(argv_of: list[list[str]], devices: int, timeout: int = 600
                  ) -> list[subprocess.CompletedProcess]:
  """Runs one process per argv (the arguments after `python`) at once (the processes of one
  jax.distributed job, each with `devices` CPU devices, no compilation cache) and returns them
  when all have ended."""
  # No persistent compilation cache: sharing one between the processes of a gloo job has
  # hung on CPU, and these programs are compiled once anyway.
  return _run_all(argv_of, cli_env(cache_dir=None, devices=devices), timeout)


# Environment variables in which a run may differ from the preloaded launcher's environment
# (`cli_env(None)`): read only after the imports (XLA's flags when the backend starts, the
# compilation cache's folder by `prvr_jax.runtime`), or set again by the child
# (`preloaded_cli._JAX_OPTIONS`). A run that differs in any other is started afresh.
PRELOADED_ENV_KEYS = frozenset({
    'XLA_FLAGS', 'JAX_COMPILATION_CACHE_DIR', 'JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS',
    'JAX_DEBUG_LOG_MODULES'})


class _Launcher:
  """This process's `preloaded_cli.py`, started at its first run."""
  instance: '_Launcher | None' = None

  def __init__(self):
    self.log = tempfile.TemporaryFile()
    self.proc = subprocess.Popen([sys.executable, str(REPO / 'tests' / 'preloaded_cli.py')],
                                 cwd=REPO, env=cli_env(cache_dir=None), stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=self.log, text=True)
    atexit.register(self.close)
    self.read(timeout=300)

  @classmethod
  def get(cls) -> '_Launcher':
    if cls.instance is None or cls.instance.proc.poll() is not None:
      cls.instance = cls()
    return cls.instance

  def read(self, timeout: float) -> dict[str, Any]:
    """The launcher's next reply; stops it and raises `subprocess.TimeoutExpired` after
    `timeout` seconds, or `RuntimeError` with its log where it ended."""
    ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
    if not ready:
      self.close()
      raise subprocess.TimeoutExpired(self.proc.args, timeout)
    line = self.proc.stdout.readline()
    if not line:
      self.close()
      self.log.seek(0)
      raise RuntimeError('the preloaded CLI launcher ended:\n'
                         + self.log.read()[-4000:].decode(errors='replace'))
    return json.loads(line)

  def run(self, argv_of: list[list[str]], env: dict[str, str], timeout: float, folder: str
          ) -> list[subprocess.CompletedProcess]:
    files = [(os.path.join(folder, f'{i}.out'), os.path.join(folder, f'{i}.err'))
             for i in range(len(argv_of))]
    runs = [{'argv': argv, 'env': env, 'cwd': str(REPO), 'stdout': out, 'stderr': err}
            for argv, (out, err) in zip(argv_of, files)]
    self.proc.stdin.write(json.dumps({'runs': runs}) + '\n')
    self.proc.stdin.flush()
    pids = self.read(timeout=60)['pids']
    try:
      codes = self.read(timeout)['returncodes']
    except (subprocess.TimeoutExpired, RuntimeError):
      for pid in pids:  # the runs outlive their launcher
        with contextlib.suppress(ProcessLookupError):
          os.kill(pid, signal.SIGKILL)
      raise
    return [subprocess.CompletedProcess([sys.executable, *argv], code,
                                        pathlib.Path(out).read_text(), pathlib.Path(err).read_text())
            for argv, code, (out, err) in zip(argv_of, codes, files)]

  def close(self) -> None:
    if self.proc.poll() is None:
      self.proc.kill()
      self.proc.wait()
    if _Launcher.instance is self:
      _Launcher.instance = None


def _run_all(argv_of: list[list[str]], env: dict[str, str], timeout: float
             ) -> list[subprocess.CompletedProcess]:
  """Runs `python argv` for each argv at once in `env` and waits for all: forked from the
  launcher where `env` differs from its environment only in `PRELOADED_ENV_KEYS`, else as new
  interpreters."""
  base = cli_env(cache_dir=None)
  if not os.environ.get('PRVR_TESTS_FRESH_CLI') and all(
      env.get(k) == base.get(k) for k in (set(env) | set(base)) - PRELOADED_ENV_KEYS):
    with tempfile.TemporaryDirectory() as folder:
      return _Launcher.get().run(argv_of, env, timeout, folder)
  procs = [subprocess.Popen([sys.executable, *argv], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for argv in argv_of]
  outputs = [p.communicate(timeout=timeout) for p in procs]
  return [subprocess.CompletedProcess(p.args, p.returncode, out, err)
          for p, (out, err) in zip(procs, outputs)]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


_OPTIMIZER_STEPS = {}


def optimizer_step(config: Any, t_total: int) -> tuple[Any, Any, Any]:
  """(jitted `step(params, state, grads) -> (params, state)`, the optax transformation, its lr
  schedule) of the training optimiser (`train.make_model_optimizer`) for `t_total` updates of
  `config.model`; one per config and `t_total`, so that the tests updating the same model
  share one compile."""
  import jax  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from prvr_jax import models, train  # pylint: disable=g-import-not-at-top
  key = (config.to_json_best_effort(sort_keys=True), t_total)
  if key not in _OPTIMIZER_STEPS:
    tx, schedule = train.make_model_optimizer(config, models.get_spec(config.model), t_total)

    @jax.jit
    def step(params, state, grads):
      updates, state = tx.update(grads, state, params)
      return optax.apply_updates(params, updates), state
    _OPTIMIZER_STEPS[key] = step, tx, schedule
  return _OPTIMIZER_STEPS[key]


def load_official_model_fixture(path: pathlib.Path, name: str, config_model: dict) -> tuple:
  """(arrays, official state dict `param/*`, spec, module, our params) of a whole-model parity
  fixture made with model `name`'s official code at `config_model`."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import ml_collections  # pylint: disable=g-import-not-at-top
  from prvr_jax import convert  # pylint: disable=g-import-not-at-top
  from prvr_jax.models import registry  # pylint: disable=g-import-not-at-top
  data = np.load(path)
  state = {k[len('param/'):]: data[k] for k in data.files if k.startswith('param/')}
  spec = registry.get_spec(name)
  params = jax.tree.map(jnp.asarray, convert.torch_to_params(state, name, config_model))
  return data, state, spec, spec.build(ml_collections.ConfigDict(config_model)), params


FIXTURE_VIDEO_KEYS = ('clip_feats', 'frame_feats', 'frame_mask')
FIXTURE_QUERY_KEYS = ('query_feats', 'query_mask')


def official_fixture_batch(data: Any, prefix: str = '',
                           keys: tuple[str, ...] = FIXTURE_VIDEO_KEYS + FIXTURE_QUERY_KEYS
                           ) -> dict[str, Any]:
  """The model's training batch from a parity fixture's arrays `<prefix><key>` (`keys`), its
  `query_video`, every video and query valid, video seeds 0..B-1."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  batch = {k: jnp.asarray(data[prefix + k]) for k in keys}
  batch['query_video'] = jnp.asarray(data['query_video'])
  batch['query_valid'] = jnp.ones(len(batch['query_video']), bool)
  batch['video_valid'] = jnp.ones(len(batch['frame_feats']), bool)
  batch['video_seed'] = jnp.arange(len(batch['frame_feats']), dtype=jnp.int32)
  return batch


def check_encodings_and_scores(module: Any, params: Any, batch: dict[str, Any], data: Any,
                               rtol: float,
                               video_keys: tuple[str, ...] = FIXTURE_VIDEO_KEYS,
                               query_keys: tuple[str, ...] = FIXTURE_QUERY_KEYS) -> tuple:
  """Checks a two-branch model's evaluation encodings (`enc_clips`, `enc_frames`,
  `enc_queries`) and scores against a parity fixture's, within `rtol` of each array's
  magnitude, and that every query ranks the videos in the official order. Returns (videos,
  queries, scores)."""
  import jax  # pylint: disable=g-import-not-at-top

  @jax.jit
  def run(params):
    variables = {'params': params}
    videos = module.apply(variables, {k: batch[k] for k in video_keys}, method='encode_videos')
    queries = module.apply(variables, {k: batch[k] for k in query_keys},
                           method='encode_queries')
    return videos, queries, module.apply(variables, queries, videos, method='score')

  videos, queries, scores = run(params)
  assert_close(videos['clips'], data['enc_clips'], rtol, err_msg='clips')
  assert_close(videos['frames'], data['enc_frames'], rtol, err_msg='frames')
  assert_close(queries, data['enc_queries'], rtol, err_msg='queries')
  assert_close(scores, data['scores'], rtol, err_msg='scores')
  np.testing.assert_array_equal(np.argsort(-np.asarray(scores), axis=1),
                                np.argsort(-data['scores'], axis=1))
  return videos, queries, scores


def check_official_training_run(loss_grad_fn: Any, config: Any, state: dict, traj: Any,
                                meta: Any, loss_rtol: float, warmup_steps: int | None = None,
                                frozen: tuple[str, ...] = ()) -> None:
  """Replays an official short training run (`traj`: per step `k` its batch `batch{k}/*`, lr
  `step{k}/lr`, total loss `step{k}/loss/total` and parameters `step{k}/param/*`; `meta`:
  `steps`, `t_total`) from the official weights `state` with our optimiser
  (`optimizer_step(config, ...)`) and `loss_grad_fn(params, batch[, epoch])`, the epoch
  switching to 1 after `warmup_steps` when given. Checks every lr and total loss, and every
  parameter after every update within 5% of the summed lrs: each update moves an element by
  lr times BertAdam's normalised step, and gradients agreeing to float32 rounding differ by a
  small fraction of it. `frozen` parameters stay the official ones."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from prvr_jax import convert  # pylint: disable=g-import-not-at-top
  name = config.model.name
  update, tx, schedule = optimizer_step(config, int(meta['t_total']))
  params = jax.tree.map(jnp.asarray, convert.torch_to_params(state, name, config.model))
  opt_state = tx.init(params)
  lr_sum = 0.0
  for k in range(int(meta['steps'])):
    batch = official_fixture_batch(traj, f'batch{k}/')
    if warmup_steps is None:
      (loss, _), grads = loss_grad_fn(params, batch)
    else:
      (loss, _), grads = loss_grad_fn(params, batch, jnp.int32(k >= warmup_steps))
    params, opt_state = update(params, opt_state, grads)
    lr = float(traj[f'step{k}/lr'])
    assert_close(schedule(k), lr, rtol=1e-6, err_msg=f'step {k} lr')
    assert_close(loss, traj[f'step{k}/loss/total'], loss_rtol, err_msg=f'step {k} total')
    lr_sum += lr
    ours = convert.params_to_torch(jax.device_get(params), name)
    prefix = f'step{k}/param/'
    expected = ({n[len(prefix):]: traj[n] for n in traj.files if n.startswith(prefix)}
                if k else state)  # lr 0: the official weights stay as they were
    assert set(expected) == set(ours), f'step {k} parameter names'
    for frozen_name in frozen:
      np.testing.assert_array_equal(ours[frozen_name], state[frozen_name])
    for param, theirs in expected.items():
      np.testing.assert_allclose(ours[param], theirs, rtol=1e-6, atol=0.05 * lr_sum,
                                 err_msg=f'step {k} {param}')


def second_optimizer_step(config: Any, params: Any, grads: Any, t_total: int,
                          official_lr: float) -> dict[str, np.ndarray]:
  """The torch-named parameters after two updates of the training optimiser
  (`train.make_model_optimizer`) from the same official `grads`, as two official BertAdam steps:
  checks that the schedule's second lr is `official_lr` and that the first update (lr 0) leaves
  `params` as they are."""
  import jax  # pylint: disable=g-import-not-at-top
  from prvr_jax import convert  # pylint: disable=g-import-not-at-top
  step, tx, schedule = optimizer_step(config, t_total)
  assert_close(schedule(1), official_lr, rtol=1e-6)  # float32 lr: ~1 rounding
  p1, state = step(params, tx.init(params), grads)
  jax.tree.map(np.testing.assert_array_equal, p1, params)  # the first update has lr 0
  return convert.params_to_torch(jax.device_get(step(p1, state, grads)[0]), config.model.name)


def load_latest_params(workdir: pathlib.Path, config_path: str, variant: str | None = None
                       ) -> tuple[Any, int]:
  """(params as numpy, step) of the latest checkpoint of a train.py `workdir` trained with
  `config_path` (and `variant`)."""
  import jax
  from prvr_jax import checkpoint, parallel  # pylint: disable=g-import-not-at-top
  params, info = checkpoint.load_params(str(workdir / 'checkpoints'),
                                        load_config(config_path, variant), parallel.make_mesh())
  return jax.tree.map(np.asarray, params), info['step']


def read_jsonl(path: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in path.read_text().splitlines()]


# The pictures `prvr_jax.plots` draws for a run (`config.train.plots`, `evaluate.py --plots`).
PICTURES = ('training_curves', 'recall_by_moment_ratio', 'similarity_heatmap', 'moment_relevance')
HAS_MATPLOTLIB = importlib.util.find_spec('matplotlib') is not None


def assert_png(path, name: str) -> None:
  """`path` is a PNG of `plots.INCHES[name]` x `plots.DPI` pixels that is not one colour."""
  from matplotlib import image  # pylint: disable=g-import-not-at-top
  from prvr_jax import plots  # pylint: disable=g-import-not-at-top
  with open(path, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n', path
  pixels = image.imread(path)
  width, height = plots.INCHES[name]
  assert pixels.shape[:2] == (round(height * plots.DPI), round(width * plots.DPI)), path
  assert pixels[..., :3].std() > 0, f'{path} is blank'


def check_official_checkpoint_through_cli(model: str, variant: str, checkpoint: pathlib.Path,
                                          multibatch: pathlib.Path, overrides: list[str],
                                          tmp_path: pathlib.Path, xla_cache: Any,
                                          layout: str = 'token') -> None:
  """evaluate.py with `configs/<model>.py:<variant>` and `overrides` (the fixture's dims) on
  the official `checkpoint` and the multi-batch release (`official_release`, `layout`)
  gives the scores of the official evaluation loop stored in `multibatch` (`<variant>/scores`,
  within 1e-5 of their O(1) magnitude, as tests/eval/test_evaluate.py) and its recalls
  (`<variant>/metrics`: equal ranks give equal recalls; each test states the margin)."""
  import official_release  # pylint: disable=g-import-not-at-top
  require_tensorflow()
  folder, digest = official_release.write(str(tmp_path / 'release'), layout)
  collection, _, visual_feature, _ = official_release.LAYOUTS[layout]
  official = np.load(multibatch)
  assert digest == str(official['release_digest']), f'{multibatch.name} release_digest'
  out = tmp_path / 'eval'
  run_cli('evaluate.py', f'--config=configs/{model}.py:{variant}', *overrides,
          f'--config.data.dir={folder}', f'--config.data.collection={collection}',
          f'--config.data.visual_feature={visual_feature}', f'--checkpoint={checkpoint}',
          '--split=test', f'--output_dir={out}', cache_dir=xla_cache)
  lines = (pathlib.Path(folder) / 'TextData' / f'{collection}test.caption.txt').read_text()
  cap_ids = [line.split(' ', 1)[0] for line in lines.splitlines() if line.strip()]
  assert list(official['cap_ids']) == cap_ids
  assert list(official['video_ids']) == list(dict.fromkeys(c.split('#')[0] for c in cap_ids))
  assert_close(np.load(out / 'scores.npy'), official[f'{variant}/scores'], rtol=1e-5)
  metrics = json.loads((out / 'metrics.json').read_text())
  assert_close([metrics[k] for k in ('r1', 'r5', 'r10', 'r100', 'sumr')],
               official[f'{variant}/metrics'], rtol=1e-12)
  assert metrics['checkpoint_source'] == 'official' and metrics['model'] == model
