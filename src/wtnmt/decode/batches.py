"""A decoding batch's tensors: sentences grouped by length under a token budget, their ids
padded into the tensors the search reads (decode/translator.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from wtnmt.special import BOS, EOS, PAD


def cut_to(
    ids: list[list[int]], longest: int, warn: Callable[[str], None], first: int, label: str
) -> list[list[int]]:
    """Each sequence cut to ``longest`` pieces, in place, with a warning naming it by
    ``label`` (numbered from ``first``)."""
    for i, seq in enumerate(ids):
        if len(seq) > longest:
            where = label.format(first + i)
            warn(f"{where}: {len(seq)} pieces, cut to the model's maximum of {longest}")
            ids[i] = seq[:longest]
    return ids


def length_batches(ids: list[list[int]], budget: int) -> list[list[int]]:
    """Indices of non-empty sentences, grouped by length under the token budget."""
    order = sorted((i for i, s in enumerate(ids) if s), key=lambda i: len(ids[i]))
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and (len(current) + 1) * (len(ids[i]) + 1) > budget:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def padded(seqs: list[list[int]], device: torch.device, *, bos: bool = False) -> torch.Tensor:
    """[B, longest + 1]: each sequence with EOS after it (or BOS before it), PAD after."""
    width = max(map(len, seqs)) + 1
    out = torch.full((len(seqs), width), PAD, dtype=torch.long)
    for row, seq in enumerate(seqs):
        full = [BOS, *seq] if bos else [*seq, EOS]
        out[row, : len(full)] = torch.tensor(full, dtype=torch.long)
    return out.to(device)


def prefix_tensor(seqs: list[list[int]], device: torch.device) -> torch.Tensor | None:
    """A batch's forced target prefixes [B, P], PAD-padded (None: none has one)."""
    width = max(map(len, seqs))
    if width == 0:
        return None
    out = torch.full((len(seqs), width), PAD, dtype=torch.long)
    for row, seq in enumerate(seqs):
        out[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
    return out.to(device)
