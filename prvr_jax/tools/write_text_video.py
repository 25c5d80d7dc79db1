r"""Writes precomputed CLIP features of a text-video dataset (MSR-VTT, DiDeMo, LSMDC) as a
release (`text_video_features.write_feature_release`; docs/text_video_data.md).

  prvr-write-text-video --dataset=msrvtt --annotations=T-MASS/data/MSRVTT \
      --frame_features=frames.h5 --text_features=text.h5 --out=/data/release

(or python -m prvr_jax.tools.write_text_video). Writes `<out>/<collection>/`.
"""

import logging
import os

from absl import flags

from prvr_jax import runtime
from prvr_jax.data import frames as frames_lib
from prvr_jax.data import text_video
from prvr_jax.data import text_video_features


def parse_splits(text: str) -> dict[str, str]:
  """'train=train,val=test,test=test' -> {ours: official}."""
  out = {}
  for item in text.split(','):
    ours, sep, theirs = item.strip().partition('=')
    if not sep or not ours or not theirs:
      raise ValueError(f'--splits={text!r}: expected ours=official pairs separated by commas, '
                       'e.g. train=train,val=test,test=test')
    out[ours] = theirs
  return out


def _main(argv: list[str]) -> None:
  del argv
  fl = flags.FLAGS
  kwargs = {'train_file': fl.msrvtt_train} if fl.dataset == 'msrvtt' else {}
  splits = text_video.read_splits(fl.dataset, fl.annotations, parse_splits(fl.splits), **kwargs)
  collection = fl.collection or fl.dataset
  counts = text_video_features.write_feature_release(
      splits, fl.frame_features, fl.text_features, fl.out, collection,
      num_frames=fl.num_frames, dim=fl.dim)
  for name, c in counts.items():
    print(f'{name} ({splits[name].name}): {c.videos} videos, {c.captions} captions, '
          f'{c.short_videos} with fewer than {fl.num_frames} frames')
  print(f'wrote {os.path.join(fl.out, collection)}; read it with release.Release('
        f'{fl.out!r}, {collection!r}, {text_video.VISUAL_FEATURE!r}, '
        f'{text_video.TEXT_FEATURE!r})')


def main() -> None:
  """The `prvr-write-text-video` command."""
  flags.DEFINE_enum('dataset', None, list(text_video.DATASETS), 'which dataset', required=True)
  flags.DEFINE_string('annotations', None, 'folder of the official annotation files '
                      '(T-MASS data/MSRVTT, data/Didemo, data/LSMDC)', required=True)
  flags.DEFINE_string('frame_features', None, 'HDF5: video_id -> [n_frames, dim] CLIP image '
                      'features', required=True)
  flags.DEFINE_string('text_features', None, 'HDF5: caption_id -> [dim] CLIP sentence '
                      'features', required=True)
  flags.DEFINE_string('out', None, 'release root (gets <collection>/)', required=True)
  flags.DEFINE_string('collection', None, 'collection name (default: the dataset)')
  flags.DEFINE_string('splits', 'train=train,val=test,test=test',
                      'our split = official split, comma separated')
  flags.DEFINE_enum('msrvtt_train', '9k', sorted(text_video.MSRVTT_TRAIN),
                    'MSR-VTT training list')
  flags.DEFINE_integer('num_frames', frames_lib.NUM_FRAMES, 'frames kept per video')
  flags.DEFINE_integer('dim', text_video.CLIP_DIM, 'CLIP feature dim')
  logging.basicConfig(level=logging.INFO)
  runtime.run(_main, huge_pages=False)


if __name__ == '__main__':
  main()
