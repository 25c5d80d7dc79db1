r"""Draws docs/efficiency.png from `benchmarks/retrieval.py` JSONs (a model measured in
several is drawn from the last).

  python3 benchmarks/plot_efficiency.py --output=docs/efficiency.png \
      --results=benchmarks/results/retrieval_amd_epyc.json \
      --results=benchmarks/results/retrieval_amd_epyc_ms_sl.json \
      --results=benchmarks/results/retrieval_amd_epyc_hlformer_ral.json \
      --results=benchmarks/results/retrieval_amd_epyc_holmes_dreamprvr.json

Left: ms per query against gallery size per model (log-log), our index search solid (less its
query encoding, as the official path receives encoded queries), the official ranking path
dashed. Right: test SumR on the synthetic benchmark against bytes stored per video at the
synthetic config (the picture of a PRVR paper's Figure 1); bytes come from
`spec.bytes_per_video` of each config's `synthetic` variant, SumR from our docs:

* docs/results.md, its first table (3 seeds, mean +- std; one run where it says so): every PRVR
  model but ProtoPRVR;
* docs/protoprvr.md, Table 5 (3 seeds): 10 / 20 / 30 / 60 prototypes per branch, SumR
  213.3 / 199.5 / 194.0 / 186.5 (30 is the config's default), one sweep drawn as a line;
* docs/tmass.md, "Measured on the synthetic task" (3 seeds): T-MASS 256.9 +- 2.4 with M = 20
  samples -- a different task (the synthetic text-video retrieval set, 500 test videos, not
  the PRVR benchmark), drawn hollow.
"""

from collections.abc import Sequence
import importlib.util
import json
import os

from absl import app
from absl import flags
import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=wrong-import-position

from prvr_jax import models  # pylint: disable=wrong-import-position

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_RESULTS = flags.DEFINE_multi_string('results', None, 'A JSON written by '
                                     'benchmarks/retrieval.py; a model in several is drawn '
                                     'from the last.')
_OUTPUT = flags.DEFINE_string('output', os.path.join(ROOT, 'docs', 'efficiency.png'),
                              'The PNG to write.')

LABELS = {'ms_sl': 'MS-SL', 'gmmformer': 'GMMFormer', 'gmmformer_v2': 'GMMFormer v2',
          'amdnet': 'AMDNet', 'protoprvr': 'ProtoPRVR', 'tmass': 'T-MASS',
          'hlformer': 'HLFormer', 'ral': 'RAL', 'holmes': 'Holmes', 'dreamprvr': 'DreamPRVR',
          'msc_prvr': 'MSC-PRVR'}
_PALETTE = plt.get_cmap('tab20').colors
COLOURS = dict(zip(LABELS, _PALETTE[::2] + _PALETTE[1::2]))
# model -> [(config overrides of the synthetic variant, test SumR mean, std or None)] of the
# models docs/results.md does not list as its first table does.
OTHER_SUMR = {
    'protoprvr': [({'num_prototypes': 10}, 213.3, 6.6), ({'num_prototypes': 20}, 199.5, 11.1),
                  ({}, 194.0, 6.9), ({'num_prototypes': 60}, 186.5, 10.7)],
    'tmass': [({}, 256.9, 2.4)],
}
OTHER_TASK = ('tmass',)


def results_sumr(path: str = os.path.join(ROOT, 'docs', 'results.md')
                 ) -> dict[str, list[tuple[dict[str, int], float, float | None]]]:
  """model -> [({}, test SumR mean, std or None)] from the first table of docs/results.md
  (rows `| <label> | <mean> ± <std> | ...` or `| <label> | <mean> (one run...) | ...`)."""
  names = {label: name for name, label in LABELS.items()}
  out = {}
  with open(path, encoding='utf-8') as f:
    for line in f:
      cells = [c.strip() for c in line.strip().strip('|').split('|')]
      if len(cells) < 2 or cells[0] not in names or names[cells[0]] in out:
        continue
      figure = cells[1].split('(')[0].split('±')
      try:
        mean = float(figure[0])
      except ValueError:
        continue
      out[names[cells[0]]] = [({}, mean, float(figure[1]) if len(figure) > 1 else None)]
  return out


def synthetic_bytes(name: str, overrides: dict[str, int]) -> int:
  """Bytes stored per video at configs/<name>.py:synthetic (with `overrides`)."""
  spec = importlib.util.spec_from_file_location(f'config_{name}',
                                                os.path.join(ROOT, 'configs', f'{name}.py'))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config('synthetic')
  for key, value in overrides.items():
    config.model[key] = value
  return models.get_spec(config.model).bytes_per_video(config.model)


def plot_speed(ax, report: dict) -> None:
  for model in report['models']:
    name = model['model']
    points = [p for p in model['points'] if 'ours_ms_per_query' in p]
    ax.plot([p['videos'] for p in points], [p['ours_match_ms_per_query'] for p in points],
            '-o', color=COLOURS[name], label=LABELS[name], markersize=3)
    int8 = [p for p in points if p['dtype'] == 'int8']
    ax.plot([p['videos'] for p in int8], [p['ours_match_ms_per_query'] for p in int8], 'x',
            color=COLOURS[name], markersize=8)
    official = [p for p in points if 'official_ms_per_query' in p]
    if official:
      ax.plot([p['videos'] for p in official], [p['official_ms_per_query'] for p in official],
              '--s', color=COLOURS[name], markersize=3, markerfacecolor='none')
  ax.plot([], [], 'k-', label='ours (index search less query encoding)')
  ax.plot([], [], 'k--', label='official ranking path')
  ax.plot([], [], 'kx', label='int8 index (float32 does not fit)')
  ax.set_xscale('log')
  ax.set_yscale('log')
  ax.set_xlabel('gallery size (videos)')
  ax.set_ylabel('ms per query')
  machine = report['machine']
  where = machine['cpu'] if machine['platform'] == 'cpu' else machine['device']
  ax.set_title(f'Exact top-{report["settings"]["k"]} search, paper-size configs\n{where}, '
               f'{machine["cpu_count"]} cores, {machine["date"][:10]}', fontsize=9)
  ax.grid(True, which='both', alpha=0.3)
  ax.legend(fontsize=7)


def plot_accuracy(ax) -> None:
  for name, rows in {**results_sumr(), **OTHER_SUMR}.items():
    xs = [synthetic_bytes(name, overrides) for overrides, _, _ in rows]
    ys = [mean for _, mean, _ in rows]
    errors = [std or 0.0 for _, _, std in rows]
    hollow = name in OTHER_TASK
    ax.errorbar(xs, ys, yerr=errors, fmt='-o' if len(rows) > 1 else 'o', color=COLOURS[name],
                markerfacecolor='none' if hollow else COLOURS[name], capsize=2,
                label=LABELS[name] + (' (text-video task)' if hollow else ''))
    if name == 'protoprvr':
      for x, y, (overrides, _, _) in zip(xs, ys, rows):
        ax.annotate(str(overrides.get('num_prototypes', 30)), (x, y), fontsize=7,
                    textcoords='offset points', xytext=(4, 4))
  ax.set_xscale('log')
  ax.set_xlabel('bytes stored per video (float32, synthetic config)')
  ax.set_ylabel('test SumR (synthetic benchmark)')
  ax.set_title('Accuracy against storage (ProtoPRVR: prototypes per branch)', fontsize=9)
  ax.grid(True, which='both', alpha=0.3)
  ax.legend(fontsize=7)


def main(argv: Sequence[str]) -> None:
  del argv
  if not _RESULTS.value:
    raise app.UsageError('--results=<retrieval JSON> (one or more) is required.')
  runs, report = {}, {}
  for path in _RESULTS.value:
    with open(path, encoding='utf-8') as f:
      report = json.load(f)
    runs.update({model['model']: model for model in report['models']})
  report['models'] = list(runs.values())  # the machine and settings of the last file
  figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
  plot_speed(left, report)
  plot_accuracy(right)
  figure.tight_layout()
  figure.savefig(_OUTPUT.value, dpi=120)
  print(f'{_OUTPUT.value} written')


if __name__ == '__main__':
  app.run(main)
