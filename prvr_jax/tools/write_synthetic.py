r"""Writes the synthetic benchmark (`synthetic`): its shard folder, or its release layout.

  prvr-write-synthetic --out DIR --size default --format shards|mssl \
      [--seed 0] [--text_feature roberta|clip]

(or python -m prvr_jax.tools.write_synthetic). Training generates it by itself; this is for
looking at it, or for running `prvr-prepare` / `prvr-check` on its release layout.
"""

import functools
import logging

from absl import flags

from prvr_jax import runtime
from prvr_jax.data import release as release_lib
from prvr_jax.data import synthetic


def _main(argv: list[str]) -> None:
  del argv
  fl = flags.FLAGS
  spec = synthetic.SIZES[fl.size]
  if fl.format == 'mssl':
    path = synthetic.write_mssl(functools.partial(synthetic.generate, spec, fl.seed), fl.out,
                                fl.text_feature)
    print(f'wrote the {fl.text_feature} release layout to {path} '
          f'(--config.data.dir={path} --config.data.collection={synthetic.COLLECTION} '
          f'--config.data.visual_feature={synthetic.VISUAL_FEATURE} '
          f'--config.data.text_feature={fl.text_feature})')
  else:
    synthetic.write_shards(spec, fl.out, fl.seed, text_feature=fl.text_feature)
    print(f'wrote shards to {fl.out}')


def main() -> None:
  """The `prvr-write-synthetic` command."""
  flags.DEFINE_string('out', None, 'output folder', required=True)
  flags.DEFINE_enum('size', 'default', sorted(synthetic.SIZES), 'benchmark size')
  flags.DEFINE_enum('format', 'shards', ['mssl', 'shards'], 'MS-SL release layout or shards')
  flags.DEFINE_integer('seed', 0, 'generator seed')
  flags.DEFINE_enum('text_feature', 'roberta', list(release_lib.TEXT_FEATURES),
                    'token features (MS-SL layout) or sentence vectors (CLIP layout)')
  logging.basicConfig(level=logging.INFO)
  runtime.run(_main, huge_pages=False)


if __name__ == '__main__':
  main()
