r"""Converts Moment-DETR's QVHighlights release into the release layout
(`qvhighlights.build_release`; docs/qvhighlights.md).

  prvr-write-qvhighlights --annotations=moment_detr/data \
      --features=/data/qvhighlights/features --out=/data/prvr

(or python -m prvr_jax.tools.write_qvhighlights). Writes `<out>/qvhighlights/`.
"""

import logging
import os

from absl import flags

from prvr_jax import runtime
from prvr_jax.data import qvhighlights


def _main(argv: list[str]) -> None:
  del argv
  fl = flags.FLAGS
  counts = qvhighlights.build_release(fl.annotations, fl.features, fl.out)
  for name, c in counts.items():
    print(f'{name}: {c.videos} videos, {c.queries} queries, {c.segments} segments, '
          f'{c.clipped_windows} clipped window(s)')
  print(f'wrote {os.path.join(fl.out, qvhighlights.COLLECTION)}; train with: python train.py '
        f'--config=configs/protoprvr.py:qvhighlights --config.data.dir={fl.out} --workdir=DIR')


def main() -> None:
  """The `prvr-write-qvhighlights` command."""
  flags.DEFINE_string('annotations', None, 'folder of highlight_{train,val}_release.jsonl',
                      required=True)
  flags.DEFINE_string('features', None, 'folder of slowfast_features/, clip_features/, '
                      'clip_text_features/', required=True)
  flags.DEFINE_string('out', None, 'new or empty output folder (gets qvhighlights/)',
                      required=True)
  logging.basicConfig(level=logging.INFO)
  runtime.run(_main, huge_pages=False)


if __name__ == '__main__':
  main()
