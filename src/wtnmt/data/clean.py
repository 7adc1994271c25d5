"""Cleaning with a report: what is dropped is dropped as a pair, and counted by reason."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

Pair = tuple[str, str]


def drop_empty_and_duplicates(
    pairs: list[Pair], *, duplicates: bool
) -> tuple[list[Pair], Counter[str]]:
    """Drop pairs with an empty (or blank) side, and with ``duplicates`` exact repeats of an
    earlier pair (the first occurrence stays)."""
    kept: list[Pair] = []
    dropped: Counter[str] = Counter()
    seen: set[Pair] = set()
    for pair in pairs:
        if not pair[0].strip() or not pair[1].strip():
            dropped["empty"] += 1
        elif duplicates and pair in seen:
            dropped["duplicate"] += 1
        else:
            if duplicates:
                seen.add(pair)
            kept.append(pair)
    return kept, dropped


def length_filter(
    src_lengths: Sequence[int], tgt_lengths: Sequence[int], *, max_tokens: int, max_ratio: float
) -> tuple[list[int], Counter[str]]:
    """Indices of the pairs to keep: each side at most ``max_tokens`` subword tokens and the
    longer side at most ``max_ratio`` times the shorter (as Moses' clean-corpus-n)."""
    keep: list[int] = []
    dropped: Counter[str] = Counter()
    for i, (s, t) in enumerate(zip(src_lengths, tgt_lengths, strict=True)):
        if s > max_tokens or t > max_tokens:
            dropped["too_long"] += 1
        elif max(s, t) > max_ratio * max(min(s, t), 1):
            dropped["length_ratio"] += 1
        else:
            keep.append(i)
    return keep, dropped
