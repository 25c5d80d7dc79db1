"""Text-video frames in (`frame_dataset`): a `tf.data` pipeline of (video frames, tokenized
caption) pairs of a `text_video.TextVideoSplit` from folders of frame images
(`<frames_root>/<video_id>/*.jpg`), with CLIP preprocessing inside the pipeline
(`prvr_jax.data.frames`); pairs in `text_video.pair_order`."""

import os
import re
from collections.abc import Callable, Iterator

import numpy as np
import tensorflow as tf

from prvr_jax.data import frames as frames_lib
from prvr_jax.data import text_video
from prvr_jax.data.release import MAX_LISTED, DataError
from prvr_jax.files import listing


def _tokens(tokenize: Callable[[list[str]], np.ndarray], texts: list[str]) -> np.ndarray:
  tokens = np.asarray(tokenize(texts))
  if tokens.ndim != 2 or tokens.shape[0] != len(texts) or tokens.dtype.kind not in 'iu':
    raise ValueError(f'tokenize(texts) must return integers [len(texts)={len(texts)}, '
                     f'context_len], got {tokens.dtype} {tokens.shape}')
  limits = np.iinfo(np.int32)
  if tokens.size and (tokens.min() < limits.min or tokens.max() > limits.max):
    raise ValueError('tokenize(texts) returned token ids outside int32')
  return tokens.astype(np.int32)


class FrameBatches:
  """(video, caption) pairs of `split` as batches, one pair per caption (the official items).

  Iterating yields numpy dicts (docs/text_video_data.md):

    frames        [B, num_frames, size, size, 3] float32, CLIP-normalised
    tokens        [B, context_len] int32, `tokenize([text, ...])` rows
    video_index   [B] int32, the video's index in `split.video_ids` (-1: padding)
    caption_index [B] int32, the caption's index in `split.captions` (-1: padding)
    valid         [B] bool, False for padding pairs

  `frames_root` holds `<video_id>/` frame folders; `tokenize` maps texts to int token ids
  `[N, context_len]` (the CLIP tokenizer); `mode` samples frames ('uniform' or 'rand');
  `train_augment` takes T-MASS's training transform instead of the evaluation one; `shuffle`
  permutes the pairs every epoch, seeded by `seed` (as are 'rand' sampling and augmentation);
  `num_epochs=None` repeats forever; the last partial batch of an epoch is dropped
  (`drop_remainder`) or filled with padding pairs; `size` is the crop side. Attributes:
  `dataset` (the `tf.data.Dataset`), `num_examples` (pairs per epoch), `batches_per_epoch`,
  `frame_files` (video_id -> its frame image paths).
  """

  def __init__(self, split: text_video.TextVideoSplit, frames_root: str, *,
               tokenize: Callable[[list[str]], np.ndarray], batch_size: int,
               num_frames: int = frames_lib.NUM_FRAMES, mode: str = 'uniform',
               train_augment: bool = False, shuffle: bool = False, seed: int = 0,
               num_epochs: int | None = 1, drop_remainder: bool = False,
               size: int = frames_lib.CLIP_SIZE, num_parallel_calls: int = tf.data.AUTOTUNE):
    text_video.check_batching(batch_size, num_epochs, len(split.captions), drop_remainder,
                              f'split {split.name!r}')
    if mode not in frames_lib.SAMPLE_MODES:
      raise ValueError(f'mode must be one of {frames_lib.SAMPLE_MODES}, got {mode!r}')
    if num_frames < 1 or size < 1:
      raise ValueError(f'num_frames and size must be >= 1, got {num_frames}, {size}')
    frames_lib.keep_tf_off_accelerators()
    self.split = split
    self.batch_size, self.num_epochs = batch_size, num_epochs
    self.num_frames, self.mode, self.size = num_frames, mode, size
    self.tokens = _tokens(tokenize, [t for _, _, t in split.captions])
    self.video_index = split.caption_video_index()
    self.frame_files = self._list_frames(split, os.fspath(frames_root))
    n = len(split.captions)
    self.num_examples = n
    self.batches_per_epoch = text_video.pair_steps(n, batch_size, drop_remainder)
    self._shuffle, self._seed, self._drop = shuffle, seed, drop_remainder
    self.dataset = self._build(train_augment, num_parallel_calls)

  @staticmethod
  def _list_frames(split: text_video.TextVideoSplit, root: str) -> dict[str, list[str]]:
    if not os.path.isdir(root):
      raise FileNotFoundError(f'frames root {root} does not exist')
    out, missing = {}, []
    for vid in split.video_ids:
      folder = os.path.join(root, vid)
      if not os.path.isdir(folder):
        missing.append(f'video {vid}: {folder}')
        continue
      out[vid] = frames_lib.list_frame_files(folder, vid)
    if missing:
      raise FileNotFoundError(
          f'{len(missing)} of {len(split.video_ids)} videos of {split.dataset} split '
          f'{split.name!r} have no frame folder <frames_root>/<video_id>:\n'
          f'{listing(missing, limit=MAX_LISTED)}')
    return out

  def __len__(self) -> int:
    """Batches in all (`num_epochs` epochs); raises for an endless stream."""
    if self.num_epochs is None:
      raise TypeError('an endless stream (num_epochs=None) has no length')
    return self.batches_per_epoch * self.num_epochs

  def _examples(self) -> Iterator[tuple]:
    """One epoch after another: (paths [T], video_index, caption_index, tokens, seed, valid)."""
    t = self.num_frames
    blank = ([b''] * t, -1, -1, np.zeros_like(self.tokens[0]), np.zeros(2, np.int64), False)
    epoch = 0
    while self.num_epochs is None or epoch < self.num_epochs:
      order = text_video.pair_order(self.num_examples, self.batch_size, shuffle=self._shuffle,
                                    seed=self._seed, epoch=epoch, drop_remainder=self._drop)
      rng = np.random.default_rng([self._seed, epoch, 1])
      for c in order:
        if c < 0:
          yield blank
          continue
        v = int(self.video_index[c])
        vid = self.split.video_ids[v]
        paths = self.frame_files[vid]
        idx = frames_lib.sample_frame_indices(len(paths), t, self.mode, rng, video=vid)
        seed = rng.integers(0, 2**31 - 1, size=2, dtype=np.int64)
        yield [paths[i].encode() for i in idx], v, int(c), self.tokens[c], seed, True
      epoch += 1

  def _build(self, train_augment: bool, num_parallel_calls: int) -> tf.data.Dataset:
    t, size = self.num_frames, self.size
    context = self.tokens.shape[1]
    signature = (tf.TensorSpec([t], tf.string), tf.TensorSpec([], tf.int32),
                 tf.TensorSpec([], tf.int32), tf.TensorSpec([context], tf.int32),
                 tf.TensorSpec([2], tf.int64), tf.TensorSpec([], tf.bool))
    ds = tf.data.Dataset.from_generator(self._examples, output_signature=signature)

    def decode(paths):
      return frames_lib.decode_frames([p.decode() for p in paths.numpy()])

    def load(paths, video_index, caption_index, tokens, seed, valid):
      def read():
        x = tf.py_function(decode, [paths], tf.uint8)
        x.set_shape([t, None, None, 3])
        if train_augment:
          return frames_lib.clip_train_augment(x, seed, size)
        return frames_lib.clip_preprocess(x, size)

      frames = tf.cond(valid, read, lambda: tf.zeros([t, size, size, 3], tf.float32))
      return {'frames': frames, 'tokens': tokens, 'video_index': video_index,
              'caption_index': caption_index, 'valid': valid}

    ds = ds.map(load, num_parallel_calls=num_parallel_calls, deterministic=True)
    return ds.batch(self.batch_size, drop_remainder=True).prefetch(2)

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    it = self.dataset.as_numpy_iterator()
    while True:
      try:
        batch = next(it)
      except StopIteration:
        return
      except tf.errors.OpError as e:
        found = re.search(r'(?:DataError|FileNotFoundError): (.+)', e.message)
        if found:
          raise DataError(found.group(1)) from None
        raise
      yield batch


frame_dataset = FrameBatches  # the pipeline's entry point
