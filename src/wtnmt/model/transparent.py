"""Transparent attention (Bapna et al., 2018, §3).

Decoder layer j attends to z_j = Σ_{i=0..N} s_{i,j} h_i instead of the top encoder layer,
with s_{·,j} = softmax(W_{·,j}) over a learned [N+1, N_dec] matrix W (zeros at start: every
layer weighs the same) and dropout on W while training.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class TransparentCombination(nn.Module):
    def __init__(self, *, encoder_layers: int, decoder_layers: int, dropout: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(encoder_layers + 1, decoder_layers))  # W
        self.dropout = dropout

    def forward(self, states: list[Tensor]) -> tuple[list[Tensor], Tensor]:
        """states: h_0 … h_N, each [B, S, D] → (z_1 … z_Ndec each [B, S, D], s [N+1, N_dec])."""
        w = F.dropout(self.weight, p=self.dropout, training=self.training)
        s = w.softmax(dim=0)  # [N+1, N_dec], columns on the simplex
        stacked = torch.stack(states, dim=-1)  # [B, S, D, N+1]
        z = stacked @ s  # [B, S, D, N_dec]
        return list(z.unbind(-1)), s
