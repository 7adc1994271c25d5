"""Batch planning: a pure function of the lengths, the budget, the seed and the epoch.

    plan = plan_batches(src_lengths, tgt_lengths, max_tokens=4096, seed=1, epoch=3)

- Sentences of similar length go together: examples are ordered by (source, target) length,
  ties broken by a shuffle seeded with (seed, epoch), so batch contents vary across epochs.
- A batch holds as many examples as fit ``n · (max source length + max target length) ≤
  max_tokens`` (padded source + target tokens). An example over the budget alone gets a batch
  of its own and is counted in ``oversize``.
- The order of the batches is shuffled from (seed, epoch): deterministic for a given seed and
  epoch, different for another epoch.
- ``shard(rank, world)``: rank r takes batches r, r + world, …; every rank gets the same
  number (the last ``len % world`` batches of the shuffled order sit out this epoch, so no
  example is seen twice). Resuming is slicing: ``plan.batches[k:]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BatchPlan:
    batches: list[np.ndarray]  # example indices of each batch, in the order to run them
    oversize: int  # examples longer than the budget, each alone in a batch
    epoch: int

    def __len__(self) -> int:
        return len(self.batches)

    def shard(self, rank: int, world: int) -> BatchPlan:
        """The batches of one of ``world`` data-parallel ranks; equal counts on every rank."""
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is not in [0, {world})")
        per_rank = len(self.batches) // world
        return BatchPlan(self.batches[rank : per_rank * world : world], self.oversize, self.epoch)

    def resume(self, start: int) -> list[np.ndarray]:
        """The batches still to run when ``start`` of them are done."""
        return self.batches[start:]


def _rng(seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng([seed, epoch])


def plan_batches(
    src_lengths: np.ndarray,
    tgt_lengths: np.ndarray,
    *,
    max_tokens: int,
    seed: int,
    epoch: int,
    shuffle: bool = True,
) -> BatchPlan:
    """Plan one epoch. Lengths are the token counts the model sees (EOS included)."""
    src_lengths = np.asarray(src_lengths, dtype=np.int64)
    tgt_lengths = np.asarray(tgt_lengths, dtype=np.int64)
    if src_lengths.shape != tgt_lengths.shape or src_lengths.ndim != 1:
        raise ValueError(f"length arrays differ: {src_lengths.shape} and {tgt_lengths.shape}")
    if max_tokens <= 0:
        raise ValueError(f"max_tokens={max_tokens} must be positive")
    rng = _rng(seed, epoch)
    order = rng.permutation(len(src_lengths)) if shuffle else np.arange(len(src_lengths))
    # stable sorts keep the shuffled order among equal lengths: source length leads
    order = order[np.argsort(tgt_lengths[order], kind="stable")]
    order = order[np.argsort(src_lengths[order], kind="stable")]
    batches: list[np.ndarray] = []
    oversize = 0
    start, max_src, max_tgt = 0, 0, 0
    src_sorted, tgt_sorted = src_lengths[order].tolist(), tgt_lengths[order].tolist()
    for i, (s, t) in enumerate(zip(src_sorted, tgt_sorted, strict=True)):
        new_src, new_tgt = max(max_src, s), max(max_tgt, t)
        if i > start and (i - start + 1) * (new_src + new_tgt) > max_tokens:
            batches.append(order[start:i])
            start, new_src, new_tgt = i, s, t
        if s + t > max_tokens:
            oversize += 1
        max_src, max_tgt = new_src, new_tgt
    if start < len(order):
        batches.append(order[start:])
    if shuffle:
        batches = [batches[i] for i in rng.permutation(len(batches))]
    return BatchPlan(batches, oversize, epoch)
