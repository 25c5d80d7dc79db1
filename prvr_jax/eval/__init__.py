"""Evaluation: splits, the generic sharded evaluator, and the outputs of an evaluation.

  evaluator = Evaluator.from_config(config, mesh)
  result = evaluator.evaluate(params, data.eval_split('test'))
"""

from prvr_jax.eval.evaluator import EvalResult, Evaluator, Gallery, text_to_video_ranks
from prvr_jax.eval.outputs import write_outputs
from prvr_jax.eval.splits import EvalSplit

__all__ = ['EvalResult', 'EvalSplit', 'Evaluator', 'Gallery', 'text_to_video_ranks',
           'write_outputs']
