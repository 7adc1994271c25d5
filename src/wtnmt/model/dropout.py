"""Dropout whose mask is cheap to draw on CPU.

``torch.bernoulli_`` draws one 32-bit number per element from the CPU generator; on 2 cores
F.dropout over a [4,000 tokens, 256] activation took 6.9 ms. Here each element takes 16 random
bits (one 64-bit draw yields four) and is kept where they lie at or above round(p · 2¹⁶): the
drop probability is p rounded to a multiple of 2⁻¹⁶ (0.1 → 0.100006), and kept values are
scaled by the inverse of the exact keep probability, so that E[dropout(x)] = x still holds.
The same dropout took 2.4 ms (9.4 → 3.2 ms with its backward). The mask is kept as booleans
for the backward pass, as F.dropout does.

Elsewhere (GPU) and outside training it is F.dropout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

_LEVELS = 1 << 16


def keep_mask(shape: torch.Size, p: float, *, device: torch.device | None = None) -> Tensor:
    """Booleans of ``shape``, each True with probability 1 − round(p·2¹⁶)/2¹⁶, independent."""
    n = shape.numel()
    # 64 uniform bits a draw (the full range of int64), read as four 16-bit integers
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-(2**63), None)
    bits = words.view(torch.int16)[:n]
    return bits.ge(round(p * _LEVELS) - _LEVELS // 2).view(shape)


class _MaskedScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, keep: Tensor, scale: float) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.mul(keep).mul_(scale)  # (native_dropout_backward would copy keep to float)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        (keep,) = ctx.saved_tensors
        return grad.mul(keep).mul_(ctx.scale), None, None


def dropout(x: Tensor, p: float, training: bool = True) -> Tensor:
    """F.dropout(x, p, training), with the cheaper mask on CPU."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or not 0.0 < p < 1.0:
        return F.dropout(x, p=p, training=True)
    dropped = round(p * _LEVELS)
    scale = _LEVELS / (_LEVELS - dropped)
    return _MaskedScale.apply(x, keep_mask(x.shape, p), scale)


class Dropout(nn.Module):
    """nn.Dropout with the cheaper CPU mask."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
