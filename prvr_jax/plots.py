"""Pictures of a training run and of an evaluation, written as PNG files (docs/plots.md).

matplotlib is an optional extra (`pip install 'prvr_jax[plots]'`), imported only when a picture
is drawn; figures are drawn with the Agg canvas (no window, no global pyplot state).

  training_curves.png          loss terms per step, val SumR per epoch (`metrics.jsonl`)
  recall_by_moment_ratio.png   R@1/5/10/100 of each moment-to-video group (spans known)
  similarity_heatmap.png       scores of a sample of queries x their videos, ground truth marked
  moment_relevance.png         a query's relevance over its video against the annotated moment
                               (models naming `ModelSpec.relevance`)

  plots.write_training_plots(workdir)                                 # after training
  plots.write_evaluation_plots(config, params, data, result, out_dir,
                               spans=index.spans, durations=index.durations)
"""

from collections.abc import Mapping, Sequence
import dataclasses
import json
import os
from typing import Any

from absl import logging
import jax
import numpy as np

from prvr_jax import files
from prvr_jax import metrics as metrics_lib
from prvr_jax import parallel
from prvr_jax.eval.evaluator import EvalResult
from prvr_jax.eval.splits import EvalSplit, GROUND_TRUTH_KEY, QUERY_KEY, VIDEO_KEY
from prvr_jax.layers.precision import matmul_precision
from prvr_jax.models import registry

INSTALL_HINT = "pip install 'prvr_jax[plots]'"
DPI = 100
# Figure size in inches of each picture (pixels: inches x DPI).
INCHES = {'training_curves': (11.0, 4.0), 'recall_by_moment_ratio': (7.0, 4.0),
          'similarity_heatmap': (9.0, 8.0), 'moment_relevance': (11.0, 6.0)}
# Fixed margins (fractions of the figure): a layout engine costs about a second per picture.
MARGINS = {'training_curves': dict(left=0.07, right=0.98, bottom=0.12, top=0.92, wspace=0.22),
           'recall_by_moment_ratio': dict(left=0.1, right=0.98, bottom=0.08, top=0.92),
           'similarity_heatmap': dict(left=0.24, right=1.0, bottom=0.14, top=0.95),
           'moment_relevance': dict(left=0.06, right=0.98, bottom=0.09, top=0.9, hspace=0.45,
                                    wspace=0.15)}
METRICS_FILE = 'metrics.jsonl'
# Scalars of the train records that are not loss terms.
NOT_LOSS_TERMS = ('lr', 'grad_norm', 'steps_per_sec')
HEATMAP_VIDEOS = 12          # videos of the heatmap sample (the split's first ones)
QUERIES_PER_VIDEO = 2        # heatmap rows per video
RELEVANCE_QUERIES = 4        # panels of moment_relevance.png


def _matplotlib() -> Any:
  """matplotlib, or an ImportError saying how to install it."""
  try:
    import matplotlib  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(f'Plots need matplotlib, an optional extra: {INSTALL_HINT}') from e
  return matplotlib


def require_matplotlib() -> None:
  """Raises the install hint now when matplotlib is missing (before a long evaluation)."""
  _matplotlib()


def _figure(name: str) -> Any:
  """A new `Figure` of `INCHES[name]` and `MARGINS[name]` on an Agg canvas."""
  _matplotlib()
  from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
  from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
  figure = Figure(figsize=INCHES[name], dpi=DPI)
  figure.subplots_adjust(**MARGINS[name])
  FigureCanvasAgg(figure)
  return figure


def _save(figure: Any, path: str) -> str:
  """Writes `figure` to `path` as PNG (atomically) and returns `path`."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  files.write_atomic(path, lambda f: figure.savefig(f, format='png', dpi=DPI))
  return path


def _label(text: str, limit: int = 28) -> str:
  return text if len(text) <= limit else text[:limit - 3] + '...'


# ----------------------------------------------------------------------------- training


def read_metrics(path: str) -> list[dict[str, Any]]:
  """The whole records of a run's `metrics.jsonl` (lines cut by a crash are skipped)."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f'{path}: no metrics file (train.py writes it into its workdir).')
  records, torn = [], 0
  with open(path, encoding='utf-8', errors='replace') as f:
    for line in f:
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except json.JSONDecodeError:
        torn += 1
        continue
      if isinstance(record, dict) and 'step' in record and 'split' in record:
        records.append(record)
      else:
        torn += 1
  if torn:
    logging.warning('%s: skipped %d line(s) that are not whole records.', path, torn)
  return records


def training_curves(metrics_path: str, out_path: str) -> str:
  """Left: the loss and each loss term of the train records per step (log scale when all are
  positive); right: val SumR per epoch, the best epoch starred. Returns `out_path`."""
  records = read_metrics(metrics_path)
  train = [r for r in records if r['split'] == 'train']
  val = sorted((r for r in records if r['split'] == 'val' and 'sumr' in r),
               key=lambda r: r['epoch'])
  if not train and not val:
    raise ValueError(f'{metrics_path} holds no train or val records to draw.')
  figure = _figure('training_curves')
  losses, sumr = figure.subplots(1, 2, width_ratios=(3, 2))
  steps = np.array([r['step'] for r in train])
  terms = ['loss'] + sorted({k for r in train for k in r}
                            - {'step', 'split', 'epoch', 'loss', *NOT_LOSS_TERMS})
  positive = True
  for name in terms:
    values = np.array([r.get(name, np.nan) for r in train], np.float64)
    if np.isfinite(values).any():
      positive &= bool(np.nanmin(values) > 0)
      losses.plot(steps, values, label=name, linewidth=2.0 if name == 'loss' else 1.0)
  if train and positive:
    losses.set_yscale('log')
  losses.set(xlabel='step', ylabel='training loss', title='loss terms (train records)')
  if train:
    losses.legend(fontsize='small')
  if val:
    epochs = [r['epoch'] for r in val]
    values = [r['sumr'] for r in val]
    best = int(np.argmax(values))
    sumr.plot(epochs, values, marker='o')
    sumr.plot(epochs[best], values[best], marker='*', markersize=14, linestyle='none',
              label=f'best: {values[best]:.1f} (epoch {epochs[best]})')
    sumr.legend(fontsize='small')
  else:
    sumr.text(0.5, 0.5, 'no validation record yet', ha='center', va='center',
              transform=sumr.transAxes)
  sumr.set(xlabel='epoch', ylabel='SumR (R@1+5+10+100)', title='validation SumR')
  for axes in (losses, sumr):
    axes.xaxis.set_major_locator(_integer_ticks())
  return _save(figure, out_path)


def _integer_ticks() -> Any:
  from matplotlib.ticker import MaxNLocator  # pylint: disable=g-import-not-at-top
  return MaxNLocator(integer=True)


def write_training_plots(workdir: str, out_dir: str | None = None) -> dict[str, str]:
  """`training_curves.png` of `<workdir>/metrics.jsonl` into `out_dir` (default `workdir`);
  process 0 draws. Returns {picture name: path}."""
  if jax.process_index() != 0:
    return {}
  path = os.path.join(out_dir or workdir, 'training_curves.png')
  return {'training_curves': training_curves(os.path.join(workdir, METRICS_FILE), path)}


# ----------------------------------------------------------------------------- evaluation


def recall_by_moment_ratio(ranks: np.ndarray, moment_ratio: np.ndarray,
                           mv_groups: Sequence[tuple[float, float]], out_path: str) -> str:
  """Bars of R@1/5/10/100 (`metrics.recalls`) of all queries and of each moment-to-video
  group `(lo, hi]` of `moment_ratio`.

  Args:
    ranks: `[Nq]` text-to-video rank of each query.
    moment_ratio: `[Nq]` moment length / video length (NaN: unknown, only in 'all').
    mv_groups: the `(lo, hi]` groups (`config.eval.mv_groups`).
    out_path: the PNG written.
  """
  ranks, moment_ratio = np.asarray(ranks), np.asarray(moment_ratio, np.float64)
  if ranks.shape != moment_ratio.shape:
    raise ValueError(f'ranks {ranks.shape} and moment_ratio {moment_ratio.shape} differ.')
  groups = [('all', np.ones(ranks.shape, bool))] + [
      (f'M/V ({lo:g}, {hi:g}]', (moment_ratio > lo) & (moment_ratio <= hi))
      for lo, hi in mv_groups]
  figure = _figure('recall_by_moment_ratio')
  axes = figure.subplots()
  ks = metrics_lib.RECALL_KS
  width = 0.8 / len(groups)
  for i, (name, members) in enumerate(groups):
    recalls = metrics_lib.recalls(ranks[members])
    bars = axes.bar(np.arange(len(ks)) + (i - (len(groups) - 1) / 2) * width,
                    [recalls[f'r{k}'] for k in ks], width,
                    label=f'{name}: {int(members.sum())} queries, SumR {recalls["sumr"]:.1f}')
    axes.bar_label(bars, fmt='%.0f', fontsize='x-small')
  axes.set_xticks(np.arange(len(ks)), [f'R@{k}' for k in ks])
  axes.set(ylabel='recall (%)', ylim=(0, 105), title='text-to-video recall by moment length')
  axes.legend(fontsize='small', loc='upper left')
  return _save(figure, out_path)


def similarity_heatmap(scores: np.ndarray, query_keys: Sequence[int],
                       ground_truth: Sequence[int], out_path: str,
                       caption_ids: Sequence[str], video_ids: Sequence[str],
                       ranks: np.ndarray | None = None) -> str:
  """Scores of the queries `query_keys` (rows) against their ground-truth videos (columns, in
  order of appearance), each query's ground-truth cell outlined.

  Args:
    scores: `[Nq, Nv]` score matrix (rows by query key, columns by video key).
    query_keys, ground_truth: the sampled queries' keys and their videos' keys.
    out_path: the PNG written.
    caption_ids, video_ids: key -> id (the tick labels).
    ranks: optional `[Nq]` text-to-video ranks, shown beside the caption ids.
  """
  query_keys, ground_truth = np.asarray(query_keys), np.asarray(ground_truth)
  columns = list(dict.fromkeys(ground_truth.tolist()))
  block = np.asarray(scores)[query_keys[:, None], np.asarray(columns)[None, :]]
  figure = _figure('similarity_heatmap')
  axes = figure.subplots()
  image = axes.imshow(block, cmap='viridis', aspect='auto', interpolation='nearest')
  figure.colorbar(image, ax=axes, label='score')
  for row, video in enumerate(ground_truth):
    axes.add_patch(_rectangle((columns.index(int(video)) - 0.5, row - 0.5)))
  rows = [_label(caption_ids[k]) + ('' if ranks is None else f' (rank {int(ranks[k])})')
          for k in query_keys]
  axes.set_yticks(np.arange(len(rows)), rows, fontsize='x-small')
  axes.set_xticks(np.arange(len(columns)), [_label(video_ids[v], 16) for v in columns],
                  rotation=90, fontsize='x-small')
  axes.set(xlabel='video (outlined: the query\'s ground truth)', ylabel='query',
           title=f'{len(rows)} queries x their {len(columns)} videos (rank among all '
                 f'{np.shape(scores)[1]} videos)')
  return _save(figure, out_path)


def _rectangle(corner: tuple[float, float]) -> Any:
  from matplotlib.patches import Rectangle  # pylint: disable=g-import-not-at-top
  return Rectangle(corner, 1.0, 1.0, fill=False, edgecolor='red', linewidth=2.0)


@dataclasses.dataclass
class RelevanceExample:
  """One query's relevance curves over its video.

  Attributes:
    title: the panel title (caption id, rank).
    curves: name -> `[T]` relevance over positions covering the video evenly (NaN: padding).
    span: the annotated moment (start, end) in seconds, or None.
    duration: the video's duration in seconds, or None (the x axis is then the fraction of
      the video).
  """
  title: str
  curves: dict[str, np.ndarray]
  span: tuple[float, float] | None = None
  duration: float | None = None


def moment_relevance(examples: Sequence[RelevanceExample], out_path: str,
                     title: str = '') -> str:
  """One panel per example (at most `RELEVANCE_QUERIES`): each curve scaled to [0, 1] over
  the video's time (its raw range in the legend), the annotated moment shaded."""
  if not examples:
    raise ValueError('moment_relevance: no example to draw.')
  figure = _figure('moment_relevance')
  panels = figure.subplots(2, 2, squeeze=False).ravel()
  for axes, example in zip(panels, examples[:RELEVANCE_QUERIES]):
    length = example.duration or 1.0
    for name, curve in example.curves.items():
      real = np.asarray(curve, np.float64)
      real = real[np.isfinite(real)]
      if not real.size:
        continue
      low, high = real.min(), real.max()
      # Position i of the n real ones covers [i / n, (i + 1) / n] of the video.
      axes.stairs((real - low) / (high - low) if high > low else np.ones_like(real),
                  np.linspace(0.0, length, real.size + 1), baseline=None,
                  label=f'{name} ({low:.3g} to {high:.3g})')
    if example.span is not None:
      axes.axvspan(*example.span, color='tab:green', alpha=0.2, label='annotated moment')
    axes.set(xlim=(0, length), ylim=(-0.05, 1.15), title=_label(example.title, 60),
             xlabel='time (s)' if example.duration else 'fraction of the video',
             ylabel='relevance (scaled)')
    axes.legend(fontsize='x-small')
  for axes in panels[len(examples):]:
    axes.set_axis_off()
  if title:
    figure.suptitle(title)
  return _save(figure, out_path)


@dataclasses.dataclass
class Sample:
  """Queries of the split's first videos with their inputs.

  Attributes:
    query_keys, ground_truth: `[N]` the queries' keys and their videos' keys.
    queries: the queries' batch (`[N, ...]` rows of the split's query batches).
    videos: the videos' batch, row i the video of query i (None unless asked for).
  """
  query_keys: np.ndarray
  ground_truth: np.ndarray
  queries: dict[str, np.ndarray]
  videos: dict[str, np.ndarray] | None


def sample_queries(data: EvalSplit, num_videos: int = HEATMAP_VIDEOS,
                   per_video: int = QUERIES_PER_VIDEO, video_inputs: Sequence[str] = ()
                   ) -> Sample:
  """Up to `per_video` queries of each of the first `num_videos` videos the query stream
  names (caption-file order: the split's first videos), reading the streams only as far as
  needed; with `video_inputs`, also those inputs of each query's video."""
  picked: dict[int, list[tuple[int, Mapping[str, np.ndarray], int]]] = {}  # video -> queries
  for batch in data.query_batches():
    for row, (key, video) in enumerate(zip(np.asarray(batch[QUERY_KEY]).tolist(),
                                           np.asarray(batch[GROUND_TRUTH_KEY]).tolist())):
      if key < 0 or (video not in picked and len(picked) == num_videos):
        continue
      if len(picked.setdefault(video, [])) < per_video:
        picked[video].append((key, batch, row))
    if len(picked) == num_videos:
      break
  chosen = [(video, *item) for video, items in picked.items() for item in items]
  if not chosen:
    raise ValueError('The evaluation split has no queries to sample.')
  videos = None
  if video_inputs:
    found = {}
    for batch in data.video_batches():
      for row, key in enumerate(np.asarray(batch[VIDEO_KEY]).tolist()):
        if key in picked:
          found[key] = (batch, row)
      if len(found) == len(picked):
        break
    if len(found) < len(picked):
      raise ValueError(f'Videos (keys {sorted(set(picked) - set(found))[:5]}) of the sampled '
                       'queries are not in the evaluation video stream.')
    videos = _stack([found[video] for video, _, _, _ in chosen], include=video_inputs)
  return Sample(query_keys=np.array([key for _, key, _, _ in chosen], np.int64),
                ground_truth=np.array([video for video, _, _, _ in chosen], np.int64),
                queries=_stack([(batch, row) for _, _, batch, row in chosen],
                               exclude=(QUERY_KEY, GROUND_TRUTH_KEY)),
                videos=videos)


def _stack(items: Sequence[tuple[Mapping[str, np.ndarray], int]],
           include: Sequence[str] | None = None, exclude: Sequence[str] = ()
           ) -> dict[str, np.ndarray]:
  """Rows `(batch, row)` stacked into one batch of the keys `include` that the batches hold
  (default: all but `exclude`)."""
  names = [k for k in items[0][0] if k not in exclude and (include is None or k in include)]
  return {k: np.stack([np.asarray(batch[k])[row] for batch, row in items]) for k in names}


def relevance_curves(config: Any, params: Any, queries: Mapping[str, np.ndarray],
                     videos: Mapping[str, np.ndarray]) -> dict[str, np.ndarray] | None:
  """`config.model`'s `ModelSpec.relevance` of `Q` queries over their `Q` videos (row q: query
  q's video): name -> `[Q, T]` (NaN: padding), or None for a model that names none."""
  spec = registry.get_spec(config.model)
  if spec.relevance is None:
    return None
  module = spec.build(config.model)
  video_inputs, query_inputs = spec.inputs(config.model)

  @jax.jit
  def relevance(params, queries, videos):
    with matmul_precision(config.eval.matmul_precision):
      return module.apply({'params': params}, queries, videos, method=spec.relevance)

  curves = relevance(params, {k: queries[k] for k in query_inputs},
                     {k: videos[k] for k in video_inputs if k in videos})
  return {name: np.asarray(curve) for name, curve in jax.device_get(curves).items()}


def _relevance_examples(config: Any, params: Any, data: EvalSplit, sample: Sample,
                        ranks: np.ndarray, spans: np.ndarray | None,
                        durations: np.ndarray | None) -> list[RelevanceExample]:
  """`RelevanceExample`s of up to `RELEVANCE_QUERIES` sampled queries of distinct videos,
  those with a known moment first."""
  keys = sample.query_keys
  known = (np.zeros(keys.shape, bool) if spans is None
           else (spans[keys, 0] >= 0) & (durations[keys] > 0))
  first_of_video = np.unique(sample.ground_truth, return_index=True)[1]
  chosen = sorted(first_of_video, key=lambda i: (not known[i], i))[:RELEVANCE_QUERIES]
  curves = relevance_curves(config, params, {k: v[chosen] for k, v in sample.queries.items()},
                            {k: v[chosen] for k, v in sample.videos.items()})
  examples = []
  for row, i in enumerate(chosen):
    key = int(keys[i])
    examples.append(RelevanceExample(
        title=f'{data.caption_ids[key]} (rank {int(ranks[key])})',
        curves={name: curve[row] for name, curve in curves.items()},
        span=(float(spans[key, 0]), float(spans[key, 1])) if known[i] else None,
        duration=float(durations[key]) if known[i] else None))
  return examples


def write_evaluation_plots(config: Any, params: Any, data: EvalSplit, result: EvalResult,
                           out_dir: str, spans: np.ndarray | None = None,
                           durations: np.ndarray | None = None) -> dict[str, str]:
  """The evaluation's pictures into `out_dir`: `recall_by_moment_ratio.png` (when the split
  has moment ratios), `similarity_heatmap.png`, and `moment_relevance.png` for a model that
  names `ModelSpec.relevance`.

  Call on every process (the parameters are gathered to the hosts); process 0 writes.

  Args:
    config: the run config (`model`, `eval.mv_groups`, `eval.matmul_precision`).
    params: the evaluated parameters.
    data: the evaluated split; result: its `EvalResult`.
    out_dir: where the PNG files go.
    spans: optional `[Nq, 2]` annotated moment (start, end) in seconds by query key (start
      < 0: unknown), with `durations` `[Nq]` the videos' durations (<= 0: unknown).

  Returns:
    {picture name: path} of the files written (empty on other processes).
  """
  require_matplotlib()
  num_queries = len(data.caption_ids)
  if (spans is None) != (durations is None):
    raise ValueError('write_evaluation_plots: pass spans and durations together.')
  if spans is not None:
    spans, durations = np.asarray(spans, np.float64), np.asarray(durations, np.float64)
    if spans.shape != (num_queries, 2) or durations.shape != (num_queries,):
      raise ValueError(f'spans {spans.shape} / durations {durations.shape} do not match the '
                       f'{num_queries} queries of the split.')
  spec = registry.get_spec(config.model)
  sample = sample_queries(data, video_inputs=spec.inputs(config.model)[0]
                          if spec.relevance else ())
  examples = []
  if spec.relevance:
    examples = _relevance_examples(config, parallel.to_host(params), data, sample,
                                   result.ranks, spans, durations)
  if jax.process_index() != 0:
    return {}
  written = {}
  path = {name: os.path.join(out_dir, f'{name}.png') for name in INCHES}
  if data.moment_ratio is not None:
    written['recall_by_moment_ratio'] = recall_by_moment_ratio(
        result.ranks, data.moment_ratio, config.eval.mv_groups, path['recall_by_moment_ratio'])
  written['similarity_heatmap'] = similarity_heatmap(
      result.scores, sample.query_keys, sample.ground_truth, path['similarity_heatmap'],
      data.caption_ids, data.video_ids, result.ranks)
  if examples:
    written['moment_relevance'] = moment_relevance(
        examples, path['moment_relevance'],
        title=f'{config.model.name}: relevance of a query over its video')
  logging.info('Plots: %s', ', '.join(written.values()))
  return written


def write_plots(config: Any, params: Any, shards: Any, split: str, data: EvalSplit,
                result: EvalResult, output_dir: str, workdir: str | None = None
                ) -> dict[str, str]:
  """The pictures of an evaluation into `output_dir` (`write_evaluation_plots`, with the
  annotated moments of `split` where `shards` have them) and, when `workdir` has a metrics
  file, its training curves. Call on every process; returns {picture name: path} (process 0).

  Args:
    config, params: the model evaluated.
    shards: the run's data (`prvr_jax.data.protocol.RunData`).
    split: 'val' / 'test'; data, result: the split evaluated and its `EvalResult`.
    output_dir: where the PNG files go.
    workdir: a train.py workdir, or None.
  """
  moments = shards.moments(split)
  written = write_evaluation_plots(config, params, data, result, output_dir, **moments)
  if workdir and os.path.isfile(os.path.join(workdir, METRICS_FILE)):
    written.update(write_training_plots(workdir, output_dir))
  return written
