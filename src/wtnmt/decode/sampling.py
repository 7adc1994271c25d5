"""Sampling: each next token drawn from the model's distribution, sharpened or flattened by a
temperature and cut to its ``top_k`` most probable tokens or to the smallest set holding
``top_p`` of the probability (nucleus sampling, Holtzman et al., 2020) — what back-translation
uses (Edunov et al., 2018; fairseq's ``--sampling``, Marian's ``--output-sampling``).

Reproducible under a seed, and independent of how sentences are batched: the uniform number
behind the draw of step t of sample j of a sentence is a hash of (seed, the sentence's source
ids and forced prefix, j, t), integer arithmetic the native engine repeats (search_ops.h), so a
sentence's samples are the same in any batch, on any number of workers, for a given engine.
The draw itself is an inverse CDF over the kept tokens, most probable first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

MASK32 = 0xFFFFFFFF
MAX_TEMPERATURE = 100.0
MAX_SAMPLES = 1024


@dataclass(frozen=True)
class Sampling:
    """How tokens are drawn: ``temperature`` (> 0; 1: the model's distribution), ``top_k``
    (0: every token), ``top_p`` (1: every token), ``seed``, ``samples`` a sentence."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    samples: int = 1

    def __post_init__(self) -> None:
        if not 0.0 < self.temperature <= MAX_TEMPERATURE:  # nan too
            raise ValueError(
                f"temperature={self.temperature!r}: allowed above 0 up to {MAX_TEMPERATURE:g} "
                f"(greedy search is the limit at 0)"
            )
        if not 0 <= self.top_k:
            raise ValueError(f"top_k={self.top_k!r}: allowed 0 (every token) or more")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p!r}: allowed above 0 up to 1")
        if not 0 <= self.seed <= MASK32:
            raise ValueError(f"seed={self.seed!r}: allowed 0 to {MASK32}")
        if not 1 <= self.samples <= MAX_SAMPLES:
            raise ValueError(f"samples={self.samples!r}: allowed 1 to {MAX_SAMPLES}")


# ------------------------------------------------------------------------------------ hashing
def mix32(x: int) -> int:
    """A 32-bit integer hash (Wellons' lowbias32)."""
    x &= MASK32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & MASK32
    x ^= x >> 16
    return x


def _times(x: Tensor, c: int) -> Tensor:
    """(x · c) mod 2^32 of int64 tensors of 32-bit values, without overflowing int64."""
    low = x * (c & 0xFFFF)
    high = ((x * (c >> 16)) & 0xFFFF) << 16
    return (low + high) & MASK32


def mix32_tensor(x: Tensor) -> Tensor:
    """``mix32`` of each element of an int64 tensor."""
    x = x & MASK32
    x = x ^ (x >> 16)
    x = _times(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _times(x, 0x846CA68B)
    return x ^ (x >> 16)


def sentence_key(seed: int, source: Sequence[int], prefix: Sequence[int] = ()) -> int:
    """What a sentence's draws hang on: the seed, its source ids and its forced prefix."""
    h = mix32(seed + 0x9E3779B9)
    for token in source:
        h = mix32(h ^ token)
    h = mix32(h ^ 0x85EBCA6B)  # between the source and the prefix
    for token in prefix:
        h = mix32(h ^ token)
    return h


def row_keys(keys: Sequence[int], samples: int, device: torch.device) -> Tensor:
    """[B·samples] the key of each sample row (sentence-major)."""
    rows = [mix32(k ^ mix32(j + 0x27D4EB2F)) for k in keys for j in range(samples)]
    return torch.tensor(rows, dtype=torch.long, device=device)


def uniforms(keys: Tensor, step: int) -> Tensor:
    """[N] float32 in [0, 1): step ``step``'s draw of each row, 24 bits of its hash."""
    h = mix32_tensor(keys ^ mix32(step + 0x165667B1))
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))


# ------------------------------------------------------------------------------------ drawing
NUCLEUS_FIRST = 256  # top-p looks for its tokens among this many before ranking them all


def sample_pick(lprobs: Tensor, u: Tensor, temperature: float, top_k: int, top_p: float) -> Tensor:
    """[N] the token drawn from each row of ``lprobs`` [N, V] (ruled-out tokens at -inf) with
    its uniform ``u`` [N]: probabilities ∝ exp(lprobs / temperature) over the ``top_k`` most
    probable (0: all), then the most probable of them holding ``top_p``; an inverse CDF over
    those, most probable first (without either, over every token in id order: no ranking)."""
    scores = lprobs / temperature if temperature != 1.0 else lprobs
    v = scores.size(-1)
    index: Tensor | None = None
    if 0 < top_k < v:
        values, index = scores.topk(top_k, dim=-1, sorted=True)
        probs = torch.softmax(values, dim=-1)
    elif top_p < 1.0:
        index, probs = _nucleus_candidates(scores, top_p)
    else:
        probs = torch.softmax(scores, dim=-1)
    if top_p < 1.0:  # keep a token while the more probable ones hold less than top_p
        before = probs.cumsum(-1) - probs
        probs = probs.masked_fill(before.ge(top_p), 0.0)
    cdf = probs.cumsum(-1)
    target = (u * cdf[:, -1]).unsqueeze(1)
    j = torch.searchsorted(cdf, target, right=True)[:, 0]
    # where u·total rounds up to the total: the last token of non-zero probability
    last = probs.gt(0).cumsum(-1).argmax(-1)
    j = torch.minimum(j, last)
    return j if index is None else index.gather(1, j.unsqueeze(1))[:, 0]


def _nucleus_candidates(scores: Tensor, top_p: float) -> tuple[Tensor, Tensor]:
    """The tokens top-p chooses among, most probable first, and their probabilities (of the
    whole distribution): the ``NUCLEUS_FIRST`` most probable where they hold ``top_p`` in
    every row (the rest could not be kept), else every token ranked."""
    total = scores.logsumexp(-1, keepdim=True)
    first = min(NUCLEUS_FIRST, scores.size(-1))
    values, index = scores.topk(first, dim=-1, sorted=True)
    probs = (values - total).exp()
    if first < scores.size(-1) and not bool(probs.sum(-1).ge(top_p).all()):
        values, index = scores.sort(dim=-1, descending=True, stable=True)
        probs = (values - total).exp()
    return index, probs


__all__ = [
    "MAX_SAMPLES",
    "MAX_TEMPERATURE",
    "NUCLEUS_FIRST",
    "Sampling",
    "mix32",
    "mix32_tensor",
    "row_keys",
    "sample_pick",
    "sentence_key",
    "uniforms",
]
