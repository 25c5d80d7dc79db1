r"""Checks a feature release against its catalogue entry before a long run (`check`).

  prvr-check --config=configs/ms_sl.py:tvr --config.data.dir=/data/prvr/tvr

(or python -m prvr_jax.tools.check). Prints the report ending in its verdict (docs/data_check.md)
and exits 1 when there are problems.
"""

import sys

from absl import flags
from ml_collections import config_flags

from prvr_jax import runtime
from prvr_jax.data import check


def _main(argv: list[str]) -> None:
  del argv
  fl = flags.FLAGS
  # --[no]catalogue when given, else the config's `data.check_published` (as `prepare` and
  # `train.py` read it).
  published = fl.config.data.get('check_published', True)
  kwargs = dict(use_catalogue=published if fl.catalogue is None else fl.catalogue,
                record=fl.record or None)
  if fl.cheap:
    report = check.cheap_check(fl.config, **kwargs)
  else:
    report = check.check_release(fl.config, update_record=fl.update_record,
                                 progress=fl.progress, **kwargs)
  print(report.format())
  sys.exit(0 if report.ok else 1)


def main() -> None:
  """The `prvr-check` command."""
  config_flags.DEFINE_config_file('config', None, 'model config file[:variant], e.g. '
                                  'configs/ms_sl.py:tvr', lock_config=True)
  flags.DEFINE_string('record', '', 'checksum record (default: <collection folder>/'
                      f'{check.CHECKSUMS_FILE})')
  flags.DEFINE_bool('update_record', False, 'replace the checksum record with the current '
                    'checksums')
  flags.DEFINE_bool('catalogue', None, 'compare with the catalogue entry of the config '
                    '(published dims and split sizes); --nocatalogue for a release of your own '
                    '(default: --config.data.check_published)')
  flags.DEFINE_bool('cheap', False, 'only the cheap part: no feature value read, no checksum')
  flags.DEFINE_bool('progress', True, 'show a progress bar on stderr')
  flags.mark_flag_as_required('config')
  runtime.run(_main, huge_pages=False)


if __name__ == '__main__':
  main()
