"""MS-SL's training objective (as coded): clip_nce * NCE + triplet on the multi-scale clips,
frame_nce * paired NCE + paired triplet on the `[Q, Q]` KCGA matrices, plus GMMFormer v2's
L_div / L_om as plug-ins (`config.loss.qdl`, `config.loss.om`; 0 = off, the official model).
"""

from prvr_jax.models import two_branch

objective = two_branch.make_objective(two_branch.diversity_and_matching, paired_frames=True)
