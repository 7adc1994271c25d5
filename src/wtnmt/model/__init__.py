"""The Transformer and the Weighted Transformer (Ahmed, Keskar & Socher, 2017)."""

from wtnmt.model.branch_weights import (
    BranchWeights,
    branch_weight_table,
    branch_weights_overridden,
    chosen_branch_weights,
    named_branch_weights,
    override_branch_weights,
    project_branch_weights,
)
from wtnmt.model.build import build_like, build_model
from wtnmt.model.outputs import (
    AttentionInternals,
    AttentionOutput,
    EncoderOutput,
    ModelInternals,
    ModelOutput,
)
from wtnmt.model.packed import decoding_mode, quantize_decoding
from wtnmt.model.simplex import project_simplex
from wtnmt.model.transformer import DecoderCache, Seq2Seq, count_parameters, real_positions

__all__ = [
    "AttentionInternals",
    "AttentionOutput",
    "BranchWeights",
    "DecoderCache",
    "EncoderOutput",
    "ModelInternals",
    "ModelOutput",
    "Seq2Seq",
    "branch_weight_table",
    "branch_weights_overridden",
    "build_like",
    "build_model",
    "chosen_branch_weights",
    "count_parameters",
    "decoding_mode",
    "named_branch_weights",
    "override_branch_weights",
    "project_branch_weights",
    "project_simplex",
    "quantize_decoding",
    "real_positions",
]
