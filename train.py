r"""Trains a PRVR model; resumes from --workdir; tests the best checkpoint at the end.

  python train.py --config=configs/gmmformer_v2.py:tvr --config.data.dir=/data/tvr \
      --workdir=/tmp/gmmformer_v2_tvr

The checkout's entry point of `prvr-train` (`prvr_jax.tools.train`). Multi-host: pass
--coordinator_address/--num_processes/--process_id on every process, or --multihost where JAX
detects the cluster (TPU pods, SLURM, ...). See docs/training.md.
"""

from prvr_jax.tools import train

if __name__ == '__main__':
  train.main()
