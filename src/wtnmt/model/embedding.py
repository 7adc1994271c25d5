"""Token embeddings (shared by source, target and output projection) and positions."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from wtnmt.model.packed import PackedLinear


class TokenEmbedding(nn.Module):
    """One [V, D] matrix for source and target embeddings and the output projection (tied),
    embeddings scaled by √D (Vaswani et al. §3.4)."""

    def __init__(
        self,
        *,
        vocab_size: int,
        d_model: int,
        pad_id: int,
        output_bias: bool = False,
        zero_row: int | None = None,
    ) -> None:
        """``zero_row``: a row held at zero (model.decoder_start: zero, ``<s>``'s): zero when
        made and when loaded, and never trained (training multiplies by the matrix with that
        row zeroed, so no gradient reaches it), so that every engine and export reading the
        matrix sees a zero vector there."""
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, d_model))
        # a bias on the logits (model.output_bias: Marian's final_logits_bias), or none
        self.bias = nn.Parameter(torch.zeros(vocab_size)) if output_bias else None
        self.scale = math.sqrt(d_model)
        self.pad_id = pad_id
        self.zero_row = zero_row
        if zero_row is not None:  # (the index _matrix fills, on the weight's device)
            self.register_buffer("_zero_index", torch.tensor([zero_row]), persistent=False)
        # N(0, D^-1/2): the scaled embedding then has unit variance, as the positions do
        nn.init.normal_(self.weight, std=d_model**-0.5)
        with torch.no_grad():
            self.weight[pad_id].zero_()
        self._hold_zero_row()
        self._output = PackedLinear()  # decoding's output projection, packed for oneDNN

    def _hold_zero_row(self) -> None:
        if self.zero_row is not None:
            with torch.no_grad():
                self.weight[self.zero_row].zero_()

    def _load_from_state_dict(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super()._load_from_state_dict(*args, **kwargs)
        self._hold_zero_row()  # (weights from a run that started from <s>: train.init_from)

    def _matrix(self) -> Tensor:
        """The [V, D] matrix; in training with ``zero_row`` that row zeroed in the graph, so
        that its gradient is zero."""
        if self.zero_row is None or not self.training:
            return self.weight
        return self.weight.index_fill(0, self._zero_index, 0.0)

    def packed_linears(self) -> tuple[PackedLinear, ...]:
        """The products this module packs for decoding (see ``packed.quantize_decoding``)."""
        return (self._output,)

    def forward(self, tokens: Tensor) -> Tensor:
        return nn.functional.embedding(tokens, self._matrix(), self.pad_id) * self.scale

    def logits(self, x: Tensor) -> Tensor:
        return self._output(x, self._matrix(), self.bias)  # x·Eᵀ (+ b): [..., D] → [..., V]


def sinusoid_table(length: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(pos / 10000^(2i/D))."""
    pos = torch.arange(length, dtype=torch.float64)[:, None]  # [L, 1]
    inv = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # [D/2]
    table = torch.zeros(length, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * inv)
    table[:, 1::2] = torch.cos(pos * inv)
    return table.float()


class Positions(nn.Module):
    """Sinusoidal (fixed) or learned position vectors, added to the scaled embeddings."""

    def __init__(self, *, max_positions: int, d_model: int, learned: bool) -> None:
        super().__init__()
        self.max_positions = max_positions
        self.learned: nn.Parameter | None = None
        if learned:
            self.learned = nn.Parameter(torch.empty(max_positions, d_model))
            nn.init.normal_(self.learned, std=d_model**-0.5)
        else:
            self.register_buffer("table", sinusoid_table(max_positions, d_model), persistent=False)

    def forward(self, length: int, offset: int = 0) -> Tensor:
        """Positions offset … offset+length−1 → [length, D]."""
        if offset + length > self.max_positions:
            raise ValueError(
                f"a sequence of {offset + length} tokens exceeds model.max_positions="
                f"{self.max_positions}: shorten the input or raise max_positions"
            )
        return self._table()[offset : offset + length]

    def at(self, index: Tensor) -> Tensor:
        """The positions ``index`` [T] (a tensor: one decoder step of a graph exported for
        every step, export/onnx) → [T, D]; the caller keeps them below max_positions."""
        return self._table().index_select(0, index)

    def _table(self) -> Tensor:
        return self.learned if self.learned is not None else self.table
