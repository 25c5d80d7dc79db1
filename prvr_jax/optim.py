"""Optimisers: the official BertAdam with warmup-linear schedule, AdamW, and T-MASS's AdamW.

BertAdam (the optimiser of all official PRVR repos) differs from Adam: each
parameter tensor's gradient is clipped to its own L2 norm, there is no bias
correction, and weight decay is decoupled and added to the update before the
learning rate. Weight-decay masks follow optax: True = decayed.

'hf_adamw' is the Hugging Face AdamW that T-MASS (and X-Pool) train with: bias correction
folded into the step size with eps outside it, decay applied to the already-updated weights,
per-group learning rates (the CLIP backbone's and the head's), global-norm clipping as
torch's `clip_grad_norm_`, and a cosine schedule with linear warm-up.
"""

import math
from typing import Any, Callable, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import optax

MaskOrFn = Union[Any, Callable[[optax.Params], Any]]


def default_decay_mask(params: optax.Params) -> Any:
  """Decay every leaf except biases and LayerNorm scales (Flax names)."""
  def decayed(path, _):
    last = path[-1]
    name = getattr(last, 'key', getattr(last, 'name', None))
    return name not in ('bias', 'scale')
  return jax.tree_util.tree_map_with_path(decayed, params)


def warmup_linear_schedule(lr: float, warmup_proportion: float,
                           total_steps: int) -> optax.Schedule:
  """The official "warmup_linear" schedule as an optax schedule.

  `count` is the number of updates already applied (so the first update uses
  lr * 0 when warming up). With progress p = count / total_steps and warmup
  proportion w: lr * p / w for p < w, then lr * max((1 - p) / (1 - w), 0).
  `warmup_proportion = -1` means no warmup; `total_steps < 0` gives a
  constant lr, as in the official code.
  """
  if not (0. <= warmup_proportion < 1. or warmup_proportion == -1):
    raise ValueError(
        f'warmup_linear_schedule: warmup_proportion must be in [0, 1) or -1, '
        f'got {warmup_proportion}.')
  warmup = max(float(warmup_proportion), 0.)
  if total_steps < 0:
    return optax.constant_schedule(lr)
  if total_steps == 0:
    raise ValueError('warmup_linear_schedule: total_steps must not be 0.')

  def schedule(count):
    progress = jnp.asarray(count, jnp.float32) / float(total_steps)
    decay = jnp.maximum((1. - progress) / (1. - warmup), 0.)
    if warmup == 0.:
      return lr * decay
    return lr * jnp.where(progress < warmup, progress / warmup, decay)

  return schedule


def warmup_cosine_schedule(lr: float, warmup_proportion: float,
                           total_steps: int) -> optax.Schedule:
  """`get_cosine_schedule_with_warmup` of the official T-MASS code, by update count.

  With W = int(warmup_proportion * total_steps): lr * count / max(1, W) for count < W, then
  lr * max(0, (1 + cos(pi * (count - W) / max(1, total_steps - W))) / 2).
  """
  if not 0. <= warmup_proportion < 1.:
    raise ValueError(f'warmup_cosine_schedule: warmup_proportion must be in [0, 1), got '
                     f'{warmup_proportion}.')
  if total_steps <= 0:
    raise ValueError(f'warmup_cosine_schedule: total_steps must be positive, got {total_steps}.')
  warmup = int(warmup_proportion * total_steps)

  def schedule(count):
    count = jnp.asarray(count, jnp.float32)
    progress = (count - warmup) / max(1, total_steps - warmup)
    cosine = jnp.maximum(0., 0.5 * (1. + jnp.cos(math.pi * progress)))
    return lr * jnp.where(count < warmup, count / max(1, warmup), cosine)

  return schedule


SCHEDULES = {'warmup_linear': warmup_linear_schedule, 'warmup_cosine': warmup_cosine_schedule}


def clip_by_global_norm_torch(max_norm: float) -> optax.GradientTransformation:
  """torch's `clip_grad_norm_`: every gradient scaled by min(1, max_norm / (norm + 1e-6)),
  norm the L2 norm of all gradients together."""
  def update_fn(updates, state, params=None):
    del params
    norm = optax.tree.norm(updates)
    factor = jnp.minimum(1., max_norm / (norm + 1e-6))
    return jax.tree.map(lambda g: (g * factor).astype(g.dtype), updates), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


class ScaleByHfAdamWState(NamedTuple):
  count: jax.Array
  mu: optax.Updates
  nu: optax.Updates


def hf_adamw_updates(learning_rate: optax.Schedule, *, weight_decay: float,
                     lr_multiplier: Any = None, b1: float = 0.9, b2: float = 0.999,
                     eps: float = 1e-6) -> optax.GradientTransformation:
  """The Hugging Face AdamW step (`correct_bias=True`) as complete updates.

  With lr = learning_rate(count) * multiplier (per leaf) and t = count + 1:
    p' = p - lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)
    p'' = p' - lr * weight_decay * p'
  `lr_multiplier`: pytree like the params of per-leaf factors (None: 1 everywhere).
  """
  def init_fn(params):
    zeros = lambda p: jnp.zeros_like(p)
    return ScaleByHfAdamWState(count=jnp.zeros((), jnp.int32),
                               mu=jax.tree.map(zeros, params), nu=jax.tree.map(zeros, params))

  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError('hf_adamw_updates needs the params (decay acts on the updated weights)')
    mu = jax.tree.map(lambda m, g: b1 * m + (1. - b1) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: b2 * v + (1. - b2) * g * g, state.nu, updates)
    t = (state.count + 1).astype(jnp.float32)
    correction = jnp.sqrt(1. - b2 ** t) / (1. - b1 ** t)
    base_lr = learning_rate(state.count)
    multipliers = (jax.tree.map(lambda _: 1., params) if lr_multiplier is None
                   else lr_multiplier)

    def step(p, m, v, factor):
      lr = base_lr * factor
      stepped = p - lr * correction * m / (jnp.sqrt(v) + eps)
      return (stepped - lr * weight_decay * stepped - p).astype(p.dtype)

    new_updates = jax.tree.map(step, params, mu, nu, multipliers)
    return new_updates, ScaleByHfAdamWState(count=state.count + 1, mu=mu, nu=nu)

  return optax.GradientTransformation(init_fn, update_fn)


def clamp_params(lower: Any, upper: Any) -> optax.GradientTransformation:
  """Updates that leave `clip(p + u, lower, upper)` (pytrees like the params; -inf / +inf =
  unbounded): the official in-place clamps of bounded weights (CLIP's logit scale after each
  step; HLFormer's curvature and scale factors before each forward, which is the same
  trajectory once the initial values are inside their bounds)."""
  def update_fn(updates, state, params=None):
    if params is None:
      raise ValueError('clamp_params needs the params')
    return jax.tree.map(lambda u, p, lo, hi: jnp.clip(p + u, lo, hi) - p, updates, params,
                        lower, upper), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def clip_by_tensor_norm(max_norm: float,
                        stacked: Optional[MaskOrFn] = None) -> optax.GradientTransformation:
  """Scales each official tensor's gradient to L2 norm <= max_norm (torch's `clip_grad_norm_`).

  Like torch, the factor is min(1, max_norm / (norm + 1e-6)). Where `stacked` (a pytree of
  bools like the params, or a callable params -> one) is True, the leaf's leading axis holds
  separate official tensors (a `GMMBlock`'s K branches) and each slice is clipped on its own.
  """
  def clip(g, is_stacked):
    axes = tuple(range(1 if is_stacked else 0, g.ndim))
    norm = jnp.sqrt(jnp.sum(jnp.square(g.astype(jnp.float32)), axis=axes, keepdims=True))
    factor = jnp.minimum(1., max_norm / (norm + 1e-6))
    return (g * factor).astype(g.dtype)

  def update_fn(updates, state, params=None):
    del params
    if stacked is None:
      mask = jax.tree.map(lambda _: False, updates)
    else:
      mask = stacked(updates) if callable(stacked) else stacked
    return jax.tree.map(clip, updates, mask), state

  return optax.GradientTransformation(
      lambda params: optax.EmptyState(), update_fn)


class ScaleByBertAdamState(NamedTuple):
  mu: optax.Updates
  nu: optax.Updates


def scale_by_bert_adam(b1: float = 0.9, b2: float = 0.999,
                       eps: float = 1e-6) -> optax.GradientTransformation:
  """Adam moments without bias correction: m / (sqrt(v) + eps)."""
  def init_fn(params):
    zeros = lambda p: jnp.zeros_like(p)
    return ScaleByBertAdamState(mu=jax.tree.map(zeros, params),
                                nu=jax.tree.map(zeros, params))

  def update_fn(updates, state, params=None):
    del params
    mu = jax.tree.map(lambda m, g: b1 * m + (1. - b1) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: b2 * v + (1. - b2) * g * g, state.nu,
                      updates)
    updates = jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu)
    return updates, ScaleByBertAdamState(mu=mu, nu=nu)

  return optax.GradientTransformation(init_fn, update_fn)


def bert_adam(learning_rate: optax.ScalarOrSchedule, *, weight_decay: float,
              weight_decay_mask: Optional[MaskOrFn], max_grad_norm: float = 1.0,
              stacked: Optional[MaskOrFn] = None, b1: float = 0.9, b2: float = 0.999,
              eps: float = 1e-6) -> optax.GradientTransformation:
  """The official BertAdam as an optax transformation.

  update = -lr_t * (m / (sqrt(v) + eps) + weight_decay * p * mask), with each
  gradient tensor first clipped to L2 norm <= max_grad_norm (skipped when
  max_grad_norm <= 0) and no bias correction.

  Args:
    learning_rate: a float or an optax schedule of the update count
      (see `warmup_linear_schedule`).
    weight_decay: decay factor. Note that the official `get_opts` hard-codes
      0.01 in its decayed param group, whatever the configured `wd`.
    weight_decay_mask: pytree of bools like the params (True = decayed) or a
      callable params -> such a pytree; None decays everything.
    max_grad_norm: per-tensor clipping norm.
    stacked: which leaves stack separate tensors on their leading axis (see
      `clip_by_tensor_norm`); None: none.
    b1, b2, eps: Adam constants.
  """
  parts = []
  if max_grad_norm > 0:
    parts.append(clip_by_tensor_norm(max_grad_norm, stacked))
  parts.append(scale_by_bert_adam(b1, b2, eps))
  if weight_decay > 0:
    parts.append(optax.add_decayed_weights(weight_decay, weight_decay_mask))
  parts.append(optax.scale_by_learning_rate(learning_rate))
  return optax.chain(*parts)


def adamw(learning_rate: optax.ScalarOrSchedule, *, weight_decay: float,
          weight_decay_mask: Optional[MaskOrFn] = default_decay_mask,
          max_grad_norm: float = 1.0, b1: float = 0.9, b2: float = 0.999,
          eps: float = 1e-8) -> optax.GradientTransformation:
  """optax AdamW with global-norm gradient clipping (skipped if <= 0).

  By default no decay on biases and LayerNorm scales (`default_decay_mask`).
  """
  opt = optax.adamw(learning_rate, b1=b1, b2=b2, eps=eps,
                    weight_decay=weight_decay, mask=weight_decay_mask)
  if max_grad_norm > 0:
    return optax.chain(optax.clip_by_global_norm(max_grad_norm), opt)
  return opt


def make_schedule(config_optim: Any, total_steps: int) -> optax.Schedule:
  """The lr schedule of `config.optim` (`schedule`: 'warmup_linear' by default)."""
  name = config_optim.get('schedule', 'warmup_linear')
  if name not in SCHEDULES:
    raise ValueError(f'config.optim.schedule={name!r}; expected one of {sorted(SCHEDULES)}')
  return SCHEDULES[name](config_optim.lr, config_optim.warmup_proportion, total_steps)


def make_gradient_transformation(config_optim: Any, total_steps: int,
                                 weight_decay_mask: Optional[MaskOrFn] = None,
                                 stacked: Optional[MaskOrFn] = None, lr_multiplier: Any = None,
                                 bounds: tuple[Any, Any] | None = None
                                 ) -> optax.GradientTransformation:
  """The optax transformation of `config.optim`, with the per-leaf rules passed in (a
  training run takes them from its model: `prvr_jax.train.make_model_optimizer`).

  Args:
    config_optim: `config.optim` with `name` ('bert_adam' | 'adamw' | 'hf_adamw'), `lr`,
      `schedule`, `warmup_proportion`, `weight_decay`, `max_grad_norm`.
    total_steps: planned number of updates (the official t_total).
    weight_decay_mask: the mask for 'bert_adam' (from the rules the model
      declares, `ModelSpec.weight_decay_mask`); None = `default_decay_mask`.
      'adamw' always uses `default_decay_mask` (no decay on biases and on
      any LayerNorm parameter).
    stacked: for 'bert_adam', the leaves clipped per leading-axis slice
      (`ModelSpec.stacked_mask`).
    lr_multiplier: for 'hf_adamw', per-leaf lr factors (the backbone group's
      `backbone_lr / lr`).
    bounds: (lower, upper) per-leaf bounds the weights are clamped to after each update, under
      every optimiser (`ModelSpec.bound_trees`; None: none).
  """
  schedule = make_schedule(config_optim, total_steps)
  name = config_optim.name
  if name == 'hf_adamw':
    parts: list[optax.GradientTransformation] = []
    if config_optim.max_grad_norm > 0:
      parts.append(clip_by_global_norm_torch(config_optim.max_grad_norm))
    parts.append(hf_adamw_updates(schedule, weight_decay=config_optim.weight_decay,
                                  lr_multiplier=lr_multiplier,
                                  eps=config_optim.get('eps', 1e-6)))
    if bounds is not None:  # inside the chain: the optimiser state keeps its structure
      parts.append(clamp_params(*bounds))
    return optax.chain(*parts)
  if name == 'bert_adam':
    tx = bert_adam(
        schedule, weight_decay=config_optim.weight_decay,
        weight_decay_mask=(default_decay_mask if weight_decay_mask is None
                           else weight_decay_mask),
        max_grad_norm=config_optim.max_grad_norm, stacked=stacked)
  elif name == 'adamw':
    tx = adamw(schedule, weight_decay=config_optim.weight_decay,
               max_grad_norm=config_optim.max_grad_norm)
  else:
    raise ValueError(
        f"config.optim.name must be 'bert_adam', 'adamw' or 'hf_adamw', got {name!r}.")
  return tx if bounds is None else optax.chain(tx, clamp_params(*bounds))
