#!/usr/bin/env python3
"""The float32 products of a decoding step on oneDNN's and MKL's kernels (model/float32_kernels.py).

    python benchmarks/float32_products.py [--threads 2] [--rounds 5] [--rows 32,160,640]
    python benchmarks/float32_products.py --search [--threads 2] [--rounds 5] [--limit 256]

The products of a `weighted-small` / `transformer-small` decoding step (d 256, FFN 1,024,
vocabulary 8,000) at 32 rows (greedy, batches of 32), 160 (beam 5) and 640 (an encoder's: 32
sentences of 20 tokens), each as PackedLinear multiplies (``multiply_float32``, bias added):
by oneDNN's reordered copy of the weight and by MKL's [in, out] copy. µs a product, the median
of ``--rounds`` rounds of 200 calls (40 at 640 rows), MKL's speed as a ratio to oneDNN's
measured in the same round, and each shape's sum. Each kernel's output is checked against a
float64 product first. ``--search``: the native engine's whole search instead (decode_speed.py's
protocol: `weighted-small`, the synthetic test sentences sorted by length, batches of 32,
exactly 24 output tokens), greedy and beam 5, its float32 products on either library in turn
(packed again for each), ms a step (medians of the rounds) and oneDNN's time over MKL's
(median of the rounds' ratios, lowest–highest). Run it with nothing else on the cores.
"""

import argparse
import functools
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_speed import LENGTH, protocol_arguments, protocol_setup
from int8_products import SHAPES  # (in, out, what)
from wtnmt.decode.search import search_batch
from wtnmt.model import quantize_decoding
from wtnmt.model.float32_kernels import cpu_vendor, multiply_float32, pack_float32
from wtnmt.runtime import machine_line

KERNELS = ("onednn", "mkl")


def timed(fn, x: torch.Tensor, calls: int) -> float:
    fn(x)
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
    return (time.perf_counter() - start) / calls * 1e6


def searches(args: argparse.Namespace) -> None:
    """The native engine's whole search on either library, in turn within each round."""
    from wtnmt.decode.native.network import NativeEngine

    model, inputs = protocol_setup(args)
    steps = len(inputs) * (LENGTH + 1)
    for beam in (1, 5):
        times: dict[str, list[float]] = {k: [] for k in KERNELS}
        for _ in range(args.rounds):
            for kernels in KERNELS:
                os.environ["WTNMT_FLOAT32_KERNELS"] = kernels
                quantize_decoding(model, "none")  # (drops the copies packed before)
                engine = NativeEngine(model)
                for src in inputs[:2]:  # packs the weights
                    search_batch(engine, src, beam=beam, min_len=LENGTH, max_len=LENGTH)
                start = time.perf_counter()
                for src in inputs:
                    search_batch(engine, src, beam=beam, min_len=LENGTH, max_len=LENGTH)
                times[kernels].append((time.perf_counter() - start) * 1e3 / steps)
        ratios = sorted(a / b for a, b in zip(times["onednn"], times["mkl"], strict=True))
        print(f"{'greedy' if beam == 1 else f'beam {beam}'}: ms a step, oneDNN "
              f"{statistics.median(times['onednn']):.2f}, MKL {statistics.median(times['mkl']):.2f}"
              f"; oneDNN / MKL {statistics.median(ratios):.2f} ({ratios[0]:.2f}–{ratios[-1]:.2f})",
              flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    protocol_arguments(parser, limit=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", default="32,160,640", help="comma-separated")
    parser.add_argument("--search", action="store_true", help="the native engine's search")
    args = parser.parse_args()
    if args.search:
        return searches(args)
    try:
        counts = [int(r) for r in args.rows.split(",")]
    except ValueError:
        parser.error(f"--rows {args.rows!r}: comma-separated counts of rows")
    torch.set_num_threads(args.threads)
    print(machine_line(args.threads), f"vendor {cpu_vendor() or 'unknown'}")
    print("| rows | in→out | what | oneDNN | MKL |\n|---|---|---|---|---|")
    g = torch.Generator().manual_seed(0)
    for rows in counts:
        calls = 200 if rows < 512 else 40
        total = dict.fromkeys(KERNELS, 0.0)
        for n_in, n_out, what in SHAPES:
            weight = torch.randn(n_out, n_in, generator=g) / n_in**0.5
            bias = torch.randn(n_out, generator=g)
            x = torch.randn(rows, n_in, generator=g)
            want = x.double() @ weight.double().t() + bias.double()
            fns = {}
            for kernels in KERNELS:
                packed = pack_float32(weight, rows, kernels)
                fns[kernels] = fn = functools.partial(
                    multiply_float32, packed=packed, bias=bias, kernels=kernels
                )
                assert torch.allclose(fn(x).double(), want, rtol=1e-5, atol=1e-4), kernels
            times = {k: [] for k in KERNELS}
            ratios = []
            for _ in range(args.rounds):
                for kernels in KERNELS:
                    times[kernels].append(timed(fns[kernels], x, calls))
                ratios.append(times["onednn"][-1] / times["mkl"][-1])
            med = {k: statistics.median(v) for k, v in times.items()}
            for k in KERNELS:
                total[k] += med[k]
            print(f"| {rows} | {n_in}→{n_out} | {what} | {med['onednn']:,.0f} | "
                  f"{med['mkl']:,.0f} ({statistics.median(ratios):.2f}×) |")  # fmt: skip
        ratio = total["onednn"] / total["mkl"]
        print(f"| {rows} | the five | | {total['onednn']:,.0f} | {total['mkl']:,.0f} "
              f"({ratio:.2f}×) |")  # fmt: skip


if __name__ == "__main__":
    main()
