"""The multi-batch release of the official evaluation parity (tests/fixtures/README.md).

The release is not stored: the fixture generator (outside the repo) and the tests write it
with this function from the same seeded numpy generator, and the fixtures record the
sha256 of its arrays (`release_digest`), so a test can tell a changed release from a
disagreement with the official code.
"""

import hashlib

import numpy as np

# layout -> (collection, seed, visual feature folder, text feature)
LAYOUTS = {
    'token': ('multi', 20260, 'i3d_multi', 'roberta'),  # GMMFormer v1 / v2, MS-SL
    'clip': ('multiclip', 20268, None, 'clip'),          # AMDNet (sentence vectors)
    'long': ('multilong', 20270, 'i3d_multi', 'roberta'),  # MSC-PRVR (every video >= 128 frames)
}
# Fewest frames of a video, by layout (default 8). MSC-PRVR merges a video's frames resampled
# to 128 by the pairs of largest dot product: a shorter video repeats frames, whose tied pairs
# the official code orders by torch's unstable sort.
MIN_FRAMES = {'long': 128}
VISUAL_DIM, QUERY_DIM = 48, 40
NUM_VIDEOS = 64
# Videos 0-5 train, 6-9 val, 10-63 test (54 videos, 1-2 captions each; no split overlap).
SPLITS = {'train': range(0, 6), 'val': range(6, 10), 'test': range(10, NUM_VIDEOS)}
# The official evaluation batch sizes the fixtures were made with (their config fields
# eval_context_bsz / eval_query_bsz): 54 test videos = 2.7 video batches, 80 / 81 test
# captions = 6 query batches.
OFFICIAL_VIDEO_BATCH, OFFICIAL_QUERY_BATCH = 20, 15
# Most frames of a test video, by its official evaluation batch.
FRAME_BOUNDS = (200, 110, 70)


def make_release(layout: str) -> dict:
  """The release's arrays: {'videos': id -> [n, 48], 'captions': split -> [(cap_id, text)]
  in file order, 'features': cap_id -> [tokens, 40] (token layout) or [40] (clip)}.

  Tokens 3..40 per caption (truncation at 30 triggers); caption lines shuffled, so videos
  interleave. Test videos in first-appearance positions 0-19 / 20-39 / 40-53 (the official
  evaluation batches of `OFFICIAL_VIDEO_BATCH`) get 8..200 / 8..110 / 8..70 frames (layout
  'long': every video 128..200 / 128 / 128, `MIN_FRAMES`), so the
  batches' longest videos differ (128 after uniform sampling, then about 110 and 70: GMMFormer
  v1's frame windows follow them); clip averaging to 32 and sampling to 128 both trigger.
  Features are float32 normal with per-column scales 0.1..5 (clip layout: plus a per-video
  offset; not normalised)."""
  collection, seed, _, text_feature = LAYOUTS[layout]
  rng = np.random.default_rng(seed)
  scales = rng.uniform(0.1, 5.0, VISUAL_DIM).astype(np.float32)
  captions, features = {}, {}
  for split, ids in SPLITS.items():
    items = []
    for k in ids:
      for i in range(int(rng.integers(1, 3))):
        cap_id = f'{collection}_v{k:03d}#enc#{i}'
        items.append((cap_id, f'caption {i} of video {k}'))
        shape = (QUERY_DIM,) if text_feature == 'clip' else (int(rng.integers(3, 41)),
                                                              QUERY_DIM)
        features[cap_id] = rng.standard_normal(shape).astype(np.float32)
    order = rng.permutation(len(items))
    captions[split] = [items[i] for i in order]
  test_order = list(dict.fromkeys(c.split('#', 1)[0] for c, _ in captions['test']))
  videos = {}
  for k in range(NUM_VIDEOS):
    video_id = f'{collection}_v{k:03d}'
    position = test_order.index(video_id) if video_id in test_order else 0
    longest = FRAME_BOUNDS[position // OFFICIAL_VIDEO_BATCH]
    shortest = MIN_FRAMES.get(layout, 8)
    frames = rng.standard_normal((int(rng.integers(shortest, max(longest, shortest) + 1)),
                                  VISUAL_DIM))
    frames = frames.astype(np.float32) * scales
    if text_feature == 'clip':
      frames += rng.standard_normal(VISUAL_DIM).astype(np.float32)
    videos[video_id] = frames
  return {'videos': videos, 'captions': captions, 'features': features}


def release_digest(data: dict) -> str:
  """sha256 over the release's ids, caption order and array bytes."""
  h = hashlib.sha256()
  for vid, x in data['videos'].items():
    h.update(vid.encode() + x.tobytes())
  for split, items in data['captions'].items():
    h.update(split.encode() + repr(items).encode())
  for cap_id, x in data['features'].items():
    h.update(cap_id.encode() + x.tobytes())
  return h.hexdigest()


def write(root: str, layout: str) -> tuple[str, str]:
  """Writes the release under `root` (`release.write_release`); returns (its collection
  folder, `release_digest`)."""
  # Imported here: the fixture generator computes `release_digest` in the official code's
  # environment, without prvr_jax.
  from prvr_jax.data import release  # pylint: disable=g-import-not-at-top
  collection, _, visual_feature, text_feature = LAYOUTS[layout]
  data = make_release(layout)
  folder = release.write_release(root, collection, data['videos'], data['captions'],
                                 data['features'], visual_feature=visual_feature,
                                 text_feature=text_feature)
  return folder, release_digest(data)
