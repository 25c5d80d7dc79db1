"""`benchmarks/startup.py` reads the first step's time and the train step's compile from the log
lines JAX and the training loop write."""

import sys

import pytest

import support

sys.path.insert(0, str(support.REPO / 'benchmarks'))
import startup  # pylint: disable=g-import-not-at-top,wrong-import-position

from prvr_jax.train import logs  # pylint: disable=g-import-not-at-top,wrong-import-position


def test_parse_log_reads_the_step_and_the_first_step_line():
  lines = [
      (1.0, 'W1128 pjit.py:526] Finished tracing init for jit in 0.500000000 sec'),
      (2.0, 'W1128 pxla.py:1514] Finished XLA compilation of jit(init) in 1.250000000 sec'),
      (3.0, 'W1128 pjit.py:526] Finished tracing step for jit in 2.100000000 sec'),
      (4.0, 'W1128 pxla.py:734] Finished jaxpr to MLIR module conversion jit(step) in '
            '0.900000000 sec'),
      (5.0, "I1128 host_callback_cache.py:108] Persistent compilation cache hit for 'jit_step' "
            '(host callbacks)'),
      (6.0, 'W1128 pxla.py:1514] Finished XLA compilation of jit(step) in 0.400000000 sec'),
      (7.5, f'I1128 logs.py:160] {logs.FIRST_STEP_LOG} step 1 done, 8.1 s after the process '
            'started.'),
      (9.0, 'W1128 pxla.py:1514] Finished XLA compilation of jit(evaluate) in 5.0 sec'),
  ]
  parsed = startup.parse_log(lines)
  assert parsed.pop('compiles_s') == pytest.approx(1.65, rel=1e-9)
  assert parsed == {'first_step_s': 7.5, 'process_age_s': 8.1, 'trace_s': 2.1, 'lower_s': 0.9,
                    'compile_s': 0.4, 'cache_hit': True}
  # No first step (a failed run): its figures are None, the compiles it logged are kept.
  cold = startup.parse_log(lines[:2])
  assert cold['first_step_s'] is None and cold['compile_s'] is None and not cold['cache_hit']
  assert cold['compiles_s'] == pytest.approx(1.25, rel=1e-9)
