"""Constraint windows that rescale attention logits (GMMFormer's "Gaussian blocks").

A window is a `[Lq, Lk]` matrix multiplied element-wise into the attention logits before the
key mask and the softmax (it does not add a log-prior: distant logits shrink towards 0).

Kinds (`docs/paper_vs_code.md` explains where each comes from):
  * `gaussian` -- as in the official code: query centres `i / L`, key positions
    `linspace(0, 1, L)`, `sigma = max(width, 0.01) / 9`, each row divided by its maximum.
  * `gaussian_paper` -- the papers' Eq. 7: `exp(-(j - i)^2 / width) / (2 pi)` in frame
    index units, `width` being the variance.
  * `bartlett`, `boxcar` -- the papers' ablations, on the official grid with the Gaussian's
    3-sigma half width `width / 3`: a triangle / a flat window, row-max normalised.
A width of `None` means plain attention (a window of ones).
"""

from collections.abc import Sequence
import math

import jax.numpy as jnp

WINDOW_KINDS = ('gaussian', 'gaussian_paper', 'bartlett', 'boxcar')


def _grid(size: int, length) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
  """Query centres `[..., size, 1]`, key positions `[..., 1, size]`, valid keys `[..., 1, size]`.

  `length` (None, a scalar or an array `[...]`) is the sequence length the official code
  would see; positions at or beyond it are padding (their keys are masked anyway).
  """
  index = jnp.arange(size, dtype=jnp.float32)
  if length is None:
    length = jnp.float32(size)
  length = jnp.asarray(length, jnp.float32)[..., None, None]
  centres = index[:, None] / length
  positions = index[None, :] / jnp.maximum(length - 1.0, 1.0)
  valid_keys = index[None, :] < length
  return centres, positions, valid_keys


def _row_max_normalise(window: jnp.ndarray, valid_keys: jnp.ndarray) -> jnp.ndarray:
  window = jnp.where(valid_keys, window, 0.0)
  row_max = jnp.max(window, axis=-1, keepdims=True)
  return jnp.where(row_max > 0, window / jnp.where(row_max > 0, row_max, 1.0), window)


def constraint_window(kind: str, width: float | None, size: int, length=None) -> jnp.ndarray:
  """One window of `kind` and `width` for a sequence padded to `size`.

  Args:
    kind: one of `WINDOW_KINDS`.
    width: the window width (variance for `gaussian_paper`); None gives ones.
    size: the static (padded) sequence length.
    length: optional true length(s) `[...]` used for the official normalised grid
      (GMMFormer v1 sizes its frame windows by the padded batch length); default `size`.
  Returns:
    `[..., size, size]` float32.
  """
  if kind not in WINDOW_KINDS:
    raise ValueError(f'Unknown window kind {kind!r}; expected one of {WINDOW_KINDS} '
                     '(config.model.window).')
  batch_shape = () if length is None else jnp.shape(length)
  if width is None:
    return jnp.ones(batch_shape + (size, size), jnp.float32)
  if kind == 'gaussian_paper':
    index = jnp.arange(size, dtype=jnp.float32)
    window = jnp.exp(-jnp.square(index[None, :] - index[:, None]) / width) / (2 * math.pi)
    return jnp.broadcast_to(window, batch_shape + (size, size))
  centres, positions, valid_keys = _grid(size, length)
  distance = positions - centres
  if kind == 'gaussian':
    sigma = max(width, 0.01) / 9.0
    window = jnp.exp(-jnp.square(distance) / (2 * sigma**2))
  else:
    half_width = max(width, 0.01) / 3.0
    if kind == 'bartlett':
      window = jnp.maximum(1.0 - jnp.abs(distance) / half_width, 0.0)
    else:
      window = (jnp.abs(distance) <= half_width).astype(jnp.float32)
  return _row_max_normalise(window, valid_keys)


def stacked_windows(kind: str, widths: Sequence[float | None], size: int,
                    length=None) -> jnp.ndarray:
  """Windows for K parallel branches: `[K, ..., size, size]`."""
  return jnp.stack([constraint_window(kind, w, size, length) for w in widths])
