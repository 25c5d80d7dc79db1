"""Evaluation: splits, the generic sharded evaluator, and evaluate.py's checkpoint run.

  evaluator = Evaluator.from_config(config, mesh)
  result = evaluator.evaluate(params, data.eval_split('test'))
"""

from prvr_jax.eval.evaluator import EvalResult, Evaluator, Gallery, text_to_video_ranks
from prvr_jax.eval.run import evaluate_checkpoint, write_outputs
from prvr_jax.eval.splits import EvalSplit

__all__ = ['EvalResult', 'EvalSplit', 'Evaluator', 'Gallery',
           'evaluate_checkpoint', 'text_to_video_ranks', 'write_outputs']
