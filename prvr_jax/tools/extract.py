r"""CLIP features of your own videos (`prvr-extract`, or `python -m prvr_jax.tools.extract`).

  # A folder of video files and/or frame folders -> /feats/mine in AMDNet's CLIP layout:
  prvr-extract --videos=/data/my_videos --out=/feats --collection=mine \
      --clip_weights=/weights/clip/ViT-B-32.state_dict.pt
  # A list of paths (one per line), 2 rows per second, frame folders extracted at 5 fps:
  prvr-extract --videos=list.txt --out=/feats --collection=mine \
      --clip_weights=/weights/clip/model.safetensors --fps=2 --frames_fps=5
  # Caption splits (`<video_id>#<n> <caption>` lines) -> TextData, to train and evaluate on it:
  prvr-extract --out=/feats --collection=mine --clip_weights=/weights/clip/ViT-B-32.state_dict.pt \
      --captions=train:train.txt --captions=val:val.txt --captions=test:test.txt
  # A test run with a random-initialised tiny CLIP (no weights needed):
  prvr-extract --videos=/tmp/videos --out=/tmp/feats --collection=test --clip_weights=random:tiny

Writes <out>/<collection>/FeatureData/new_clip_vit_32_<collection>_vid_features.hdf5,
thumbnails/<video_id>.jpg and extract_manifest.json (docs/extract.md). Run the same command
again to resume an interrupted extraction; --restart starts over. Files that cannot be read
are skipped and listed at the end (and in the manifest's "skipped"); the exit status is 0
when the run finished, whatever it skipped.
"""

import os

from absl import app
from absl import flags

from prvr_jax import runtime

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The flags of prvr-extract and `runtime.define_flags`'s."""
  from prvr_jax.data import extract  # pylint: disable=g-import-not-at-top
  flags.DEFINE_string('videos', None, 'A folder of video files and frame folders, or a text '
                      'file listing their paths (one per line, relative to its folder).')
  flags.DEFINE_string('out', None, 'The folder the collection folder is written in (nothing '
                      'outside it is written).')
  flags.DEFINE_string('collection', None, 'The collection name: <out>/<collection>/.')
  flags.DEFINE_string(
      'clip_weights', None, 'A CLIP weights file (OpenAI / open_clip state dict .pt / .bin / '
      '.safetensors, or Hugging Face CLIPModel model.safetensors; OpenAI\'s released file names '
      'are verified by their published sha256), or random:<backbone>[:<seed>] (backbone tiny, '
      'ViT-B/32, ViT-B/16) for tests and throughput runs.')
  flags.DEFINE_float('fps', extract.DEFAULT_FPS, 'Feature rows per second of video.')
  flags.DEFINE_float('frames_fps', extract.DEFAULT_FRAMES_FPS,
                     'The rate at which the images of frame folders were extracted.')
  flags.DEFINE_integer('batch_size', extract.DEFAULT_BATCH_SIZE,
                       'Frames per encoder batch (rounded up to a multiple of the devices).')
  flags.DEFINE_bool('restart', False, 'Discard an earlier (finished or interrupted) extraction '
                    'of this collection and start over; only files prvr-extract wrote are '
                    'removed.')
  flags.DEFINE_bool('progress', True, 'Show a progress bar (stderr).')
  flags.DEFINE_multi_string(
      'captions', None, 'split:path of a caption file (`<video_id>#<n> <caption>` lines), '
      'repeated per split: writes the collection\'s TextData (caption files and CLIP sentence '
      'vectors from the same weights) so that it trains and evaluates like a release. Without '
      '--videos: added to an extracted collection.')
  flags.DEFINE_string('clip_vocab', None, 'CLIP\'s BPE vocabulary for --captions (default '
                      'PRVR_CLIP_VOCAB or open_clip\'s copy).')
  runtime.define_flags()


def _main(argv: list[str]) -> None:
  del argv
  from prvr_jax.data import extract  # pylint: disable=g-import-not-at-top
  from prvr_jax.data import frames  # pylint: disable=g-import-not-at-top
  required = ('out', 'collection', 'clip_weights') + (() if FLAGS.captions else ('videos',))
  missing = [f'--{name}' for name in required if not FLAGS[name].value]
  if missing:
    raise app.UsageError(f'{", ".join(missing)} required.')
  # The compilation cache only where --compilation_cache_dir asks: nothing outside --out.
  cache = FLAGS.compilation_cache_dir
  runtime.start(cache if cache is not None else '')
  frames.keep_tf_off_accelerators()
  try:
    captions = extract.parse_captions_flag(FLAGS.captions or [])
    weights = extract.load_weights(FLAGS.clip_weights)
    if FLAGS.videos:
      result = extract.extract(FLAGS.videos, FLAGS.out, FLAGS.collection, FLAGS.clip_weights,
                               fps=FLAGS.fps, frames_fps=FLAGS.frames_fps,
                               batch_size=FLAGS.batch_size, restart=FLAGS.restart,
                               progress=FLAGS.progress, weights=weights)
      print(extract.summary(result))
    if captions:
      counts = extract.add_captions(os.path.join(FLAGS.out, FLAGS.collection), captions,
                                    FLAGS.clip_weights, weights=weights, vocab=FLAGS.clip_vocab)
      print('captions: ' + ', '.join(f'{split} {n}' for split, n in counts.items()))
  except extract.ExtractError as e:
    raise app.UsageError(str(e)) from None


def main() -> None:
  """The `prvr-extract` command."""
  define_flags()
  runtime.run(_main, huge_pages=False)


if __name__ == '__main__':
  main()
