"""The train state, the optimiser of a config, and the state's (sharded) construction."""

from typing import Any

from flax import struct
import jax
import jax.numpy as jnp
from jax.sharding import Mesh
import ml_collections
import optax

from prvr_jax import optim
from prvr_jax.clip import weights as clip_weights
from prvr_jax import parallel
from prvr_jax.runtime import xla
from prvr_jax.models.spec import ModelSpec, match_paths


class TrainState(struct.PyTreeNode):
  """step: updates done; params: the model's `params` collection; rng: raw PRNG key."""
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array


def make_model_optimizer(config: ml_collections.ConfigDict, spec: ModelSpec, total_steps: int
                         ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """The optimiser of `config.optim` for `total_steps` updates of `spec`'s model (of
  `config.model`), and its lr schedule.

  The weight-decay mask, BertAdam's per-tensor clipping groups, the backbone's lr group
  (`config.optim.backbone_lr`) and the clamped weights come from the rules the model declares
  (`ModelSpec.no_decay`, `stacked`, `backbone`, `bounds`) applied to its parameter tree.
  """
  shapes = spec.param_shapes(config.model)
  lr_multiplier = None
  if spec.backbone:
    ratio = config.optim.get('backbone_lr', config.optim.lr) / config.optim.lr
    lr_multiplier = jax.tree.map(lambda in_backbone: ratio if in_backbone else 1.,
                                 match_paths(shapes, spec.backbone))
  tx = optim.make_gradient_transformation(
      config.optim, total_steps, spec.weight_decay_mask(shapes), spec.stacked_mask(shapes),
      lr_multiplier=lr_multiplier, bounds=spec.bound_trees(config.model, shapes))
  return tx, optim.make_schedule(config.optim, total_steps)


def _state(params: Any, train_rng: jax.Array, tx: optax.GradientTransformation) -> TrainState:
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                    rng=train_rng)


def _init_fn(config: ml_collections.ConfigDict, spec: ModelSpec,
             tx: optax.GradientTransformation):
  def init(rng: jax.Array) -> TrainState:
    params_rng, train_rng = jax.random.split(rng)
    return _state(spec.init_params(config.model, params_rng), train_rng, tx)
  return init


def abstract_train_state(config: ml_collections.ConfigDict, spec: ModelSpec,
                         tx: optax.GradientTransformation, mesh: Mesh) -> TrainState:
  """ShapeDtypeStructs (with replicated shardings) of the train state of `spec`'s model;
  nothing computed, and the model not traced again (`ModelSpec.param_shapes` is)."""
  abstract = jax.eval_shape(
      lambda params: _state(params, jax.random.PRNGKey(0), tx),
      spec.param_shapes(config.model))
  sharding = parallel.replicated(mesh)
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                      abstract)


# XLA options of the init program by platform. The init runs once per run, so on CPUs LLVM
# optimises it at level 1 instead of 3: about half the compile, the same parameters bit for bit
# (tests/train/test_state.py; level 0 changes the last bit of some), a slower run that is not
# noticed. An option that `XLA_FLAGS` sets is left to it.
INIT_COMPILER_OPTIONS = {'cpu': {'xla_backend_optimization_level': 1}}


def _init_compiler_options() -> dict[str, Any] | None:
  options = INIT_COMPILER_OPTIONS.get(jax.default_backend(), {})
  return {k: v for k, v in options.items() if not xla.sets(k)} or None


def create_train_state(config: ml_collections.ConfigDict, spec: ModelSpec,
                       tx: optax.GradientTransformation, mesh: Mesh) -> TrainState:
  """Fresh state of `spec`'s model from `config.train.seed`, computed on device already
  replicated; with `config.model.clip_weights`, the model's CLIP towers and logit scale start
  from that checkpoint (`prvr_jax.clip.weights.load`)."""
  init = jax.jit(_init_fn(config, spec, tx), out_shardings=parallel.replicated(mesh))
  rng = jax.random.PRNGKey(config.train.seed)
  state = init.lower(rng).compile(compiler_options=_init_compiler_options())(rng)
  path = config.model.get('clip_weights')
  if path:
    _, clip_params = clip_weights.load(path)
    params = clip_weights.into_model(jax.device_get(state.params), clip_params,
                                     f'config.model.clip_weights={path}')
    state = state.replace(params=jax.device_put(params, parallel.replicated(mesh)))
  return state
