"""Encoder and decoder layers, assembled from parts the builder hands them.

A layer is a stack of sublayers, each wrapped in residual + dropout + layer norm:
    norm: post   x = LN(x + Drop(Sublayer(x)))          (Vaswani et al.)
    norm: pre    x = x + Drop(Sublayer(LN(x)))          (a final LN closes the stack)

Transformer layers:        encoder [self-attn, FFN]     decoder [self-attn, cross-attn, FFN]
Weighted Transformer:      encoder [branched self]      decoder [self-attn, branched cross]
(the branched sublayer replaces attention *and* FFN; residual and norm go around all of it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch.nn.functional as F
from torch import Tensor, nn

from wtnmt.model.cache import LayerCache
from wtnmt.model.dropout import dropout, relu_dropout, residual_dropout
from wtnmt.model.outputs import AttentionInternals, AttentionOutput
from wtnmt.model.packed import PackedLinear


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (eq. 4); with ``activation="swish"``,
    swish(x W1 + b1) W2 + b2, swish(h) = h·σ(h) (Marian's)."""

    def __init__(
        self,
        *,
        d_model: int,
        d_ff: int,
        activation_dropout: float,
        activation: Literal["relu", "swish"] = "relu",
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.activation_dropout = activation_dropout
        self.swish = activation == "swish"
        for fc in (self.fc1, self.fc2):
            nn.init.xavier_uniform_(fc.weight)
            nn.init.zeros_(fc.bias)
        self._fc1, self._fc2 = PackedLinear(), PackedLinear()

    def packed_linears(self) -> tuple[PackedLinear, ...]:
        """The products this module packs for decoding (see ``packed.quantize_decoding``)."""
        return (self._fc1, self._fc2)

    def forward(self, x: Tensor) -> Tensor:
        # on [B·T, D] rather than [B, T, D]: F.linear returns a view for 3-d inputs, and the
        # in-place ReLU on a view would cost two copies of the hidden layer in the backward
        flat = x.reshape(-1, x.size(-1))
        h = self._fc1(flat, self.fc1.weight, self.fc1.bias)
        if self.swish:
            h = dropout(F.silu(h), self.activation_dropout, self.training)
        else:
            h = relu_dropout(h, self.activation_dropout, self.training)
        return self._fc2(h, self.fc2.weight, self.fc2.bias).view(*x.shape[:-1], -1)


class Residual(nn.Module):
    """Residual connection, dropout and layer norm around one sublayer."""

    def __init__(self, *, d_model: int, dropout: float, norm: Literal["post", "pre"]) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.p = dropout
        self.pre = norm == "pre"

    def forward(
        self, x: Tensor, sublayer: Callable[[Tensor], AttentionOutput]
    ) -> tuple[Tensor, AttentionInternals | None]:
        """x: [B, T, D]; ``sublayer`` maps [B, T, D] to an AttentionOutput of [B, T, D]."""
        result = sublayer(self.norm(x) if self.pre else x)
        out = residual_dropout(x, result.out, self.p, self.training)  # x + Drop(sublayer)
        if self.pre:
            return out, result.internals
        return self.norm(out), result.internals

    def extra_repr(self) -> str:
        return f"dropout={self.p}, norm={'pre' if self.pre else 'post'}"


class EncoderLayer(nn.Module):
    def __init__(
        self,
        *,
        self_attn: nn.Module,
        ffn: nn.Module | None,
        d_model: int,
        dropout: float,
        norm: Literal["post", "pre"],
    ) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.self_attn_res = Residual(d_model=d_model, dropout=dropout, norm=norm)
        self.ffn = ffn  # None when self_attn is a branched sublayer (it holds the FFNs)
        self.ffn_res = Residual(d_model=d_model, dropout=dropout, norm=norm) if ffn else None

    def forward(
        self, x: Tensor, *, src_pad: Tensor | None, need_internals: bool = False
    ) -> tuple[Tensor, AttentionInternals | None]:
        """x: [B, S, D], src_pad: [B, S] True at padding (None: no padding)."""
        x, internals = self.self_attn_res(
            x, lambda h: self.self_attn(h, key_pad=src_pad, need_internals=need_internals)
        )
        if self.ffn is not None:
            x, _ = self.ffn_res(x, lambda h: AttentionOutput(out=self.ffn(h)))  # type: ignore[misc]
        return x, internals


class DecoderLayer(nn.Module):
    def __init__(
        self,
        *,
        self_attn: nn.Module,
        cross_attn: nn.Module,
        ffn: nn.Module | None,
        d_model: int,
        dropout: float,
        norm: Literal["post", "pre"],
    ) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.self_attn_res = Residual(d_model=d_model, dropout=dropout, norm=norm)
        self.cross_attn = cross_attn
        self.cross_attn_res = Residual(d_model=d_model, dropout=dropout, norm=norm)
        self.ffn = ffn  # None when cross_attn is a branched sublayer
        self.ffn_res = Residual(d_model=d_model, dropout=dropout, norm=norm) if ffn else None

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        *,
        src_pad: Tensor | None,
        cache: LayerCache | None = None,
        need_internals: bool = False,
    ) -> tuple[Tensor, AttentionInternals | None, AttentionInternals | None]:
        """x: [B, T, D] target states; memory: [B, S, D] (None with a cache, which holds the
        encoder side's keys and values). With a cache, T is one step.

        Decoder self-attention is causal and takes no key padding mask: targets are padded on
        the right, so a real position never sees a padded one through the causal mask.
        """
        x, self_int = self.self_attn_res(
            x, lambda h: self.self_attn(h, cache=cache, need_internals=need_internals)
        )
        x, cross_int = self.cross_attn_res(
            x,
            lambda h: self.cross_attn(
                h, memory, key_pad=src_pad, cache=cache, need_internals=need_internals
            ),
        )
        if self.ffn is not None:
            x, _ = self.ffn_res(x, lambda h: AttentionOutput(out=self.ffn(h)))  # type: ignore[misc]
        return x, self_int, cross_int
