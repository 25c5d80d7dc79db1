"""Holmes (ICML 2026) as coded in the official implementation (`src/`).

GMMFormer v2's model with another mixing in its GMM blocks. Query branch: projection ->
positional encoding -> v2 attention block -> attention pooling. Clip branch (32 clips) and
frame branch (padded to 128 frames): projection -> positional encoding -> one GMM block of 8
windowed v2 blocks (Gaussian widths None, 2^-1, 2^0, ..., 2^5) mixed per position by a
cross-attention from the mean of their outputs (`GMMBlock(aggregation='mean_consolidation')`,
the official `DyGMMBlock`). Padded frames are zeroed after encoding.
Scores: S_c = max over clips, S_f = max over frames (cosine; raw dot for InfoNCE);
eval S = 0.6 S_c + 0.4 S_f. The learnable `weight_token` is kept (the official model holds it
and its checkpoints store it) but unused, as officially.
"""

from prvr_jax.models.gmmformer_v2.model import GMMFormerV2

# The official `DyGMMBlock` windows: plain attention, then 2^i for i = -1..5.
WIDTHS = (None,) + tuple(2.0**i for i in range(-1, 6))


class Holmes(GMMFormerV2):
  """Attributes mirror `config.model` (see configs/holmes.py); GMMFormer v2's with Holmes's
  defaults."""
  widths: tuple[float | None, ...] = WIDTHS
  aggregation: str = 'mean_consolidation'
  clip_score_weight: float = 0.6
  frame_score_weight: float = 0.4
