"""Choosing among a vocabulary's log-probabilities on CPU without ranking all of them: the k
best extensions of beam search (``top_extensions``) and greedy search's argmax
(``row_argmax``), both through the maxima of 128-token blocks (decode/search.py)."""

from __future__ import annotations

import torch
from torch import Tensor

_BLOCK = 128  # vocabulary block of the two-stage top-k


def top_extensions(
    lprobs: Tensor, scores: Tensor, k: int, block: int = _BLOCK
) -> tuple[Tensor, Tensor, Tensor]:
    """The k best extensions of each sentence, best first: ``topk`` of scores + log-probs.

    lprobs [n, G, V] (G hypotheses per sentence), scores [n, G] → summed scores [n, k'],
    hypothesis [n, k'] and token [n, k'], k' = min(k, G·V). The same as
    ``(scores[..., None] + lprobs).view(n, -1).topk(k)`` (up to the order of ties), without
    writing a vocabulary-wide sum or ranking it: on CPU those two passes cost more than the
    rest of the search. Each row is cut into blocks of 128 tokens; the k extensions lie in
    the k blocks with the best maxima (a block left out has k better maxima above it), so only
    those k·128 values are ranked. (``block``, 128, is a parameter rather than a module
    constant so that TorchScript can compile the function too.)
    """
    n, g, v = lprobs.shape
    k = min(k, g * v)
    if v <= 4 * block:
        top, flat = (scores[:, :, None] + lprobs).view(n, -1).topk(k, dim=1)
        return top, flat // v, flat % v
    full = v // block * block
    maxima = lprobs[..., :full].reshape(n, g, -1, block).amax(-1)  # [n, G, V // 128]
    if full < v:
        maxima = torch.cat([maxima, lprobs[..., full:].amax(-1, keepdim=True)], dim=-1)
    per_hyp = maxima.size(-1)
    maxima = (maxima + scores[:, :, None]).view(n, -1)  # [n, G·blocks]
    best = maxima.topk(min(k, maxima.size(1)), dim=1).indices  # [n, kb]
    hyp = best // per_hyp
    cols = (best % per_hyp * block)[:, :, None] + torch.arange(block, device=lprobs.device)
    flat = hyp[:, :, None] * v + cols.clamp(max=v - 1)  # [n, kb, 128] into [n, G·V]
    values = lprobs.view(n, -1).gather(1, flat.view(n, -1)).view_as(flat)
    values = (values + scores.gather(1, hyp)[:, :, None]).masked_fill(cols >= v, float("-inf"))
    top, pos = values.view(n, -1).topk(k, dim=1)
    flat = flat.view(n, -1).gather(1, pos)
    return top, flat // v, flat % v


def row_argmax(x: Tensor) -> Tensor:
    """x [n, V] → the index of each row's maximum [n], the first where several are equal
    (as ``x.argmax(1)``). On CPU, ``argmax`` and ``max(dim)`` have no vector path: over
    [32, 8,000] they took 0.23 ms, the maxima of 128-wide blocks 0.03 ms and this whole
    function 0.13 ms. So the best block is found from the blocks' maxima, and the argmax
    taken over its 128 values only."""
    n, v = x.shape
    if v <= 4 * _BLOCK:
        return x.argmax(1)
    full = v // _BLOCK * _BLOCK
    maxima = x[:, :full].reshape(n, -1, _BLOCK).amax(-1)  # [n, V // 128]
    if full < v:
        maxima = torch.cat([maxima, x[:, full:].amax(-1, keepdim=True)], dim=-1)
    start = maxima.argmax(1, keepdim=True) * _BLOCK  # [n, 1] the first block with the max
    # the last block may be short: its columns past V repeat V − 1, which comes after them
    cols = (start + torch.arange(_BLOCK, device=x.device)).clamp_(max=v - 1)
    return cols.gather(1, x.gather(1, cols).argmax(1, keepdim=True))[:, 0]


__all__ = ["row_argmax", "top_extensions"]


def force_tokens(lprobs: Tensor, want: Tensor, free: int) -> Tensor:
    """A forced target prefix's step, in place: where ``want`` [n] is not ``free`` (PAD), every
    hypothesis of that sentence (lprobs [n, G, V]) may only take that token, at the model's
    log-probability of it (counted in the score, as fairseq and CTranslate2 count it)."""
    rows = want.ne(free)
    index = want.clamp_min(0)[:, None, None].expand(lprobs.size(0), lprobs.size(1), 1)
    kept = lprobs.gather(-1, index)
    only = torch.full_like(lprobs, float("-inf")).scatter_(-1, index, kept)
    return lprobs.copy_(torch.where(rows[:, None, None], only, lprobs))
