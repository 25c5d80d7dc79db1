"""The model contract: what the registry knows of a model, and what its objective is given.

A model is a Flax Linen module with three methods used through `module.apply(..., method=...)`
by training, evaluation, the index and user code:

  stored = module.apply(variables, video_batch, method='encode_videos')   # pytree, leading axis B
  queries = module.apply(variables, query_batch, method='encode_queries') # pytree, leading axis Q
  scores = module.apply(variables, queries, stored, method='score',
                        rngs=...)                                         # [Q, B]

plus `__call__(batch, deterministic)`, the training forward, whose output dict holds at least
`scores` (`[Q, B]`, the same score as `score` for every query-video pair of the batch).
`video_batch` / `query_batch` are dicts with the batch contract's keys (docs/design.md).
The objective beside the model turns a training batch into a loss:

  loss, metrics = spec.objective(module, params, batch, rngs, ctx)

with `rngs` one key per name of `spec.rng_streams` and `ctx` a `LossContext`.
Models with explicit moments name one more method, `spec.relevance`: each query's relevance
over the clips or frames of its own video (`prvr_jax.plots` draws it against the annotated
moment).
"""

from collections.abc import Callable, Mapping, Sequence
import dataclasses
import json
import math
import re
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from prvr_jax.models import batch as batch_lib
from prvr_jax.models.fields import module_fields
from prvr_jax.models.torch_names import Leaf
from prvr_jax.ops import max_similarity

Params = Any
Batch = Mapping[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class LossContext:
  """What an objective reads besides the parameters and the batch.

  Built inside the jitted train step. `epoch` and `step` are traced int32 scalars, so
  schedules inside the loss (hard negatives from an epoch on) switch without recompiling.
  The objective sees the loss settings only: what it needs of the model's fields the module
  it is given already holds.

  Attributes:
    loss: the run's `config.loss` (static): the terms' weights, margins and schedules.
    epoch: the epoch of this update (0-based).
    step: updates done before this one.
  """
  loss: Any
  epoch: jax.Array
  step: jax.Array


Objective = Callable[[nn.Module, Params, Batch, Mapping[str, jax.Array], LossContext],
                     tuple[jax.Array, dict[str, jax.Array]]]


@dataclasses.dataclass(frozen=True)
class OfficialCheckpoint:
  """How a model reads the authors' PyTorch checkpoints.

  Attributes:
    names: params tree (arrays or shapes) -> every leaf with its torch name(s).
    infer_config: official state_dict -> the `config.model` fields its shapes determine.
    ignored: torch names read and dropped (tensors the official model holds but never uses,
      buffers that are no parameters).
  """
  names: Callable[[Params], Sequence[Leaf]]
  infer_config: Callable[[Mapping[str, np.ndarray]], dict[str, Any]]
  ignored: tuple[str, ...] = ()


def _never(config_model: Any) -> bool:
  del config_model
  return False


def _no_bounds(config_model: Any) -> tuple[tuple[str, float, float], ...]:
  del config_model
  return ()


def path_of(key_path: Sequence[Any]) -> str:
  """A pytree key path as 'a/b/c'."""
  return '/'.join(str(getattr(k, 'key', getattr(k, 'name', k))) for k in key_path)


def match_paths(tree: Any, patterns: Sequence[str]) -> Any:
  """Pytree of bools like `tree`: whether the leaf's 'a/b/c' path matches any regex."""
  compiled = [re.compile(p) for p in patterns]
  return jax.tree_util.tree_map_with_path(
      lambda path, _: any(p.search(path_of(path)) for p in compiled), tree)


_STORED_PER_VIDEO: dict[tuple[str, str], dict[str, jax.ShapeDtypeStruct]] = {}
_PARAM_SHAPES: dict[tuple[str, type, str], Params] = {}


def _config_key(config_model: Any) -> str:
  """A canonical text of a model config (a ConfigDict or a mapping), for caching."""
  if hasattr(config_model, 'to_dict'):
    config_model = config_model.to_dict()
  return json.dumps(config_model, sort_keys=True, default=repr)


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """One registry entry.

  Attributes:
    name: `config.model.name`.
    module: the Linen module class; built from the `config.model` fields it declares.
    objective: the training loss, see the module docstring.
    rng_streams: the keys the objective receives (a split of the step's key, in this order).
    no_decay: regexes on 'a/b/c' parameter paths exempt from weight decay (BertAdam/AdamW).
    stacked: regexes on parameter paths whose leading axis stacks separate tensors (BertAdam
      clips each slice on its own, as the official per-tensor clipping does).
    gradient_free: regexes on parameter paths whose gradient is analytically zero (e.g. a
      bias added uniformly before a softmax), for the contract test.
    official: how to read official PyTorch checkpoints, or None.
    param_counts: parameter count per config variant, as the model's docs state them.
    encoding_depends_on_batch: `config.model -> bool`, whether a video's encoding depends on the
      other videos of its batch (GMMFormer's frame windows); evaluation then keeps the
      official chunks.
    score_rng_streams: RNG keys `score` needs (models that sample at evaluation).
    example_batch: `(config.model, num_videos, queries_per_video) ->` a training batch of
      zeros with the model's input keys and shapes.
    video_inputs, query_inputs: the keys of a video / query batch the model reads.
    input_keys: `config.model -> (video_inputs, query_inputs)` for a model whose inputs depend
      on its config (T-MASS on features or on pixels and tokens); None: the fields above.
    backbone: regexes on parameter paths trained at `config.optim.backbone_lr` (a pretrained
      backbone's group; 'hf_adamw' only).
    bounds: `config.model -> ((regex, lo, hi), ...)`: matching weights are clamped to
      `[lo, hi]` after every update, under every optimiser (the official in-place clamps:
      CLIP's logit scale, HLFormer's curvature and scale factors).
    fingerprint_exempt: `config.model` fields a checkpoint does not depend on (evaluation-only
      settings, the path of initial weights): changing them keeps resuming and evaluating.
    candidate_set: the stored leaf (a set `[L, D]` per video) whose vectors an approximate
      index searches for two-stage retrieval (`prvr_jax.index`): max-over-set cosine.
    candidate_query: the part of the query encoding matched against `candidate_set` (None:
      the encoding is one `[Q, D]` array).
    relevance: the module method giving each query's relevance over the positions of its own
      video, for models with explicit moments (None: the model has none). Called as
      `module.apply(variables, query_batch, video_batch, method=relevance)` with `Q` queries
      and `Q` videos (row q: query q's video), it returns name -> `[Q, T]`: one curve per
      name over T positions (clips, frames) that cover the video evenly in time order, NaN
      at padded positions (`position_scores`, `real_positions`).
    learned_spans: the module method giving, for a model that learns its moments' spans
      (AMDNet), each query's best-matching learned span in its own video: called as
      `relevance` is, it returns `[Q, 2]` (start, end) fractions of the video. Search by text
      returns it as the hit's span (None: the best position of `relevance`'s curve).
    pretrained: for a model with nothing to train (zero-shot CLIP), `config -> params`: its
      parameters from the config alone (pretrained weights); train.py refuses such a model,
      evaluate.py and `prvr-index build` run it without --checkpoint. None: a trained model.
  """
  name: str
  module: type[nn.Module]
  objective: Objective
  rng_streams: tuple[str, ...] = ('dropout',)
  no_decay: tuple[str, ...] = ()
  stacked: tuple[str, ...] = ()
  gradient_free: tuple[str, ...] = ()
  official: OfficialCheckpoint | None = None
  param_counts: Mapping[str, int] = dataclasses.field(default_factory=dict)
  encoding_depends_on_batch: Callable[[Any], bool] = _never
  score_rng_streams: tuple[str, ...] = ()
  example_batch: Callable[..., dict[str, np.ndarray]] = batch_lib.example_batch
  video_inputs: tuple[str, ...] = batch_lib.VIDEO_INPUTS
  query_inputs: tuple[str, ...] = batch_lib.QUERY_INPUTS
  input_keys: Callable[[Any], tuple[tuple[str, ...], tuple[str, ...]]] | None = None
  backbone: tuple[str, ...] = ()
  bounds: Callable[[Any], tuple[tuple[str, float, float], ...]] = _no_bounds
  fingerprint_exempt: tuple[str, ...] = ()
  candidate_set: str = 'clips'
  candidate_query: str | None = None
  relevance: str | None = None
  learned_spans: str | None = None
  pretrained: Callable[[Any], Params] | None = None

  @property
  def trainable(self) -> bool:
    """Whether the model has parameters to train (`pretrained` is None)."""
    return self.pretrained is None

  def inputs(self, config_model: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(video inputs, query inputs): the batch keys `config.model`'s module reads."""
    if self.input_keys is not None:
      return self.input_keys(config_model)
    return self.video_inputs, self.query_inputs

  def build(self, config_model: Any) -> nn.Module:
    """The module with the fields of `config.model` it declares (others keep defaults)."""
    values = {k: config_model[k] for k in module_fields(self.module) if k in config_model}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    return self.module(**values)

  def init_params(self, config_model: Any, rng: jax.Array) -> Params:
    """Parameters for `config.model`'s input dims."""
    return self.build(config_model).init({'params': rng},
                                          self.example_batch(config_model))['params']

  def param_shapes(self, config_model: Any) -> Params:
    """`jax.ShapeDtypeStruct` tree of the parameters, without computing anything.

    Traced once per (model, config) in a process: the optimiser, the abstract train state and
    the checkpoint's restore all ask at start-up."""
    key = (self.name, self.module, _config_key(config_model))
    if key not in _PARAM_SHAPES:
      _PARAM_SHAPES[key] = jax.eval_shape(lambda rng: self.init_params(config_model, rng),
                                          jax.random.key(0))
    return jax.tree.map(lambda leaf: leaf, _PARAM_SHAPES[key])  # a new tree: callers own it

  def stored_per_video(self, config_model: Any) -> dict[str, jax.ShapeDtypeStruct]:
    """What `encode_videos` keeps per video: 'a/b' path -> shape and dtype of one video's part.

    Traced once per (model, config) in a process: every index write, open and search asks."""
    key = (self.name, _config_key(config_model))
    if key not in _STORED_PER_VIDEO:
      _STORED_PER_VIDEO[key] = self._trace_stored_per_video(config_model)
    return dict(_STORED_PER_VIDEO[key])

  def _trace_stored_per_video(self, config_model: Any) -> dict[str, jax.ShapeDtypeStruct]:
    module = self.build(config_model)
    batch = self.example_batch(config_model, num_videos=1)
    videos = {k: batch[k] for k in self.inputs(config_model)[0]}
    stored = jax.eval_shape(
        lambda params: module.apply({'params': params}, videos, method='encode_videos'),
        self.param_shapes(config_model))
    return {path_of(path): jax.ShapeDtypeStruct(leaf.shape[1:], leaf.dtype)
            for path, leaf in jax.tree_util.tree_leaves_with_path(stored)}

  def bytes_per_video(self, config_model: Any) -> int:
    """Bytes of the stored representation of one video."""
    return sum(math.prod(s.shape) * np.dtype(s.dtype).itemsize
               for s in self.stored_per_video(config_model).values())

  def weight_decay_mask(self, params: Params) -> Any:
    """True where weight decay applies (every leaf not matched by `no_decay`)."""
    return jax.tree.map(lambda exempt: not exempt, match_paths(params, self.no_decay))

  def bound_trees(self, config_model: Any, params: Params) -> tuple[Any, Any] | None:
    """(lower, upper): per-leaf bounds of `bounds(config_model)` (-inf / +inf where none
    applies; the tightest where several do), or None for a model without bounds."""
    bounds = self.bounds(config_model)
    if not bounds:
      return None
    def matching(path) -> list[tuple[float, float]]:
      return [(lo, hi) for pattern, lo, hi in bounds if re.search(pattern, path_of(path))]
    lower = jax.tree_util.tree_map_with_path(
        lambda path, _: max((lo for lo, _ in matching(path)), default=-math.inf), params)
    upper = jax.tree_util.tree_map_with_path(
        lambda path, _: min((hi for _, hi in matching(path)), default=math.inf), params)
    return lower, upper

  def stacked_mask(self, params: Params) -> Any:
    """True where the leaf's leading axis stacks separate tensors (`stacked`)."""
    return match_paths(params, self.stacked)


def position_scores(queries: jax.Array, sets: jax.Array) -> jax.Array:
  """Each query's cosine with every element of its own set, by the scorer the set's score is
  the max of (`ops.max_similarity`, each element a set of one): queries `[Q, D]`, sets
  `[Q, L, D]` -> `[Q, L]`, whose max over L is the query's max-over-set score."""
  def one_query(query, elements):  # [D], [L, D] -> [L]: L sets of one element
    return max_similarity(query[None], elements[:, None], cosine=True)[0]
  return jax.vmap(one_query)(queries, sets)


def real_positions(curves: jax.Array, mask: jax.Array) -> jax.Array:
  """`curves [Q, L]` with NaN where `mask [Q, L]` is 0 (padding)."""
  return jnp.where(mask > 0, curves, jnp.nan)


def count_params(params: Params) -> int:
  """Number of scalars in a params tree (arrays or shapes)."""
  return sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(params))
