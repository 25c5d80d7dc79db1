r"""Evaluates a checkpoint (ours or an official PyTorch one) on the val or test split.

  python evaluate.py --config=configs/gmmformer_v2.py:tvr --config.data.dir=/data/tvr \
      --checkpoint=/tmp/gmmformer_v2_tvr --split=test --output_dir=/tmp/eval
  python evaluate.py --config=configs/gmmformer_v2.py:tvr --config.data.dir=/data/tvr \
      --checkpoint=/path/to/official/best.ckpt
  python evaluate.py --config=configs/gmmformer_v2.py:tvr --config.data.dir=/data/tvr \
      --index=/idx/tvr_test       # a built index of the split (prvr-index build)

The checkout's entry point of `prvr-evaluate` (`prvr_jax.tools.evaluate`, which says what it
writes). Multi-host flags as train.py.
"""

from prvr_jax.tools import evaluate

if __name__ == '__main__':
  evaluate.main()
