"""Disagreement regularization of attention heads (Li et al., 2018, §3.2).

For one attention module with H heads, at each real (non-padding) position:

    subspace  D_sub = −(1/H²) Σ_i Σ_j cos(V^i, V^j)          V^h: value projection at a key
    position  D_pos = −(1/H²) Σ_i Σ_j Σ_k A^i_{qk} A^j_{qk}   A^h: attention row of a query
    output    D_out = −(1/H²) Σ_i Σ_j cos(O^i, O^j)          O^h: head output at a query

Both cosine sums are computed as ‖Σ_i n_i‖² with n_i the unit vectors (no H×H matrix), and
the position sum as Σ_k (Σ_i A^i_{qk})². Each value lies in [−1, 0]: −1 when all heads agree,
−1/H when heads are orthogonal (cosines) or attend to disjoint positions.

How terms are averaged (Li et al. leave it open; this is the choice wtnmt makes):
- over positions: the mean over all real positions of the batch (every token of every
  sentence counts once, padding never), so the term does not depend on batch composition;
- over layers and module kinds: the mean over every selected module (each layer of each of
  encoder_self, decoder_self, encoder_decoder that the config names);
- over terms: the selected terms are summed, as in Li et al.'s combinations (Table 1).
The training loss is then  loss = NLL − λ·D  (maximising log-likelihood + λ·D).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor

from wtnmt.model.outputs import AttentionInternals, ModelInternals

TERMS = ("subspace", "position", "output")
MODULE_KINDS = ("encoder_self", "decoder_self", "encoder_decoder")


def _masked_mean(values: Tensor, pad: Tensor | None) -> Tensor:
    """Mean of values [B, L] over positions where pad [B, L] is False."""
    if pad is None:
        return values.mean()
    keep = (~pad).to(values.dtype)
    return (values * keep).sum() / keep.sum().clamp_min(1.0)


def _cosine_agreement(vectors: Tensor) -> Tensor:
    """(1/H²) Σ_i Σ_j cos(x^i, x^j) per position: vectors [B, H, L, Dk] → [B, L]."""
    h = vectors.size(1)
    summed = F.normalize(vectors, dim=-1).sum(dim=1)  # [B, L, Dk] = Σ_i x^i/‖x^i‖
    return summed.pow(2).sum(-1) / h**2


def subspace_disagreement(values: Tensor, key_pad: Tensor | None) -> Tensor:
    """values [B, H, S, Dk], key_pad [B, S] True at padding → scalar D_sub."""
    return -_masked_mean(_cosine_agreement(values), key_pad)


def output_disagreement(heads: Tensor, query_pad: Tensor | None) -> Tensor:
    """heads [B, H, T, Dk], query_pad [B, T] True at padding → scalar D_out."""
    return -_masked_mean(_cosine_agreement(heads), query_pad)


def position_disagreement(probs: Tensor, query_pad: Tensor | None) -> Tensor:
    """probs [B, H, T, S] (rows on the simplex), query_pad [B, T] → scalar D_pos."""
    h = probs.size(1)
    agreement = probs.sum(dim=1).pow(2).sum(-1) / h**2  # [B, T]
    return -_masked_mean(agreement, query_pad)


def module_disagreement(
    internals: AttentionInternals,
    term: str,
    *,
    query_pad: Tensor | None,
    key_pad: Tensor | None,
) -> Tensor:
    if term == "subspace":
        return subspace_disagreement(internals.values, key_pad)
    if term == "position":
        return position_disagreement(internals.probs, query_pad)
    if term == "output":
        return output_disagreement(internals.heads, query_pad)
    raise ValueError(f"unknown disagreement term {term!r}: expected one of {TERMS}")


def _modules(internals: ModelInternals, kind: str):  # type: ignore[no-untyped-def]
    """(module internals, query padding, key padding) of every layer of one kind."""
    src, tgt = internals.src_pad, internals.tgt_pad
    pads = {"encoder_self": (src, src), "decoder_self": (tgt, tgt), "encoder_decoder": (tgt, src)}
    if kind not in pads:
        raise ValueError(f"unknown attention module kind {kind!r}: expected one of {MODULE_KINDS}")
    query_pad, key_pad = pads[kind]
    return [(m, query_pad, key_pad) for m in getattr(internals, kind)]


def disagreement(
    internals: ModelInternals, *, terms: Iterable[str], modules: Iterable[str]
) -> Tensor:
    """D of one forward pass: per term the mean over the selected modules, summed over terms."""
    selected = [entry for kind in modules for entry in _modules(internals, kind)]
    total = internals.src_pad.new_zeros((), dtype=torch.float32)
    for term in terms:
        if not selected:
            break
        values = [module_disagreement(m, term, query_pad=qp, key_pad=kp) for m, qp, kp in selected]
        total = total + torch.stack(values).float().mean()
    return total


def disagreement_scores(internals: ModelInternals) -> dict[str, dict[str, list[float]]]:
    """Every term for every module and layer (Li et al., Tables 4–5): kind → term → [layer]."""
    scores: dict[str, dict[str, list[float]]] = {}
    with torch.no_grad():
        for kind in MODULE_KINDS:
            entries = _modules(internals, kind)
            scores[kind] = {
                term: [
                    float(module_disagreement(m, term, query_pad=qp, key_pad=kp))
                    for m, qp, kp in entries
                ]
                for term in TERMS
            }
    return scores
