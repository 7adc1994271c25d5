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

from wtnmt.model.attention import HeadAttention, init_out_projection, merge_heads
from wtnmt.model.branch_weights import BranchWeights, InitMode, WeightMode
from wtnmt.model.cache import LayerCache
from wtnmt.model.dropout import relu_dropout
from wtnmt.model.outputs import AttentionOutput
from wtnmt.model.packed import PackedLinear, weights_generation
from wtnmt.model.speed import fast_paths


class _BranchTail(torch.autograd.Function):
    """Concat_i(hid_i) · W2 + b2 = Σ_i hid_i W2_i + b2 for hid [M, BT, F/M], W2 [F, D], as M
    multiply-adds into one output (M calls, deliberately): the concatenation would copy hid
    ([BT, F], the largest activation of the sublayer) forward and its gradient back, and keep
    that copy for the backward beside hid itself (which the ReLU keeps). The backward
    multiplies all branches at once against the incoming gradient broadcast over M (a
    stride-0 batch, not copied). On 2 CPU cores, [4, 4,080, 256] forward and backward: 37 ms
    against 41 ms; float32 training of `weighted-small` peaked at 1.49 GiB, 1.55–1.66 before.
    For full-precision training only: in bf16 the output would be rounded after each branch."""

    @staticmethod
    def forward(ctx, hid: Tensor, w2: Tensor, b2: Tensor) -> Tensor:  # type: ignore[override]
        m = hid.size(0)
        w = w2.view(m, -1, w2.size(-1))  # [M, F/M, D]
        out = torch.addmm(b2, hid[0], w[0])
        for i in range(1, m):
            out.addmm_(hid[i], w[i])
        ctx.save_for_backward(hid, w)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:  # type: ignore[override]
        hid, w = ctx.saved_tensors
        wide = grad.expand(hid.size(0), *grad.shape)  # [M, BT, D]
        d_hid = torch.bmm(wide, w.transpose(1, 2))  # [M, BT, F/M]
        d_w = torch.bmm(hid.transpose(1, 2), wide)  # [M, F/M, D]
        return d_hid, d_w.view(-1, w.size(-1)), grad.sum(0)


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
        kept: int | None = None,
    ) -> None:
        """``kept``: build only this many of the M branches (a pruned model: each of the same
        shape as in the full one, Dk = D/M and, under ``split``, F/M)."""
        super().__init__()
        dk, inner = d_model // branches, d_ff // branches if ffn == "split" else d_ff
        m = branches if kept is None else kept
        self.ffn = ffn
        self.activation_dropout = activation_dropout
        self.attn = HeadAttention(
            d_model=d_model,
            heads=m,
            dropout=attention_dropout,
            causal=False,
            cross=cross,
            head_dim=dk,
        )
        self.w_out = nn.Parameter(torch.empty(m, dk, d_model))  # W^{O_i}: Dk × D, eq. 6
        init_out_projection(self.w_out)
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

    def packed_linears(self) -> tuple[PackedLinear, ...]:
        """The products this module packs for decoding (see ``packed.quantize_decoding``)."""
        return (self._tail,)

    def keys_values(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """The keys and values [M, B, S, Dk] of ``memory`` a cross-attention step reads
        (what a decoder cache holds for it)."""
        return self.attn.proj.keys_values(memory)

    def _fused_weights(self, kappa: Tensor, alpha: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """W_i = κ_i W^{O_i} W1_i, the output weights and bias the tail multiplies with.

        split:  W [M, Dk, F/M], Stack_i(α_i W2_i) [F, D], Σ_i α_i b2_i [D]
        shared: W [M, Dk, F],   W2 [F, D],               (Σ_i α_i) b2 [D]
        Without gradients (decoding) the weights cannot change between calls, so the result
        is kept until a parameter changes (each in-place update bumps its version counter):
        step-wise decoding would otherwise rebuild it at every step.
        """
        key = None
        if not torch.is_grad_enabled() and fast_paths():  # (plain_math: computed each call)
            # autocast makes bf16 fused weights: a pass without it must not reuse them
            autocast = torch.is_autocast_enabled(self.w1.device.type)
            if self._params is None:  # (the same objects for the module's life)
                self._params = list(self.parameters())
            # an optimizer step counts too: fused Adam bumps no version counter
            key = (
                autocast,
                weights_generation(),
                *((p.data_ptr(), p._version) for p in self._params),
            )
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
            hid = torch.baddbmm(self.b1[:, None, :], flat, w)  # [M, BT, F/M]
            hid = relu_dropout(hid, self.activation_dropout, self.training)
            if fast_paths() and torch.is_grad_enabled() and hid.dtype == w2.dtype:
                out = _BranchTail.apply(hid, w2, b2)  # [BT, D]
            else:  # decoding (the packed or int8 matmul) and autocast: one matmul on
                # Concat_i(hid_i) [BT, F], whose sum over F is not rounded branch by branch
                concat = hid.permute(1, 0, 2).reshape(b * t, -1)
                out = self._tail(concat, w2.t(), b2, key=key)
        else:
            hid = torch.baddbmm(self.b1, flat, w)  # [M, BT, F]
            hid = relu_dropout(hid, self.activation_dropout, self.training)
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
