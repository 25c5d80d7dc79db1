"""Training: state and optimiser (`state`), the jitted step (`step`), the batch stream
(`data`), metric logs (`logs`) and the epoch loop (`loop`). Checkpoints live one level below,
in `prvr_jax.checkpoint`, shared with evaluation.
"""

from typing import Any

from prvr_jax.train.logs import NonFiniteLossError
from prvr_jax.train.state import TrainState, abstract_train_state, create_train_state
from prvr_jax.train.state import make_model_optimizer
from prvr_jax.train.step import make_train_step

__all__ = ['NonFiniteLossError', 'TrainState', 'abstract_train_state', 'create_train_state',
           'make_model_optimizer', 'make_train_step', 'train_and_evaluate']


def __getattr__(name: str) -> Any:
  # The epoch loop reads data through tf.data: imported on first use, so that the state, the
  # step and the optimiser work without TensorFlow.
  if name == 'train_and_evaluate':
    from prvr_jax.train.loop import train_and_evaluate  # pylint: disable=g-import-not-at-top
    return train_and_evaluate
  raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
