"""What training checks of its data beyond the data layer's own checks."""

import ml_collections

from prvr_jax.data import protocol


def check_matching_bound(config: ml_collections.ConfigDict, data: protocol.RunData) -> None:
  """Raises where `loss.om_solver='device'` would meet a training video with more captions
  than `model.num_clips` (the device solver matches at most that many queries per video)."""
  most = data.max_captions_per_video
  if (config.loss.get('om_solver', 'host') != 'device' or not config.loss.get('om', 0)
      or most is None):
    return
  if most > config.model.num_clips:
    raise ValueError(
        f'--config.loss.om_solver=device matches at most config.model.num_clips='
        f'{config.model.num_clips} captions per video, but a video of split '
        f'{data.batching.split("train")!r} of {data.dir} has {most}. '
        'Use --config.loss.om_solver=host.')
