#!/usr/bin/env python3
"""Decoding speed of the `small`-shaped Weighted Transformer, measured as
../shared/bench/PEERS.md measured fairseq (beam 5: 1,276 output tokens/s), OpenNMT-py (968),
JoeyNMT (175) and CTranslate2 (2,174 float32).

    python benchmarks/decode_speed.py [--bench-dir ../shared/bench] [--limit 1000]

The 1,000 test sentences of make_synthetic.py sorted by length (as fairseq's generate and
`wtnmt translate` batch them), batches of 32 sentences, output length forced to exactly 24
tokens (min = max = 24) so that every system does the same work, greedy and beam 5, with the
key/value cache and without it (recomputing the prefix), 2 threads. Random weights (seeded):
with the length forced, the work does not depend on them. Model loading is excluded. Greedy
and beam 5 alternate over ``--rounds`` rounds and the medians are reported, as PEERS.md took
medians of 3 (this machine's speed drifts by ±20% over minutes). The last line reads
`beam5 out tok/s: S  greedy out tok/s: G  cache speed-up: Rx`.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from records import add_record_argument
from train_speed import ROOT, build_data
from wtnmt.config import load_config
from wtnmt.data import ParallelData
from wtnmt.decode import beam_search, greedy_search
from wtnmt.model import build_model
from wtnmt.runtime import machine_line, tune_cpu_allocator
from wtnmt.special import EOS, PAD

LENGTH = 24


def batches(
    data: ParallelData, limit: int, size: int, *, by_length: bool = True
) -> list[torch.Tensor]:
    """The first ``limit`` test sentences sorted by length (as fairseq's generate and
    `wtnmt translate` batch them) or in file order, in batches of ``size``."""
    n = min(limit, len(data))
    order = sorted(range(n), key=lambda i: len(data.src[i])) if by_length else list(range(n))
    out = []
    for start in range(0, n, size):
        rows = [[*data.src[i].tolist(), EOS] for i in order[start : start + size]]
        src = torch.full((len(rows), max(map(len, rows))), PAD, dtype=torch.long)
        for r, ids in enumerate(rows):
            src[r, : len(ids)] = torch.tensor(ids)
        out.append(src)
    return out


def setup(
    bench_dir: Path, work: Path, *, threads: int = 2, preset: str = "weighted-small"
) -> tuple[torch.nn.Module, ParallelData]:
    """The threads, the allocator as `wtnmt translate` sets it, the benchmark's test split and
    the ``preset`` model (the `small` Weighted Transformer) with random seeded weights."""
    torch.set_num_threads(threads)
    tune_cpu_allocator()
    vocab = build_data(bench_dir, work)
    data = ParallelData(work / "prepared", "test")
    torch.manual_seed(0)
    model = build_model(load_config(preset).model, vocab_size=vocab).eval()
    return model, data


def protocol_arguments(parser: argparse.ArgumentParser, limit: int) -> None:
    """The options of the scripts that decode this protocol's batches with one preset."""
    parser.add_argument("--bench-dir", type=Path, default=ROOT.parent / "shared" / "bench")
    parser.add_argument("--work", type=Path, default=ROOT / "bench-data")
    parser.add_argument("--model", default="weighted-small", help="the preset decoded")
    parser.add_argument("--limit", type=int, default=limit, help="test sentences to decode")
    parser.add_argument("--threads", type=int, default=2)


def protocol_setup(args: argparse.Namespace) -> tuple[torch.nn.Module, list[torch.Tensor]]:
    """The model and its batches of 32 for ``protocol_arguments``' options, the machine line
    printed."""
    model, data = setup(args.bench_dir, args.work, threads=args.threads, preset=args.model)
    print(f"{machine_line()}; {args.model}, {args.limit} sentences, batches of 32", flush=True)
    return model, batches(data, args.limit, 32)


def run(model, inputs, *, beam: int, use_cache: bool) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    start, tokens = time.perf_counter(), 0
    for src in inputs:
        if beam == 1:
            hyps = greedy_search(model, src, min_len=LENGTH, max_len=LENGTH, use_cache=use_cache)
            tokens += sum(len(h.tokens) for h in hyps)
        else:
            hyps = beam_search(
                model, src, beam=beam, min_len=LENGTH, max_len=LENGTH, use_cache=use_cache
            )
            tokens += sum(len(h[0].tokens) for h in hyps)
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench-dir", type=Path, default=ROOT.parent / "shared" / "bench")
    parser.add_argument("--work", type=Path, default=ROOT / "bench-data")
    parser.add_argument("--limit", type=int, default=1000, help="test sentences to decode")
    parser.add_argument(
        "--uncached-limit",
        type=int,
        default=320,
        help="sentences decoded without the cache (it is slow)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (median)")
    parser.add_argument(
        "--file-order",
        action="store_true",
        help="batch the sentences in file order, unsorted (as JoeyNMT's figures were taken)",
    )
    add_record_argument(parser)
    args = parser.parse_args()
    print(machine_line(2), flush=True)
    model, data = setup(args.bench_dir, args.work)
    inputs = batches(data, args.limit, 32, by_length=not args.file_order)
    run(model, inputs[:1], beam=5, use_cache=True)  # warm-up
    rounds: dict[str, list[float]] = {"greedy": [], "beam5": []}
    for r in range(args.rounds):
        for name, beam in (("greedy", 1), ("beam5", 5)):
            seconds, tokens = run(model, inputs, beam=beam, use_cache=True)
            assert tokens == LENGTH * min(args.limit, len(data)), tokens
            rounds[name].append(tokens / seconds)
            print(
                f"round {r + 1} {name:7s} cached: {tokens / seconds:8.0f} out tok/s "
                f"({tokens / LENGTH / seconds:.1f} sent/s, {seconds:.1f} s)",
                flush=True,
            )
    results = {name: statistics.median(values) for name, values in rounds.items()}
    few = inputs[: max(args.uncached_limit // 32, 1)]
    cached_s, n = run(model, few, beam=5, use_cache=True)
    uncached_s, _ = run(model, few, beam=5, use_cache=False)
    speedup = uncached_s / cached_s
    print(
        f"beam5   uncached: {n / uncached_s:8.0f} out tok/s on the first {n // LENGTH} "
        f"sentences (cached on the same: {n / cached_s:.0f})"
    )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"peak RSS (whole run, uncached decoding included): {rss:.2f} GiB")
    print(
        f"beam5 out tok/s: {results['beam5']:.0f}  greedy out tok/s: {results['greedy']:.0f}  "
        f"cache speed-up: {speedup:.1f}x"
    )
    if args.record:
        from records import keep

        order = "file order" if args.file_order else "sorted by length"
        keep(
            "decode-speed",
            machine=machine_line(2),
            headers=["search (PyTorch engine, float32)", "output tok/s"],
            rows=[
                [f"greedy, {min(args.limit, len(data)):,} sentences {order}",
                 f"{results['greedy']:,.0f}"],
                ["beam 5, the same", f"{results['beam5']:,.0f}"],
                [f"beam 5 without the key/value cache (first {n // LENGTH} sentences)",
                 f"{n / uncached_s:,.0f} (cached on the same: {n / cached_s:,.0f}, "
                 f"{speedup:.1f}×)"],
                ["peak RSS (the whole run)", f"{rss:.2f} GiB"],
            ],
        )  # fmt: skip


if __name__ == "__main__":
    main()
