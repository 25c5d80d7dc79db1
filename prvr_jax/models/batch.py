"""Batches in the batch contract (docs/design.md) for initialisation, tests and benchmarks."""

from typing import Any

import numpy as np

VIDEO_INPUTS = ('clip_feats', 'frame_feats', 'frame_mask')
QUERY_INPUTS = ('query_feats', 'query_mask')


def example_batch(config_model: Any, num_videos: int = 2,
                  queries_per_video: int = 1) -> dict[str, np.ndarray]:
  """A training batch of zeros with the static shapes of `config.model` (all items valid)."""
  num_queries = num_videos * queries_per_video
  f32 = np.float32
  lc, lf, lq = config_model.num_clips, config_model.max_frames, config_model.max_query_len
  return {
      'clip_feats': np.zeros((num_videos, lc, config_model.visual_dim), f32),
      'frame_feats': np.zeros((num_videos, lf, config_model.visual_dim), f32),
      'frame_mask': np.ones((num_videos, lf), f32),
      'video_valid': np.ones((num_videos,), bool),
      'video_seed': np.arange(num_videos, dtype=np.int32),
      'query_feats': np.zeros((num_queries, lq, config_model.query_dim), f32),
      'query_mask': np.ones((num_queries, lq), f32),
      'query_valid': np.ones((num_queries,), bool),
      'query_video': np.repeat(np.arange(num_videos, dtype=np.int32), queries_per_video),
  }


def random_batch(config_model: Any, rng: np.random.Generator, frame_lengths: tuple[int, ...],
                 query_lengths: tuple[int, ...], queries_per_video: int = 1
                 ) -> dict[str, np.ndarray]:
  """`example_batch` with standard-normal features, zeroed past each video's frame length and
  each query's token length (masks to match). One entry of `frame_lengths` per video, of
  `query_lengths` per query."""
  batch = example_batch(config_model, len(frame_lengths), queries_per_video)
  if len(query_lengths) != len(batch['query_video']):
    raise ValueError(f'{len(query_lengths)} query lengths for {len(batch["query_video"])} '
                     'queries')
  for key in ('clip_feats', 'frame_feats', 'query_feats'):
    batch[key] = rng.normal(size=batch[key].shape).astype(np.float32)
  for feats, mask, lengths in (('frame_feats', 'frame_mask', frame_lengths),
                               ('query_feats', 'query_mask', query_lengths)):
    batch[mask] = (np.arange(batch[mask].shape[1])[None]
                   < np.asarray(lengths)[:, None]).astype(np.float32)
    batch[feats] *= batch[mask][..., None]
  return batch
