#!/usr/bin/env python3
"""How decoding cost grows with beam size, batch size and output length, and the latency of
one sentence, for the `small` Weighted Transformer (float32 and ``--quantize int8``).

    python benchmarks/decode_scaling.py [--sentences 256] [--rounds 3] [--quantize none int8]
                                        [--record]

The test sentences of make_synthetic.py (../shared/bench), sorted by length as
`wtnmt translate` batches them; random seeded weights with the output length forced (min =
max), so that the work does not depend on them; 2 threads; medians of ``--rounds`` rounds.
Each table's rows alternate within a round (this machine drifts by ±20% over minutes), and
each figure is also given as a ratio to the table's first row, measured in the same rounds:

- beam size 1, 2, 4, 5, 8 (batches of 32 sentences, 24 tokens): output tokens/s;
- batch size 1, 8, 32, 64 (beam 5, 24 tokens): output tokens/s;
- output length 8, 16, 24, 48 tokens (beam 5, batches of 32): milliseconds per output token;
- one sentence at a time, beam 5, 24 tokens: the latency an interactive user feels, median
  and 90th percentile over the sentences.

``--quantize none int8`` measures each precision in turn; ``--record`` keeps one table of
them (records.py: docs/BENCHMARKS.md's).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_speed import batches, setup
from records import add_record_argument, keep
from train_speed import ROOT
from wtnmt.decode import beam_search, greedy_search
from wtnmt.model import quantize_decoding
from wtnmt.runtime import machine_line


def decode(model, inputs: list[torch.Tensor], beam: int, length: int) -> float:  # type: ignore[no-untyped-def]
    """Seconds to decode ``inputs`` with ``length`` output tokens forced."""
    start = time.perf_counter()
    for src in inputs:
        if beam == 1:
            greedy_search(model, src, min_len=length, max_len=length)
        else:
            beam_search(model, src, beam=beam, min_len=length, max_len=length)
    return time.perf_counter() - start


def table(title: str, rows: dict[str, list[float]], unit: str) -> None:
    first = statistics.median(next(iter(rows.values())))
    print(f"\n{title}")
    for name, values in rows.items():
        m = statistics.median(values)
        print(f"  {name:14s} {m:9.2f} {unit}   ×{m / first:5.2f} the first row")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench-dir", type=Path, default=ROOT.parent / "shared" / "bench")
    parser.add_argument("--work", type=Path, default=ROOT / "bench-data")
    parser.add_argument("--sentences", type=int, default=256, help="test sentences decoded")
    parser.add_argument("--latency-sentences", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quantize", choices=["none", "int8"], nargs="+", default=["none"])
    add_record_argument(parser)
    args = parser.parse_args()
    print(machine_line(2), flush=True)
    model, data = setup(args.bench_dir, args.work)
    rows = [measured(model, data, args, quantize) for quantize in args.quantize]
    if args.record:
        headers = ["precision", *(f"beam {b}" for b in BEAMS), *(f"batch {b}" for b in SIZES),
                   "ms a token, 8–48 tokens", "one sentence, ms: median (p90)"]  # fmt: skip
        note = f"{args.sentences} sentences, medians of {args.rounds} rounds"
        keep("decode-scaling", machine=machine_line(2), headers=headers, rows=rows, note=note)


BEAMS, SIZES, LENGTHS = (1, 2, 4, 5, 8), (1, 8, 32, 64), (8, 16, 24, 48)


def measured(model, data, args, quantize: str) -> list[str]:  # type: ignore[no-untyped-def]
    """The tables of one precision, printed; their row of the record."""
    quantize_decoding(model, quantize)  # type: ignore[arg-type]
    n = args.sentences
    by32 = batches(data, n, 32)
    decode(model, by32[:1], 5, 24)  # warm-up
    beams: dict[str, list[float]] = {}
    sizes: dict[str, list[float]] = {}
    lengths: dict[str, list[float]] = {}
    latency: list[float] = []
    sized = {size: batches(data, n, size) for size in SIZES}
    for _ in range(args.rounds):
        for beam in BEAMS:
            beams.setdefault(f"beam {beam}", []).append(24 * n / decode(model, by32, beam, 24))
        for size, inputs in sized.items():
            rate = 24 * n / decode(model, inputs, 5, 24)
            sizes.setdefault(f"batch {size}", []).append(rate)
        for length in LENGTHS:
            ms = decode(model, by32, 5, length) / (length * n) * 1000
            lengths.setdefault(f"{length} tokens", []).append(ms)
    for src in sized[1][: args.latency_sentences]:
        latency.append(decode(model, [src], 5, 24) * 1000)
    print(f"weighted-small, quantize {quantize}, {n} sentences, medians of {args.rounds}")
    table("beam size (batches of 32, 24 tokens): output tokens/s", beams, "tok/s")
    table("batch size (beam 5, 24 tokens): output tokens/s", sizes, "tok/s")
    table("output length (beam 5, batches of 32): ms per output token", lengths, "ms")
    latency.sort()
    p90 = latency[math.ceil(0.9 * len(latency)) - 1]  # nearest rank
    median = statistics.median(latency)
    print(
        f"\none sentence (batch 1, beam 5, 24 tokens): median {median:.1f} ms,"
        f" 90th percentile {p90:.1f} ms over {len(latency)} sentences"
    )
    per_token = [statistics.median(v) for v in lengths.values()]
    return [
        "float32" if quantize == "none" else "int8",
        *(f"{statistics.median(v):,.0f}" for v in beams.values()),
        *(f"{statistics.median(v):,.0f}" for v in sizes.values()),
        f"{min(per_token):.2f}–{max(per_token):.2f}",
        f"{median:.1f} ({p90:.1f})",
    ]


if __name__ == "__main__":
    main()
