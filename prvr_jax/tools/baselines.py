r"""The reference rankers on a shard folder or the synthetic benchmark (`baselines.evaluate`).

  prvr-baselines --shards=DIR            # a shard folder
  prvr-baselines --synthetic=default     # the synthetic benchmark (generated if needed)

(or python -m prvr_jax.tools.baselines)
"""

from collections.abc import Sequence

from absl import flags

from prvr_jax import baselines
from prvr_jax import runtime
from prvr_jax.data import pipeline
from prvr_jax.data import synthetic


def _main(argv: Sequence[str]) -> None:
  del argv
  fl = flags.FLAGS
  if bool(fl.shards) == bool(fl.synthetic):
    raise flags.ValidationError('pass exactly one of --shards and --synthetic')
  path = fl.shards
  if fl.synthetic:
    path = synthetic.ensure(fl.synthetic, fl.synthetic_dir, seed=fl.seed)
  dataset = pipeline.open_shards(path)
  if fl.split not in dataset.splits:
    raise flags.ValidationError(f'--split={fl.split}: {dataset.manifest_path} has the splits '
                                f'{sorted(dataset.splits)}')
  results = baselines.evaluate(dataset, fl.split)
  print(f'{path} [{fl.split}]  (mean-pooled ridge l2={results["mean_pooled"]["ridge_l2"]:g})')
  print(baselines.format_table(results))


def main() -> None:
  """The `prvr-baselines` command."""
  flags.DEFINE_string('shards', None, 'shard folder')
  flags.DEFINE_enum('synthetic', None, sorted(synthetic.SIZES),
                    'synthetic benchmark size (generated if needed)')
  flags.DEFINE_string('synthetic_dir', '/tmp/prvr_jax_synthetic', 'where to generate it')
  flags.DEFINE_integer('seed', 0, 'synthetic benchmark seed')
  flags.DEFINE_string('split', 'test', 'split to evaluate')
  runtime.run(_main, huge_pages=False)


if __name__ == '__main__':
  main()
