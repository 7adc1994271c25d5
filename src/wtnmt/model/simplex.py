"""Euclidean projection onto the probability simplex (Duchi et al., 2008, Fig. 1).

The paper keeps κ and α on the simplex "by projection" after every training step (§3).
"""

from __future__ import annotations

import torch
from torch import Tensor


def project_simplex(v: Tensor) -> Tensor:
    """argmin_w ‖w − v‖₂ subject to w ≥ 0, Σw = 1, over the last axis.

    Sort-based, O(M log M): with u sorted in decreasing order, ρ is the largest j with
    u_j − (Σ_{r≤j} u_r − 1)/j > 0, θ = (Σ_{r≤ρ} u_r − 1)/ρ and w = max(v − θ, 0).
    """
    # the projection of v + c is that of v: shifted so that the largest is 0, the test below
    # holds for j = 1 in floating point too (else for |v| ≳ 1e8, float32 rounds u_1 − 1 to u_1)
    v = v - v.amax(dim=-1, keepdim=True)
    u, _ = torch.sort(v, dim=-1, descending=True)
    cumsum = u.cumsum(dim=-1) - 1.0
    j = torch.arange(1, v.size(-1) + 1, device=v.device, dtype=v.dtype)
    support = u - cumsum / j > 0  # a prefix of True values
    rho = support.sum(dim=-1, keepdim=True).clamp_min(1)  # ≥ 1 but for NaN input
    theta = cumsum.gather(-1, rho - 1) / rho.to(v.dtype)
    return (v - theta).clamp_min(0.0)


__all__ = ["project_simplex"]
