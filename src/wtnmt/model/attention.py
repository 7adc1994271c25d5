"""Scaled dot-product attention and multi-head attention (Vaswani et al., eq. 1–3).

Inside the model, heads are kept *head-major*: ``[H, B, T, Dk]``. The head axis leads so
that the branched sublayer can treat it as the batch axis of one ``bmm`` (no Python loop over
branches, no copy between attention and the branch algebra). Internals handed to callers are
transposed views in the conventional ``[B, H, T, Dk]`` layout.

Projections carry no bias, as in tensor2tensor, the code the paper's numbers come from: a bias
on W^{O_i} would be redundant with the branch FFN's b1_i, and leaving it out of both models
keeps the Transformer and the Weighted Transformer at the same parameter count. A Transformer
may have them (``model.attention_bias``: Marian's models, `wtnmt import hf`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from wtnmt.model.attention_math import attend
from wtnmt.model.cache import LayerCache
from wtnmt.model.outputs import AttentionInternals, AttentionOutput
from wtnmt.model.packed import PackedLinear


class HeadProjection(nn.Module):
    """W_i^Q, W_i^K, W_i^V of all heads as one [3·H·Dk, D] matrix (eq. 2 / eq. 5): [3D, D],
    except in a pruned Weighted Transformer, whose sublayers keep H < D/Dk heads."""

    def __init__(
        self, *, d_model: int, heads: int, head_dim: int | None = None, bias: bool = False
    ) -> None:
        super().__init__()
        self.heads = heads
        width = heads * (head_dim or d_model // heads)  # H·Dk
        self.weight = nn.Parameter(torch.empty(3 * width, d_model))
        # b^Q; b^K; b^V (model.attention_bias), or none
        self.bias = nn.Parameter(torch.zeros(3 * width)) if bias else None
        self._qkv, self._q, self._kv = PackedLinear(), PackedLinear(), PackedLinear()
        for block in self.weight.view(3, width, d_model):
            nn.init.xavier_uniform_(block)

    def packed_linears(self) -> tuple[PackedLinear, ...]:
        """The products this module packs for decoding (see ``packed.quantize_decoding``)."""
        return (self._qkv, self._q, self._kv)

    def _split(self, x: Tensor, n: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, n, self.heads, -1).permute(2, 3, 0, 1, 4)  # [n, H, B, T, Dk]

    def self_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x: [B, T, D] → q, k, v each [H, B, T, Dk], in one matmul."""
        q, k, v = self._split(self._qkv(x, self.weight, self.bias), 3)
        return q, k, v

    def queries(self, x: Tensor) -> Tensor:
        d = self.weight.size(0) // 3  # H·Dk
        bias = None if self.bias is None else self.bias[:d]
        return self._split(self._q(x, self.weight[:d], bias), 1)[0]  # [H, B, T, Dk]

    def keys_values(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        d = self.weight.size(0) // 3
        bias = None if self.bias is None else self.bias[d:]
        k, v = self._split(self._kv(memory, self.weight[d:], bias), 2)  # [H, B, S, Dk] each
        return k, v


class HeadAttention(nn.Module):
    """The heads of eq. 2 / eq. 5: projections and attention, self or over a memory.

    Every attention flavour (multi-head, branched, weighted) owns one of these and differs
    only in what it does with the heads afterwards.
    """

    def __init__(
        self,
        *,
        d_model: int,
        heads: int,
        dropout: float,
        causal: bool,
        cross: bool = False,
        head_dim: int | None = None,
        bias: bool = False,
    ) -> None:
        super().__init__()
        self.heads = heads
        self.causal = causal
        # a cross-attention module reads the encoder side from the cache when decoding
        # step-wise; otherwise a memory passed in is what makes attention cross-attention
        self.cross = cross
        self.dropout = dropout
        self.proj = HeadProjection(d_model=d_model, heads=heads, head_dim=head_dim, bias=bias)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None = None,
        *,
        key_pad: Tensor | None = None,
        cache: LayerCache | None = None,
        need_internals: bool = False,
    ) -> tuple[Tensor, AttentionInternals | None]:
        """x: [B, T, D]; memory: [B, S, D] for cross-attention, None for self-attention.

        With a cache, self-attention appends this step's keys and values to it and attends to
        the whole prefix; cross-attention reads the keys and values computed once per source
        sentence. When x holds G hypotheses per sentence (beam search), a sentence's G queries
        attend to its one copy of the keys as G query positions: no copy per hypothesis.
        Returns heads [H, B, T, Dk] and, when asked, the internals.
        """
        causal = self.causal
        p = self.dropout if self.training else 0.0
        if memory is None and not (self.cross and cache is not None):
            q, k, v = self.proj.self_qkv(x)
            if cache is not None:
                if q.size(2) != 1 or need_internals:
                    raise ValueError("a cache takes one step at a time, without internals")
                return cache.attend_self(q, k, v, dropout_p=p), None
        elif cache is not None:
            if need_internals:
                raise ValueError("a cache takes one step at a time, without internals")
            return cache.attend_cross(self.proj.queries(x), dropout_p=p), None
        else:
            q = self.proj.queries(x)
            k, v = self.proj.keys_values(memory)
        heads, probs = attend(
            q, k, v, key_pad=key_pad, causal=causal, dropout_p=p, need_probs=need_internals
        )
        if not need_internals:
            return heads, None
        assert probs is not None
        internals = AttentionInternals(
            probs=probs.transpose(0, 1),  # [B, H, T, S]
            values=v.transpose(0, 1),  # [B, H, S, Dk]
            heads=heads.transpose(0, 1),  # [B, H, T, Dk]
        )
        return heads, internals


def merge_heads(
    heads: Tensor, w_out: Tensor, linear: PackedLinear | None = None, bias: Tensor | None = None
) -> Tensor:
    """Σ_h head_h · W^{O_h} = Concat(heads)·W^O (eq. 3) (+ ``bias``).  heads [H,B,T,Dk],
    w_out [H,Dk,D]. ``linear``: the PackedLinear to multiply with when w_out is a parameter."""
    h, b, t, dk = heads.shape
    concat = heads.permute(1, 2, 0, 3).reshape(b * t, h * dk)  # [BT, D]
    w = w_out.reshape(h * dk, -1)  # [D, D]
    if linear is not None:
        out = linear(concat, w.t(), bias)
    else:
        out = concat @ w if bias is None else torch.addmm(bias, concat, w)
    return out.view(b, t, -1)  # [B, T, D]


def init_out_projection(w_out: Tensor) -> None:
    """Xavier-uniform for W^O seen as one [D, D] matrix, whatever its head split."""
    h, dk, d = w_out.shape
    bound = math.sqrt(6.0 / (h * dk + d))
    nn.init.uniform_(w_out, -bound, bound)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1 … head_H)·W^O (eq. 2–3)."""

    def __init__(
        self,
        *,
        d_model: int,
        heads: int,
        dropout: float,
        causal: bool,
        cross: bool = False,
        bias: bool = False,
    ) -> None:
        super().__init__()
        self.attn = HeadAttention(
            d_model=d_model, heads=heads, dropout=dropout, causal=causal, cross=cross, bias=bias
        )
        self.w_out = nn.Parameter(torch.empty(heads, d_model // heads, d_model))  # W^O split
        init_out_projection(self.w_out)
        self.out_bias = nn.Parameter(torch.zeros(d_model)) if bias else None  # b^O
        self._out = PackedLinear()

    def packed_linears(self) -> tuple[PackedLinear, ...]:
        return (self._out,)

    def keys_values(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """The keys and values [H, B, S, Dk] of ``memory`` a cross-attention step reads
        (what a decoder cache holds for it)."""
        return self.attn.proj.keys_values(memory)

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
        )
        out = merge_heads(heads, self.w_out, self._out, self.out_bias)
        return AttentionOutput(out=out, internals=internals)
