"""The jitted train step: objective, gradients, update; per-step RNG by `fold_in`."""

from collections.abc import Callable
from concurrent import futures
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh
import ml_collections
import optax

from prvr_jax import parallel
from prvr_jax.kernels import policy
from prvr_jax.layers.precision import matmul_precision
from prvr_jax.models.spec import LossContext, ModelSpec
from prvr_jax.train.state import TrainState

StepFn = Callable[[TrainState, dict[str, jax.Array], jax.Array],
                  tuple[TrainState, dict[str, jax.Array]]]


def make_train_step(config: ml_collections.ConfigDict, spec: ModelSpec,
                    tx: optax.GradientTransformation, schedule: optax.Schedule,
                    mesh: Mesh) -> StepFn:
  """Jitted `(state, batch, epoch) -> (state, metrics)` for the model of `spec`.

  The state is donated; `epoch` is a traced int32 scalar (`LossContext.epoch`), so epoch-
  dependent losses never recompile. The step's key `fold_in(state.rng, state.step)` is split
  into one key per name of `spec.rng_streams`. metrics: `loss`, the objective's terms, `lr`
  (of this update) and `grad_norm` (global L2 norm of the gradients before clipping), all
  replicated scalars. Matmuls run at `config.train.matmul_precision`; the model's layers run
  with the CPU kernels as `config.train.kernels` says ('auto': where `kernels.policy`
  enables them).
  """
  module = spec.build(config.model)
  precision = config.train.matmul_precision
  kernels = policy.CHOICES[config.train.kernels]

  def step(state: TrainState, batch: dict[str, jax.Array], epoch: jax.Array
           ) -> tuple[TrainState, dict[str, jax.Array]]:
    keys = jax.random.split(jax.random.fold_in(state.rng, state.step), len(spec.rng_streams))
    rngs = dict(zip(spec.rng_streams, keys))
    ctx = LossContext(loss=config.loss, epoch=jnp.asarray(epoch, jnp.int32), step=state.step)
    with matmul_precision(precision), policy.fast_kernels(kernels):
      (loss, terms), grads = jax.value_and_grad(spec.objective, argnums=1, has_aux=True)(
          module, state.params, batch, rngs, ctx)
      with jax.named_scope('optimizer'):  # named for the profile breakdown (benchmarks/)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
    metrics: dict[str, Any] = {'loss': loss, **terms, 'lr': schedule(state.step),
                               'grad_norm': optax.tree.norm(grads)}
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  replicated = parallel.replicated(mesh)
  return jax.jit(step, out_shardings=(replicated, replicated), donate_argnums=0)


def compile_ahead(step: Any, state: Any, batch: dict[str, jax.Array], epoch: jax.Array
                  ) -> futures.Future:
  """Traces and lowers the jitted `step` (`make_train_step`) for arguments like these (arrays,
  or `jax.ShapeDtypeStruct` leaves, with their shardings) here, and compiles it, or loads it
  from the persistent cache, in a background thread -> a Future of the compiled step.

  XLA releases the GIL while it compiles or loads, so the start-up's Python work (the state's
  init, the evaluator) runs beside it. The compiled step takes arguments of exactly these
  shapes and shardings, as every training batch has, and raises on others. A process that
  fails before it asks for the result exits once the compile is done."""
  lowered = step.trace(state, batch, epoch).lower()
  executor = futures.ThreadPoolExecutor(1, thread_name_prefix='compile_train_step')
  compiled = executor.submit(lowered.compile)
  executor.shutdown(wait=False)
  return compiled
