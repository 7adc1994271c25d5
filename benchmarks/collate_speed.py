#!/usr/bin/env python3
"""Making a training batch from the prepared ids: `ParallelData.collate` (whole-array gathers
and scatters) against the same batch built a row at a time (the form it replaced), on one
epoch's batches of a prepared split, the two taking turns round by round:

    python benchmarks/collate_speed.py [--data data-bin/multi30k.en-de] [--max-tokens 16384 4096]
                                       [--record]

Printed: for each batch size, the median milliseconds a batch of each over `--rounds` rounds,
and the ratio; ``--record`` keeps the table (records.py: docs/BENCHMARKS.md's). A batch
is made once an update on the host; on a GPU, where a small model's update is paced by the
host, that time is part of every update.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from records import add_record_argument, keep
from wtnmt.data import ParallelData
from wtnmt.data.batching import plan_batches
from wtnmt.runtime import machine_line
from wtnmt.special import BOS, EOS, PAD


def row_by_row(data: ParallelData, indices: np.ndarray) -> tuple[torch.Tensor, ...]:
    """The batch as it was made before: a loop over its pairs."""
    src = [data.src[i] for i in indices]
    tgt = [data.tgt[i] for i in indices]
    n, s_len, t_len = len(indices), max(map(len, src)) + 1, max(map(len, tgt)) + 1
    src_ids = np.full((n, s_len), PAD, dtype=np.int64)
    tgt_in = np.full((n, t_len), PAD, dtype=np.int64)
    tgt_out = np.full((n, t_len), PAD, dtype=np.int64)
    for row, (s, t) in enumerate(zip(src, tgt, strict=True)):
        src_ids[row, : len(s)] = s
        src_ids[row, len(s)] = EOS
        tgt_in[row, 0] = BOS
        tgt_in[row, 1 : len(t) + 1] = t
        tgt_out[row, : len(t)] = t
        tgt_out[row, len(t)] = EOS
    return torch.from_numpy(src_ids), torch.from_numpy(tgt_in), torch.from_numpy(tgt_out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=Path("data-bin/multi30k.en-de"))
    parser.add_argument("--split", default="train")
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[16384, 4096])
    parser.add_argument("--rounds", type=int, default=15)
    add_record_argument(parser)
    args = parser.parse_args()
    if not (args.data / f"{args.split}.src.npy").is_file():
        sys.exit(f"--data {args.data}: no prepared {args.split} split there (wtnmt prepare)")
    torch.set_num_threads(1)
    print(machine_line(1), flush=True)
    data = ParallelData(args.data, args.split)
    rows = [timed(data, tokens, args.rounds) for tokens in args.max_tokens]
    headers = ["batch", "row by row", "`collate`", "speed-up"]
    for row in rows:
        print(" | ".join(row), flush=True)
    if args.record:
        note = f"{args.data.name}, {args.split} split, medians of {args.rounds} rounds"
        keep("collate-speed", machine=machine_line(1), headers=headers, rows=rows, note=note)


def timed(data: ParallelData, max_tokens: int, rounds: int) -> list[str]:
    """One row: batches of ``max_tokens`` of one epoch, both forms taking turns."""
    plan = plan_batches(data.src_lengths, data.tgt_lengths, max_tokens=max_tokens, seed=1, epoch=1)
    for indices in plan.batches:  # the same batches, or the timing means nothing
        batch = data.collate(indices)
        old = row_by_row(data, indices)
        new = (batch.src, batch.tgt_in, batch.tgt_out)
        assert all(torch.equal(a, b) for a, b in zip(old, new, strict=True))
    forms = {"row by row": lambda i: row_by_row(data, i), "collate": data.collate}
    times: dict[str, list[float]] = {name: [] for name in forms}
    for r in range(rounds):
        for name in list(forms)[r % 2 :] + list(forms)[: r % 2]:
            start = time.perf_counter()
            for indices in plan.batches:
                forms[name](indices)
            times[name].append((time.perf_counter() - start) / len(plan.batches))
    pairs = np.mean([len(b) for b in plan.batches])
    median = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    return [
        f"{max_tokens:,} tokens ({pairs:.0f} pairs)",
        f"{median['row by row']:.2f} ms",
        f"{median['collate']:.2f} ms",
        f"**{median['row by row'] / median['collate']:.1f}×**",
    ]


if __name__ == "__main__":
    main()
