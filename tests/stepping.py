"""Two decoders' steps compared through what beam search does to them: 20 steps of random
prefixes, reorders that keep, swap or double hypotheses, a sentence that finishes."""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

from wtnmt.special import BOS


class Stepper(Protocol):
    def __call__(self, prefix: Tensor) -> Tensor: ...
    def reorder(self, index: Tensor, sentences: Tensor | None) -> None: ...


def walk(first: Stepper, second: Stepper, vocab_size: int, tolerance: float) -> float:
    """The largest difference of the two steppers' log-probabilities (3 source sentences, two
    hypotheses each after the first step) over 20 steps; an AssertionError naming it as soon
    as a step differs by ``tolerance`` or more."""
    g = torch.Generator().manual_seed(0)
    worst = 0.0

    def check(prefix: Tensor) -> None:
        nonlocal worst
        expected, got = first(prefix), second(prefix)
        assert got.shape == expected.shape
        difference = (got - expected).abs().max().item()
        assert difference < tolerance, f"the steps differ by {difference:.2e}"
        worst = max(worst, difference)

    with torch.inference_mode():
        prefix = torch.full((3, 1), BOS)
        check(prefix)  # the first step: one hypothesis a sentence
        index = torch.tensor([0, 0, 1, 1, 2, 2])  # each sentence's hypothesis, twice
        sentences = None
        for t in range(1, 20):  # 20 steps: the ONNX buffers (16 steps at first) grow once
            first.reorder(index, sentences)
            second.reorder(index, sentences)
            prefix = prefix.index_select(0, index)
            tokens = torch.randint(4, vocab_size, (prefix.size(0), 1), generator=g)
            prefix = torch.cat([prefix, tokens], dim=1)
            check(prefix)
            n = prefix.size(0) // 2
            if t == 8:  # sentence 1 is done: sentences 0 and 2 go on, hypotheses swapped
                index, sentences = torch.tensor([1, 0, 5, 5]), torch.tensor([0, 2])
            else:  # beam search's reorder: each keeps one of its sentence's two, or both
                pick = torch.randint(0, 2, (n, 2), generator=g)
                index, sentences = (torch.arange(n)[:, None] * 2 + pick).view(-1), None
    return worst


__all__ = ["Stepper", "walk"]
