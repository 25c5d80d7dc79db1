"""Evaluation: splits, the generic sharded evaluator, and the outputs of an evaluation.

  evaluator = Evaluator.from_config(config, mesh)
  result = evaluator.evaluate(params, data.eval_split('test'))
"""

from prvr_jax.eval.evaluator import DenseResult, EvalResult, Evaluator, Gallery
from prvr_jax.eval.evaluator import dense_results, text_to_video_ranks
from prvr_jax.eval.outputs import write_outputs
from prvr_jax.eval.splits import DenseTargets, EvalSplit

__all__ = ['DenseResult', 'DenseTargets', 'EvalResult', 'EvalSplit', 'Evaluator', 'Gallery',
           'dense_results', 'text_to_video_ranks', 'write_outputs']
