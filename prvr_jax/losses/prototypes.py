"""ProtoPRVR's prototype terms: masked-token InfoNCE (cross-modal reconstruction), masked MSE
(uni-modal reconstruction), the video-mixing attention guidance and prototype orthogonality."""

import jax
import jax.numpy as jnp

from prvr_jax.losses.masking import masked_logsumexp, masked_mean, upcast
from prvr_jax.ops import l2_normalize


def masked_token_nce(reconstructed: jax.Array, targets: jax.Array, valid: jax.Array,
                     temperature: float = 1.0) -> jax.Array:
  """Eq. 4: InfoNCE of each reconstructed masked token against every masked token of the
  batch, by cosine / temperature; the positive is the token it replaced.

  Args:
    reconstructed: [Q, M, Dq] decoder outputs at the masked positions.
    targets: [Q, M, Dq] the backbone tokens that were masked.
    valid: [Q, M] bool, the masked position is a real token of a valid query.
    temperature: divides the cosines (the paper's Eq. 4: 1).
  Returns:
    Scalar, the mean over valid masked tokens.
  """
  width = targets.shape[-1]
  rec = l2_normalize(upcast(reconstructed)).reshape(-1, width)
  tgt = l2_normalize(upcast(targets)).reshape(-1, width)
  valid = valid.reshape(-1)
  logits = rec @ tgt.T / temperature
  loss = masked_logsumexp(logits, valid[None, :], axis=1) - jnp.diagonal(logits)
  return masked_mean(loss, valid)


def reconstruction_mse(reconstructed: jax.Array, targets: jax.Array,
                       mask: jax.Array) -> jax.Array:
  """Eq. 5: mean squared error over the real positions (and every feature).

  Args:
    reconstructed, targets: [B, L, D].
    mask: [B, L], 1 = a real position of a valid video.
  """
  error = jnp.mean(jnp.square(upcast(reconstructed) - upcast(targets)), axis=-1)
  return masked_mean(error, mask > 0)


def attention_guidance_loss(first_share: jax.Array, first_is_own: jax.Array, valid: jax.Array,
                            margin: float = 0.2) -> jax.Array:
  """Eq. 7: -[L log(a1 + beta) + (1 - L) log(1 - (a1 - beta))], mean over valid entries.

  Args:
    first_share: a1 [...], the retrieved prototype's attention mass on the first video of
      a mixed pair (a2 = 1 - a1 is on the second).
    first_is_own: L [...] bool, the query belongs to the first video.
    valid: [...] bool.
    margin: beta.
  """
  a1 = upcast(first_share)
  loss = -jnp.where(first_is_own, jnp.log(a1 + margin), jnp.log(1.0 - (a1 - margin)))
  return masked_mean(loss, valid)


def orthogonality_loss(prototypes: jax.Array, video_valid: jax.Array) -> jax.Array:
  """Eq. 8: ||max(P P^T, 0) - I||_F / (P (P - 1)) of the L2-normalised prototypes, mean over
  valid videos.

  Args:
    prototypes: [B, P, D].
    video_valid: [B] bool.
  """
  normalized = l2_normalize(upcast(prototypes))
  num = normalized.shape[1]
  overlap = jnp.maximum(jnp.einsum('bpd,bkd->bpk', normalized, normalized), 0.0)
  off_diagonal = overlap - jnp.eye(num)
  # sqrt has an infinite gradient at 0 (orthogonal prototypes): differentiate it where > 0.
  squared = jnp.sum(jnp.square(off_diagonal), axis=(1, 2))
  norm = jnp.where(squared > 0, jnp.sqrt(jnp.where(squared > 0, squared, 1.0)), 0.0)
  return masked_mean(norm / (num * (num - 1)), video_valid)
