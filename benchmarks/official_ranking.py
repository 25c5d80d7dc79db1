r"""The official ranking path: how the authors' evaluation code answers text-to-video queries.

Written by us, in torch (CPU, float32) and numpy, following the *cost structure* of each
official evaluation; the *math* is ours (`module.apply(..., method='score')`), so the scores
equal our index's up to float32 rounding and the ranks differ only at genuine near-ties.
Nothing here is used by the package; benchmarks compare our retrieval index against it.

What the official evaluations do once the gallery is encoded (query encoding is left out on
both sides: `official_scores` takes the encoded queries):

* MS-SL (`HuiGuanLab/ms-sl`, method/eval.py `compute_query2ctx_info`, model.py
  `get_pred_from_raw_query`): per query batch of `eval_query_bsz`, the clip branch re-normalises
  the whole gallery's 528 multi-scale clips, builds the `[G, 528, b]` cosines and maxes them;
  the frame branch projects every gallery frame through the key and value Linear layers again
  (`key_clip_guided_attention_in_inference`: `[G, L, D]` twice per batch), gathers the key clip
  of each (video, query) pair, runs the masked softmax over the frames for `[G, L, b]` logits,
  attends, re-normalises and takes the cosine. The fused batches are concatenated, moved to
  numpy and negated; `eval_q2m` loops over the queries with a full `np.argsort` each.
  The released code needs its `cross=True` keyword dropped to run (docs/paper_vs_code.md);
  that is the only repair and the formula is ours.
* GMMFormer, GMMFormer v2 (`huangmozhi9527/GMMFormer[_v2]`, src/Validations/validations.py):
  per query batch, `get_clip_scale_scores` re-normalises the gallery's 32 clips (v2: also the
  128 zero-padded frames, through the same function) into `[G, L, b]` cosines, then max; v1's
  video branch re-normalises the `[G, D]` video vectors. Fused on the device, concatenated,
  negated; `eval_q2m` loops over the queries with `torch.argsort` + `torch.where` (on CUDA;
  `official_ranks_torch`).
* AMDNet (`songpipi/AMDNet`, Validations/validations.py): the clip branch of the GMMFormer
  code (it also keeps the `[b, 32, G]` clip cosines it returns), same ranking loop.
* HLFormer (`lijun2005/ICCV25-HLFormer`, src/Models/HLFormer/model.py
  `get_pred_from_raw_query`, src/Validations/validations.py): GMMFormer v2's structure,
  `get_clip_scale_scores` on the 32 clips and on the 128 frames (the hyperbolic branches only
  shape the stored vectors; scoring is Euclidean).
* Holmes (`lijun2005/ICML26-Holmes`, src/Models/holmes/model.py `get_pred_from_raw_query`,
  src/Validations/validations.py) and DreamPRVR (`lijun2005/CVPR26-DreamPRVR`,
  src/Models/DreamPRVR/model.py, src/Validations/validations.py): GMMFormer v2's structure,
  `get_clip_scale_scores` on the 32 clips and on the 128 frames (Holmes's transport and
  DreamPRVR's registers only shape the stored vectors).
* RAL (`zhanglong-ustc/RAL-PRVR`, src/Models/RAL4gmmv2/model.py `get_pred_from_raw_query`):
  per query batch, the clip branch as GMMFormer v2's; the frame branch
  (`get_frame_scale_scores`) re-normalises the batch's word tokens and the gallery's 128
  frames, computes the word confidences (`text_weight_fc` on the unit tokens, a softmax over
  real words), builds the `[b, G, Lq, 128]` word-frame cosines, multiplies by both masks,
  maxes over frames and sums the words by their confidences. Same ranking loop.
* ProtoPRVR: no official code exists; we use the MS-SL lineage's evaluation it builds on
  (`get_clip_scale_scores` on each branch's prototypes, MS-SL's query batch of 50).
* T-MASS (`Jiamian-Wang/T-MASS-text-video-retrieval`, trainer/trainer_stochastic.py
  `_valid_epoch_step`, modules/metrics.py, modules/stochastic_module.py): all texts at once
  (no query batching in scoring): X-Pool pools every video by every text into `[G, T, D]`;
  then a Python loop over the videos tiles the video's frames to `[T, F, D]` and, for each of
  the M trials, recomputes the radius (`LinearCosRadius`: re-normalises the tiled frames, a
  `[T, F, F]` matmul of the repeated text whose mean over one axis is the `[T, F]` cosines,
  a Linear, exp), adds noise; stacks `[M, T, D]`, normalises, picks the best trial per text and
  copies it row by row in a Python loop over the texts. Then
  `generate_embeds_per_video_id_stochastic` regroups both `[G, T, D]` tensors by video id in
  Python dict loops over every (video, text) pair, and the similarity is taken on the
  regrouped tensors; the ranks come from a double `torch.argsort` of the whole matrix
  (`t2v_metrics`, `official_ranks_double_argsort`).
  Ours is the paper's Eq. 10 without the released code's leak (docs/tmass.md): the final
  similarity pairs each text's selected sample with the video pooled by *that* text (the
  released bmm pairs it with the video pooled by the video's own caption), computed as a
  per-pair product on the regrouped tensors; and the noise is our per-video bank
  (`layers.stochastic_text.video_noise_bank`, the key our `score` draws from), shared by the
  texts of a video, where the released loop draws fresh `rand_like` noise per text and trial.

Timing: T-MASS's noise banks come from JAX (`tmass_noise`, the key our `score` uses); draw them
once outside the timed region and pass `noise=`. Small torch ops thrash with more threads than
free cores: pass `torch_threads`.

Ranking: `official_ranks` is MS-SL's `eval_q2m` (numpy), `official_ranks_torch` the
GMMFormer / GMMFormer v2 / AMDNet / HLFormer / RAL / Holmes / DreamPRVR copy of it in torch,
`official_ranks_double_argsort` T-MASS's `t2v_metrics`; `official_top_k` answers a top-k query
from the same per-query full argsort (the official code has no top-k path). MS-SL's evaluation
also ranks its clip-only and frame-only matrices and computes a mAP (a second full argsort per
query) for each of the three; these functions rank the fused matrix once.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

# Official evaluation query batch sizes (the queries scored against the whole gallery at once).
OFFICIAL_QUERY_BATCH = {
    # HuiGuanLab/ms-sl method/config.py: `--eval_query_bsz` default 50 (100 only under
    # --debug); the videos are encoded by `--eval_context_bsz` 200.
    'ms_sl': 50,
    # huangmozhi9527/GMMFormer src/Configs/{tvr,act,cha}.py: cfg['eval_query_bsz'] = 50
    # (cfg['eval_context_bsz'] = 100).
    'gmmformer': 50,
    # huangmozhi9527/GMMFormer_v2 src/Configs/{tvr,act,cha}.py: cfg['eval_query_bsz'] = 50
    # (cfg['eval_context_bsz'] = 100).
    'gmmformer_v2': 50,
    # songpipi/AMDNet Configs/{tvr,act,cha}.py: cfg['eval_query_bsz'] = 50
    # (cfg['eval_context_bsz'] = 100).
    'amdnet': 50,
    # lijun2005/ICCV25-HLFormer and zhanglong-ustc/RAL-PRVR src/Configs/{tvr,act,cha}.py:
    # cfg['eval_query_bsz'] = 50 (cfg['eval_context_bsz'] = 100).
    'hlformer': 50,
    'ral': 50,
    # lijun2005/ICML26-Holmes and lijun2005/CVPR26-DreamPRVR src/Configs/{tvr,act,cha}.py:
    # cfg['eval_query_bsz'] = 50 (cfg['eval_context_bsz'] = 100).
    'holmes': 50,
    'dreamprvr': 50,
    # No official code: MS-SL's value (the lineage's evaluation ProtoPRVR builds on).
    'protoprvr': 50,
    # Jiamian-Wang/T-MASS config/all_config.py `--batch_size` 32 batches only the text
    # encoder; trainer_stochastic.py `_valid_epoch_step` scores all texts at once (None).
    'tmass': None,
}

# The per-model scorers below read these.
_TWO_BRANCH = ('ms_sl', 'gmmformer', 'gmmformer_v2', 'hlformer', 'holmes', 'dreamprvr',
               'protoprvr')
# Two-branch models that store and score 32 clips and 128 frames as GMMFormer v2 does.
_CLIPS_AND_FRAMES = ('gmmformer_v2', 'hlformer', 'holmes', 'dreamprvr')
LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, as the official X-Pool uses.


# ------------------------------------------------------------------------------------ helpers

def _tensor(x: Any) -> torch.Tensor:
  """A float32 CPU tensor of a numpy / jax array (a copy, so torch owns it)."""
  return torch.from_numpy(np.array(x, dtype=np.float32, copy=True))


def _param(params: Mapping[str, Any], path: str) -> torch.Tensor:
  node = params
  for name in path.split('/'):
    node = node[name]
  return _tensor(node)


def _linear(params: Mapping[str, Any], path: str) -> tuple[torch.Tensor, torch.Tensor | None]:
  """(weight, bias) of a Flax Dense in torch's Linear layout (weight = kernel^T)."""
  kernel = _param(params, f'{path}/kernel').t().contiguous()
  node = params
  for name in path.split('/'):
    node = node[name]
  return kernel, (_tensor(node['bias']) if 'bias' in node else None)


def _layer_norm(params: Mapping[str, Any], path: str) -> tuple[torch.Tensor, torch.Tensor]:
  return _param(params, f'{path}/scale'), _param(params, f'{path}/bias')


def _query_batches(num_queries: int, batch: int | None) -> Iterator[slice]:
  """The official query loader's batches (consecutive, the last one short; one empty batch
  for no queries, so the results keep their `[0, G]` shape)."""
  step = max(num_queries, 1) if batch is None else batch
  for start in range(0, max(num_queries, 1), step):
    yield slice(start, min(start + step, num_queries))


@contextlib.contextmanager
def _threads(count: int | None):
  if count is None:
    yield
    return
  previous = torch.get_num_threads()
  torch.set_num_threads(count)
  try:
    yield
  finally:
    torch.set_num_threads(previous)


def _max_cosine(queries: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
  """The official `get_clip_scale_scores` structure: re-normalise the gallery set `[G, L, D]`
  and the query batch `[b, D]`, matmul to `[G, L, b]`, permute to `[b, L, G]`, max over L."""
  items = F.normalize(items, dim=-1)
  queries = F.normalize(queries, dim=-1)
  cosines = torch.matmul(items, queries.t()).permute(2, 1, 0)
  best, _ = torch.max(cosines, dim=1)
  return best


# ---------------------------------------------------------------------------- per-model scores

def _ms_sl_batch(weights: Mapping[str, torch.Tensor], gallery: Mapping[str, torch.Tensor],
                 queries: torch.Tensor, cfg: Any) -> torch.Tensor:
  """One MS-SL query batch: `get_clip_scale_scores` (re-normalised gallery, argmax kept as
  the key clip) + `key_clip_guided_attention_in_inference` (every frame projected again)."""
  clips, frames, mask = gallery['clips'], gallery['frames'], gallery['frame_mask']
  cosines = torch.matmul(F.normalize(clips, dim=-1),
                         F.normalize(queries, dim=-1).t()).permute(2, 1, 0)  # [b, P, G]
  clip_scores, key_index = torch.max(cosines, dim=1)                        # [b, G]
  keys = F.linear(frames, weights['key'])                                    # [G, L, D]
  values = F.linear(frames, weights['value'])                                # [G, L, D]
  videos = torch.arange(frames.shape[0]).unsqueeze(1)
  key_clips = clips[videos, key_index.t()]                                   # [G, b, D]
  logits = torch.bmm(keys, key_clips.transpose(2, 1))                        # [G, L, b]
  logits = logits.masked_fill(mask.unsqueeze(-1).eq(0), -1e9)
  attention = torch.softmax(logits, dim=1)
  attended = torch.bmm(attention.transpose(1, 2), values)                    # [G, b, D]
  frame_scores = torch.sum(F.normalize(attended, dim=-1)
                           * F.normalize(queries, dim=-1).unsqueeze(0), dim=-1).t()
  return cfg.clip_score_weight * clip_scores + cfg.frame_score_weight * frame_scores


def _two_branch_scores(model_name: str, params: Mapping[str, Any],
                       stored: Mapping[str, np.ndarray], queries: Any, cfg: Any,
                       batch: int | None) -> np.ndarray:
  if cfg.get('stochastic_text', False):
    raise ValueError(f'{model_name} with stochastic_text (our text-mass plug-in) has no official '
                     'evaluation to reproduce')
  if model_name == 'ms_sl':
    gallery = {k: _tensor(stored[k]) for k in ('clips', 'frames', 'frame_mask')}
    # mapping_linear[0] / [1] of the official model: bias-free Linear layers.
    weights = {name: _param(params, f'key_clip_attention/{name}').t().contiguous()
               for name in ('key', 'value')}
  elif model_name == 'gmmformer':
    gallery = {k: _tensor(stored[k]) for k in ('clips', 'video')}
  elif model_name in _CLIPS_AND_FRAMES:
    gallery = {k: _tensor(stored[k]) for k in ('clips', 'frames')}
  else:  # protoprvr
    gallery = {k: _tensor(stored[k]) for k in ('clip_prototypes', 'frame_prototypes')}
  if model_name == 'protoprvr':
    query_sets = {k: _tensor(queries[k]) for k in ('clip', 'frame')}
    num_queries = query_sets['clip'].shape[0]
  else:
    query_sets = {'clip': _tensor(queries)}
    num_queries = query_sets['clip'].shape[0]
  fused = []
  for rows in _query_batches(num_queries, batch):
    if model_name == 'ms_sl':
      fused.append(_ms_sl_batch(weights, gallery, query_sets['clip'][rows], cfg))
      continue
    if model_name == 'protoprvr':
      clip_scores = _max_cosine(query_sets['clip'][rows], gallery['clip_prototypes'])
      frame_scores = _max_cosine(query_sets['frame'][rows], gallery['frame_prototypes'])
    else:
      q = query_sets['clip'][rows]
      clip_scores = _max_cosine(q, gallery['clips'])
      if model_name == 'gmmformer':
        frame_scores = torch.matmul(F.normalize(gallery['video'], dim=-1),
                                    F.normalize(q, dim=-1).t()).permute(1, 0)
      else:
        frame_scores = _max_cosine(q, gallery['frames'])
    fused.append(cfg.clip_score_weight * clip_scores + cfg.frame_score_weight * frame_scores)
  return torch.cat(fused, dim=0).cpu().numpy().copy()


def _ral_scores(params: Mapping[str, Any], stored: Mapping[str, np.ndarray],
                queries: Mapping[str, Any], cfg: Any, batch: int | None) -> np.ndarray:
  clips = _tensor(stored['clips'])
  frames, frame_mask = _tensor(stored['frames']), _tensor(stored['frame_mask'])
  vectors, tokens, token_mask = (_tensor(queries[k]) for k in ('query', 'tokens', 'token_mask'))
  fc_0 = _linear(params, 'text_weight_fc/fc_0')
  fc_2 = _linear(params, 'text_weight_fc/fc_2')
  fused = []
  for rows in _query_batches(vectors.shape[0], batch):
    clip_scores = _max_cosine(vectors[rows], clips)
    unit_tokens = F.normalize(tokens[rows], dim=-1)
    unit_frames = F.normalize(frames, dim=-1)
    mask = token_mask[rows]
    weights = F.linear(F.relu(F.linear(unit_tokens, *fc_0)), *fc_2).squeeze(2)
    weights = torch.softmax(weights.masked_fill(mask == 0, float('-inf')), dim=-1)
    logits = torch.einsum('atd,bvd->abtv', unit_tokens, unit_frames)
    logits = torch.einsum('abtv,at->abtv', logits, mask)
    logits = torch.einsum('abtv,bv->abtv', logits, frame_mask)
    frame_scores = torch.einsum('abt,at->ab', logits.max(dim=-1)[0], weights)
    fused.append(cfg.clip_score_weight * clip_scores + cfg.frame_score_weight * frame_scores)
  return torch.cat(fused, dim=0).cpu().numpy().copy()


def _amdnet_scores(stored: Mapping[str, np.ndarray], queries: np.ndarray,
                   batch: int | None) -> np.ndarray:
  clips = _tensor(stored['clips'])
  texts = _tensor(queries)
  scores = []
  for rows in _query_batches(texts.shape[0], batch):
    # The official `get_clip_scale_scores` also returns the `[b, 32, G]` cosines (kept by the
    # caller until the next batch); the max is the score.
    normalised = F.normalize(clips, dim=-1)
    cosines = torch.matmul(normalised, F.normalize(texts[rows], dim=-1).t()).permute(2, 1, 0)
    best, _ = torch.max(cosines, dim=1)
    scores.append(best)
  return torch.cat(scores, dim=0).cpu().numpy().copy()


# --------------------------------------------------------------------------------------- T-MASS

def tmass_noise(params: Mapping[str, Any], config_model: Any, keys: np.ndarray,
                sampling_key: Any = None) -> np.ndarray:
  """`[G, M, D]` noise banks of the videos `keys [G]`, exactly as our `TMASS.score` draws them
  from the 'sampling' stream `sampling_key` (default: the evaluator's, `score_seed` 0)."""
  import jax  # pylint: disable=import-outside-toplevel
  from prvr_jax.layers import stochastic_text  # pylint: disable=import-outside-toplevel
  from prvr_jax.models import registry  # pylint: disable=import-outside-toplevel

  spec = registry.get_spec(config_model)
  module = spec.build(config_model)
  if sampling_key is None:  # prvr_jax.eval.evaluator: fold_in(key(score_seed), stream index)
    sampling_key = jax.random.fold_in(jax.random.key(0),
                                      spec.score_rng_streams.index('sampling'))

  def draw(model, video_keys):  # the first make_rng('sampling') of the root, as in `score`
    return stochastic_text.video_noise_bank(
        model.make_rng('sampling'), video_keys, model.num_samples, model.hidden_dim,
        model.stochastic_prior, model.stochastic_std)

  bank = module.apply({'params': params}, np.asarray(keys, np.int32), method=draw,
                      rngs={'sampling': sampling_key})
  return np.asarray(bank, np.float32)


def _x_pool(p: Mapping[str, Any], texts: torch.Tensor, frames: torch.Tensor,
            num_heads: int) -> torch.Tensor:
  """X-Pool as the official `Transformer` lays it out: texts `[T, D]`, frames `[G, F, D]` ->
  every video pooled by every text `[G, T, D]` (evaluation: dropout off)."""
  num_texts, dim = texts.shape
  num_videos, num_frames, _ = frames.shape
  head_dim = dim // num_heads
  norm1 = _layer_norm(p, 'layer_norm1')
  texts = F.layer_norm(texts, (dim,), *norm1, eps=LAYER_NORM_EPS)
  frames = F.layer_norm(frames, (dim,), *norm1, eps=LAYER_NORM_EPS)
  q = F.linear(texts, *_linear(p, 'q_proj')).reshape(num_texts, num_heads, head_dim)
  q = q.permute(1, 2, 0)                                                   # [H, hd, T]
  k = F.linear(frames, *_linear(p, 'k_proj')).reshape(num_videos, num_frames, num_heads,
                                                       head_dim).permute(0, 2, 1, 3)
  v = F.linear(frames, *_linear(p, 'v_proj')).reshape(num_videos, num_frames, num_heads,
                                                       head_dim).permute(0, 2, 3, 1)
  logits = (k @ q) / math.sqrt(head_dim)                                   # [G, H, F, T]
  attention = (v @ torch.softmax(logits, dim=2)).permute(0, 3, 1, 2)      # [G, T, H, hd]
  attention = attention.reshape(num_videos, num_texts, dim)
  attended = F.layer_norm(F.linear(attention, *_linear(p, 'out_proj')), (dim,),
                          *_layer_norm(p, 'layer_norm2'), eps=LAYER_NORM_EPS)
  out = attended + F.linear(attended, *_linear(p, 'linear_proj'))
  return F.layer_norm(out, (dim,), *_layer_norm(p, 'layer_norm3'), eps=LAYER_NORM_EPS)


def _log_radius(radius: tuple[torch.Tensor, torch.Tensor], texts: torch.Tensor,
                tiled_frames: torch.Tensor) -> torch.Tensor:
  """The official `LinearCosRadius` structure: texts `[T, D]`, one video tiled to `[T, F, D]`
  -> `[T, D]`; the text is repeated over the frames, so the `[T, F, F]` product's mean over
  one axis is the `[T, F]` cosines."""
  num_frames = tiled_frames.shape[1]
  texts = texts / texts.norm(dim=-1, keepdim=True)
  tiled_frames = tiled_frames / tiled_frames.norm(dim=-1, keepdim=True)
  repeated = texts.unsqueeze(1).repeat(1, num_frames, 1)
  cosines = torch.mean(torch.matmul(repeated, tiled_frames.permute(0, 2, 1)), dim=1)
  return F.linear(cosines, *radius)


def _group_by_video(per_pair: torch.Tensor, groups: list[Any]) -> torch.Tensor:
  """`generate_embeds_per_video_id_stochastic`'s regrouping: `[G, T, D]` -> `[G, N, S, D]`
  with the texts of each group (first-appearance order) in S slots, -inf padded; Python dict
  loops over every (video, text) pair, as the official code."""
  dim = per_pair.shape[-1]
  out = []
  for i in range(per_pair.shape[0]):
    by_group: dict[Any, list[torch.Tensor]] = {}
    for t, group in enumerate(groups):
      by_group.setdefault(group, []).append(per_pair[i, t, :])
    stacked = {g: torch.stack(rows) for g, rows in by_group.items()}
    slots = max(x.shape[0] for x in stacked.values())
    out.append(torch.stack([
        torch.cat([x, torch.full((slots - x.shape[0], dim), float('-inf'))]) for x in
        stacked.values()]))
  return torch.stack(out)


def _tmass_chunk(p: Mapping[str, Any], cfg: Any, texts: torch.Tensor, frames: torch.Tensor,
                 noise: torch.Tensor | None, groups: list[Any]) -> torch.Tensor:
  """`[T, G]` scores of `texts` against every video, the official evaluation's structure."""
  num_texts, dim = texts.shape
  pooled = _x_pool(p['pool'], texts, frames, cfg.num_heads)             # [G, T, D], at once
  if noise is None:  # num_samples = 0: the deterministic text against its pooled video
    return torch.sum(F.normalize(texts, dim=-1).unsqueeze(0) * F.normalize(pooled, dim=-1),
                     dim=-1).t()
  radius = _linear(p, 'radius/linear')
  selected = torch.zeros((frames.shape[0], num_texts, dim))
  for g, (video, video_pooled) in enumerate(zip(frames, pooled)):
    tiled = video.unsqueeze(0).tile((num_texts, 1, 1))                  # [T, F, D]
    trials = []
    for m in range(noise.shape[1]):  # the official recomputes the radius every trial
      text_std = torch.exp(_log_radius(radius, texts, tiled))
      trials.append(texts + noise[g, m] * text_std)
    trials = torch.stack(trials, dim=0)                                  # [M, T, D]
    trials = trials / trials.norm(dim=-1, keepdim=True)
    video_pooled = video_pooled / video_pooled.norm(dim=-1, keepdim=True)
    best = torch.argmax(torch.sum(trials * video_pooled, dim=-1), dim=0)  # [T]
    plane = torch.ones((num_texts, dim))
    for i in range(num_texts):
      plane[i, :] = trials[best[i], i, :]
    selected[g] = plane
  texts_grouped = _group_by_video(selected, groups)                      # [G, N, S, D]
  pooled_grouped = _group_by_video(pooled, groups)
  texts_grouped = texts_grouped / texts_grouped.norm(dim=-1, keepdim=True)
  pooled_grouped = pooled_grouped / pooled_grouped.norm(dim=-1, keepdim=True)
  # Eq. 10 without the leak: each text's selected sample against the video pooled by that
  # same text (the released bmm takes the video pooled by the video's own caption).
  sims = torch.sum(texts_grouped * pooled_grouped, dim=-1).permute(1, 2, 0)  # [N, S, G]
  order = list(dict.fromkeys(groups))
  index = {g: n for n, g in enumerate(order)}
  slot, seen = [], {}
  for group in groups:
    slot.append(seen.get(group, 0))
    seen[group] = slot[-1] + 1
  return sims[[index[g] for g in groups], slot]


def _tmass_scores(params: Mapping[str, Any], stored: Mapping[str, np.ndarray],
                  queries: np.ndarray, cfg: Any, batch: int | None, noise: np.ndarray | None,
                  sampling_key: Any, query_video: np.ndarray | None) -> np.ndarray:
  frames = _tensor(stored['frames'])
  texts = _tensor(queries)
  if texts.shape[0] == 0:
    return np.zeros((0, frames.shape[0]), np.float32)
  bank = None
  if cfg.num_samples:
    if noise is None:
      noise = tmass_noise(params, cfg, stored['key'], sampling_key)
    bank = _tensor(noise)
    if bank.shape != (frames.shape[0], cfg.num_samples, frames.shape[-1]):
      raise ValueError(f'noise {tuple(bank.shape)}; expected [G, M, D] = '
                       f'{(frames.shape[0], cfg.num_samples, frames.shape[-1])}')
  groups = (list(range(texts.shape[0])) if query_video is None
            else [int(v) for v in np.asarray(query_video)])
  out = [_tmass_chunk(params, cfg, texts[rows], frames, bank, groups[rows])
         for rows in _query_batches(texts.shape[0], batch)]
  return torch.cat(out, dim=0).cpu().numpy().copy()


# ------------------------------------------------------------------------------------ interface

def official_scores(model_name: str, params: dict, stored: dict[str, np.ndarray], queries,
                    config_model, query_batch_size: int | None = None,
                    torch_threads: int | None = None, *, noise: np.ndarray | None = None,
                    sampling_key: Any = None,
                    query_video: np.ndarray | None = None) -> np.ndarray:
  """[Q, G] float32 fused scores computed as the official evaluation does, in torch (CPU).

  Args:
    model_name: 'ms_sl', 'gmmformer', 'gmmformer_v2', 'amdnet', 'protoprvr', 'hlformer',
      'ral', 'holmes', 'dreamprvr' or 'tmass'.
    params: our Flax params tree (`spec.init_params(...)` or a checkpoint's).
    stored: our `encode_videos` output as numpy, leading axis G.
    queries: our `encode_queries` output as numpy (`[Q, D]`; ProtoPRVR {'clip', 'frame'};
      RAL {'query', 'tokens', 'token_mask'}).
    config_model: the config's `model` section.
    query_batch_size: queries scored together; None: `OFFICIAL_QUERY_BATCH[model_name]`
      (T-MASS: all at once, as official; a number then bounds its `[G, T, D]` memory).
    torch_threads: `torch.set_num_threads` for the call (restored after).
    noise: T-MASS only, `[G, M, D]` noise banks (default: drawn as our `score` draws them,
      `tmass_noise`).
    sampling_key: T-MASS only, the 'sampling' key our `score` got (default: the evaluator's
      with `score_seed` 0); ignored when `noise` is given.
    query_video: T-MASS only, `[Q]` the video id of each query for the official regrouping of
      texts by video (None: each query its own group; the scores are the same either way).
  """
  if isinstance(params, Mapping) and set(params) == {'params'}:
    params = params['params']
  if model_name not in OFFICIAL_QUERY_BATCH:
    raise ValueError(f'no official ranking path for {model_name!r}; expected one of '
                     f'{sorted(OFFICIAL_QUERY_BATCH)}')
  if query_batch_size is None:
    query_batch_size = OFFICIAL_QUERY_BATCH[model_name]
  if query_batch_size is not None and query_batch_size < 1:
    raise ValueError(f'query_batch_size must be positive, got {query_batch_size}')
  with _threads(torch_threads), torch.inference_mode():
    if model_name in _TWO_BRANCH:
      return _two_branch_scores(model_name, params, stored, queries, config_model,
                                query_batch_size)
    if model_name == 'amdnet':
      return _amdnet_scores(stored, np.asarray(queries), query_batch_size)
    if model_name == 'ral':
      return _ral_scores(params, stored, queries, config_model, query_batch_size)
    return _tmass_scores(params, stored, np.asarray(queries), config_model, query_batch_size,
                         noise, sampling_key, query_video)


def official_ranks(scores: np.ndarray, ground_truth: np.ndarray) -> np.ndarray:
  """[Q] int ranks (1-based) of each query's ground-truth gallery row, per-query np.argsort of
  -scores + position lookup as the official eval_q2m does (a Python loop over queries)."""
  errors = -1 * np.asarray(scores)
  num_queries, num_videos = errors.shape
  ranks = np.zeros((num_queries,), np.int32)
  for i in range(num_queries):
    order = np.argsort(errors[i])
    rank = num_videos + 1
    for target in np.atleast_1d(ground_truth[i]):
      position = np.where(order == target)[0][0] + 1
      rank = min(rank, position)
    ranks[i] = rank
  return ranks


def official_ranks_torch(scores: np.ndarray, ground_truth: np.ndarray) -> np.ndarray:
  """The GMMFormer / GMMFormer v2 / AMDNet `eval_q2m`: the same loop on the torch tensor
  (`torch.argsort` + `torch.where` per query; on CUDA there, on CPU here)."""
  errors = -1 * torch.from_numpy(np.asarray(scores, np.float32))
  num_queries, num_videos = errors.shape
  ranks = torch.zeros((num_queries,), dtype=torch.int32)
  with torch.inference_mode():
    for i in range(num_queries):
      order = torch.argsort(errors[i])
      rank = num_videos + 1
      for target in np.atleast_1d(ground_truth[i]):
        position = int(torch.where(order == int(target))[0][0]) + 1
        rank = min(rank, position)
      ranks[i] = rank
  return ranks.numpy()


def official_ranks_double_argsort(scores: np.ndarray, ground_truth: np.ndarray) -> np.ndarray:
  """T-MASS's `t2v_metrics`: a descending `torch.argsort` of every row, then an argsort of that
  (each video's position), read at the ground truth; 1-based here (the official keeps 0-based
  ranks and adds 1 in its metrics)."""
  with torch.inference_mode():
    order = torch.argsort(torch.from_numpy(np.asarray(scores, np.float32)), dim=-1,
                          descending=True)
    positions = torch.argsort(order, dim=-1)
    gt = torch.from_numpy(np.asarray(ground_truth, np.int64)).reshape(-1, 1)
    return (torch.gather(positions, 1, gt)[:, 0] + 1).numpy().astype(np.int32)


def official_top_k(scores: np.ndarray, k: int) -> np.ndarray:
  """[Q, k] gallery rows, from the same per-query full argsort the official code does (the way
  the official code would answer a top-k query)."""
  errors = -1 * np.asarray(scores)
  return np.stack([np.argsort(errors[i])[:k] for i in range(errors.shape[0])]
                  ) if errors.shape[0] else np.zeros((0, k), np.int64)
