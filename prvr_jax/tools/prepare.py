r"""Prepares the feature shards of a release (`prepare.prepare_from_config`), after checking it
(`check.check_before_run`).

  prvr-prepare --config=configs/gmmformer_v2.py:tvr \
      --config.data.dir=/data/ms-sl/tvr --out=/data/shards/tvr

(or python -m prvr_jax.tools.prepare). Writes `<out>/manifest.json` and the TFDS folders
beside it; prints each split's counts.
"""

import json
import logging

from absl import flags
from ml_collections import config_flags

from prvr_jax import config_lib
from prvr_jax import runtime
from prvr_jax.data import check
from prvr_jax.data import prepare


def _main(argv: list[str]) -> None:
  del argv
  config, out = flags.FLAGS.config, flags.FLAGS.out
  config_lib.validate(config)
  if not config.data.dir:
    raise flags.ValidationError('set --config.data.dir to the release (collection) folder')
  check.check_before_run(config)
  path = prepare.prepare_from_config(config, out, flags.FLAGS.num_shards,
                                     flags.FLAGS.workers or None)
  with open(path, encoding='utf-8') as f:
    manifest = json.load(f)
  for name, s in manifest['splits'].items():
    print(f'{name}: {s["num_videos"]} videos, {s["num_captions"]} captions, '
          f'{len(s["shards"])} shards, skipped {len(s["skipped"])} bad item(s)')
  print(f'wrote {path}')


def main() -> None:
  """The `prvr-prepare` command."""
  config_flags.DEFINE_config_file('config', None, 'model config file[:dataset]', lock_config=True)
  flags.DEFINE_string('out', None, 'output shard folder', required=True)
  flags.DEFINE_integer('num_shards', 0, 'shards per split; 0 = about 256 MiB each, at least 8')
  flags.DEFINE_integer('workers', 0, 'processes writing shards; 0 = the usable CPUs (at most '
                       f'{prepare.MAX_DEFAULT_WORKERS}), in-process for a small split')
  flags.mark_flag_as_required('config')
  logging.basicConfig(level=logging.INFO)
  runtime.run(_main, huge_pages=False)


if __name__ == '__main__':
  main()
