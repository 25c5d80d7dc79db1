"""Official PyTorch checkpoints <-> prvr_jax parameters (`convert.checkpoint_to_params_file`,
`convert.params_file_to_torch`).

  prvr-convert --model=gmmformer_v2 --checkpoint=best.ckpt --out=params.msgpack
  prvr-convert --model=gmmformer_v2 --params=params.msgpack --out=state_dict.npz

(or `python -m prvr_jax.tools.convert ...`). Import reads the checkpoint with
`prvr_jax.torch_file` (tensors only, no code from the file); export writes an `.npz`, or a
torch file when torch is installed. `--out` must not be the input file (by any
path or link), and an existing `--out` is replaced only with `--overwrite`.
"""

from absl import flags
import jax

from prvr_jax import convert
from prvr_jax import runtime


def _main(argv: list[str]) -> None:
  del argv
  args = flags.FLAGS
  if bool(args.checkpoint) == bool(args.params):
    raise ValueError('pass exactly one of --checkpoint (torch -> msgpack) and --params '
                     '(msgpack -> torch names)')
  if args.checkpoint:
    params = convert.checkpoint_to_params_file(args.checkpoint, args.model, args.out,
                                               args.overwrite)
    print(f'wrote {args.out}: {sum(x.size for x in jax.tree_util.tree_leaves(params)):,} '
          f'{args.model} parameters')
  else:
    state_dict = convert.params_file_to_torch(args.params, args.model, args.out, args.overwrite)
    print(f'wrote {args.out}: {len(state_dict)} official {args.model} tensors')


def main() -> None:
  """The `prvr-convert` command."""
  flags.DEFINE_enum('model', None, convert.convertible_models(), 'model name', required=True)
  flags.DEFINE_string('checkpoint', None, 'official best.ckpt or state_dict file to convert')
  flags.DEFINE_string('params', None, 'flax msgpack params to export to torch names')
  flags.DEFINE_string('out', None, '.msgpack (import); .npz or a torch file (export)',
                      required=True)
  flags.DEFINE_bool('overwrite', False, 'replace an existing --out (never the input file)')
  runtime.run(_main, huge_pages=False)


if __name__ == '__main__':
  main()
