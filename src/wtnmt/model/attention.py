"""Scaled dot-product attention and multi-head attention (Vaswani et al., eq. 1–3).

Inside the model, heads are kept *head-major*: ``[H, B, T, Dk]``. The head axis leads so
that the branched sublayer can treat it as the batch axis of one ``bmm`` (no Python loop over
branches, no copy between attention and the branch algebra). Internals handed to callers are
transposed views in the conventional ``[B, H, T, Dk]`` layout.

Projections carry no bias, as in tensor2tensor, the code the paper's numbers come from: a bias
on W^{O_i} would be redundant with the branch FFN's b1_i, and leaving it out of both models
keeps the Transformer and the Weighted Transformer at the same parameter count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from wtnmt.model.dropout import dropout, keep_scale, masked
from wtnmt.model.outputs import AttentionInternals, AttentionOutput
from wtnmt.model.packed import PackedLinear


@dataclass
class LayerCache:
    """Keys and values one decoder layer has seen, for step-wise decoding.

    ``cross_k``/``cross_v`` are computed once per source sentence. The decoder's own keys and
    values are written once, at their step, and never copied again: beam search reorders
    hypotheses at every step, and copying every hypothesis' history each time (what a cache
    of one row per hypothesis needs) cost more than the attention itself. Step τ's keys of
    the G hypotheses of sentence b sit in slots ``self_k[:, b, τ, 0:G]``; hypothesis n reads
    its own prefix through ``path[n, τ]``, the slot its ancestor took at step τ (G = 1:
    always slot 0). Each hypothesis scores every slot of its sentence and ``own_slots``, an
    additive bias of 0 on the slots of its path and −inf elsewhere, leaves it its own: one
    add per layer and step, where gathering the scores and scattering the probabilities back
    cost a dozen small operations. Mutable on purpose: each step appends.
    """

    cross_k: Tensor  # [H, B, S, Dk]   one per *sentence*, shared by its hypotheses, ×1/√Dk
    cross_v: Tensor  # [H, B, S, Dk]
    path: Tensor  # [B·G, t] long   the slot of each step a hypothesis' prefix went through
    self_k: Tensor | None = None  # [H, B, capacity, W, Dk]   steps × slots, ×1/√Dk
    self_v: Tensor | None = None  # the same, zeros in the slots no hypothesis took
    steps: int = 0  # steps written
    capacity: int = 16  # steps to make room for at first (grown when needed)
    width: int = 1  # slots per step (hypotheses per sentence) to make room for at first

    cross_bias: Tensor | None = None  # [H·B, 1, S]: 0, or −inf at source padding
    own_slots: Tensor | None = None  # [B, G, t·W]: 0 on each hypothesis' path, −inf elsewhere

    def attend_cross(self, q: Tensor, *, dropout_p: float = 0.0) -> Tensor:
        """softmax(QKᵀ/√Dk + padding)·V over the source, for queries q [H, B·G, T, Dk] of G
        hypotheses per sentence (one copy of the keys per sentence). → heads [H, B·G, T, Dk].

        The keys were scaled by 1/√Dk once and the padding mask made an additive bias once,
        so that scoring is one batched multiply-add per step."""
        h, n, t, dk = q.shape
        b, s = self.cross_k.size(1), self.cross_k.size(2)
        group = n // b
        q3 = q.reshape(h * b, group * t, dk)
        k3 = self.cross_k.view(h * b, s, dk).transpose(1, 2)
        if self.cross_bias is None:
            scores = torch.bmm(q3, k3)
        else:
            scores = torch.baddbmm(self.cross_bias, q3, k3)
        probs = scores.softmax(dim=-1)
        if dropout_p > 0:
            probs = dropout(probs, dropout_p)
        heads = torch.bmm(probs, self.cross_v.view(h * b, s, dk))
        return heads.view(h, n, t, dk)

    def reorder(self, path: Tensor, sentences: Tensor | None = None) -> LayerCache:
        """The cache for reordered hypotheses (``path`` already reordered) and, when some
        sentences are done, for source sentences ``sentences`` [B'] only. The keys and values
        are shared with this cache, which is not to be used any more."""

        if sentences is None:
            return replace(self, path=path, own_slots=None)

        def pick(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.index_select(1, sentences)

        bias = self.cross_bias
        if bias is not None:
            h, s = self.cross_k.size(0), bias.size(-1)
            bias = bias.view(h, -1, 1, s).index_select(1, sentences).view(-1, 1, s)
        return replace(
            self,
            cross_k=pick(self.cross_k),
            cross_v=pick(self.cross_v),
            cross_bias=bias,
            path=path,
            own_slots=None,
            self_k=pick(self.self_k),
            self_v=pick(self.self_v),
        )

    def slots(self, group: int) -> int:
        """How many slots a step the buffers hold once a step of ``group`` hypotheses per
        sentence is written (``path`` is read only where there are several)."""
        held = 0 if self.self_k is None else self.self_k.size(3)
        return max(self.width, group, held)

    def _room(self, k: Tensor, group: int) -> None:
        """Make the buffers hold one more step of ``group`` slots (grown by doubling).

        Keys and values are zero in every slot no hypothesis took: such a slot is scored
        (its −inf bias makes it probability 0) and meets probability 0 in the product with
        the values, and neither may be NaN, as uninitialised memory can be.
        """
        h, b, dk = k.size(0), self.cross_k.size(1), k.size(-1)
        if self.self_k is not None:
            _, _, capacity, width, _ = self.self_k.shape
            if self.steps < capacity and group <= width:
                return
            capacity, width = max(capacity, 2 * self.steps), max(width, group)
        else:
            capacity, width = max(self.capacity, 1), max(self.width, group)
        for name in ("self_k", "self_v"):
            old = getattr(self, name)
            new = k.new_zeros(h, b, capacity, width, dk)  # a slot never written stays 0
            if old is not None:
                new[:, :, : self.steps, : old.size(3)] = old[:, :, : self.steps]
            setattr(self, name, new)

    def attend_self(self, q: Tensor, k: Tensor, v: Tensor, *, dropout_p: float) -> Tensor:
        """Append this step's k, v [H, B·G, 1, Dk] and attend from q [H, B·G, 1, Dk] to each
        hypothesis' own prefix (this step included). → heads [H, B·G, 1, Dk]."""
        h, n, _, dk = q.shape
        b = self.cross_k.size(1)
        group = n // b
        self._room(k, group)
        assert self.self_k is not None and self.self_v is not None
        t = self.steps
        # keys are kept ×1/√Dk (written once) rather than every step's scores divided
        if k.requires_grad:  # (out= takes no part in autograd)
            self.self_k[:, :, t, :group] = k.view(h, b, group, dk) * dk**-0.5
        else:
            torch.mul(k.view(h, b, group, dk), dk**-0.5, out=self.self_k[:, :, t, :group])
        self.self_v[:, :, t, :group] = v.view(h, b, group, dk)
        self.steps = t = t + 1
        width = self.self_k.size(3)
        # batched matmuls over H·B on views (no copy) of the buffers' first t steps
        keys = self.self_k[:, :, :t].reshape(h * b, t * width, dk)
        values = self.self_v[:, :, :t].reshape(h * b, t * width, dk)
        scores = torch.bmm(q.reshape(h * b, group, dk), keys.transpose(1, 2))  # [HB, G, t·W]
        if width > 1:  # each hypothesis' own prefix (the bias decode_step made for the step)
            assert self.own_slots is not None and self.own_slots.size(-1) == t * width
            scores.view(h, b, group, t * width).add_(self.own_slots)
        probs = scores.softmax(dim=-1)
        if dropout_p > 0:
            probs = dropout(probs, dropout_p)
        return torch.bmm(probs, values).view(h, n, 1, dk)


def own_slot_bias(path: Tensor, group: int, width: int) -> Tensor:
    """path [B·G, t] (the slot of each step on each hypothesis' prefix) → an additive bias
    [B, G, t·W]: 0 on those slots, −inf on every other slot of the sentence's buffers."""
    n, t = path.shape
    cols = torch.arange(t, device=path.device) * width + path  # [B·G, t]
    bias = torch.full((n, t * width), float("-inf"), device=path.device)
    return bias.scatter_(1, cols, 0.0).view(n // group, group, t * width)


def padding_bias(key_pad: Tensor, heads: int, dtype: torch.dtype) -> Tensor:
    """key_pad [B, S] (True at padding) → the additive bias [H·B, 1, S] of batched scores
    over H·B: 0, or −inf at padding."""
    b, s = key_pad.shape
    bias = torch.zeros(b, 1, s, dtype=dtype, device=key_pad.device)
    bias.masked_fill_(key_pad[:, None, :], float("-inf"))
    return bias.expand(heads, b, 1, s).reshape(heads * b, 1, s)


_SHORT_QUERIES = 8  # query blocks up to this length skip the fused kernel (see attend)
_CPU_SHORT_KEYS = 128  # and, on CPU without gradients, attention to up to this many keys


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    key_pad: Tensor | None,
    causal: bool,
    dropout_p: float,
    need_probs: bool,
) -> tuple[Tensor, Tensor | None]:
    """softmax(QKᵀ/√Dk)·V for head-major inputs (eq. 1).

    q: [H, B, T, Dk], k and v: [H, B, S, Dk], key_pad: [B, S] True at padding.
    Returns heads [H, B, T, Dk] and, when ``need_probs``, the probabilities [H, B, T, S]
    before dropout. Without probabilities it runs PyTorch's fused kernel
    (scaled_dot_product_attention), except on the short query blocks of step-wise decoding
    and, on CPU without gradients, over short sources.
    """
    # The fused kernel pays a fixed cost per call that decoding's short query blocks (one new
    # token per hypothesis) do not recover: there two matmuls and a softmax measured 2× faster.
    # On CPU without gradients its blocked loops lose to the same two matmuls up to ~100 keys:
    # [4, 32, 25, 64] 361 against 599 µs, [4, 32, 60, 64] 1.3 against 1.9 ms, [4, 8, 150, 64]
    # 5.9 against 3.1 ms (2 cores). With dropout, PyTorch's CPU kernel falls back to these
    # same operations, with a dearer dropout mask than ours (model/dropout.py): on CPU they
    # run here.
    if causal and key_pad is not None:  # pragma: no cover - the model never asks for both
        raise ValueError("attend: causal attention with a key padding mask is not supported")
    fused = q.size(-2) > _SHORT_QUERIES or dropout_p > 0
    if q.device.type == "cpu" and (
        dropout_p > 0 or (k.size(-2) <= _CPU_SHORT_KEYS and not torch.is_grad_enabled())
    ):
        fused = False
    if not need_probs and fused:
        mask = None if key_pad is None else ~key_pad[None, :, None, :]  # [1,B,1,S] True=attend
        heads = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal
        )
        return heads, None
    # The math path, as batched matmuls over H·B: the head-split views of the projections
    # are copied once anyway (matmul would), so the copy of q carries the 1/√Dk and, under
    # dropout, the copy of v carries the dropout's 1/(1 − p). Masks are additive biases of
    # the first matmul (baddbmm), not extra passes over the scores.
    h, b, t, dk = q.shape
    s = k.size(2)
    q3 = (q * dk**-0.5).reshape(h * b, t, dk)
    k3 = k.reshape(h * b, s, dk).transpose(1, 2)
    bias = None
    if key_pad is not None:
        bias = padding_bias(key_pad, h, q.dtype)
    elif causal:
        bias = q.new_zeros(t, s).masked_fill_(
            torch.ones(t, s, dtype=torch.bool, device=q.device).triu(s - t + 1), float("-inf")
        )
    scores = torch.bmm(q3, k3) if bias is None else torch.baddbmm(bias, q3, k3)  # [HB, T, S]
    probs = scores.softmax(dim=-1)
    if dropout_p > 0:
        dropped = masked(probs, dropout_p)
        v3 = (v * keep_scale(dropout_p)).reshape(h * b, s, dk)
    else:
        dropped, v3 = probs, v.reshape(h * b, s, dk)
    heads = torch.bmm(dropped, v3).view(h, b, t, dk)
    return heads, probs.view(h, b, t, s) if need_probs else None


class HeadProjection(nn.Module):
    """W_i^Q, W_i^K, W_i^V of all heads as one [3D, D] matrix (eq. 2 / eq. 5)."""

    def __init__(self, *, d_model: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.weight = nn.Parameter(torch.empty(3 * d_model, d_model))
        self._qkv, self._q, self._kv = PackedLinear(), PackedLinear(), PackedLinear()
        nn.init.xavier_uniform_(self.weight.view(3, d_model, d_model)[0])
        nn.init.xavier_uniform_(self.weight.view(3, d_model, d_model)[1])
        nn.init.xavier_uniform_(self.weight.view(3, d_model, d_model)[2])

    def packed_linears(self) -> tuple[PackedLinear, ...]:
        """The products this module packs for decoding (see ``packed.quantize_decoding``)."""
        return (self._qkv, self._q, self._kv)

    def _split(self, x: Tensor, n: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, n, self.heads, -1).permute(2, 3, 0, 1, 4)  # [n, H, B, T, Dk]

    def self_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x: [B, T, D] → q, k, v each [H, B, T, Dk], in one matmul."""
        q, k, v = self._split(self._qkv(x, self.weight), 3)
        return q, k, v

    def queries(self, x: Tensor) -> Tensor:
        d = self.weight.size(1)
        return self._split(self._q(x, self.weight[:d]), 1)[0]  # [H, B, T, Dk]

    def keys_values(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        d = self.weight.size(1)
        k, v = self._split(self._kv(memory, self.weight[d:]), 2)  # [H, B, S, Dk] each
        return k, v


class HeadAttention(nn.Module):
    """The heads of eq. 2 / eq. 5: projections and attention, self or over a memory.

    Every attention flavour (multi-head, branched, weighted) owns one of these and differs
    only in what it does with the heads afterwards.
    """

    def __init__(
        self, *, d_model: int, heads: int, dropout: float, causal: bool, cross: bool = False
    ) -> None:
        super().__init__()
        self.heads = heads
        self.causal = causal
        # a cross-attention module reads the encoder side from the cache when decoding
        # step-wise; otherwise a memory passed in is what makes attention cross-attention
        self.cross = cross
        self.dropout = dropout
        self.proj = HeadProjection(d_model=d_model, heads=heads)

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


def merge_heads(heads: Tensor, w_out: Tensor, linear: PackedLinear | None = None) -> Tensor:
    """Σ_h head_h · W^{O_h} = Concat(heads)·W^O (eq. 3).  heads [H,B,T,Dk], w_out [H,Dk,D].
    ``linear``: the PackedLinear to multiply with when w_out is a parameter."""
    h, b, t, dk = heads.shape
    concat = heads.permute(1, 2, 0, 3).reshape(b * t, h * dk)  # [BT, D]
    w = w_out.reshape(h * dk, -1)  # [D, D]
    out = concat @ w if linear is None else linear(concat, w.t())
    return out.view(b, t, -1)  # [B, T, D]


def init_out_projection(w_out: Tensor) -> None:
    """Xavier-uniform for W^O seen as one [D, D] matrix, whatever its head split."""
    h, dk, d = w_out.shape
    bound = math.sqrt(6.0 / (h * dk + d))
    nn.init.uniform_(w_out, -bound, bound)


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1 … head_H)·W^O (eq. 2–3)."""

    def __init__(
        self, *, d_model: int, heads: int, dropout: float, causal: bool, cross: bool = False
    ) -> None:
        super().__init__()
        self.attn = HeadAttention(
            d_model=d_model, heads=heads, dropout=dropout, causal=causal, cross=cross
        )
        self.w_out = nn.Parameter(torch.empty(heads, d_model // heads, d_model))  # W^O split
        init_out_projection(self.w_out)
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
        return AttentionOutput(out=merge_heads(heads, self.w_out, self._out), internals=internals)
