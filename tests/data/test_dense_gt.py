"""The dense multi-ground-truth reader: prvr-ea's two files, every bad file refused by name."""

import json
import re

import ml_collections
import numpy as np
import pytest

from prvr_jax.data import dense_gt
from prvr_jax.data.release import DataError

CAPTIONS = """v1#enc#0 a man opens a door
v1#enc#1 a dog runs
v2#enc#0 a door is opened by a man
v3#enc#0 a cat sleeps
"""
GT = [{'query_id': 'v1#enc#0', 'caption': 'a man opens a door', 'gt_video_ids': ['v1', 'v2']},
      {'query_id': 'v3#enc#0', 'gt_video_ids': ['v3']}]


def _write(folder, gt_lines, captions=CAPTIONS, stem='syndenseval'):
  """Writes `<stem>.caption.txt` and `<stem>.gt.jsonl` (dicts as JSON, strings verbatim)."""
  caption_path, gt_path = folder / f'{stem}.caption.txt', folder / f'{stem}.gt.jsonl'
  caption_path.write_text(captions)
  gt_path.write_text(''.join((x if isinstance(x, str) else json.dumps(x)) + '\n'
                             for x in gt_lines))
  return str(caption_path), str(gt_path)


def test_reads_queries_positives_and_candidates(tmp_path):
  caption_path, gt_path = _write(tmp_path, GT[:1] + [''] + GT[1:])  # a blank line is skipped
  dense = dense_gt.read(caption_path, gt_path)
  assert dense.query_ids == ['v1#enc#0', 'v3#enc#0']
  assert dense.positives == [('v1', 'v2'), ('v3',)]
  assert dense.lines == [1, 3]
  assert dense.video_ids == ['v1', 'v2', 'v3']  # the candidates: the caption file's videos
  assert len(dense.sha256['captions']) == len(dense.sha256['ground_truth']) == 64
  # prvr-ea's other key for the list is read too.
  _, gt_path = _write(tmp_path, [{'query_id': 'v3#enc#0', 'video_ids': ['v3', 'v1']}])
  assert dense_gt.read(caption_path, gt_path).positives == [('v3', 'v1')]


@pytest.mark.parametrize('lines,problem', [
    (['{"query_id": "v1#enc#0", "gt_video_ids": ["v1"'], r':1: malformed JSON'),
    ([GT[0], '{"query_id": "v3#enc#0", "gt_video_ids": [NaN]}'], r':2: malformed JSON'),
    (['{"query_id": "v1#enc#0", "query_id": "v2#enc#0", "gt_video_ids": ["v1"]}'],
     r':1: malformed JSON .*appears twice'),
    (['["v1#enc#0", ["v1"]]'], r':1: expected an object'),
    ([{'gt_video_ids': ['v1']}], r':1: no query_id'),
    ([GT[0], GT[1], GT[0]], r":3: query 'v1#enc#0' listed twice \(first on line 1\)"),
    ([{'query_id': 'v1#enc#0', 'gt_video_ids': []}], r":1: query 'v1#enc#0' has no positives"),
    ([{'query_id': 'v1#enc#0'}], r":1: query 'v1#enc#0' has no positives"),
    ([{'query_id': 'v1#enc#0', 'gt_video_ids': 'v1'}], r":1: query 'v1#enc#0' has no positives"),
    ([{'query_id': 'v1#enc#0', 'gt_video_ids': ['v1', 7]}], r":1: query 'v1#enc#0': positive 7 "
     'is not a video id'),
    ([GT[1], {'query_id': 'v1#enc#0', 'gt_video_ids': ['v2', 'v1', 'v2']}],
     r":2: query 'v1#enc#0' lists positive video 'v2' twice"),
    ([{'query_id': 'v1#enc#0', 'gt_video_ids': ['v1', 'v9']}],
     r":1: query 'v1#enc#0': unknown positive video 'v9'"),
    ([{'query_id': 'v2#enc#5', 'gt_video_ids': ['v2']}],
     r":1: dense query 'v2#enc#5' has no caption in .*syndenseval.caption.txt"),
    ([''], r'gt.jsonl: no dense queries'),
])
def test_bad_ground_truth_files_are_refused_naming_file_line_and_query(tmp_path, lines, problem):
  caption_path, gt_path = _write(tmp_path, lines)
  with pytest.raises(DataError) as error:
    dense_gt.read(caption_path, gt_path)
  last = str(error.value).splitlines()[-1]
  assert last.startswith(gt_path), last
  assert re.search(problem, last), last


def test_bad_bytes_long_lines_and_caption_files_are_refused(tmp_path, monkeypatch):
  caption_path, gt_path = _write(tmp_path, GT)
  with open(gt_path, 'ab') as f:
    f.write(b'{"query_id": "v2#enc#0\xff", "gt_video_ids": ["v2"]}\n')
  with pytest.raises(DataError, match=r'gt.jsonl:3: not UTF-8'):
    dense_gt.read(caption_path, gt_path)
  # A line longer than the cap is refused before it is read whole.
  monkeypatch.setattr(dense_gt, 'MAX_LINE_BYTES', 64)
  _, gt_path = _write(tmp_path, [GT[1], {'query_id': 'v1#enc#0', 'gt_video_ids': ['v1'] * 40}])
  with pytest.raises(DataError, match=r'gt.jsonl:2: line longer than 64 bytes'):
    dense_gt.read(caption_path, gt_path)
  # The caption file goes through the release's caption reader (duplicates, missing text).
  caption_path, gt_path = _write(tmp_path, GT, captions=CAPTIONS + 'v1#enc#1 again\n')
  with pytest.raises(DataError, match=r"caption.txt:5: duplicate caption id 'v1#enc#1'"):
    dense_gt.read(caption_path, gt_path)


def test_align_maps_ids_to_split_keys_and_refuses_other_data(tmp_path):
  caption_path, gt_path = _write(tmp_path, GT)
  dense = dense_gt.read(caption_path, gt_path)
  # The split: queries in another order, one more video (v4) that is no candidate.
  caption_ids = ['v3#enc#0', 'v2#enc#0', 'v1#enc#1', 'v1#enc#0', 'v4#enc#0']
  video_ids = ['v3', 'v2', 'v1', 'v4']
  targets = dense_gt.align(dense, caption_ids, video_ids, 'test')
  np.testing.assert_array_equal(targets.rows, [3, 0])
  np.testing.assert_array_equal(targets.columns, [0, 1, 2])  # v3, v2, v1 by key; not v4
  np.testing.assert_array_equal(targets.positives, [[2, 1], [0, -1]])  # v1, v2 | v3
  np.testing.assert_array_equal(targets.own, [2, 0])
  assert targets.positive_ids == [['v1', 'v2'], ['v3']]
  assert targets.files['ground_truth'] == gt_path
  with pytest.raises(DataError, match=r"gt.jsonl:2: dense query 'v3#enc#0' is not a query of "
                                      r"the evaluated split 'test'"):
    dense_gt.align(dense, caption_ids[1:], video_ids, 'test')
  with pytest.raises(DataError, match=r"caption.txt: video 'v2' is not a video of the "
                                      r"evaluated split 'test'"):
    dense_gt.align(dense, caption_ids, ['v3', 'v1', 'v4'], 'test')


def _config(**data):
  config = ml_collections.ConfigDict({'data': {'dir': '', 'collection': 'tvr', 'dense_gt': '',
                                               'dense_captions': ''}})
  config.data.update(data)
  return config


def test_locate_follows_prvr_ea_layout_and_the_flags(tmp_path):
  release = tmp_path / 'tvr'
  (release / 'TextData').mkdir(parents=True)
  with pytest.raises(FileNotFoundError, match=r'tvrdenseval_v.gt.jsonl.*--config.data.dense_gt'):
    dense_gt.locate(_config(dir=str(release)), '')
  in_text_data = _write(release / 'TextData', GT, stem='tvrdenseval_v')
  assert dense_gt.locate(_config(dir=str(release)), '') == in_text_data
  beside = _write(release, GT, stem='tvrdenseval_v')  # the collection folder comes first
  assert dense_gt.locate(_config(dir=str(release)), '') == beside
  assert dense_gt.locate(_config(dir=str(tmp_path)), '') == beside  # a root of collections
  # Other collections: `<collection>denseval`; the synthetic benchmark: the run's data folder.
  synthetic = _write(tmp_path, GT, stem='syntheticdenseval')
  assert dense_gt.locate(_config(collection='synthetic'), str(tmp_path)) == synthetic
  # The flags win; either file alone names its sibling.
  mine = _write(tmp_path, GT, stem='mine')
  assert dense_gt.locate(_config(dir=str(release), dense_gt=mine[1]), '') == mine
  assert dense_gt.locate(_config(dense_captions=mine[0]), '') == mine
  with pytest.raises(FileNotFoundError, match=r'nothere.gt.jsonl does not exist '
                                              r'\(--config.data.dense_gt\)'):
    dense_gt.locate(_config(dense_captions=mine[0], dense_gt=str(tmp_path / 'nothere.gt.jsonl')),
                    '')
  with pytest.raises(ValueError, match=r'--config.data.dense_gt=.*labels.json does not end'):
    dense_gt.locate(_config(dense_gt=str(tmp_path / 'labels.json')), '')
  (release / 'tvrdenseval_v.caption.txt').unlink()
  with pytest.raises(FileNotFoundError, match=r'has no caption file beside it'):
    dense_gt.locate(_config(dir=str(release)), '')
