r"""The authors' official PyTorch training step, built from a checkout outside this repo.

  step, info = make_step('gmmformer_v2', '/src/GMMFormer_v2', config, batch, epoch=0)
  loss = step()   # one official update on `batch`

`benchmarks/train_step.py --official=PATH` times `step` beside our jitted step on the same
batch. Nothing of the official code lives here: it is imported at runtime from PATH, the root
of a plain checkout of the repo in `OFFICIAL_REPOS` (`git archive HEAD | tar -x`), and this
module only adds glue: runtime shims, the config mapping and the batch conversion. torch is
imported inside `make_step` only.

What `step()` runs, as each official training loop does per batch (progress bars, loss
meters and log writes left out):

* GMMFormer, GMMFormer v2, AMDNet, HLFormer, RAL, Holmes (`src/`), DreamPRVR
  (`train_one_epoch` of src/main.py, AMDNet main.py): the loss's `use_hard_negative` flag set
  from the official `hard_negative_start_epoch` on (AMDNet's loss never reads it; Holmes's also
  `warmup_end` from `warmup_epoch` on), `model.train()`, `zero_grad`, the forward on the batch
  dict, the official criterion (`Losses.builder.get_losses`; RAL's returns the loss with a
  dict of its terms, DreamPRVR's with its diffusion term for the log: the loss is taken),
  `backward`, the step of the
  optimiser from `Opts.builder.get_opts` (BertAdam, warmup_linear; it clips each parameter
  tensor's gradient to norm 1 itself, the loop adds no clipping).
* MS-SL (method/train.py `train_epoch`): `model.set_hard_negative(True, hard_pool_size)` from
  `hard_negative_start_epoch` on, `model.train()`, the forward (which builds the loss),
  `zero_grad`, `backward`, no global clipping (`--grad_clip` -1), and method/optimization.py's
  BertAdam over the two parameter groups method/train.py `train` builds (decay 0.01 except
  names containing "bias", "LayerNorm.bias" or "LayerNorm.weight"). The official `train` runs
  every epoch in `torch.autograd.detect_anomaly()`, and so does `step()` unless
  `detect_anomaly=False` (`info['detect_anomaly']`).
* T-MASS (its head on precomputed CLIP features): the official `Trainer._train_epoch`
  (trainer/trainer_stochastic.py) on a one-batch loader: forward, CLIP loss plus the
  support-text loss times `support_loss_weight`, backward, global-norm clipping to 1, the HF
  AdamW of modules/optimization.py over train.py's groups ("clip." parameters at `clip_lr`,
  the rest at `noclip_lr`), the cosine schedule's step, `zero_grad`, the logit-scale clamp.

The batch (our batch contract, all items valid) becomes what the official loader returns for
those videos and captions. MS-SL lineage and AMDNet (`collate_train`): videos sorted by frame
count, longest first (the sort key is the length of the frame features; stable), clips
`[B, 32, Dv]`, frames and `videos_mask` padded to the longest video, each video's captions in
batch order, `text_feat` / `text_mask` padded to the longest caption (AMDNet: sentence
vectors `[Q, Dq]`, `text_mask` None), `text_labels` the list of video positions. T-MASS: one
(caption, video) pair per caption, the video's `clip_feats` `[F, D]` repeated per pair.

Runtime shims (no file under PATH is edited):

* The official source dir goes first on `sys.path` (GMMFormer, v2: `src/`; the others: the
  root); modules of the same top-level names loaded from elsewhere are dropped first.
* `ipdb`, `seaborn`, `matplotlib`, `matplotlib.pyplot`: imported, never used on these paths;
  empty modules when not installed. T-MASS's `ujson` is the standard `json` when missing.
  HLFormer's Lorentz layers import `geoopt` (not in its requirements.txt; 0.5.1 runs it; not
  stubbed: its Lorentz manifold runs in the step) and the GMM-lineage builders `easydict`:
  both must be importable.
* CPU-only torch: `Tensor.cuda` and `Module.cuda` become the identity (the GMMFormer windows,
  the query-diversity loss of HLFormer, RAL, Holmes and DreamPRVR, their windows, and AMDNet's
  `mask_div` call `.cuda()` in the step). With CUDA the code runs as released, on the GPU
  (model and batch moved with `.cuda()`, as the official mains do; T-MASS's trainer moves them
  itself).
* `Configs/tvr.py` creates its result folders on import (GMMFormer's under the absolute
  `/data1/...`, HLFormer's and DreamPRVR's `/data2/...`): it is imported in a throwaway cwd with
  `os.makedirs` a no-op, and its `cfg` dict copied (`get_cfg_defaults`, which writes a yaml,
  is not called).
* MS-SL: `MS_SL_Net.forward` passes a `cross` keyword that `get_pred_from_raw_query` does not
  take (TypeError as released): the method is wrapped to drop it (it is read nowhere). The
  options are do_tvr.sh's: method/config.py's parser (`BaseOptions().initialize()`; `parse`,
  which creates folders, is not called) given `--q_feat_size 768 --margin 0.1`.
* AMDNet, the four repairs of its release as patches: (1) `Models/gmmformer/model.py` imports
  a `NeXtVLAD` that `model_components_new` does not define: a placeholder class of that name
  is put into the components module first; (2) `GMMBlock.forward` calls a
  `generate_gauss_weight` method on `gauss_center` / `gauss_width` attributes, none of which
  exist, and drops the results: `GMMBlock` gets the method (returning three Nones) and the two
  attributes (None); (3) `mask_div`'s `.cuda()` is the identity above; (4) the validation fix
  is not needed for training.
* T-MASS: the options are config/all_config.py's parser (`AllConfig()` under a patched argv
  with the README's MSRVTT-9k `--arch=clip_stochastic --noclip_lr=3e-5`, a fixed `--datetime`,
  which skips its random sleep, and output folders in a throwaway dir). `CLIPStochastic`
  imports `transformers.CLIPModel` in its constructor: a stand-in module is in `sys.modules`
  for that call only, whose CLIP returns the batch's caption and frame features and holds
  CLIP's trained logit scale (ln 100); the pixel input is a `[pairs * F, 3, 1, 1]`
  placeholder (`input_res` 1). `gen_log` (a file and console log per step) is a no-op, and
  `skip_eval` is set (a one-batch loader makes every step an evaluation step).
* `get_opts` / the schedules take the loader only for its length (times the epochs): a sized
  placeholder of `_STEPS_PER_EPOCH` batches (the lr value does not change the cost).

The config: our `config.model` fields map onto the official ones (dims, heads, lengths,
dropouts, the `sft_factor` of v2 and its successors, HLFormer's Lorentz width, attention
count and curvature, DreamPRVR's registers, branches, timesteps and denoiser depth, T-MASS's
width, frames, heads, dropout and prior;
`visual_feat_dim`, which the official code reads off the features); given the full config,
`loss` and `optim` map too (loss weights, margin, hard-negative epoch and pool, lr, warmup;
Holmes also its EDL temperatures, transport scale and bucket ratio, warm-up epoch and label
betas; DreamPRVR its QSP temperature; T-MASS also the support weight, weight decay and CLIP
lr). A field without an official
counterpart must hold the value the official code hard-codes (e.g. the window widths, MS-SL's
NCE weights, AMDNet's relevance weight, RAL's sample count and MIL / KL weights, Holmes's 50
Sinkhorn iterations, DreamPRVR's cosine schedule and perturbation scale, the 0.01 weight
decay of the BertAdam groups, no text mass, no probabilistic plug-in outside RAL), else
`make_step` raises; fields the
training step never reads are listed in `_IGNORED`.
"""

from collections.abc import Callable, Mapping
import contextlib
import copy
import functools
import importlib
import importlib.util
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import types
from typing import Any
from unittest import mock

import numpy as np

OFFICIAL_REPOS: dict[str, str] = {
    'gmmformer': 'huangmozhi9527/GMMFormer',
    'gmmformer_v2': 'huangmozhi9527/GMMFormer_v2',
    'ms_sl': 'HuiGuanLab/ms-sl',
    'amdnet': 'songpipi/AMDNet',
    'tmass': 'Jiamian-Wang/T-MASS-text-video-retrieval',
    'hlformer': 'lijun2005/ICCV25-HLFormer',
    'ral': 'zhanglong-ustc/RAL-PRVR',
    'holmes': 'lijun2005/ICML26-Holmes',
    'dreamprvr': 'lijun2005/CVPR26-DreamPRVR',
}

_GMM_PACKAGES = ('Configs', 'Datasets', 'Losses', 'Models', 'Opts', 'Utils', 'Validations')
# name -> (source dir under PATH, files that identify the repo, its top-level packages).
_LAYOUT: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    'gmmformer': ('src', ('src/main.py', 'src/Models/gmmformer/model.py',
                          'src/Configs/tvr.py'), _GMM_PACKAGES),
    'gmmformer_v2': ('src', ('src/main.py', 'src/Models/gmmformerV2/model.py',
                             'src/Configs/tvr.py'), _GMM_PACKAGES),
    'ms_sl': ('', ('method/model.py', 'method/optimization.py', 'method/config.py'),
              ('method', 'utils')),
    'amdnet': ('', ('main.py', 'Models/gmmformer/model_components_new.py', 'Configs/tvr.py'),
               _GMM_PACKAGES),
    'tmass': ('', ('model/clip_stochastic.py', 'trainer/trainer_stochastic.py',
                   'config/all_config.py'), ('config', 'model', 'modules', 'trainer')),
    'hlformer': ('src', ('src/main.py', 'src/Models/HLFormer/model.py',
                         'src/Models/onmt/lorentz.py', 'src/Configs/tvr.py'), _GMM_PACKAGES),
    'ral': ('src', ('src/main.py', 'src/Models/RAL4gmmv2/model.py', 'src/Configs/tvr.py'),
            _GMM_PACKAGES),
    # Holmes's `src/` variant (its `multisrc/` dual-query variant is not ours).
    'holmes': ('src', ('src/main.py', 'src/Models/holmes/model.py', 'src/Losses/partialot.py',
                       'src/Configs/tvr.py'), _GMM_PACKAGES),
    'dreamprvr': ('src', ('src/main.py', 'src/Models/DreamPRVR/model.py',
                          'src/Models/DreamPRVR/diffusion_model.py', 'src/Configs/tvr.py'),
                  _GMM_PACKAGES),
}

# Flags of the official criterion's `cfg` that its training loop sets every epoch: the flag ->
# the cfg key of the epoch it turns on at (`use_hard_negative` for every GMM-lineage loop,
# Holmes's `warmup_end` too).
_EPOCH_FLAGS: dict[str, dict[str, str]] = {
    'holmes': {'use_hard_negative': 'hard_negative_start_epoch',
               'warmup_end': 'warmup_epoch'},
}
_DEFAULT_EPOCH_FLAGS = {'use_hard_negative': 'hard_negative_start_epoch'}

_STEPS_PER_EPOCH = 100

# Our 'section.key' -> the official cfg key, or (key, index) of an entry of a list value.
_GMM_DIMS = {
    'model.visual_dim': 'visual_feat_dim', 'model.query_dim': 'q_feat_size',
    'model.hidden_dim': 'hidden_size', 'model.num_heads': 'n_heads',
    'model.max_query_len': 'max_desc_l', 'model.max_frames': 'max_ctx_l',
    'model.num_clips': 'map_size', 'model.dropout': 'drop', 'model.input_dropout': 'input_drop',
    'optim.lr': 'lr', 'optim.warmup_proportion': 'lr_warmup_proportion',
}
_GMM_LOSS = {
    'model.clip_score_weight': 'clip_scale_w', 'model.frame_score_weight': 'frame_scale_w',
    'loss.margin': 'margin', 'loss.hard_pool_size': 'hard_pool_size',
    'loss.hard_negative_start_epoch': 'hard_negative_start_epoch',
    'loss.clip_nce': ('loss_factor', 0), 'loss.frame_nce': ('loss_factor', 1),
    'loss.qdl': ('loss_factor', 2), 'loss.qdl_delta': ('neg_factor', 0),
    'loss.qdl_alpha': ('neg_factor', 1),
}
_V2_KEYS = {**_GMM_DIMS, **_GMM_LOSS, 'model.temperature': 'sft_factor',
            'loss.om': ('loss_factor', 3), 'loss.qdl_gamma': ('neg_factor', 2)}
_KEYS: dict[str, dict[str, Any]] = {
    'gmmformer': {**_GMM_DIMS, **_GMM_LOSS},
    'gmmformer_v2': _V2_KEYS,
    'ral': _V2_KEYS,
    # Holmes's loss_factor [clip NCE, frame NCE, QDL, intra-video EDL, EDL, unused].
    'holmes': {**_GMM_DIMS, **_GMM_LOSS, 'model.temperature': 'sft_factor',
               'loss.qdl_gamma': ('neg_factor', 2), 'loss.intra_edl': ('loss_factor', 3),
               'loss.edl': ('loss_factor', 4), 'loss.edl_tau': 'edl_tau',
               'loss.edl_intra_tau': 'edl_intra_video_tau', 'loss.pot_epsilon': 'pot_scale',
               'loss.pot_bucket_quantile': 'pot_prompt_ratio',
               'loss.warmup_epoch': 'warmup_epoch', 'loss.division_beta': 'division_beta',
               'loss.smooth_beta': 'smooth_beta'},
    # DreamPRVR's loss_factor [clip NCE, frame NCE, QDL, QSP, KL, DRE].
    'dreamprvr': {**_GMM_DIMS, **_GMM_LOSS, 'model.temperature': 'sft_factor',
                  'loss.qdl_gamma': ('neg_factor', 2), 'loss.qsp': ('loss_factor', 3),
                  'loss.kl': ('loss_factor', 4), 'loss.dre': ('loss_factor', 5),
                  'loss.qsp_temperature': 'deterministic_tau',
                  'model.num_registers': 'num_registers', 'model.timesteps': 'timesteps',
                  'model.num_diffusion_layers': 'num_diffusion_layers',
                  'model.attention_num': 'attention_num'},
    'hlformer': {**_GMM_DIMS, **_GMM_LOSS, 'model.temperature': 'sft_factor',
                 'loss.partial_order': ('loss_factor', 3), 'loss.qdl_gamma': ('neg_factor', 2),
                 'model.lorentz_dim': 'lorentz_dim', 'model.attention_num': 'attention_num',
                 'model.curv_init': 'curv_init', 'model.learn_curv': 'learn_curv_bool'},
    # MS-SL: attributes of the method/config.py options.
    'ms_sl': {**_GMM_DIMS, 'model.clip_score_weight': 'clip_scale_w',
              'model.frame_score_weight': 'frame_scale_w', 'loss.margin': 'margin',
              'loss.hard_pool_size': 'hard_pool_size',
              'loss.hard_negative_start_epoch': 'hard_negative_start_epoch'},
    'amdnet': {'model.visual_dim': 'visual_feat_dim', 'model.query_dim': 'q_feat_size',
               'model.hidden_dim': 'hidden_size', 'model.num_heads': 'n_heads',
               'model.num_spans': 'event_size', 'model.max_frames': 'max_ctx_l',
               'model.num_clips': 'map_size', 'model.dropout': 'drop',
               'model.input_dropout': 'input_drop', 'optim.lr': 'lr',
               'optim.warmup_proportion': 'lr_warmup_proportion',
               'loss.clip_nce': ('loss_factor', 0),
               'loss.moment_diversity': ('loss_factor', 1)},
    # T-MASS: attributes of the config/all_config.py options.
    'tmass': {'model.hidden_dim': 'embed_dim', 'model.num_frames': 'num_frames',
              'model.num_heads': 'num_mha_heads', 'model.dropout': 'transformer_dropout',
              'model.stochastic_prior': 'stochastic_prior',
              'model.stochastic_std': 'stochastic_prior_std',
              'model.num_samples': 'stochasic_trials', 'loss.support': 'support_loss_weight',
              'optim.lr': 'noclip_lr', 'optim.backbone_lr': 'clip_lr',
              'optim.weight_decay': 'weight_decay',
              'optim.warmup_proportion': 'warmup_proportion'},
}

# Values the official code hard-codes (no counterpart in its config). The optimisers' parameter
# groups fix the weight decay at 0.01 (the config's `wd` is overridden by them).
_NO_TEXT_MASS = {'model.stochastic_text': False, 'loss.stochastic_support': 0.0}
# RAL's probabilistic plug-in, off in every other official model (its settings are then read
# by nothing: `_PROBABILISTIC` in `_IGNORED`).
_NO_PLUGIN = {'model.probabilistic': False}
_BERT_ADAM = {'optim.name': 'bert_adam', 'optim.schedule': 'warmup_linear',
              'optim.max_grad_norm': 1.0, 'optim.weight_decay': 0.01}
_V2_FIXED = {**_NO_TEXT_MASS, **_BERT_ADAM, 'model.window': 'gaussian',
             'model.widths': (None, 0.5, 1.0, 5.0, 10.0, 3.0, 0.1, 8.0),
             'model.aggregation': 'temporal_consolidation', 'model.num_clips': 32,
             'model.max_frames': 128}
_FIXED: dict[str, dict[str, Any]] = {
    'gmmformer': {**_NO_TEXT_MASS, **_NO_PLUGIN, **_BERT_ADAM, 'model.window': 'gaussian',
                  'model.widths': (None, 0.5, 1.0, 5.0), 'model.aggregation': 'average',
                  'model.temperature': 1.0, 'model.frame_window_length': 'batch_max'},
    # DyGMMBlock hard-codes 32 clips and 128 frames (`frame_len`), encode_context pads to 128.
    'gmmformer_v2': {**_V2_FIXED, **_NO_PLUGIN},
    # RAL4GMMV2_Net: v2's blocks, 6 samples per distribution, 26 support slots per token;
    # Losses/loss.py weighs the MIL and KL terms 4e-3 and 2.5e-4.
    'ral': {**_V2_FIXED, 'model.num_samples': 6, 'model.support_slots': 26,
            'loss.proxy_matching': 4e-3, 'loss.distribution_alignment': 2.5e-4},
    # HLFormer's blocks hard-code 32 clips and 128 frames (`frame_len`, encode_context pads);
    # its loss has no OT term.
    'hlformer': {**_NO_TEXT_MASS, **_NO_PLUGIN, **_BERT_ADAM, 'model.num_clips': 32,
                 'model.max_frames': 128, 'loss.om': 0.0},
    # Holmes_Net's DyGMMBlocks: windows None, 2^-1..2^5 mixed from their mean token, 32 clips
    # and 128 frames (`frame_len`); POT / BatchPOT run 50 Sinkhorn iterations, no tolerance.
    'holmes': {**_NO_TEXT_MASS, **_NO_PLUGIN, **_BERT_ADAM, 'model.window': 'gaussian',
               'model.widths': (None, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0),
               'model.aggregation': 'mean_consolidation', 'model.num_clips': 32,
               'model.max_frames': 128, 'loss.om': 0.0, 'loss.pot_iterations': 50,
               'loss.pot_tolerance': 0.0},
    # DreamPRVR_Net: 32 clips and 128 frames (`frame_len`), GaussianDiffusion's cosine
    # schedule and x_0 clamp to [-1, 1], TextSampler's 0.1 perturbation, the time table
    # re-drawn N(0, 0.02) by `reset_parameters`.
    'dreamprvr': {**_NO_TEXT_MASS, **_NO_PLUGIN, **_BERT_ADAM, 'model.num_clips': 32,
                  'model.max_frames': 128, 'model.beta_schedule': 'cosine',
                  'model.clip_denoised': 1.0, 'model.perturbation_scale': 0.1,
                  'model.time_table': 'normal', 'loss.om': 0.0},
    'ms_sl': {**_NO_TEXT_MASS, **_NO_PLUGIN, **_BERT_ADAM, 'loss.clip_nce': 0.02,
              'loss.frame_nce': 0.04, 'loss.qdl': 0.0, 'loss.om': 0.0},
    'amdnet': {**_BERT_ADAM, 'model.max_query_len': 1, 'loss.moment_diversity_alpha': 0.15,
               'loss.moment_relevance': 25.0, 'loss.moment_relevance_margin': 0.02,
               'loss.qdl': 0.0, 'loss.om': 0.0},
    # The head on precomputed CLIP features (no backbone), one feature per caption.
    'tmass': {'model.backbone': '', 'model.max_query_len': 1, 'loss.text_ce': 0.0,
              'optim.name': 'hf_adamw', 'optim.schedule': 'warmup_cosine',
              'optim.max_grad_norm': 1.0},
}

# Fields the training step does not read (evaluation only, or settings of a term that is off).
_STOCHASTIC = ('model.stochastic_samples', 'model.stochastic_top_k', 'model.stochastic_prior',
               'model.stochastic_std')
_PROBABILISTIC = ('model.num_samples', 'model.support_slots', 'loss.proxy_matching',
                  'loss.distribution_alignment')
_IGNORED: dict[str, tuple[str, ...]] = {
    'gmmformer': ('model.name', 'optim.backbone_lr') + _STOCHASTIC + _PROBABILISTIC,
    # Either solver finds scipy's assignment (tests/losses/test_matching.py).
    'gmmformer_v2': ('model.name', 'optim.backbone_lr', 'loss.om_solver') + _STOCHASTIC
                    + _PROBABILISTIC,
    'ral': ('model.name', 'optim.backbone_lr', 'loss.om_solver') + _STOCHASTIC,
    'hlformer': ('model.name', 'optim.backbone_lr') + _STOCHASTIC + _PROBABILISTIC,
    'holmes': ('model.name', 'optim.backbone_lr') + _STOCHASTIC + _PROBABILISTIC,
    'dreamprvr': ('model.name', 'optim.backbone_lr') + _STOCHASTIC + _PROBABILISTIC,
    'ms_sl': ('model.name', 'model.score_query_chunk', 'optim.backbone_lr', 'loss.qdl_delta',
              'loss.qdl_alpha', 'loss.qdl_gamma') + _STOCHASTIC + _PROBABILISTIC,
    'amdnet': ('model.name', 'optim.backbone_lr', 'loss.qdl_delta', 'loss.qdl_alpha',
               'loss.qdl_gamma'),
    # Checked against the feature width and the frame count in `_tmass`; `model.noise` is the
    # evaluation's noise (the training step draws its own).
    'tmass': ('model.name', 'model.clip_weights', 'model.visual_dim', 'model.query_dim',
              'model.num_clips', 'model.max_frames', 'model.noise'),
}


def _flat(config: Any) -> dict[str, Any]:
  """{'section.key': value} of our config: the full config, or its `model` section alone."""
  sections = {s: config[s] for s in ('model', 'loss', 'optim') if s in config}
  if 'model' not in sections:
    sections = {'model': config}
  return {f'{s}.{k}': v for s, fields in sections.items() for k, v in fields.items()}


def _same(a: Any, b: Any) -> bool:
  """Config values equal (numbers to 1e-9 relative, sequences element-wise)."""
  if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
    return (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b)
            and all(_same(x, y) for x, y in zip(a, b)))
  if isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or isinstance(b, str):
    return a == b
  if a is None or b is None:
    return a is b
  return bool(np.isclose(float(a), float(b), rtol=1e-9, atol=0.0))


def _map_config(name: str, config: Any, official: Any) -> None:
  """Writes our values into `official` (a dict or an options namespace), in place.

  Raises:
    ValueError: naming every field without an official counterpart that differs from the
      value the official code hard-codes, or that is unknown here.
  """
  flat = _flat(config)
  if flat.get('model.name', name) != name:
    raise ValueError(f'config.model.name is {flat["model.name"]!r}, not {name!r}')
  get = official.get if isinstance(official, dict) else functools.partial(getattr, official)
  problems = []
  for key, value in flat.items():
    if key in _FIXED[name]:
      if not _same(value, _FIXED[name][key]):
        problems.append(f'{key}={value!r}: the official code hard-codes {_FIXED[name][key]!r}')
      continue
    if key in _IGNORED[name]:
      continue
    target = _KEYS[name].get(key)
    if target is None:
      problems.append(f'{key}={value!r}: no official counterpart known')
    elif isinstance(target, tuple):
      values = list(get(target[0]))
      values[target[1]] = value
      _set(official, target[0], values)
    else:
      _set(official, target, value)
  if problems:
    raise ValueError(f'the official {OFFICIAL_REPOS[name]} code cannot take this config:\n  '
                     + '\n  '.join(problems))


def _set(official: Any, key: str, value: Any) -> None:
  if isinstance(official, dict):
    official[key] = value
  else:
    setattr(official, key, value)


def _check_checkout(name: str, path: str) -> str:
  """The official source dir under `path`, after checking `path` is the expected repo."""
  if name not in _LAYOUT:
    known = ', '.join(OFFICIAL_REPOS)
    raise ValueError(f'no official training step for model {name!r}; known: {known}')
  subdir, markers, _ = _LAYOUT[name]
  root = os.path.abspath(path)
  missing = [m for m in markers if not os.path.isfile(os.path.join(root, m))]
  if missing:
    raise ValueError(
        f'--official={path}: not a checkout of github.com/{OFFICIAL_REPOS[name]} (missing '
        f'{", ".join(missing)}); pass the root of a plain checkout of that repo')
  return os.path.join(root, subdir) if subdir else root


def _commit(path: str) -> str | None:
  """The commit of the checkout: PATH/COMMIT, else `git rev-parse HEAD` where a .git exists."""
  commit_file = os.path.join(path, 'COMMIT')
  if os.path.isfile(commit_file):
    with open(commit_file) as f:
      return f.read().strip() or None
  if not os.path.exists(os.path.join(path, '.git')):
    return None
  try:
    out = subprocess.run(['git', '-C', path, 'rev-parse', 'HEAD'], capture_output=True,
                         text=True, check=True, timeout=30)
  except (OSError, subprocess.SubprocessError):
    return None
  return out.stdout.strip() or None


def _import_torch():
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError('the official training step needs PyTorch (pip install torch) in the '
                      'Python that runs it') from e
  return torch


def _install_shims(torch, source: str, packages: tuple[str, ...]) -> None:
  """sys.path, stubs for unused imports, and `.cuda()` as the identity without CUDA."""
  for mod_name in list(sys.modules):
    if mod_name.split('.')[0] in packages:
      file = getattr(sys.modules[mod_name], '__file__', None) or ''
      if not os.path.abspath(file).startswith(source + os.sep):
        del sys.modules[mod_name]
  if source in sys.path:
    sys.path.remove(source)
  sys.path.insert(0, source)
  # Looked up before any stub goes in: find_spec refuses a stub (it has no __spec__).
  missing = {package for package in ('ipdb', 'seaborn', 'matplotlib')
             if package not in sys.modules and importlib.util.find_spec(package) is None}
  for mod_name in ('ipdb', 'seaborn', 'matplotlib', 'matplotlib.pyplot'):
    if mod_name.split('.')[0] in missing:
      sys.modules[mod_name] = types.ModuleType(mod_name)
  if isinstance(sys.modules.get('matplotlib'), types.ModuleType) and (
      'matplotlib.pyplot' in sys.modules):
    sys.modules['matplotlib'].pyplot = sys.modules['matplotlib.pyplot']
  if not torch.cuda.is_available():
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self


def _import_config(source: str) -> dict[str, Any]:
  """A copy of the official Configs/tvr.py `cfg` (imported with no folder created)."""
  cwd = os.getcwd()
  with tempfile.TemporaryDirectory() as tmp, mock.patch('os.makedirs'):
    os.chdir(tmp)
    try:
      module = importlib.import_module('Configs.tvr')
    finally:
      os.chdir(cwd)
  if not os.path.abspath(module.__file__).startswith(source + os.sep):
    raise ImportError(f'Configs.tvr came from {module.__file__}, not {source}')
  return copy.deepcopy(module.cfg)


def _collate(torch, batch: Mapping[str, np.ndarray], sentence: bool) -> dict[str, Any]:
  """The official `collate_train` output for the videos and captions of our `batch`."""
  for key in ('video_valid', 'query_valid'):
    if key in batch and not np.all(batch[key]):
      raise ValueError(f'batch[{key!r}] has invalid entries; the official step takes full '
                       'batches only')
  frame_lengths = np.asarray(batch['frame_mask']).sum(1).round().astype(int)
  query_lengths = np.asarray(batch['query_mask']).sum(1).round().astype(int)
  query_video = np.asarray(batch['query_video'])
  num_videos = len(frame_lengths)
  if np.any(frame_lengths < 1) or np.any(query_lengths < 1):
    raise ValueError('every video needs a frame and every query a token')
  # Stable descending sort on the frame count, as `data.sort(key=len(x[1]), reverse=True)`.
  order = sorted(range(num_videos), key=lambda v: frame_lengths[v], reverse=True)
  captions = [np.flatnonzero(query_video == v) for v in order]
  if any(len(c) == 0 for c in captions):
    raise ValueError('every video of the batch needs at least one caption')
  queries = np.concatenate(captions)
  labels = [i for i, c in enumerate(captions) for _ in c]

  clips = np.asarray(batch['clip_feats'], np.float32)[order]
  max_frames = frame_lengths.max()
  frames = np.zeros((num_videos, max_frames, clips.shape[-1]), np.float32)
  frame_mask = np.zeros((num_videos, max_frames), np.float32)
  for i, v in enumerate(order):
    frames[i, :frame_lengths[v]] = batch['frame_feats'][v, :frame_lengths[v]]
    frame_mask[i, :frame_lengths[v]] = 1.0
  query_feats = np.asarray(batch['query_feats'], np.float32)
  if sentence:
    text = query_feats[queries, 0]
    text_mask = None
  else:
    max_words = query_lengths.max()
    text = np.zeros((len(queries), max_words, query_feats.shape[-1]), np.float32)
    text_mask = np.zeros((len(queries), max_words), np.float32)
    for i, q in enumerate(queries):
      text[i, :query_lengths[q]] = query_feats[q, :query_lengths[q]]
      text_mask[i, :query_lengths[q]] = 1.0
    text_mask = torch.from_numpy(text_mask)
  return dict(clip_video_features=torch.from_numpy(clips),
              frame_video_features=torch.from_numpy(frames),
              videos_mask=torch.from_numpy(frame_mask), text_feat=torch.from_numpy(text),
              text_mask=text_mask, text_labels=labels)


def _to_device(torch, batch: dict[str, Any]) -> dict[str, Any]:
  if not torch.cuda.is_available():
    return batch
  return {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _gmm_family(torch, name: str, source: str, config: Any, batch: Mapping[str, np.ndarray],
                epoch: int) -> tuple[Callable[[], float], Any]:
  """GMMFormer, GMMFormer v2, AMDNet, HLFormer, RAL, Holmes and DreamPRVR: the builders of
  their src/main.py."""
  if name == 'hlformer' and importlib.util.find_spec('geoopt') is None:
    raise ImportError('the official HLFormer code imports geoopt (missing from its '
                      'requirements.txt; 0.5.1 runs it), which the Python that runs it lacks '
                      '(--official_python): pip install geoopt==0.5.1')
  cfg = _import_config(source)
  if name == 'amdnet':
    components = importlib.import_module('Models.gmmformer.model_components_new')
    if not hasattr(components, 'NeXtVLAD'):  # repair 1
      components.NeXtVLAD = type('NeXtVLAD', (torch.nn.Module,), {})
    block = components.GMMBlock
    if not hasattr(block, 'generate_gauss_weight'):  # repair 2
      block.generate_gauss_weight = lambda self, *args: (None, None, None)
      block.gauss_center = block.gauss_width = None
  _map_config(name, config, cfg)
  models = importlib.import_module('Models.builder')
  losses = importlib.import_module('Losses.builder')
  opts = importlib.import_module('Opts.builder')
  torch.manual_seed(cfg['seed'])
  model = models.get_models(cfg).cuda()
  criterion = losses.get_losses(cfg)
  optimizer = opts.get_opts(cfg, model, range(_STEPS_PER_EPOCH))
  official_batch = _to_device(torch, _collate(torch, batch, sentence=name == 'amdnet'))

  flags = _EPOCH_FLAGS.get(name, _DEFAULT_EPOCH_FLAGS)

  def step() -> float:
    for flag, start in flags.items():
      criterion.cfg[flag] = epoch >= cfg[start]
    model.train()
    optimizer.zero_grad()
    input_list = model(official_batch)
    loss = criterion(input_list, official_batch)
    if isinstance(loss, tuple):  # RAL's, DreamPRVR's criterion: (loss, what its loop logs)
      loss = loss[0]
    loss.backward()
    optimizer.step()
    return loss.cpu().item()

  return step, model


def _ms_sl(torch, config: Any, batch: Mapping[str, np.ndarray], epoch: int,
           detect_anomaly: bool) -> tuple[Callable[[], float], Any]:
  """MS-SL: the model config and optimiser of method/train.py `start_training` / `train`."""
  options = importlib.import_module('method.config').BaseOptions()
  options.initialize()
  opt = options.parser.parse_args(['--q_feat_size', '768', '--margin', '0.1'])  # do_tvr.sh
  _map_config('ms_sl', config, opt)
  net = importlib.import_module('method.model').MS_SL_Net
  if not getattr(net.get_pred_from_raw_query, '_drops_cross', False):
    original = net.get_pred_from_raw_query

    @functools.wraps(original)
    def drop_cross(self, *args, **kwargs):
      kwargs.pop('cross', None)
      return original(self, *args, **kwargs)

    drop_cross._drops_cross = True
    net.get_pred_from_raw_query = drop_cross
  easydict = importlib.import_module('easydict')
  model_config = easydict.EasyDict(
      visual_input_size=opt.visual_feat_dim, query_input_size=opt.q_feat_size,
      hidden_size=opt.hidden_size, max_ctx_l=opt.max_ctx_l, max_desc_l=opt.max_desc_l,
      map_size=opt.map_size, input_drop=opt.input_drop, device=opt.device_ids, drop=opt.drop,
      n_heads=opt.n_heads, initializer_range=opt.initializer_range, margin=opt.margin,
      use_hard_negative=False, hard_pool_size=opt.hard_pool_size)
  torch.manual_seed(opt.seed)
  model = net(model_config)
  if torch.cuda.is_available():
    model.cuda()
  no_decay = ('bias', 'LayerNorm.bias', 'LayerNorm.weight')
  named = list(model.named_parameters())
  groups = [
      {'params': [p for n, p in named if not any(s in n for s in no_decay)],
       'weight_decay': 0.01},
      {'params': [p for n, p in named if any(s in n for s in no_decay)], 'weight_decay': 0.0}]
  bert_adam = importlib.import_module('method.optimization').BertAdam
  optimizer = bert_adam(groups, lr=opt.lr, weight_decay=opt.wd,
                        warmup=opt.lr_warmup_proportion,
                        t_total=_STEPS_PER_EPOCH * opt.n_epoch, schedule='warmup_linear')
  b = _to_device(torch, _collate(torch, batch, sentence=False))
  if opt.hard_negative_start_epoch != -1 and epoch >= opt.hard_negative_start_epoch:
    model.set_hard_negative(True, opt.hard_pool_size)

  def step() -> float:
    with torch.autograd.set_detect_anomaly(detect_anomaly):
      model.train()
      loss, _ = model(b['clip_video_features'], b['frame_video_features'], b['videos_mask'],
                      b['text_feat'], b['text_mask'], b['text_labels'])
      optimizer.zero_grad()
      loss.backward()
      if opt.grad_clip != -1:
        torch.nn.utils.clip_grad_norm_(model.parameters(), opt.grad_clip)
      optimizer.step()
    return loss.cpu().item()

  return step, model


def _tmass(torch, config: Any, batch: Mapping[str, np.ndarray],
           epoch: int) -> tuple[Callable[[], float], Any]:
  """T-MASS's head on precomputed CLIP features, trained by the official `_train_epoch`."""
  if importlib.util.find_spec('ujson') is None:  # modules/basic_utils imports it for json
    sys.modules['ujson'] = json
  all_config = importlib.import_module('config.all_config')
  with tempfile.TemporaryDirectory() as tmp:
    argv = ['train.py', '--arch=clip_stochastic', '--exp_name=benchmark',
            '--datetime=benchmark', '--noclip_lr=3e-5', f'--output_dir={tmp}',
            f'--tb_log_dir={os.path.join(tmp, "tb")}']
    with mock.patch.object(sys, 'argv', argv), contextlib.redirect_stdout(io.StringIO()):
      cfg = all_config.AllConfig()
  _map_config('tmass', config, cfg)
  for key in ('video_valid', 'query_valid'):
    if key in batch and not np.all(batch[key]):
      raise ValueError(f'batch[{key!r}] has invalid entries; the official step takes full '
                       'batches only')
  # One (caption, video) pair per caption, as the official loader draws them.
  pair_video = np.asarray(batch['query_video'])
  frames = torch.from_numpy(np.asarray(batch['clip_feats'], np.float32)[pair_video])
  text = torch.from_numpy(np.asarray(batch['query_feats'], np.float32)[:, 0])
  if frames.shape[1:] != (cfg.num_frames, cfg.embed_dim) or text.shape[1] != cfg.embed_dim:
    raise ValueError(f'T-MASS pools {cfg.num_frames} frame features of CLIP width '
                     f'{cfg.embed_dim} (model.num_frames, model.hidden_dim); the batch has '
                     f'frames {tuple(frames.shape[1:])} and captions of width {text.shape[1]}')

  class FeatureCLIP(torch.nn.Module):
    """Stands in for transformers' CLIPModel: the batch's features, CLIP's logit scale."""

    def __init__(self):
      super().__init__()
      self.logit_scale = torch.nn.Parameter(torch.tensor(math.log(100.0)))
      self.register_buffer('frames', frames.reshape(-1, frames.shape[-1]), persistent=False)

    def get_text_features(self, features):
      return features

    def get_image_features(self, pixels):
      del pixels  # a [pairs * frames, 3, 1, 1] placeholder
      return self.frames

  fake = types.ModuleType('transformers')
  fake.CLIPModel = types.SimpleNamespace(from_pretrained=lambda name: FeatureCLIP())
  cfg.input_res = 1
  torch.manual_seed(cfg.seed)
  real = sys.modules.get('transformers')
  sys.modules['transformers'] = fake  # CLIPStochastic imports CLIPModel in its __init__
  try:
    model = importlib.import_module('model.model_factory').ModelFactory.get_model(cfg)
  finally:
    if real is None:
      del sys.modules['transformers']
    else:
      sys.modules['transformers'] = real
  named = list(model.named_parameters())
  groups = [{'params': [p for n, p in named if 'clip.' in n], 'lr': cfg.clip_lr},
            {'params': [p for n, p in named if 'clip.' not in n], 'lr': cfg.noclip_lr}]
  optimization = importlib.import_module('modules.optimization')
  optimizer = optimization.AdamW(groups, weight_decay=cfg.weight_decay)
  total = _STEPS_PER_EPOCH * cfg.num_epochs
  scheduler = optimization.get_cosine_schedule_with_warmup(
      optimizer, num_warmup_steps=int(cfg.warmup_proportion * total), num_training_steps=total)
  trainer_lib = importlib.import_module('trainer.trainer_stochastic')
  trainer_lib.gen_log = lambda *args, **kwargs: None
  cfg.skip_eval = True  # a one-batch loader makes every step an evaluation step
  data = {'text': {'features': text},
          'video': torch.zeros(len(pair_video), cfg.num_frames, 3, 1, 1)}
  trainer = trainer_lib.Trainer(
      model=model, loss=importlib.import_module('modules.loss').LossFactory.get_loss(cfg.loss),
      metrics=importlib.import_module('modules.metrics').t2v_metrics, optimizer=optimizer,
      config=cfg, train_data_loader=[data], valid_data_loader=None, tokenizer=None,
      lr_scheduler=scheduler)

  def step() -> float:
    return trainer._train_epoch(epoch + 1)['loss_train']  # pylint: disable=protected-access

  return step, model


def matmul_gflop(step: Callable[[], float]) -> float:
  """GFLOP of the matmuls (forward and backward) of one call of an official `step`, counted by
  torch's `FlopCounterMode` (matmuls, batched matmuls, convolutions, attention kernels)."""
  from torch.utils import flop_counter  # pylint: disable=g-import-not-at-top
  with flop_counter.FlopCounterMode(display=False) as counter:
    step()
  return counter.get_total_flops() / 1e9


def peak_device_mb() -> float | None:
  """torch's peak CUDA memory allocated in this process, in MB; None without CUDA."""
  torch = _import_torch()
  return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None


def make_step(name: str, path: str, config_model: Any, batch: dict[str, np.ndarray], *,
              epoch: int = 0, threads: int | None = None, detect_anomaly: bool = True
              ) -> tuple[Callable[[], float], dict[str, Any]]:
  """The official training step of model `name` on `batch`.

  Args:
    name: a key of `OFFICIAL_REPOS`.
    path: root of a plain checkout of `OFFICIAL_REPOS[name]`.
    config_model: our config's `model` section, or the whole config (then its `loss` and
      `optim` values map too; else the official TVR loss and optimiser settings hold).
    batch: our batch contract as numpy (clip_feats [B, Lc, Dv], frame_feats [B, Lf, Dv],
      frame_mask [B, Lf], query_feats [Q, Lq, Dq], query_mask [Q, Lq], query_video [Q]),
      every video and query valid.
    epoch: the epoch of the step (hard negatives from the official start epoch on).
    threads: torch CPU threads (default: all cores).
    detect_anomaly: MS-SL's step runs in autograd anomaly mode, as its released loop does
      (slower: it checks every backward op); False times it without. Other models never use it.

  Returns:
    (step, info): `step()` runs one official update (model.train(), zero_grad, forward, the
    official loss, backward, the official optimiser's step) and returns the loss; `info` holds
    'commit' (of PATH, or None), 'params' (official trainable parameters), 'torch' (version),
    'threads', 'device' ('cpu' or 'cuda') and 'detect_anomaly' (the step runs in anomaly mode,
    as MS-SL's loop does).
  """
  source = _check_checkout(name, path)
  torch = _import_torch()
  torch.set_num_threads(threads or os.cpu_count() or 1)
  _install_shims(torch, source, _LAYOUT[name][2])
  if name == 'ms_sl':
    step, model = _ms_sl(torch, config_model, batch, epoch, detect_anomaly)
  elif name == 'tmass':
    step, model = _tmass(torch, config_model, batch, epoch)
  else:
    step, model = _gmm_family(torch, name, source, config_model, batch, epoch)
  info = {'commit': _commit(os.path.abspath(path)),
          'params': sum(p.numel() for p in model.parameters() if p.requires_grad),
          'torch': torch.__version__, 'threads': torch.get_num_threads(),
          'device': 'cuda' if torch.cuda.is_available() else 'cpu',
          'detect_anomaly': name == 'ms_sl' and detect_anomaly}
  return step, info
