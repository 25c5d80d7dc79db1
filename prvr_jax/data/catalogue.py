"""The feature releases the configs use: their layout, feature dims and published split sizes.

One `FeatureRelease` per (collection, layout) a config variant can point `config.data` at;
`lookup(config)` finds it from `config.data.{source, collection, visual_feature,
text_feature}`; `prvr_jax.data.check` compares a release on disk with it. docs/data_check.md
tabulates the entries and quotes the sources, the keys of `FeatureRelease.sources` (papers
in `shared/papers/`, facts in `shared/reference/`):

* [AMDNet] "Datasets": TVR and ActivityNet Captions train / test sizes (the MS-SL partition);
  the same TVR figures are in GMMFormer and GMMFormer v2.
* [GMMFormer] AAAI 2024, "Datasets": the Charades-STA total (6,670 videos, 16,128 sentences).
* [ProtoPRVR] ICCV 2025, appendix: QVHighlights for PRVR (docs/qvhighlights.md).
* [T-MASS] CVPR 2024, "Datasets and Metrics": MSR-VTT (1K-A test), LSMDC test, 12 frames.
* [reference] shared/reference/official_code_gmmformer_amdnet_mssl.md, section 0: the MS-SL
  feature folders and dims, AMDNet's CLIP ViT-B/32 files.
* [readers] docs/text_video_data.md: rows of the official T-MASS annotation files.

Split names are ours; where a converter writes one official split under two names (our `val`
is the test split) the entry expects the same counts for both. A split without published
figures is left out of `splits`; Charades-STA has only a `total` over all caption files.
"""

import dataclasses
from collections.abc import Mapping
from typing import Any


LAYOUTS = ('bigfile', 'clip', 'frames')


@dataclasses.dataclass(frozen=True)
class Count:
  """Videos and captions (queries) of a split."""
  videos: int
  captions: int


@dataclasses.dataclass(frozen=True)
class FeatureRelease:
  """What one release holds, as published (named e.g. 'ms-sl/tvr').

  `layout` is 'bigfile' (BigFile frames + token features), 'clip' (AMDNet's CLIP HDF5 files)
  or 'frames' (annotations and frame folders); `collection`, `visual_feature`,
  `text_feature` are the `config.data` fields naming it; dims are None where nothing is
  stored; `splits` pairs splits with published sizes, `total` counts distinct videos /
  captions over all caption files where only that is known; `frames_per_video` is set where
  fixed; `extra_files` are relative to the collection folder; `sources` cites the module
  docstring's keys.
  """
  name: str
  title: str
  layout: str
  collection: str
  visual_feature: str | None
  text_feature: str
  visual_dim: int | None
  query_dim: int | None
  splits: tuple[tuple[str, Count], ...] = ()
  total: Count | None = None
  frames_per_video: int | None = None
  extra_files: tuple[str, ...] = ()
  sources: str = ''

  def __post_init__(self):
    if self.layout not in LAYOUTS:
      raise ValueError(f'{self.name}: layout must be one of {LAYOUTS}, got {self.layout!r}')

  @property
  def split_counts(self) -> dict[str, Count]:
    return dict(self.splits)

  @property
  def key(self) -> tuple[str, ...]:
    return release_key(self.collection, self.visual_feature, self.text_feature,
                       'frames' if self.layout == 'frames' else 'shards')


def release_key(collection: str, visual_feature: str | None, text_feature: str,
                source: str = 'shards') -> tuple[str, ...]:
  """The catalogue key of `config.data` fields. The CLIP layout has no BigFile, so its
  `visual_feature` does not name it."""
  if source == 'frames':
    return ('frames', collection)
  if text_feature == 'clip':
    return (collection, 'clip')
  return (collection, visual_feature or '', text_feature)


_TVR = (('train', Count(17_435, 87_175)), ('test', Count(2_179, 10_895)))
_ANET = (('train', Count(10_009, 37_421)), ('test', Count(4_917, 17_505)))
_CHARADES_TOTAL = Count(6_670, 16_128)
_QVH = (('train', Count(2_214, 7_218)), ('val', Count(474, 1_550)), ('test', Count(474, 1_550)))
_MSRVTT = (('train', Count(9_000, 180_000)), ('val', Count(1_000, 1_000)),
           ('test', Count(1_000, 1_000)))
_DIDEMO = (('train', Count(8_362, 8_362)), ('val', Count(1_004, 1_004)),
           ('test', Count(1_004, 1_004)))
_LSMDC = (('val', Count(1_000, 1_000)), ('test', Count(1_000, 1_000)))
_TMASS_SOURCES = {
    'msrvtt': '[T-MASS] 20 captions per clip, 1K-A test; [readers] 9k list: 9,000 videos',
    'didemo': '[readers] rows of didemo_{train,test}_label.csv (T-MASS gives only the total, '
              '10,642 clips / 40,543 captions)',
    'lsmdc': '[T-MASS] test: 1,000 videos (no published training-split figure)',
}
_TMASS_TITLES = {'msrvtt': 'MSR-VTT (9k train, 1K-A test)', 'didemo': 'DiDeMo',
                 'lsmdc': 'LSMDC'}


def _entries() -> list[FeatureRelease]:
  out = []
  # The MS-SL release (used unchanged by GMMFormer v1/v2, MS-SL, ProtoPRVR's RoBERTa runs).
  for collection, feature, dv, dq, title, splits, total, sources in (
      ('tvr', 'i3d_resnet', 3072, 768, 'TVR, ResNet152 + I3D, RoBERTa', _TVR, None,
       '[AMDNet], [GMMFormer]; dims [reference]'),
      ('activitynet', 'i3d', 1024, 1024, 'ActivityNet Captions, I3D, RoBERTa', _ANET, None,
       '[AMDNet] (the MS-SL partition); dims [reference]'),
      ('charades', 'i3d_rgb_lgi', 1024, 1024, 'Charades-STA, I3D, RoBERTa', (),
       _CHARADES_TOTAL, '[GMMFormer] (total only); dims [reference]')):
    out.append(FeatureRelease(f'ms-sl/{collection}', f'MS-SL release: {title}', 'bigfile',
                              collection, feature, 'roberta', dv, dq, splits, total,
                              sources=sources))
  # AMDNet's CLIP ViT-B/32 files (the paper reports no Charades result).
  for collection, title, splits in (('tvr', 'TVR', _TVR), ('activitynet', 'ActivityNet', _ANET),
                                    ('charades', 'Charades-STA', ())):
    out.append(FeatureRelease(
        f'amdnet-clip/{collection}', f'AMDNet CLIP ViT-B/32 features: {title}', 'clip',
        collection, None, 'clip', 512, 512, splits,
        sources='[AMDNet]; dims [reference]' if splits else 'dims [reference]; no counts'))
  out.append(FeatureRelease(
      'qvhighlights', 'QVHighlights for PRVR (prvr_jax.data.qvhighlights): SlowFast + CLIP '
      'frames, CLIP text tokens', 'bigfile', 'qvhighlights', 'slowfast_clip', 'clip_text',
      2816, 512, _QVH,
      extra_files=tuple(f'TextData/qvhighlights{s}.moments.txt' for s in ('train', 'val', 'test')),
      sources='[ProtoPRVR]; dims 2304 + 512 and 512 (prvr_jax.data.qvhighlights)'))
  # T-MASS: CLIP features written by `text_video_features.write_feature_release` (12 frames
  # per video), or annotations and frame folders read end to end.
  for collection, splits in (('msrvtt', _MSRVTT), ('didemo', _DIDEMO), ('lsmdc', _LSMDC)):
    title = _TMASS_TITLES[collection]
    out.append(FeatureRelease(
        f'tmass-features/{collection}', f'T-MASS CLIP ViT-B/32 features: {title}', 'clip',
        collection, 'clip_frames', 'clip', 512, 512, splits, frames_per_video=12,
        sources=_TMASS_SOURCES[collection] + '; 12 frames, 512-d [T-MASS]'))
    out.append(FeatureRelease(
        f'tmass-frames/{collection}', f'T-MASS annotations and frames: {title}', 'frames',
        collection, 'clip_frames', 'clip', None, None, splits,
        sources=_TMASS_SOURCES[collection]))
  return out


CATALOGUE: Mapping[tuple[str, ...], FeatureRelease] = {e.key: e for e in _entries()}


def by_name(name: str) -> FeatureRelease:
  """The entry called `name` (e.g. 'ms-sl/tvr')."""
  for entry in CATALOGUE.values():
    if entry.name == name:
      return entry
  raise KeyError(f'no feature release {name!r} in the catalogue; it has '
                 f'{", ".join(e.name for e in CATALOGUE.values())}')


def lookup(config: Any) -> FeatureRelease | None:
  """The entry `config.data` names, or None (a release the catalogue does not know; the
  synthetic benchmark's collection 'synthetic' is none)."""
  data = config.data
  key = release_key(data.get('collection', ''), data.get('visual_feature') or None,
                    data.get('text_feature', 'roberta'), data.get('source', 'shards'))
  return CATALOGUE.get(key)
