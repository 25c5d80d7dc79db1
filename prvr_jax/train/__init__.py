"""Training: state and optimiser (`state`), the jitted step (`step`), the batch stream
(`data`), metric logs (`logs`) and the epoch loop (`loop`). Checkpoints live one level below,
in `prvr_jax.checkpoint`, shared with evaluation.
"""

from prvr_jax import lazy_exports
from prvr_jax.train.logs import NonFiniteLossError
from prvr_jax.train.state import TrainState, abstract_train_state, create_train_state
from prvr_jax.train.state import make_optimizer
from prvr_jax.train.step import make_train_step

__all__ = ['NonFiniteLossError', 'TrainState', 'abstract_train_state', 'create_train_state',
           'make_optimizer', 'make_train_step', 'train_and_evaluate']
__getattr__ = lazy_exports(__name__, {'train_and_evaluate': 'loop'})  # tf.data
