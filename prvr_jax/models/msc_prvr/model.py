"""MSC-PRVR (Moon et al., NeurIPS 2025) as coded in the official implementation.

GMMFormer v2's model (query branch, TC-GMM clip and frame branches sharing the learnable
token) with three changes:

* The clip branch reads 32 **merged** tokens instead of 32 averaged segments: the video's 128
  frames merged by neighbour pairs 128 -> 80 -> 52 -> 32 (`layers.token_merge.merge_frames`,
  the official data loader's order-preserving token merging), l2-normalised; each token's
  size (frames merged into it) enters the branches' attention as a log-size logit bias
  (proportional attention).
* The frame branch reads the frames resampled to exactly 128 (`resample_frames`: the official
  `average_to_fixed_length`, which repeats frames of a shorter video), no padding.
* `vproj_clip`, one Linear(D, D), projects the encoded clips and frames for the cross-branch
  alignment loss only.

The merged tokens are built inside the model from `frame_feats`, so every data source serves
it; a batch that holds `clip_sizes [B, 32]` (and, for training, `frame_clip [B, 128]`) gives
the tokens as they are (`clip_feats`, the official loader's outputs; the parity fixtures).
Scores: S_c = max over clips, S_f = max over frames (cosine; raw dot for InfoNCE);
eval S = 0.4 S_c + 0.6 S_f. Queries are encoded once per step (no second encoding).
"""

from collections.abc import Mapping

import jax
import jax.numpy as jnp

from prvr_jax.layers.attention import dense
from prvr_jax.layers.token_merge import merge_frames, resample_frames
from prvr_jax.models.gmmformer_v2.model import GMMFormerV2
from prvr_jax.models.spec import Batch

# The official data loader's l2 normalisation adds this to the norm.
INPUT_EPS = 1e-5
# Keys of a batch that carries the merged clip tokens itself.
GIVEN_TOKENS = ('clip_sizes', 'frame_clip')
# The official loader's merging rounds: 128 frames -> 80 -> 52 -> 32 clips.
OFFICIAL_MERGE = (80, 52, 32)


def input_normalize(x: jax.Array) -> jax.Array:
  """`x / (||x|| + 1e-5)` over the last axis: the official loader's `l2_normalize_np_array`."""
  return x / (jnp.sqrt(jnp.sum(x * x, axis=-1, keepdims=True)) + INPUT_EPS)


def last_tokens(query_feats: jax.Array, query_mask: jax.Array) -> jax.Array:
  """`[Q, Lq, Dq], [Q, Lq] -> [Q, Dq]`: each query's feature at its last real token (the
  official `encode_clip_query`)."""
  last = jnp.maximum(jnp.sum(query_mask, axis=1).astype(jnp.int32) - 1, 0)
  return jnp.take_along_axis(query_feats, last[:, None, None], axis=1)[:, 0]


class MSCPRVR(GMMFormerV2):
  """Attributes mirror `config.model` (see configs/msc_prvr.py); GMMFormer v2's plus:

  Attributes:
    merge_targets: token counts of the rounds of neighbour-pair merging of the `max_frames`
      frames, ending at `num_clips`; empty: the official 80, 52, 32 for 128 frames and 32
      clips, otherwise rounds that halve the count (each round merges at most every pair).
    normalize_inputs: l2-normalise (eps 1e-5 added to the norm) the frames after merging and
      resampling, and the query tokens, here: the official loader's order, for data read
      without normalisation (`data.normalize=False`), where the tokens merge the raw frames
      as officially. False: the data are normalised already (the merge then ranks cosines).
  """
  max_query_len: int = 77
  clip_score_weight: float = 0.4
  frame_score_weight: float = 0.6
  merge_targets: tuple[int, ...] = ()
  normalize_inputs: bool = False

  def setup(self):
    super().setup()
    self.vproj_clip = dense(self.hidden_dim, 'vproj_clip')

  def merge_cascade(self) -> tuple[int, ...]:
    """The token counts of the merging rounds (`merge_targets`, or its default)."""
    targets = tuple(self.merge_targets)
    if not targets:
      if (self.max_frames, self.num_clips) == (128, 32):
        targets = OFFICIAL_MERGE
      else:
        count = self.max_frames
        while count > self.num_clips:
          count = max(self.num_clips, -(-count // 2))
          targets += (count,)
    counts = (self.max_frames,) + targets
    if counts[-1] != self.num_clips or any(
        n % 2 or not n // 2 <= m < n for n, m in zip(counts, counts[1:])):
      raise ValueError(f'config.model.merge_targets={targets}: each round merges an even count '
                       f'of tokens into at least half of them, from max_frames={self.max_frames}'
                       f' to num_clips={self.num_clips}')
    return targets

  def clip_tokens(self, videos: Batch) -> dict[str, jax.Array]:
    """The clip branch's input tokens `clip_inputs [B, 32, Dv]`, their `clip_sizes [B, 32]`,
    each frame's token `frame_clip [B, 128]` and the frame branch's `frames [B, 128, Dv]`,
    `frame_mask [B, 128]`: given by the batch (`GIVEN_TOKENS`) or built from its frames."""
    frame_feats, frame_mask = videos['frame_feats'], videos['frame_mask']
    if frame_feats.shape[1] != self.max_frames:
      raise ValueError(f'MSC-PRVR expects frames padded to {self.max_frames} '
                       f'(config.model.max_frames); got {frame_feats.shape[1]}')
    if 'clip_sizes' in videos:
      num = frame_feats.shape[0]
      frame_clip = videos.get('frame_clip', jnp.zeros((num, self.max_frames), jnp.int32))
      return {'clip_inputs': videos['clip_feats'], 'clip_sizes': videos['clip_sizes'],
              'frame_clip': frame_clip, 'frames': frame_feats, 'frame_mask': frame_mask}
    frames = jax.vmap(resample_frames)(frame_feats, frame_mask)
    cascade = self.merge_cascade()
    tokens, sizes, labels = jax.vmap(lambda f: merge_frames(f, cascade))(frames)
    if self.normalize_inputs:
      frames = input_normalize(frames)
    return {'clip_inputs': input_normalize(tokens), 'clip_sizes': sizes, 'frame_clip': labels,
            'frames': frames, 'frame_mask': jnp.ones(frames.shape[:2], frames.dtype)}

  def query_tokens(self, queries: Batch) -> jax.Array:
    """`query_feats [Q, Lq, Dq]`, normalised here with `normalize_inputs`."""
    feats = queries['query_feats']
    return input_normalize(feats) if self.normalize_inputs else feats

  def encode_queries(self, queries: Batch, deterministic: bool = True) -> jax.Array:
    """A query batch (`query_feats [Q, Lq, Dq]`, `query_mask [Q, Lq]`) -> `[Q, D]`."""
    return self.query(self.query_tokens(queries), queries['query_mask'], deterministic)

  def __call__(self, batch: Batch, deterministic: bool = True) -> dict[str, jax.Array]:
    """`TwoBranchModel`'s training forward plus `teacher [Q, Dq]`: each query's (input)
    feature at its last real token, the target of the text correlation preservation."""
    out = super().__call__(batch, deterministic)
    return {**out, 'teacher': last_tokens(self.query_tokens(batch), batch['query_mask'])}

  def _encode(self, videos: Batch, deterministic: bool) -> dict[str, jax.Array]:
    tokens = self.clip_tokens(videos)
    clips = self.clip(tokens['clip_inputs'], None, None, self.weight_token, deterministic,
                      key_bias=jnp.log(tokens['clip_sizes']))
    mask = tokens['frame_mask']
    frames = self.frame(tokens['frames'], mask, None, self.weight_token, deterministic)
    return {'clips': clips, 'frames': frames * mask[..., None],
            **{k: tokens[k] for k in ('clip_inputs', 'clip_sizes', 'frame_clip')}}

  def encode_videos(self, videos: Batch, deterministic: bool = True) -> dict[str, jax.Array]:
    """`frame_feats [B, 128, Dv]`, `frame_mask [B, 128]` (or the given tokens) ->
    {'clips': `[B, 32, D]`, 'frames': `[B, 128, D]`}, with text mass also `key [B]`."""
    return self.stored_form(self.training_videos(videos, deterministic))

  def training_videos(self, videos: Batch, deterministic: bool) -> dict[str, jax.Array]:
    """`encode_videos`' encodings plus the clip tokens the alignment loss reads."""
    return self.with_key(self._encode(videos, deterministic), videos)

  def stored_form(self, encoded: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """The training encodings without the clip tokens."""
    return {k: v for k, v in encoded.items() if k not in ('clip_inputs', 'clip_sizes',
                                                          'frame_clip')}

  def auxiliary_queries(self, batch: Batch, videos: Mapping[str, jax.Array],
                        deterministic: bool) -> jax.Array:
    """MSC-PRVR encodes its queries once: no second encoding (`[Q, 0]`; its losses read none)."""
    del videos, deterministic
    return jnp.zeros((batch['query_feats'].shape[0], 0), batch['query_feats'].dtype)

  def extra_outputs(self, videos: Mapping[str, jax.Array], out: Mapping[str, jax.Array],
                    deterministic: bool) -> dict[str, jax.Array]:
    """The alignment loss's inputs: `clip_proj [B, 32, D]`, `frame_proj [B, 128, D]`
    (`vproj_clip` of the encodings) and the clip tokens (`clip_inputs`, `clip_sizes`,
    `frame_clip`)."""
    del out, deterministic
    return {'clip_proj': self.vproj_clip(videos['clips']),
            'frame_proj': self.vproj_clip(videos['frames']),
            **{k: videos[k] for k in ('clip_inputs', 'clip_sizes', 'frame_clip')}}
