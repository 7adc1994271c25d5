"""Where each branch attends: cross-attention maps of translations (paper §4.4 looks at these).

The maps are read from one teacher-forced pass over each source and the translation the
search produced: row t is the attention the decoder paid to the source when it predicted
output token t (the last row predicts EOS). In a Weighted Transformer every head of the
encoder–decoder sublayer is a branch, so each map comes with the κ_i and α_i that weigh the
branch's contribution (eq. 6–7); a Transformer's heads carry none.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from wtnmt.special import BOS, EOS, PAD


@dataclass(frozen=True)
class LayerAttention:
    """One decoder layer's cross-attention for one sentence."""

    maps: Tensor  # [M, T, S]  rows: output tokens + EOS; columns: source tokens + EOS
    kappa: list[float] | None  # [M] the branch weights in effect (None: multi-head attention)
    alpha: list[float] | None


def _padded(seqs: list[list[int]], *, bos: bool, eos: bool) -> Tensor:
    rows = [[BOS] * bos + list(s) + [EOS] * eos for s in seqs]
    out = torch.full((len(rows), max(map(len, rows))), PAD, dtype=torch.long)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return out


@torch.no_grad()
def cross_attention(  # type: ignore[no-untyped-def]
    model, sources: list[list[int]], outputs: list[list[int]], *, device: torch.device
) -> list[list[LayerAttention]]:
    """For each (source ids, output ids) pair, without BOS/EOS: one ``LayerAttention`` per
    decoder layer, its maps cut to the sentence's own lengths (|output|+1 rows, |source|+1
    columns)."""
    if len(sources) != len(outputs):
        raise ValueError(f"{len(sources)} sources but {len(outputs)} outputs")
    if not sources:
        return []
    src = _padded(sources, bos=False, eos=True).to(device)  # [B, S]
    tgt_in = _padded(outputs, bos=True, eos=False).to(device)  # [B, T]
    internals = model(src, tgt_in, need_internals=True).internals
    result: list[list[LayerAttention]] = [[] for _ in sources]
    for layer in internals.encoder_decoder:
        probs = layer.probs.float().cpu()  # [B, H, T, S]
        kappa = None if layer.kappa is None else layer.kappa.float().tolist()
        alpha = None if layer.alpha is None else layer.alpha.float().tolist()
        for i, (s, o) in enumerate(zip(sources, outputs, strict=True)):
            maps = probs[i, :, : len(o) + 1, : len(s) + 1].clone()  # [M, T_i, S_i]
            result[i].append(LayerAttention(maps=maps, kappa=kappa, alpha=alpha))
    return result
