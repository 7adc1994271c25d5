"""Branched attention: the Weighted Transformer's sublayer (Ahmed et al., 2017, eq. 5–7).

    head_i  = Attention(Q W_i^Q, K W_i^K, V W_i^V)                      eq. 5
    hbar_i  = κ_i · head_i W^{O_i}                                      eq. 6
    out     = Σ_i α_i · FFN_i(hbar_i)                                   eq. 7

It replaces both the multi-head attention and the FFN sublayer of a Transformer layer.

Fused forward. The tail is linear up to the ReLU, so with W_i = κ_i W^{O_i} W1_i:

    hid_i = ReLU(head_i W_i + b1_i)                       [M, B·T, F/M]   one bmm over branches
    out   = Concat_i(hid_i) · Stack_i(α_i W2_i) + Σ_i α_i b2_i   [B·T, D]  one matmul

which is the same function with the same parameters (and so the same gradients), never builds
the M D-wide activations hbar_i, scales only weights by κ and α (never activations), and
costs Dk·F + F·D multiply-adds per token instead of the D² + 2·D·F of the Transformer's W^O
and FFN. ``branch_ffn: shared`` (one full-width FFN used by
every branch) fuses the same way with W_i = κ_i W^{O_i} W1 and (Σ_i α_i hid_i) · W2.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Literal

import torch
from torch import Tensor, nn

from wtnmt.model.attention import HeadAttention, LayerCache, init_out_projection, merge_heads
from wtnmt.model.branch_weights import BranchWeights, InitMode, WeightMode
from wtnmt.model.dropout import dropout
from wtnmt.model.outputs import AttentionOutput
from wtnmt.model.packed import PackedLinear


class BranchedAttention(nn.Module):
    """Σ_i α_i FFN_i(κ_i head_i W^{O_i}) over M = H branches, self- or cross-attention."""

    def __init__(
        self,
        *,
        d_model: int,
        branches: int,
        d_ff: int,
        ffn: Literal["split", "shared"],
        weights: WeightMode,
        topk: int,
        init: InitMode,
        attention_dropout: float,
        activation_dropout: float,
        cross: bool = False,
    ) -> None:
        super().__init__()
        m, dk = branches, d_model // branches
        self.ffn = ffn
        self.activation_dropout = activation_dropout
        self.attn = HeadAttention(
            d_model=d_model, heads=m, dropout=attention_dropout, causal=False, cross=cross
        )
        self.w_out = nn.Parameter(torch.empty(m, dk, d_model))  # W^{O_i}: Dk × D, eq. 6
        init_out_projection(self.w_out)
        inner = d_ff // m if ffn == "split" else d_ff
        lead = (m,) if ffn == "split" else ()
        # FFN_i(x) = ReLU(x W1_i + b1_i) W2_i + b2_i; split: W1_i [D, F/M], W2_i [F/M, D]
        self.w1 = nn.Parameter(torch.empty(*lead, d_model, inner))
        self.b1 = nn.Parameter(torch.zeros(*lead, inner))
        self.w2 = nn.Parameter(torch.empty(*lead, inner, d_model))
        self.b2 = nn.Parameter(torch.zeros(*lead, d_model))
        # the split FFNs are column/row blocks of one [D, F] / [F, D] matrix: initialise them
        # as the Transformer's full-width FFN would be
        bound = math.sqrt(6.0 / (d_model + d_ff))
        nn.init.uniform_(self.w1, -bound, bound)
        nn.init.uniform_(self.w2, -bound, bound)
        self.branch_weights = BranchWeights(branches=m, mode=weights, topk=topk, init=init)
        self._fused_cache: tuple[tuple, tuple[Tensor, Tensor, Tensor]] | None = None
        self._params: list[Tensor] | None = None
        self._tail = PackedLinear()  # the output matmul, packed while decoding

    def _fused_weights(self, kappa: Tensor, alpha: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """W_i = κ_i W^{O_i} W1_i, the output weights and bias the tail multiplies with.

        split:  W [M, Dk, F/M], Stack_i(α_i W2_i) [F, D], Σ_i α_i b2_i [D]
        shared: W [M, Dk, F],   W2 [F, D],               (Σ_i α_i) b2 [D]
        Without gradients (decoding) the weights cannot change between calls, so the result
        is kept until a parameter changes (each in-place update bumps its version counter):
        step-wise decoding would otherwise rebuild it at every step.
        """
        key = None
        if not torch.is_grad_enabled():
            # autocast makes bf16 fused weights: a pass without it must not reuse them
            autocast = torch.is_autocast_enabled(self.w1.device.type)
            if self._params is None:  # (the same objects for the module's life)
                self._params = list(self.parameters())
            key = (autocast, *((p.data_ptr(), p._version) for p in self._params))
            if self._fused_cache is not None and self._fused_cache[0] == key:
                return self._fused_cache[1]
        if self.ffn == "split":
            w = kappa[:, None, None] * torch.bmm(self.w_out, self.w1)  # [M, Dk, F/M]
            # α_i scales the small W2_i [F/M, D] rather than the activation hid_i [BT, F/M]
            w2 = (alpha[:, None, None] * self.w2).reshape(-1, self.w2.size(-1))  # [F, D]
            b2 = alpha @ self.b2
        else:
            w = kappa[:, None, None] * torch.matmul(self.w_out, self.w1)  # [M, Dk, F]
            w2, b2 = self.w2, alpha.sum() * self.b2
        fused = (w, w2, b2)
        self._fused_cache = None if key is None else (key, fused)
        return fused

    def _dropout(self, hid: Tensor) -> Tensor:
        if self.activation_dropout == 0:
            return hid
        return dropout(hid, self.activation_dropout, self.training)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        key_pad: Tensor | None = None,
        cache: LayerCache | None = None,
        need_internals: bool = False,
    ) -> AttentionOutput:
        """x: [B, T, D] queries; memory: [B, S, D] (None: self-attention). → [B, T, D]."""
        heads, internals = self.attn(
            x, memory, key_pad=key_pad, cache=cache, need_internals=need_internals
        )  # [M, B, T, Dk]
        kappa, alpha = self.branch_weights()  # [M] each
        w, w2, b2 = self._fused_weights(kappa, alpha)
        # without gradients the fused weights are kept, and their key says when they change
        key = None if self._fused_cache is None else self._fused_cache[0]
        m, b, t, dk = heads.shape
        flat = heads.reshape(m, b * t, dk)  # [M, BT, Dk]
        if self.ffn == "split":
            hid = torch.baddbmm(self.b1[:, None, :], flat, w).relu_()  # [M, BT, F/M]
            hid = self._dropout(hid)
            concat = hid.permute(1, 0, 2).reshape(b * t, -1)  # [BT, F] = Concat_i(hid_i)
            out = self._tail(concat, w2.t(), b2, key=key)  # [BT, D]
        else:
            hid = torch.baddbmm(self.b1, flat, w).relu_()  # [M, BT, F]
            hid = self._dropout(hid)
            weighted = torch.einsum("m,mnf->nf", alpha, hid)  # Σ_i α_i hid_i  [BT, F]
            out = self._tail(weighted, w2.t(), b2, key=key)  # [BT, D]
        if internals is not None:
            internals = replace(internals, kappa=kappa, alpha=alpha)
        return AttentionOutput(out=out.view(b, t, -1), internals=internals)


class WeightedAttention(nn.Module):
    """Σ_i α_i κ_i head_i W^{O_i}, no FFN: ``decoder_self_attention: weighted``.

    The other reading of the paper's "masked in the decoder layers": the decoder's masked
    self-attention weighs its heads like a branched sublayer but keeps no FFN of its own.
    """

    def __init__(
        self,
        *,
        d_model: int,
        branches: int,
        weights: WeightMode,
        topk: int,
        init: InitMode,
        attention_dropout: float,
        causal: bool,
    ) -> None:
        super().__init__()
        self.attn = HeadAttention(
            d_model=d_model, heads=branches, dropout=attention_dropout, causal=causal
        )
        self.w_out = nn.Parameter(torch.empty(branches, d_model // branches, d_model))
        init_out_projection(self.w_out)
        self.branch_weights = BranchWeights(branches=branches, mode=weights, topk=topk, init=init)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        key_pad: Tensor | None = None,
        cache: LayerCache | None = None,
        need_internals: bool = False,
    ) -> AttentionOutput:
        heads, internals = self.attn(
            x, memory, key_pad=key_pad, cache=cache, need_internals=need_internals
        )  # [M, B, T, Dk]
        kappa, alpha = self.branch_weights()
        w = (alpha * kappa)[:, None, None] * self.w_out  # [M, Dk, D]
        if internals is not None:
            internals = replace(internals, kappa=kappa, alpha=alpha)
        return AttentionOutput(out=merge_heads(heads, w), internals=internals)
