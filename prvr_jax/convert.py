r"""Official PyTorch checkpoints <-> prvr_jax parameters, for every model with an official format.

Reading the files is `prvr_jax.torch_file` (tensors only, no code from the file); this module
maps names. Each model declares its name map (`ModelSpec.official`, built from
`prvr_jax.models.torch_names`): Dense kernels are torch `weight.T`, LayerNorm `scale`/`bias`
are torch `weight`/`bias`, the K parallel blocks `attn0..attnK-1` of a GMM block are stacked on
the leading axis of `branches`. `torch_to_params` / `params_to_torch` apply a map in either
direction; `checkpoint_to_params_file` / `params_file_to_torch` are the two file conversions
of the command line (`prvr_jax.tools.convert`):

  prvr-convert --model=gmmformer_v2 --checkpoint=best.ckpt --out=params.msgpack
  prvr-convert --model=gmmformer_v2 --params=params.msgpack --out=state_dict.npz

(or `python -m prvr_jax.tools.convert ...`). A conversion destroys nothing: an `--out` that is the
input file (by any path, link or hard link) is refused, and an existing `--out` is replaced
(atomically, never written through a link) only with `--overwrite`. Both directions refuse
NaN or inf values, naming the file and the tensor.
"""

import collections
import os
import re
import sys
from typing import Any

from flax import serialization
from flax import traverse_util
import jax
import ml_collections
import numpy as np

from prvr_jax import files
from prvr_jax import torch_file
from prvr_jax.files import short
from prvr_jax.models import registry
from prvr_jax.models.spec import OfficialCheckpoint


def _flatten(tree: Any) -> dict[tuple[str, ...], Any]:
  return {tuple(str(getattr(k, 'key', k)) for k in path): leaf
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def _to_ours(array: np.ndarray, kind: str, shape: tuple[int, ...]) -> np.ndarray:
  if kind == 'transpose':
    return array.T if array.ndim == 2 else array
  if kind == 'reshape' and array.size == int(np.prod(shape)):
    return array.reshape(shape)
  return array


def _invert(convert: Any, array: np.ndarray, torch_shape: tuple[int, ...]) -> np.ndarray:
  """The torch tensor `t` of shape `torch_shape` with `convert(t) == array`, for a `convert`
  that permutes (and reshapes) its input's elements: read off where each element goes."""
  where = np.asarray(convert(np.arange(int(np.prod(torch_shape))).reshape(torch_shape)))
  out = np.empty(int(np.prod(torch_shape)), array.dtype)
  out[where.reshape(-1)] = np.asarray(array).reshape(-1)
  return out.reshape(torch_shape)


def _to_torch(array: np.ndarray, kind: str, torch_shape: tuple[int, ...]) -> np.ndarray:
  if kind == 'transpose':
    return array.T
  if kind == 'reshape':
    return array.reshape(torch_shape)
  return array


def _fmt(path: tuple[str, ...]) -> str:
  return '/'.join(path)


def official_format(model_name: str) -> OfficialCheckpoint:
  """The official-checkpoint description of a registered model; errors for models without."""
  spec = registry.get_spec(model_name)
  if spec.official is None:
    raise ValueError(f'{model_name} has no official PyTorch checkpoint format; convertible '
                     f'models: {convertible_models()}')
  return spec.official


def convertible_models() -> list[str]:
  """Registered models that read official PyTorch checkpoints."""
  return [n for n in registry.names() if registry.get_spec(n).official is not None]


def infer_model_config(state_dict: dict[str, np.ndarray],
                       model_name: str) -> ml_collections.ConfigDict:
  """A `config.model` with the dims an official state_dict determines (the model's defaults
  for the rest)."""
  fields = official_format(model_name).infer_config(torch_file.strip_module_prefix(state_dict))
  return ml_collections.ConfigDict({'name': model_name, **fields})


def torch_to_params(state_dict: dict[str, np.ndarray], model_name: str,
                    config_model: Any = None, source: str | None = None) -> dict[str, Any]:
  """Official state_dict (torch names -> arrays) -> our params tree.

  Every tensor is used exactly once (but the format's `ignored` names) and every shape is
  checked against `jax.eval_shape` of our model's init for `config_model` (default:
  `infer_model_config`). Raises one ValueError listing all missing, unused and mis-shaped
  keys, ending with `source` (the file) when given.
  """
  state_dict = torch_file.strip_module_prefix(dict(state_dict))
  if config_model is None:
    config_model = infer_model_config(state_dict, model_name)
  config_model = ml_collections.ConfigDict(
      config_model.to_dict() if isinstance(config_model, ml_collections.ConfigDict)
      else dict(config_model))
  if config_model.get('name', model_name) != model_name:
    raise ValueError(f'config_model.name {config_model.name!r} != model_name {model_name!r}')
  config_model.name = model_name
  shapes = registry.get_spec(model_name).param_shapes(config_model)
  expected = _flatten(shapes)
  leaves = official_format(model_name).names(shapes)

  flat, missing, misshaped, used = {}, [], [], set()
  for leaf in leaves:
    want = expected.get(leaf.path)
    if want is None:
      missing.append(f'our {_fmt(leaf.path)} (for torch {leaf.names[0]}) is not a parameter '
                     f'of {model_name} with this config_model')
      continue
    want_shape = tuple(want.shape[1:] if leaf.stacked else want.shape)
    arrays = []
    for name in leaf.names:
      if name not in state_dict:
        missing.append(f'{name} (-> {_fmt(leaf.path)}, expected shape {want_shape})')
        continue
      used.add(name)
      array = np.asarray(state_dict[name])
      if leaf.kind == 'convert':
        if tuple(array.shape) != leaf.torch_shape:
          misshaped.append(f'{name} {tuple(array.shape)} -> {_fmt(leaf.path)} expects torch '
                           f'shape {leaf.torch_shape}')
          continue
        array = np.asarray(leaf.convert(array))
      else:
        array = _to_ours(array, leaf.kind, want_shape)
      if tuple(array.shape) != want_shape:
        misshaped.append(f'{name} {tuple(np.shape(state_dict[name]))} -> {_fmt(leaf.path)} '
                         f'expects {want_shape}' + (' per branch' if leaf.stacked else ''))
        continue
      arrays.append(array.astype(want.dtype))
    if len(arrays) == len(leaf.names):
      flat[leaf.path] = np.stack(arrays) if leaf.stacked else arrays[0]
  ignored = set(official_format(model_name).ignored)
  unused = [f'{k} {tuple(np.shape(v))}' for k, v in state_dict.items()
            if k not in used and k not in ignored]
  unmapped = [f'{_fmt(p)} {tuple(s.shape)}' for p, s in expected.items()
              if p not in {leaf.path for leaf in leaves}]
  problems = [(title, items) for title, items in (
      ('missing torch keys', missing), ('unused torch keys', unused),
      ('mis-shaped torch keys', misshaped),
      (f'parameters of our {model_name} without an official counterpart', unmapped)) if items]
  if problems:
    raise ValueError(f'cannot convert the state_dict to {model_name} params:\n' + '\n'.join(
        f'  {title} ({len(items)}):\n' + files.listing(items, indent='    ', line_chars=120)
        for title, items in problems) + (f'\n  in {source}' if source else ''))
  return traverse_util.unflatten_dict(flat)


def params_to_torch(params: Any, model_name: str) -> dict[str, np.ndarray]:
  """Our params tree -> official state_dict (torch names -> numpy arrays, torch layouts)."""
  flat = {path: np.asarray(leaf) for path, leaf in _flatten(params).items()}
  leaves = official_format(model_name).names(params)
  known = {leaf.path for leaf in leaves}
  if set(flat) != known:
    raise ValueError(
        f'params do not match the official {model_name}: missing '
        f'{sorted(_fmt(p) for p in known - set(flat))}, '
        f'without an official counterpart {sorted(_fmt(p) for p in set(flat) - known)}')
  out = {}
  for leaf in leaves:
    array = flat[leaf.path]
    parts = list(array) if leaf.stacked else [array]
    torch_shape = (1, 1) + array.shape if leaf.kind == 'reshape' else None
    for name, part in zip(leaf.names, parts, strict=True):
      if leaf.kind == 'convert':
        out[name] = _invert(leaf.convert, part, leaf.torch_shape)
        continue
      out[name] = np.array(_to_torch(part, leaf.kind, torch_shape), order='C')  # 0-d stays 0-d
  return out


def torch_names(params: Any, model_name: str) -> Any:
  """Pytree like `params` of the official name of each leaf.

  Stacked branch leaves stand for `attn0..attnK-1` and are named with `attn*`, e.g.
  'clip_encoder.attn*.self.query.weight'. Leaves with no official counterpart (ablation
  options such as the `weighted` aggregation's `branch_logits`) keep their own path joined
  with dots.
  """
  names = {leaf.path: (re.sub(r'attn0\.', 'attn*.', leaf.names[0], count=1) if leaf.stacked
                       else leaf.names[0]) for leaf in official_format(model_name).names(params)}

  def name_of(path, _):
    key = tuple(str(getattr(k, 'key', k)) for k in path)
    return names.get(key, '.'.join(key))
  return jax.tree_util.tree_map_with_path(name_of, params)


def check_output(out: str, inputs: dict[str, str], overwrite: bool) -> None:
  """Refuses an output path `out` that is one of `inputs` (flag -> path; the same file by any
  path, symbolic or hard link), or that exists when not `overwrite` (or is a folder)."""
  if not os.path.basename(out):
    raise ValueError(f'--out={out!r} names no file; name the output file')
  for flag, path in inputs.items():
    same = os.path.realpath(out) == os.path.realpath(path)
    if not same and os.path.exists(out) and os.path.exists(path):
      same = os.path.samefile(out, path)
    if same:
      raise ValueError(f'--out={out} is the input file {flag}={path}; refusing to replace '
                       'what is being converted: choose another --out')
  if os.path.isdir(out):
    raise ValueError(f'--out={out} is a folder; name the output file')
  if os.path.lexists(out) and not overwrite:
    raise ValueError(f'--out={out} already exists; refusing to replace it (pass --overwrite '
                     'to replace it, or choose another --out)')


def checkpoint_to_params_file(checkpoint: str, model_name: str, out: str,
                              overwrite: bool = False) -> Any:
  """Converts an official checkpoint (or state_dict file) to a flax msgpack of `model_name`'s
  params at `out` (written atomically) and returns the params. Tensors holding NaN or inf
  values are refused, naming the first. `out` must not be the checkpoint, nor exist unless
  `overwrite` (`check_output`)."""
  check_output(out, {'--checkpoint': checkpoint}, overwrite)
  state_dict = torch_file.load_torch_checkpoint(checkpoint)
  bad = [k for k, v in state_dict.items() if not np.isfinite(v).all()]
  if bad:
    raise ValueError(f'{checkpoint}: {len(bad)} tensor(s) hold NaN or inf values '
                     f'(first: {short(bad[0], quote=False)}); refusing to convert them')
  params = torch_to_params(state_dict, model_name, source=checkpoint)
  files.write_atomic(out, lambda f: f.write(serialization.msgpack_serialize(params)))
  return params


def read_params_file(params_file: str) -> Any:
  """The params tree of a flax msgpack file (of the params, or of `{'params': ...}`), every
  leaf finite. msgpack (as flax reads it) admits no declared length beyond the data's size and
  an array's shape must match its bytes, so what is allocated is a small multiple of the
  file's size, whatever it declares. Raises `ValueError` naming the file (and parameter)."""
  with open(params_file, 'rb') as f:
    data = f.read()
  try:
    params = serialization.msgpack_restore(data)
  except Exception as e:  # pylint: disable=broad-except  (msgpack's and numpy's own errors)
    raise ValueError(f'--params={params_file} is not a flax msgpack file ({type(e).__name__}: '
                     f'{short(str(e), quote=False)})') from None
  if isinstance(params, dict) and isinstance(params.get('params'), dict):
    params = params['params']
  leaves = jax.tree_util.tree_leaves_with_path(params) if isinstance(params, dict) else []
  floating = lambda v: jax.numpy.issubdtype(v.dtype, jax.numpy.inexact)  # bfloat16 included
  if not leaves or not all(isinstance(v, (np.ndarray, np.generic))
                           and (v.dtype.kind in 'iub' or floating(v)) for _, v in leaves):
    raise ValueError(f'--params={params_file} holds no tree of numeric arrays (flax params)')
  bad = [(_fmt(tuple(str(getattr(k, 'key', k)) for k in path)), v) for path, v in leaves
         if floating(v) and not np.isfinite(v).all()]
  if bad:
    name, value = bad[0]
    raise ValueError(f'--params={params_file}: {len(bad)} parameter(s) hold NaN or inf values '
                     f'(first: {short(name, quote=False)}, '
                     f'{value.size - int(np.count_nonzero(np.isfinite(value)))} values); '
                     'refusing to export them')
  return params


def params_file_to_torch(params_file: str, model_name: str, out: str,
                         overwrite: bool = False) -> dict[str, np.ndarray]:
  """Exports a flax msgpack of `model_name`'s params (or of `{'params': ...}`) to the official
  names and layouts at `out`: an `.npz` of numpy arrays, any other name a `torch.save` file
  (which needs torch). Returns the state_dict written. `out` must not be the params file, nor
  exist unless `overwrite` (`check_output`); non-finite params are refused."""
  check_output(out, {'--params': params_file}, overwrite)
  if not out.endswith('.npz') and not torch_file.torch_available():
    raise ValueError(f'--out={out}: writing a torch file needs torch installed; write an '
                     '.npz instead')
  params = read_params_file(params_file)
  state_dict = params_to_torch(params, model_name)
  if out.endswith('.npz'):
    files.write_atomic(out, lambda f: np.savez(f, **state_dict))
  else:
    import torch  # pylint: disable=g-import-not-at-top
    tensors = collections.OrderedDict((k, torch.from_numpy(v)) for k, v in state_dict.items())
    files.write_atomic(out, lambda f: torch.save(tensors, f))
  return state_dict


if __name__ == '__main__':
  # Run as a program, this library module would exit 0 having converted nothing; it points to
  # the command instead (importing it here would make the library depend on its command).
  sys.exit('prvr_jax.convert is the library, not the command; nothing was converted. Run '
           f'`python -m prvr_jax.tools.convert {" ".join(sys.argv[1:])}` (or prvr-convert ...)')
