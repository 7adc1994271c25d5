"""Small dataclasses the model returns: internals are returned when asked, never stashed.

Shape legend (used in every model file):
    B batch · S source length · T target (query) length · D d_model · H heads
    M branches (= H) · Dk = D/H · F d_ff · N layers · V vocabulary
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor


@dataclass(frozen=True)
class AttentionInternals:
    """What one attention module computed, for analysis and disagreement regularization."""

    probs: Tensor  # [B, H, T, S]  softmax(QKᵀ/√Dk), before attention dropout
    values: Tensor  # [B, H, S, Dk] per-head value projections V^h
    heads: Tensor  # [B, H, T, Dk] per-head outputs O^h, before the output projection
    kappa: Tensor | None = None  # [M] branch weights in effect (branched/weighted modules)
    alpha: Tensor | None = None  # [M]


@dataclass(frozen=True)
class AttentionOutput:
    out: Tensor  # [B, T, D]
    internals: AttentionInternals | None = None


@dataclass(frozen=True)
class EncoderOutput:
    """The encoded source, ready for the decoder.

    ``memories[j]`` is what decoder layer j attends to: the top encoder layer for every j, or
    the transparent combination z_j (Bapna et al., 2018).
    """

    memories: list[Tensor]  # N_dec × [B, S, D]
    src_pad: Tensor  # [B, S] True at padding
    states: list[Tensor]  # h_0 (embedded source) … h_N (layer outputs), each [B, S, D]
    transparent_weights: Tensor | None = None  # [N+1, N_dec], columns on the simplex
    self_attention: list[AttentionInternals] = field(default_factory=list)


@dataclass(frozen=True)
class ModelInternals:
    """Per-layer attention internals of one forward pass, by module kind."""

    encoder_self: list[AttentionInternals]
    decoder_self: list[AttentionInternals]
    encoder_decoder: list[AttentionInternals]
    src_pad: Tensor  # [B, S] True at padding
    tgt_pad: Tensor  # [B, T] True at padding
    encoder_states: list[Tensor]  # h_0 … h_N
    transparent_weights: Tensor | None = None


@dataclass(frozen=True)
class ModelOutput:
    logits: Tensor  # [B, T, V], or [N, V] at the positions of a logits_at
    internals: ModelInternals | None = None
