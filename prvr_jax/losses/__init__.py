"""Loss terms as pure functions on the batch contract, grouped by kind and shared by every model.

* `contrastive` -- multi-positive InfoNCE (`clip_nce`) and its paired form (`paired_nce`).
* `ranking` -- the bidirectional triplet loss with random / hard negatives (`triplet_loss`,
  `paired_triplet_loss`).
* `query_diversity` -- GMMFormer's query diverse losses (v1, focal v2), DreamPRVR's query
  similarity preservation.
* `matching` -- GMMFormer v2's optimal matching loss and the Hungarian host callback.
* `moments` -- AMDNet's moment diversity and moment relevance.
* `prototypes` -- ProtoPRVR's masked-token InfoNCE, reconstruction MSE, attention guidance and
  prototype orthogonality.
* `evidential` -- Holmes's Dirichlet (EDL) risks, their Dempster-Shafer combination, the label
  calibration and the intra-video EDL.
* `partial_ot` -- Holmes's partial optimal transport (a dustbin row, log-domain Sinkhorn):
  per-query pseudo labels over a video's clips.
* `ral` -- RAL's proxy matching and distribution alignment of Gaussian embeddings.
* `stochastic` -- T-MASS's symmetric cross-entropy of pooled cosine logits, support target.
* `relational` -- relational knowledge distillation (distance- and angle-wise; MSC-PRVR's
  text correlation preservation).
* `alignment` -- MSC-PRVR's adaptive cross-branch video alignment (frames against the clips
  that hold them, merged by the clips' redundancy).
* `masking` -- the masked reductions they are written with.

A model's
objective (`prvr_jax/models/<name>/objective.py`) weights and sums these terms.
"""

from prvr_jax.losses.alignment import alignment_stages, cross_branch_alignment
from prvr_jax.losses.contrastive import clip_nce, paired_nce
from prvr_jax.losses.matching import device_assignment, hungarian_assignment
from prvr_jax.losses.matching import optimal_matching_loss
from prvr_jax.losses.moments import moment_diversity_loss, moment_relevance_loss
from prvr_jax.losses.partial_ot import holmes_partial_ot
from prvr_jax.losses.prototypes import attention_guidance_loss, masked_token_nce
from prvr_jax.losses.prototypes import orthogonality_loss, reconstruction_mse
from prvr_jax.losses.query_diversity import query_diverse_loss_v1, query_diverse_loss_v2
from prvr_jax.losses.query_diversity import query_similarity_preservation_loss
from prvr_jax.losses.ral import distribution_alignment_loss, proxy_matching_loss
from prvr_jax.losses.relational import rkd_angle, rkd_distance
from prvr_jax.losses.ranking import paired_triplet_loss, triplet_loss, triplet_negatives
from prvr_jax.losses.stochastic import pooled_logits, support_targets, symmetric_cross_entropy

__all__ = ['alignment_stages', 'attention_guidance_loss', 'clip_nce', 'cross_branch_alignment',
           'device_assignment', 'distribution_alignment_loss', 'holmes_partial_ot',
           'hungarian_assignment', 'masked_token_nce', 'moment_diversity_loss',
           'moment_relevance_loss', 'optimal_matching_loss', 'orthogonality_loss', 'paired_nce',
           'paired_triplet_loss', 'pooled_logits', 'proxy_matching_loss',
           'query_diverse_loss_v1', 'query_diverse_loss_v2',
           'query_similarity_preservation_loss', 'reconstruction_mse', 'rkd_angle',
           'rkd_distance', 'support_targets', 'symmetric_cross_entropy', 'triplet_loss',
           'triplet_negatives']
