"""GMMFormer v2's training objective (as coded): the two-branch retrieval terms plus
qdl * focal QDL v2 and om * optimal matching, both of the second query encoding
(`two_branch.diversity_and_matching`).

`config.loss.om = 0` leaves the optimal matching term (and its host callback) out.
"""

from prvr_jax.models import two_branch

objective = two_branch.make_objective(two_branch.diversity_and_matching)
