"""Sphinx extension: the generated pages of the API reference, written before Sphinx reads.

* `_generated/api/<group>.md`: one page per subpackage of `prvr_jax` (and one for the
  top-level modules), every module found by `pkgutil` documented by autodoc, so that a new
  module cannot be left out.
* `_generated/models/<name>.md`: one page per model of `prvr_jax.models.registry`: its paper
  (the first line of the model package's docstring), for every variant of
  `configs/<name>.py` the parameter count and the stored bytes per video computed with
  `jax.eval_shape` (checked against the counts the spec documents), the config options, and
  links to the paper-vs-code notes and the model's own docs.
* `_generated/guides/<doc>.md`: each Markdown file of `docs/` and the README, included as is.

The build fails (an error, or a warning under `-W`) when a registered model has no page, a
spec's documented parameter count differs from the computed one, or a model's paper cannot
be read from its package docstring.
"""

from collections.abc import Iterable, Mapping
import dataclasses
import importlib
import importlib.util
import inspect
import json
import os
import pathlib
import pkgutil
import re
import subprocess
import sys
from typing import Any

from myst_parser.mdit_to_docutils.base import default_slugify  # the anchors myst makes
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.util import logging

logger = logging.getLogger(__name__)

GENERATED = '_generated'
# Page titles and order of the subpackages of prvr_jax (others get a page titled by their name,
# after these); modules directly under prvr_jax go to 'core'.
GROUPS = {
    'layers': 'Layers (`prvr_jax.layers`)',
    'kernels': 'CPU-tuned kernels and their policy (`prvr_jax.kernels`)',
    'losses': 'Losses (`prvr_jax.losses`)',
    'models': 'Models and the registry (`prvr_jax.models`)',
    'train': 'Training (`prvr_jax.train`)',
    'eval': 'Evaluation (`prvr_jax.eval`)',
    'data': 'Data: releases, shards, pipelines (`prvr_jax.data`)',
    'index': 'Retrieval index (`prvr_jax.index`)',
    'clip': 'CLIP (`prvr_jax.clip`)',
    'serve': 'The results page (`prvr_jax.serve`, `prvr-serve`)',
    'runtime': 'Start-up of the command-line programs (`prvr_jax.runtime`)',
    'tools': 'Command-line tools (`prvr_jax.tools`, the `prvr-*` commands)',
    'core': 'Checkpoints, configs, conversion, metrics, optimisers, parallelism (`prvr_jax`)',
}


def _write(path: pathlib.Path, text: str, written: set[pathlib.Path]) -> None:
  """Writes `text` unless the file already holds it (unchanged pages are not re-read)."""
  written.add(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  if not path.exists() or path.read_text(encoding='utf-8') != text:
    path.write_text(text, encoding='utf-8')


def _toctree(entries: Iterable[str], maxdepth: int = 1) -> str:
  return '```{toctree}\n:maxdepth: %d\n\n%s\n```\n' % (maxdepth, '\n'.join(entries))


# ----------------------------------------------------------------------------- API pages


def module_groups() -> dict[str, list[str]]:
  """Group name -> the modules of `prvr_jax` in it, the package first (`__main__` left out)."""
  import prvr_jax  # pylint: disable=g-import-not-at-top
  groups = {name: [] for name in GROUPS}
  groups['core'].append('prvr_jax')
  for info in pkgutil.walk_packages(prvr_jax.__path__, 'prvr_jax.'):
    parts = info.name.split('.')
    if parts[-1] != '__main__':
      group = parts[1] if info.ispkg or len(parts) > 2 else 'core'
      groups.setdefault(group, []).append(info.name)
  return {name: sorted(modules, key=lambda m: (m.count('.'), m))
          for name, modules in groups.items() if modules}


def api_page(title: str, modules: list[str]) -> str:
  blocks = [f'# {title}\n']
  for module in modules:
    blocks.append(f'## `{module}`\n\n```{{eval-rst}}\n.. automodule:: {module}\n'
                  '   :members:\n   :ignore-module-all:\n   :show-inheritance:\n```\n')
  return '\n'.join(blocks)


# ----------------------------------------------------------------------------- model pages


@dataclasses.dataclass
class Variant:
  """One `--config=configs/<model>.py:<arg>`: its model config and what the spec computes."""
  arg: str
  model_json: str | None  # config.model (None: as the base's): traced once per distinct one
  overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
  params: int | None = None
  bytes_per_video: int | None = None


def paper_of(spec: Any) -> str:
  """The paper the model reimplements: the package docstring's `NAME (AUTHORS, VENUE)`."""
  package = spec.module.__module__.rsplit('.', 1)[0]
  doc = ' '.join((importlib.import_module(package).__doc__ or '').split())
  match = re.match(r'(.+?\))\s*:', doc)
  if not match:
    raise ExtensionError(f'{package}: its docstring does not start with "NAME (authors, '
                         f'venue): ...", where the model page takes the paper from')
  return match.group(1)


def load_config_module(path: pathlib.Path) -> Any:
  loader = importlib.util.spec_from_file_location(f'configs.{path.stem}', path)
  module = importlib.util.module_from_spec(loader)
  loader.loader.exec_module(module)
  return module


def _model_json(config: Any) -> str:
  return json.dumps(config.model.to_dict(), sort_keys=True, default=list)


def config_variants(spec: Any, config_module: Any) -> tuple[str, list[Variant], list[Variant]]:
  """(base, dataset variants, options): every variant of `config_lib.VARIANTS` the config
  file's `get_config` accepts, and every key of a module-level dict it accepts as
  `BASE,KEY`, with its overrides of the base variant (the first that is not a small one);
  options that leave the model as it is get no numbers (`model_json` None)."""
  from prvr_jax import config_lib  # pylint: disable=g-import-not-at-top
  variants = []
  for arg in config_lib.VARIANTS:
    try:
      config = config_module.get_config(arg)
    except ValueError:
      continue
    if config.model.name != spec.name:
      raise ExtensionError(f'{config_module.__file__}:{arg} configures model '
                           f'{config.model.name!r}, not {spec.name!r}')
    variants.append(Variant(arg, _model_json(config)))
  if not variants:
    raise ExtensionError(f'{config_module.__file__}: get_config accepts no variant of '
                         f'{config_lib.VARIANTS}')
  base = next((v.arg for v in variants if v.arg not in config_lib.SMALL_VARIANTS),
              variants[0].arg)
  base_flat = config_lib.flat_items(config_module.get_config(base).to_dict())
  options = []
  for name, value in vars(config_module).items():
    if (not name.isupper() or not isinstance(value, Mapping) or not value
        or not all(isinstance(v, Mapping) for v in value.values())):
      continue
    for key in value:
      try:
        config = config_module.get_config(f'{base},{key}')
      except ValueError:
        break  # not an options dict (per-dataset values, ...)
      overrides = {k: v for k, v in config_lib.flat_items(config.to_dict()).items()
                   if base_flat.get(k, '<absent>') != v}
      model_changed = any(k.startswith('model.') for k in overrides)
      options.append(Variant(f'{base},{key}', _model_json(config) if model_changed else None,
                             overrides))
  return base, variants, options


def compute_numbers(job: tuple[str, str, str, bool]) -> tuple[int, int, list | None]:
  """`(model, config file, arg, with_layout)` -> (parameter count, stored bytes per video,
  [(path, shape, dtype)] of what `encode_videos` stores per video if `with_layout`), from
  abstract shapes (`jax.eval_shape`)."""
  from prvr_jax.models import count_params, registry  # pylint: disable=g-import-not-at-top
  name, config_file, arg, with_layout = job
  spec = registry.get_spec(name)
  config_model = load_config_module(pathlib.Path(config_file)).get_config(arg).model
  layout = None
  if with_layout:
    layout = [(path, list(s.shape), str(s.dtype))
              for path, s in spec.stored_per_video(config_model).items()]
  return (count_params(spec.param_shapes(config_model)), spec.bytes_per_video(config_model),
          layout)


def run_jobs(jobs: list[tuple[str, str, str, bool]]) -> list[tuple[int, int, list | None]]:
  """`compute_numbers` of every job, split over one process per CPU (tracing is
  single-threaded Python): each runs this file with its jobs as JSON and prints the results."""
  workers = min(len(jobs), os.cpu_count() or 1)
  if workers <= 1:
    return [compute_numbers(job) for job in jobs]
  chunks = [jobs[i::workers] for i in range(workers)]
  procs = [subprocess.Popen([sys.executable, __file__, json.dumps(chunk)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for chunk in chunks]
  results: list[Any] = [None] * len(jobs)
  for i, proc in enumerate(procs):
    out, err = proc.communicate()
    if proc.returncode:
      raise ExtensionError(f'computing the model pages\' numbers failed:\n{err[-4000:]}')
    # The last line: libraries may print to stdout while importing.
    results[i::workers] = [tuple(r) for r in json.loads(out.strip().splitlines()[-1])]
  return results


def _number(value: int | None) -> str:
  return '' if value is None else f'{value:,}'


def _md_value(value: Any) -> str:
  return f'`{value!r}`'.replace('|', '\\|')


def docs_mentioning(docs_dir: pathlib.Path, name: str) -> list[str]:
  """Stems of the docs/*.md files that name `configs/<name>.py` or are `docs/<name>.md`."""
  return sorted(p.stem for p in docs_dir.glob('*.md')
                if p.stem == name or f'configs/{name}.py' in p.read_text(encoding='utf-8'))


def paper_vs_code_links(docs_dir: pathlib.Path) -> list[str]:
  """Links to the sections of docs/paper_vs_code.md (its one table names the model in each
  row)."""
  text = (docs_dir / 'paper_vs_code.md').read_text(encoding='utf-8')
  titles = re.findall(r'^## (.+)$', text, flags=re.M)
  return [f'[{t.replace("`", "")}](../guides/paper_vs_code.md#{default_slugify(t)})'
          for t in titles]


@dataclasses.dataclass
class ModelPlan:
  """What a model page shows; numbers are filled in by `fill_numbers`."""
  spec: Any
  config_file: pathlib.Path | None
  base: str = ''  # the variant options apply to and the stored layout is shown at
  variants: list[Variant] = dataclasses.field(default_factory=list)
  options: list[Variant] = dataclasses.field(default_factory=list)
  layout: list | None = None


def plan_model(spec: Any, repo: pathlib.Path) -> ModelPlan:
  config_file = repo / 'configs' / f'{spec.name}.py'
  if not config_file.is_file():
    return ModelPlan(spec, None)
  return ModelPlan(spec, config_file, *config_variants(spec, load_config_module(config_file)))


def fill_numbers(plans: list[ModelPlan]) -> None:
  """Computes each distinct model config once (`run_jobs`) and fills in the numbers."""
  jobs, index = [], {}
  for plan in plans:
    if plan.config_file is None:
      continue
    for v in plan.variants + [o for o in plan.options if o.model_json is not None]:
      key = (plan.spec.name, v.model_json)
      if key not in index:
        index[key] = len(jobs)
        jobs.append([plan.spec.name, str(plan.config_file), v.arg, False])
      jobs[index[key]][3] |= v.arg == plan.base  # and the stored layout
  results = run_jobs([tuple(job) for job in jobs])
  for plan in plans:
    for v in plan.variants + [o for o in plan.options if o.model_json is not None]:
      v.params, v.bytes_per_video, layout = results[index[(plan.spec.name, v.model_json)]]
      if v.arg == plan.base:
        plan.layout = layout


def model_page(plan: ModelPlan, repo: pathlib.Path) -> str:
  """The Markdown page of one registered model."""
  spec = plan.spec
  lines = [f'# {spec.name}\n', f'**Paper:** {paper_of(spec)}\n',
           f'**Module:** {{py:class}}`{spec.module.__module__}.{spec.module.__name__}` · '
           f'**objective:** {{py:func}}`{spec.objective.__module__}.{spec.objective.__name__}`'
           f' · **official PyTorch checkpoints:** {"read" if spec.official else "none"}\n']
  package = spec.module.__module__.rsplit('.', 1)[0]
  lines.append(inspect.cleandoc(importlib.import_module(package).__doc__) + '\n')
  if plan.config_file is None:
    lines.append(f'No `configs/{spec.name}.py`: no config variants.\n')
  else:
    lines.append(f'## Config variants\n\n`python3 train.py --config=configs/{spec.name}.py:'
                 'VARIANT`. Parameters (and the count the model documents) and the bytes '
                 '`encode_videos` stores per video are computed from the config with '
                 '`jax.eval_shape` when these docs are built.\n')
    lines.append('| variant | parameters | documented | bytes per video |\n'
                 '| --- | ---: | ---: | ---: |')
    for v in plan.variants:
      documented = spec.param_counts.get(v.arg)
      if documented is not None and documented != v.params:
        logger.warning('%s: ModelSpec.param_counts[%r] = %d, but configs/%s.py:%s has %d '
                       'parameters', spec.name, v.arg, documented, spec.name, v.arg, v.params)
      lines.append(f'| `{v.arg}` | {_number(v.params)} | {_number(documented)} | '
                   f'{_number(v.bytes_per_video)} |')
    lines.append(f'\nStored per video at `{plan.base}`: ' + ', '.join(
        f'`{path or "(array)"}` {shape} {dtype}' for path, shape, dtype in plan.layout) + '.\n')
    if plan.options:
      lines.append(f'## Options\n\n`--config=configs/{spec.name}.py:VARIANT,OPTION`, shown '
                   f'at `{plan.base}`, with numbers where the option changes the model.\n')
      lines.append('| option | overrides | parameters | bytes per video |\n'
                   '| --- | --- | ---: | ---: |')
      for o in plan.options:
        overrides = ', '.join(f'`{k}`={_md_value(v)}' for k, v in sorted(o.overrides.items()))
        lines.append(f'| `{o.arg.split(",", 1)[1]}` | {overrides or "(none)"} | '
                     f'{_number(o.params)} | {_number(o.bytes_per_video)} |')
      lines.append('')
  docs_dir = repo / 'docs'
  lines.append('## Paper vs. code\n')
  lines += [f'- {link}' for link in paper_vs_code_links(docs_dir)]
  others = [d for d in docs_mentioning(docs_dir, spec.name) if d != 'paper_vs_code']
  if others:
    lines.append('\nMore on this model: ' + ', '.join(
        f'[{d}.md](../guides/{d}.md)' for d in others) + '.')
  return '\n'.join(lines) + '\n'


# ----------------------------------------------------------------------------- docstrings

# napoleon's Google-style section headers: their indented bodies are napoleon's to format.
_SECTION = re.compile(
    r'^(Args|Arguments|Attributes|Example|Examples|Keyword Args|Keyword Arguments|Methods|'
    r'Note|Notes|Other Parameters|Parameters|Raises|References|Return|Returns|See Also|Todo|'
    r'Warning|Warnings|Warns|Yield|Yields)\s*:\s*$')


def _blank_line(lines: list[str]) -> None:
  if lines and lines[-1].strip():
    lines.append('')


def indented_blocks(lines: list[str]) -> list[str]:
  """Google-style free text -> reStructuredText: an indented block outside napoleon's
  sections (a usage example, a table, a formula, written as the Google style guide shows
  them: indented, without `::`) becomes a literal block, or a list if it is a bulleted one.

  reStructuredText would read such a block as a block quote, or as an error where no blank
  line surrounds it; this is what napoleon does not convert. `lines` are dedented (autodoc's
  `prepare_docstring`).
  """
  out: list[str] = []
  in_section = False
  i = 0
  while i < len(lines):
    line = lines[i]
    if not line.strip() or not line.startswith(' '):
      if line.strip():
        in_section = bool(_SECTION.match(line))
      out.append(line)
      i += 1
      continue
    end = i
    while end < len(lines) and (not lines[end].strip() or lines[end].startswith(' ')):
      end += 1
    block = lines[i:end]
    while block and not block[-1].strip():
      block.pop()
    previous = next((l for l in reversed(out) if l.strip()), '')
    if in_section or previous.rstrip().endswith('::'):
      out.extend(block)
    elif block[0].lstrip().startswith(('* ', '- ')):
      indent = len(block[0]) - len(block[0].lstrip())
      _blank_line(out)
      out.extend(l[indent:] for l in block)
    else:
      _blank_line(out)
      out += ['::', '']
      out.extend(block)
    _blank_line(out)
    i = end
  return out


def _process_docstring(app: Sphinx, what: str, name: str, obj: Any, options: Any,
                       lines: list[str]) -> None:
  del app, what, name, obj, options
  lines[:] = indented_blocks(lines)


# ----------------------------------------------------------------------------- guides

# Absolute path of each Markdown file shown as a guide -> its page name under guides/.
_GUIDES: dict[pathlib.Path, str] = {}
_LINK = re.compile(r'(?<!!)\[([^\]]*)\]\(([^)\s]+)\)')


def repo_links(text: str, source: pathlib.Path, repo: pathlib.Path) -> str:
  """Relative links of a repository Markdown file as they work on its guide page: to another
  guide -> that page (anchors kept); to any other file of the repository (a notebook, a
  config) -> its path as code. Links with a scheme, images and fenced code are left alone."""
  def link(match: re.Match) -> str:
    label, target = match.groups()
    if re.match(r'[a-z][a-z0-9+.-]*:', target) or target.startswith('#'):
      return match.group(0)
    path, _, anchor = target.partition('#')
    resolved = (source.parent / path).resolve()
    if resolved in _GUIDES:
      return f'[{label}]({_GUIDES[resolved]}.md{"#" + anchor if anchor else ""})'
    shown = resolved.relative_to(repo).as_posix() if resolved.is_relative_to(repo) else target
    return f'{label} (`{shown}`)'
  out, fenced = [], False
  for line in text.splitlines(keepends=True):
    if line.lstrip().startswith(('```', '~~~')):
      fenced = not fenced
    out.append(line if fenced else _LINK.sub(link, line))
  return ''.join(out)


def _include_read(app: Sphinx, relative_path: pathlib.Path, parent_docname: str,
                  content: list[str]) -> None:
  del parent_docname
  path = (pathlib.Path(app.srcdir) / relative_path).resolve()
  if path in _GUIDES:
    content[0] = repo_links(content[0], path, pathlib.Path(app.srcdir).resolve().parents[1])


# ----------------------------------------------------------------------------- wiring


def generate(app: Sphinx) -> None:
  """Writes every generated page under `<srcdir>/_generated` and removes stale ones."""
  from prvr_jax.models import registry  # pylint: disable=g-import-not-at-top
  srcdir = pathlib.Path(app.srcdir)
  repo = srcdir.parents[1]
  out = srcdir / GENERATED
  written: set[pathlib.Path] = set()

  groups = module_groups()
  for group, modules in groups.items():
    title = GROUPS.get(group, f'`prvr_jax.{group}`')
    _write(out / 'api' / f'{group}.md', api_page(title, modules), written)
  _write(out / 'api.md', '# API\n\nOne page per subpackage of `prvr_jax`.\n\n'
         + _toctree(f'api/{g}' for g in groups), written)

  names = registry.names()
  plans = [plan_model(registry.get_spec(name), repo) for name in names]
  fill_numbers(plans)
  for plan in plans:
    _write(out / 'models' / f'{plan.spec.name}.md', model_page(plan, repo), written)
  _write(out / 'models.md', '# Models\n\nOne page per model of `prvr_jax.models.registry`.\n\n'
         + _toctree(f'models/{n}' for n in names), written)

  guides = [('readme', repo / 'README.md')] + [(p.stem, p) for p in sorted(
      (repo / 'docs').glob('*.md'))]
  _GUIDES.clear()
  _GUIDES.update({path.resolve(): stem for stem, path in guides})
  for stem, path in guides:
    relative = pathlib.Path(os.path.relpath(path, out / 'guides')).as_posix()
    _write(out / 'guides' / f'{stem}.md',
           f'```{{include}} {relative}\n:relative-images:\n```\n', written)
  _write(out / 'guides.md', '# Guides\n\nThe Markdown docs of the repository.\n\n'
         + _toctree(f'guides/{stem}' for stem, _ in guides), written)

  for stale in set(out.rglob('*.md')) - written:
    stale.unlink()
  app.config.prvr_model_names = names


def check_model_pages(app: Sphinx, env: Any) -> None:
  """Every registered model has its page among the documents read."""
  missing = [n for n in app.config.prvr_model_names
             if f'{GENERATED}/models/{n}' not in env.found_docs]
  if missing:
    raise ExtensionError(f'no model page for {missing} (expected {GENERATED}/models/<name>.md)')


def setup(app: Sphinx) -> dict[str, Any]:
  app.add_config_value('prvr_model_names', [], 'env')
  app.connect('builder-inited', generate)
  app.connect('env-check-consistency', check_model_pages)
  app.connect('include-read', _include_read)
  # Before napoleon (priority 500), which turns the Google-style sections into fields.
  app.connect('autodoc-process-docstring', _process_docstring, priority=400)
  return {'parallel_read_safe': True, 'parallel_write_safe': True}


if __name__ == '__main__':  # a worker of `run_jobs`
  print(json.dumps([compute_numbers(tuple(job)) for job in json.loads(sys.argv[1])]))
