"""Official preprocessing: values against the official functions (fixture), and quirks."""

import numpy as np
import pytest

import support
from prvr_jax.data import preprocess

FIXTURE = str(support.FIXTURES / 'preprocess_official.npz')
# float64 pipelines cast to float32 (L2-normalized, O(1)): at most an ulp apart from the
# official arrays.
CAST_RTOL = support.f32_rtol(1)


@pytest.fixture(scope='module')
def official():
  return np.load(FIXTURE)


def test_average_to_fixed_length_matches_official_float32(official):
  # The official function pools a float32 array with torch.mean (float32), which sums in
  # another order: means of up to ~31 frames (n = 1000), relative to the features' magnitude.
  for n in official['ns']:
    x = official[f'x_{n}']
    got = preprocess.average_to_fixed_length(x, 32)
    assert got.shape == (32, x.shape[1]) and got.dtype == np.float32
    support.assert_close(got, official[f'avg32_{n}'], rtol=support.f32_rtol(32),
                         err_msg=f'n={n}')


def test_uniform_feature_sampling_matches_official_float32(official):
  # np.mean in float32: same summation order (row by row, in order; no products, so no FMA),
  # so the result is bit-exact on every CPU.
  for n in official['ns']:
    x = official[f'x_{n}']
    got = preprocess.uniform_feature_sampling(x, 128)
    assert got.shape == (min(n, 128), x.shape[1])
    np.testing.assert_array_equal(got, official[f'uni32_{n}'], err_msg=f'n={n}')


def test_official_video_pipeline_is_float64_then_float32(official):
  # The official BigFile yields Python floats: pooling and L2 norm run in float64,
  # the collate casts to float32. Reproduced here from the bare functions.
  assert str(official['rawdtype_1']) == 'torch.float64'
  for n in official['ns']:
    x = official[f'x_{n}'].astype(np.float64)
    clips = preprocess.l2_normalize(preprocess.average_to_fixed_length(x, 32)).astype(np.float32)
    frames = preprocess.l2_normalize(preprocess.uniform_feature_sampling(x, 128)).astype(np.float32)
    support.assert_close(clips, official[f'clips_{n}'], rtol=CAST_RTOL, err_msg=f'n={n}')
    support.assert_close(frames, official[f'frames_{n}'], rtol=CAST_RTOL, err_msg=f'n={n}')


def test_official_query_pipeline(official):
  for n in official['ntok']:
    got = preprocess.l2_normalize(preprocess.truncate_tokens(official[f't_{n}'], 30))
    assert got.shape == (min(n, 30), official[f't_{n}'].shape[1]) and got.dtype == np.float32
    # float32 L2 normalization (norms over 6 features): O(1) values.
    support.assert_close(got, official[f'tok_{n}'], rtol=support.f32_rtol(6), err_msg=f'n={n}')


def test_segment_bounds_round_half_to_even_and_clip():
  starts, ends = preprocess.segment_bounds(33, 32)
  # 16 * 33 / 32 = 16.5 rounds to 16 (half to even), 32 * 33 / 32 = 33 clips to 32.
  assert starts[16] == 16 and ends[15] == 16
  assert ends[-1] == 32 and starts[0] == 0
  starts, ends = preprocess.segment_bounds(1, 32)
  assert (starts == 0).all() and (ends == 0).all()
  # 3 * 10 / 4 = 7.5 -> 8, 1 * 10 / 4 = 2.5 -> 2.
  np.testing.assert_array_equal(preprocess.segment_bounds(10, 4)[1], [2, 5, 8, 9])


@pytest.mark.parametrize('n', [64, 192])
def test_last_frame_is_never_averaged(n):
  x = np.zeros((n, 3), np.float32)
  x[-1] = 1e6
  assert np.abs(preprocess.average_to_fixed_length(x, 32)).max() == 0
  if n > 128:  # uniform sampling pools only longer videos
    assert np.abs(preprocess.uniform_feature_sampling(x, 128)).max() == 0


def test_empty_segment_takes_the_start_frame():
  x = np.arange(5, dtype=np.float32)[:, None]
  got = preprocess.average_to_fixed_length(x, 8)[:, 0]
  # edges round(k*5/8) = 0 1 1 2 2 3 4 4 4 (last clipped to 4).
  np.testing.assert_array_equal(got, [0, 1, 1, 2, 2, 3, 4, 4])


def test_uniform_sampling_is_identity_up_to_max_len():
  x = np.ones((128, 2), np.float32)
  assert preprocess.uniform_feature_sampling(x, 128) is x
  assert preprocess.uniform_feature_sampling(np.ones((129, 2)), 128).shape == (128, 2)
  assert preprocess.uniform_feature_sampling(np.ones((500, 2)), None).shape == (500, 2)


def test_dtype_is_preserved():
  x = np.random.default_rng(0).normal(size=(50, 4))
  assert preprocess.average_to_fixed_length(x).dtype == np.float64
  assert preprocess.uniform_feature_sampling(x, 16).dtype == np.float64
  assert preprocess.l2_normalize(x.astype(np.float32)).dtype == np.float32


def test_l2_normalize_adds_eps_to_the_norm():
  x = np.array([[3.0, 4.0], [0.0, 0.0]])
  np.testing.assert_allclose(preprocess.l2_normalize(x), [[3 / 5.00001, 4 / 5.00001], [0, 0]], rtol=1e-12)


def test_truncate_tokens():
  x = np.ones((40, 3))
  assert preprocess.truncate_tokens(x, 30).shape == (30, 3)
  assert preprocess.truncate_tokens(x[:5], 30).shape == (5, 3)


@pytest.mark.parametrize('bad', [np.zeros((0, 4)), np.zeros(4), np.zeros((2, 3, 4))])
def test_bad_shapes_raise(bad):
  with pytest.raises(ValueError, match='average_to_fixed_length'):
    preprocess.average_to_fixed_length(bad)
