r"""The index from the command line (`prvr-index`, or `python -m prvr_jax.tools.index`).

  # Encode the test split once with a checkpoint (ours or official), int8 storage:
  prvr-index build --config=gmmformer_v2:tvr \
      --config.data.dir=/data/tvr --checkpoint=/runs/gmmformer_v2 --split=test \
      --out=/idx/tvr_test --dtype=int8
  # Top 100 videos of every query of a file (.npz / .h5 features, .txt texts for CLIP models):
  prvr-index search --index=/idx/tvr_test --queries=queries.h5 --k=100 \
      --output=results.jsonl
  # Two-stage search of a very large gallery (pip install prvr_jax[ann]): build the faiss
  # first stage once, then search with it:
  prvr-index candidates --index=/idx/tvr_test --kind=ivf
  prvr-index search --index=/idx/tvr_test --queries=queries.h5 \
      --candidates=/idx/tvr_test/candidates --num_candidates=200
  # What an index holds; --verify checks every file's sha256:
  prvr-index info --index=/idx/tvr_test --verify

  # Every video of your own collection (prvr-extract's folder, no captions), then search it
  # by text with the best-matching span of each video (docs/index.md):
  prvr-index build --config=clip_zero_shot:tvr_clip,max --config.data.dir=/data/mine \
      --config.data.collection=mine --split=all --out=/idx/mine
  prvr-index search --index=/idx/mine --text="a man opens the fridge" --k=10 \
      --clip_weights=/data/clip/ViT-B-32.safetensors

search writes one JSON line per query: {"query": id, "videos": [ids], "scores": [floats],
"index": the index's id}; by text (--text, or --queries=FILE.txt) also "spans" ([start, end]
seconds or null), "span_fractions" and "durations" per video (and "text" for a file's
lines, whose "query" is "line N"). It logs the index's provenance (checkpoint, step, parameters'
fingerprint). Every open checks each index file's size and sampled digest (the full sha256 of a
file whose mtime changed); --verify checks every file's full sha256.
"""

import json
import os
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from prvr_jax import runtime

COMMANDS = ('build', 'search', 'candidates', 'info')
FLAGS = flags.FLAGS


def define_flags() -> None:
  """The flags of every command and `runtime.define_flags`'s."""
  config_flags.DEFINE_config_file(
      'config', None, 'build: config file[:variant] (or model name[:variant]) of the model and '
      'the data.', lock_config=True)
  flags.DEFINE_string(
      'checkpoint', None, 'build: a train.py workdir / checkpoint folder, or an official PyTorch '
      'checkpoint file (none for clip_zero_shot: its weights from its config).')
  flags.DEFINE_string('split', 'test', 'build: the split whose videos are indexed; \'all\': '
                      'every video of the collection config.data.dir (captions or none, e.g. '
                      'your own videos from prvr-extract).')
  flags.DEFINE_string('out', None, 'build: the new index folder; candidates: the folder of the '
                      'candidate files (default <index>/candidates).')
  flags.DEFINE_enum('kind', 'ivf', ['ivf', 'flat'], 'candidates: the faiss index kind.')
  flags.DEFINE_enum('dtype', 'float32', ['float32', 'bfloat16', 'int8'],
                    'build: storage of the vectors (int8: one scale per vector).')
  flags.DEFINE_integer('shard_videos', 100_000,
                       'build: videos per shard (host memory holds one).')
  flags.DEFINE_bool('overwrite', False, 'build: replace an existing index at --out (only a '
                    'folder holding one of our indexes and nothing else; refused otherwise).')
  flags.DEFINE_bool('cross_dataset', False,
                    'build: index data other than the checkpoint\'s own split.')
  flags.DEFINE_string('index', None, 'search / candidates / info: the index folder.')
  flags.DEFINE_string('queries', None, 'search: the query file (.npz, .h5, .txt: one text '
                      'per line).')
  flags.DEFINE_multi_string('text', None, 'search: a query text (repeatable); with --queries '
                            'FILE.txt, the texts of a file.')
  flags.DEFINE_string('clip_weights', None, 'search by text: CLIP\'s weights for models reading '
                      'CLIP sentence features (default: the index\'s config.model.clip_weights); '
                      'random:tiny is a random test CLIP.')
  flags.DEFINE_string('clip_vocab', None, 'search by text: CLIP\'s BPE vocabulary (default: '
                      'the index data\'s, else PRVR_CLIP_VOCAB or open_clip\'s).')
  flags.DEFINE_integer('k', 100, 'search: videos returned per query.')
  flags.DEFINE_string('output', None, 'search: JSON-lines output (default stdout).')
  flags.DEFINE_integer('query_batch_size', 256, 'search: queries per batch.')
  flags.DEFINE_string(
      'candidates', None, 'search: a candidate file of this index (two-stage search); only its '
      '--num_candidates proposals per query are scored exactly.')
  flags.DEFINE_integer(
      'num_candidates', 200, 'search: two-stage candidates per query (docs/two_stage.md: recall '
      'against speed).')
  flags.DEFINE_bool('verify', False, 'info / search / candidates: check every file\'s full '
                    'sha256 (without it: sizes and sampled digests).')
  runtime.define_flags()


def _require(**values) -> None:
  missing = [f'--{name}' for name, value in values.items() if value is None]
  if missing:
    raise app.UsageError(f'{", ".join(missing)} required.')


def _build() -> None:
  from prvr_jax.index import build  # pylint: disable=g-import-not-at-top
  _require(config=FLAGS.config, out=FLAGS.out)
  from prvr_jax.models import registry  # pylint: disable=g-import-not-at-top
  if registry.get_spec(FLAGS.config.model).trainable:  # zero-shot models need none
    _require(checkpoint=FLAGS.checkpoint)
  index = build.build_from_checkpoint(FLAGS.config, FLAGS.checkpoint, FLAGS.split, FLAGS.out,
                                      FLAGS.dtype, FLAGS.shard_videos, FLAGS.overwrite,
                                      FLAGS.cross_dataset)
  print(f'{index.path}: {len(index)} videos of model {index.spec.name}, {index.dtype}, '
        f'{index.manifest["bytes_per_video"]} bytes per video.')


def _text_search() -> None:
  """`search --text` / `--queries=FILE.txt`: one JSON line per text, with spans."""
  from prvr_jax.index import text_search  # pylint: disable=g-import-not-at-top
  if FLAGS.candidates:
    raise app.UsageError('--candidates: search by text is exact only; drop --candidates.')
  if FLAGS.text and FLAGS.queries:
    raise app.UsageError('--text and --queries: give one of them.')
  if FLAGS.queries:
    with open(FLAGS.queries, encoding='utf-8') as f:
      lines = [(f'line {i}', line.rstrip('\n')) for i, line in enumerate(f, 1)]
    named = [(name, text) for name, text in lines if text.strip()]
    if not named:
      raise ValueError(f'--queries={FLAGS.queries} holds no query text.')
  else:
    named = [(text, text) for text in FLAGS.text]
  searcher = text_search.TextSearcher(FLAGS.index, FLAGS.clip_weights, FLAGS.verify,
                                      vocab=FLAGS.clip_vocab,
                                      query_batch_size=FLAGS.query_batch_size)
  index = searcher.index
  logging.info('Searching index %s by text', json.dumps(index.provenance(), sort_keys=True))
  k = searcher.check_k(FLAGS.k)
  lines = []
  for start in range(0, len(named), text_search.MAX_QUERIES):
    chunk = named[start:start + text_search.MAX_QUERIES]
    for (name, text), hits in zip(chunk, searcher.search([t for _, t in chunk], k)):
      lines.append(json.dumps(text_search.json_record(name, hits, index.id, text)) + '\n')
  _write_lines(lines)


def _write_lines(lines) -> None:
  if FLAGS.output:
    from prvr_jax import files  # pylint: disable=g-import-not-at-top
    files.write_atomic(FLAGS.output, lambda f: f.writelines(l.encode('utf-8') for l in lines))
  else:
    sys.stdout.writelines(lines)


def _search() -> None:
  from prvr_jax.index import queries as queries_lib  # pylint: disable=g-import-not-at-top
  from prvr_jax.index import search, store  # pylint: disable=g-import-not-at-top
  _require(index=FLAGS.index)
  if not FLAGS.text:
    _require(queries=FLAGS.queries)
  if FLAGS.output:
    _check_output(FLAGS.output, FLAGS.index, FLAGS.queries, FLAGS.candidates)
  if FLAGS.text or FLAGS.queries.lower().endswith('.txt'):
    _text_search()
    return
  index = store.open_index(FLAGS.index, verify=FLAGS.verify)
  logging.info('Searching index %s', json.dumps(index.provenance(), sort_keys=True))
  inputs = index.spec.inputs(index.config_model)[1]
  queries, ids = queries_lib.read_queries(FLAGS.queries, inputs, index.config_model)
  searcher = search.Searcher(index, query_batch_size=FLAGS.query_batch_size)
  if FLAGS.candidates:
    from prvr_jax.index import candidates  # pylint: disable=g-import-not-at-top
    result = searcher.search_two_stage(
        queries, candidates.CandidateIndex.load(FLAGS.candidates, index, FLAGS.verify),
        FLAGS.num_candidates, k=FLAGS.k, query_ids=ids)
  else:
    result = searcher.search(queries, k=FLAGS.k, query_ids=ids)
  lines = (json.dumps({'query': query_id, 'videos': videos,
                       'scores': [round(float(s), 6) for s in scores],
                       'index': index.id}) + '\n'
           for query_id, videos, scores in zip(ids, result.ids, result.scores))
  _write_lines(lines)


def _check_output(output: str, index: str, queries: str | None, candidates: str | None
                  ) -> None:
  """Refuses a --output that is the query file or lies in the index or candidate folder."""
  target = os.path.realpath(output)
  if queries and target == os.path.realpath(queries):
    raise app.UsageError(f'--output={output} is the query file --queries={queries}; choose '
                         'another --output.')
  for flag, folder in (('--index', index), ('--candidates', candidates)):
    if folder and target.startswith(os.path.realpath(folder).rstrip(os.sep) + os.sep):
      raise app.UsageError(f'--output={output} lies in the folder {flag}={folder}; choose '
                           'another --output.')


def _candidates() -> None:
  from prvr_jax.index import candidates, store  # pylint: disable=g-import-not-at-top
  _require(index=FLAGS.index)
  index = store.open_index(FLAGS.index, verify=FLAGS.verify)
  out = FLAGS.out or os.path.join(index.path, 'candidates')
  candidates.CandidateIndex.build(index, FLAGS.kind).save(out)
  print(f'{out}: {FLAGS.kind} candidates of the {len(index)} videos of {index.path}.')


def _info() -> None:
  from prvr_jax.index import store  # pylint: disable=g-import-not-at-top
  _require(index=FLAGS.index)
  index = store.open_index(FLAGS.index, verify=FLAGS.verify)
  manifest = index.manifest
  summary = {k: manifest[k] for k in ('model', 'model_config_hash', 'dtype', 'num_videos',
                                      'bytes_per_video', 'leaves', 'created', 'info')}
  if isinstance(summary['info'].get('videos'), dict):  # per-video durations and paths
    summary['info'] = {**summary['info'], 'videos': f'{len(summary["info"]["videos"])} videos'}
  summary['shards'] = len(manifest['shards'])
  summary['id'] = index.id
  summary['params_fingerprint'] = manifest.get('params_fingerprint')
  summary['verified'] = FLAGS.verify
  print(json.dumps(summary, indent=2, sort_keys=True))


def _main(argv: list[str]) -> None:
  if len(argv) != 2 or argv[1] not in COMMANDS:
    raise app.UsageError(f'Usage: prvr-index {{{",".join(COMMANDS)}}} --flags '
                         f'(got {argv[1:]}).')
  runtime.start()
  {'build': _build, 'search': _search, 'candidates': _candidates, 'info': _info}[argv[1]]()


def main() -> None:
  """The `prvr-index` command."""
  define_flags()
  runtime.run(_main, positional=True)


if __name__ == '__main__':
  main()
