"""Reusable Flax Linen building blocks for PRVR models."""

from prvr_jax.layers.attention import AttentionBlockV1, AttentionBlockV2, MultiHeadAttention
from prvr_jax.layers.common import AttentionPooling, InputProjection, PositionalEncoding
from prvr_jax.layers.diffusion import DiffusionMLP, RegisterDiffusion
from prvr_jax.layers.encoders import QueryEncoder, SequenceEncoder, VideoBranch
from prvr_jax.layers.gmm_block import AGGREGATIONS, GMMBlock
from prvr_jax.layers.latent_sampler import GPOPooling, VideoLatentSampler
from prvr_jax.layers.lorentz import LorentzAttentionBlock, LorentzLinear
from prvr_jax.layers.lorentz import LorentzMultiHeadAttention, LorentzSelfAttention
from prvr_jax.layers.multiscale import KeyClipGuidedAttention, exhaustive_clips
from prvr_jax.layers.probabilistic import ConfidenceWeightedScores, ProbabilisticEmbedding
from prvr_jax.layers.prototypes import GENERATORS, PerceiverPrototypes, PrototypeCrossAttention
from prvr_jax.layers.prototypes import SlotAttentionPrototypes
from prvr_jax.layers.reconstruction import BroadcastDecoder, MaskedTokenDecoder
from prvr_jax.layers.register_block import RegisterGaussianBlock
from prvr_jax.layers.span_masks import SpanPredictor, span_masks
from prvr_jax.layers.token_merge import merge_adjacent_pairs, merge_bipartite, merge_frames
from prvr_jax.layers.token_merge import resample_frames
from prvr_jax.layers.windows import WINDOW_KINDS, constraint_window, stacked_windows

__all__ = [
    'AGGREGATIONS', 'AttentionBlockV1', 'AttentionBlockV2', 'AttentionPooling',
    'BroadcastDecoder', 'ConfidenceWeightedScores', 'DiffusionMLP', 'GENERATORS', 'GMMBlock',
    'GPOPooling', 'InputProjection', 'KeyClipGuidedAttention', 'LorentzAttentionBlock',
    'LorentzLinear', 'LorentzMultiHeadAttention', 'LorentzSelfAttention', 'MaskedTokenDecoder',
    'MultiHeadAttention', 'PerceiverPrototypes', 'PositionalEncoding', 'ProbabilisticEmbedding',
    'PrototypeCrossAttention', 'QueryEncoder', 'RegisterDiffusion', 'RegisterGaussianBlock',
    'SequenceEncoder', 'SlotAttentionPrototypes', 'SpanPredictor', 'VideoBranch',
    'VideoLatentSampler', 'WINDOW_KINDS',
    'constraint_window', 'exhaustive_clips', 'merge_adjacent_pairs', 'merge_bipartite',
    'merge_frames', 'resample_frames', 'span_masks', 'stacked_windows',
]
