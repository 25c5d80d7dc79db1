"""RAL's training objective (as coded): GMMFormer v2's (the two-branch retrieval terms, focal
QDL v2, optimal matching) + proxy_matching * L_PM + distribution_alignment * L_DA of the two
Gaussians of each video (`prvr_jax.losses.ral`; weights `config.loss.proxy_matching`,
`config.loss.distribution_alignment`, official 4e-3 and 2.5e-4). The last two are the
probabilistic plug-in's terms (`prvr_jax.models.probabilistic.probabilistic_terms`), which
`two_branch.make_objective` adds after the model's own.
"""

from prvr_jax.models import two_branch

objective = two_branch.make_objective(two_branch.diversity_and_matching)
