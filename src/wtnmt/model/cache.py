"""What one decoder layer keeps between the steps of step-wise decoding: the source side's
keys and values (once per sentence) and its own keys and values (written once, at their step,
read by each hypothesis through its ancestry)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from wtnmt.model.attention_math import attention_core


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
        heads, _ = attention_core(
            q.reshape(h * b, group * t, dk),
            self.cross_k.view(h * b, s, dk).transpose(1, 2),
            self.cross_v.view(h * b, s, dk),
            bias=self.cross_bias,
            dropout_p=dropout_p,
        )
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
        own = None
        if width > 1:  # each hypothesis' own prefix (the bias decode_step made for the step)
            assert self.own_slots is not None and self.own_slots.size(-1) == t * width
            slots = self.own_slots

            def own(scores: Tensor) -> None:  # [HB, G, t·W], a bias shared by the H heads
                scores.view(h, b, group, t * width).add_(slots)

        heads, _ = attention_core(
            q.reshape(h * b, group, dk),
            keys.transpose(1, 2),
            values,
            add_bias=own,
            dropout_p=dropout_p,
        )
        return heads.view(h, n, 1, dk)


def own_slot_bias(path: Tensor, group: int, width: int) -> Tensor:
    """path [B·G, t] (the slot of each step on each hypothesis' prefix) → an additive bias
    [B, G, t·W]: 0 on those slots, −inf on every other slot of the sentence's buffers."""
    n, t = path.shape
    cols = torch.arange(t, device=path.device) * width + path  # [B·G, t]
    bias = torch.full((n, t * width), float("-inf"), device=path.device)
    return bias.scatter_(1, cols, 0.0).view(n // group, group, t * width)


__all__ = ["LayerCache", "own_slot_bias"]
