#!/usr/bin/env python3
"""What sampling and ensembles cost beside plain search.

    python benchmarks/decode_options_cost.py [--limit 320] [--rounds 3] [--engines native,pytorch]
        [--ensembles-only] [--record]

decode_speed.py's protocol: the benchmark's test sentences sorted by length in batches of 32,
the `small` Weighted Transformer with random seeded weights, every output exactly 24 tokens
(min = max = 24) so that each way does the same work, 2 threads. Per engine, greedy search and
sampling (plain; top-k 10; top-p 0.9; one sample a sentence) take turns over ``--rounds``
rounds; output tokens/s, medians, and each way's time against greedy's in the same round
(median, lowest–highest). Then ensembles of 2 and 4 models against one, greedy and beam 5, on
each engine. Sampling draws through ``search_batch`` as `wtnmt translate
--sampling` does (the native engine's own loop, or the PyTorch engine's).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch

from decode_speed import LENGTH, protocol_arguments, protocol_setup
from records import add_record_argument
from wtnmt.config import load_config
from wtnmt.decode.ensemble import Ensemble
from wtnmt.decode.sampling import Sampling
from wtnmt.decode.search import search_batch
from wtnmt.model import build_model
from wtnmt.runtime import machine_line

WAYS = {
    "greedy": None,
    "sampling": Sampling(seed=1),
    "top-k 10": Sampling(seed=1, top_k=10),
    "top-p 0.9": Sampling(seed=1, top_p=0.9),
}


def run(engine, inputs, sampling: Sampling | None, beam: int = 1) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    start, tokens = time.perf_counter(), 0
    for src in inputs:
        found = search_batch(
            engine, src, beam=beam, min_len=LENGTH, max_len=LENGTH, sampling=sampling
        )
        tokens += sum(len(hyps[0].tokens) for hyps in found)
    return time.perf_counter() - start, tokens


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    protocol_arguments(parser, limit=320)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engines", default="native,pytorch")
    parser.add_argument("--ensembles-only", action="store_true", help="ensembles' cost only")
    add_record_argument(parser)
    args = parser.parse_args()
    sampling_rows: list[list[str]] = []
    model, inputs = protocol_setup(args)
    engines = {}
    for name in args.engines.split(","):
        if name not in ("native", "pytorch"):
            parser.error(f"--engines {args.engines}: native and/or pytorch")
        if name == "native":
            from wtnmt.decode.native.network import NativeEngine

            engines[name] = NativeEngine(model)
        else:
            engines[name] = model
    for name, engine in engines.items() if not args.ensembles_only else ():
        run(engine, inputs[:1], None)  # warm-up
        seconds: dict[str, list[float]] = {way: [] for way in WAYS}
        ratios: dict[str, list[float]] = {way: [] for way in WAYS}
        for _ in range(args.rounds):
            this_round = {}
            for way, sampling in WAYS.items():
                took, tokens = run(engine, inputs, sampling)
                assert tokens == LENGTH * sum(src.size(0) for src in inputs), tokens
                this_round[way] = took
                seconds[way].append(tokens / took)
            for way in WAYS:
                ratios[way].append(this_round[way] / this_round["greedy"])
        for way in WAYS:
            r = ratios[way]
            print(
                f"{name:8s} {way:10s} {statistics.median(seconds[way]):8.0f} out tok/s  "
                f"time ×{statistics.median(r):.2f} of greedy ({min(r):.2f}–{max(r):.2f})",
                flush=True,
            )
        label = {"native": "native", "pytorch": "PyTorch"}[name]
        sampling_rows.append(
            [f"{label}, out tok/s", *(f"{statistics.median(seconds[w]):,.0f}" for w in WAYS)]
        )
        sampling_rows.append([f"{label}, time × greedy", *(_ratio(ratios[w]) for w in WAYS)])
    ensemble_rows = ensembles(model, inputs, args.rounds, args.model, list(engines))
    if args.record:
        from records import keep

        machine = machine_line()
        if sampling_rows:
            keep("decode-options-sampling", machine=machine,
                 headers=["engine", *WAYS], rows=sampling_rows)  # fmt: skip
        keep("decode-options-ensembles", machine=machine,
             headers=["engine, search", "1 model, out tok/s", "2 models", "4 models"],
             rows=ensemble_rows)  # fmt: skip
    return 0


def _ratio(values: list[float]) -> str:
    """A ratio's median (lowest–highest) over the rounds; 1.00 alone for the baseline."""
    if max(values) == min(values) == 1.0:
        return "1.00"
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def ensembles(model, inputs, rounds: int, preset: str, engine_names: list[str]) -> list[list[str]]:  # type: ignore[no-untyped-def]
    """One model against ensembles of 2 and 4 (the others: the same preset, other seeds), on
    each engine (the native engine's C++ search over every model, or PyTorch's steppers); the
    table's rows (engine and search; one model's out tok/s; each ensemble's and its time)."""
    rows = []
    others = []
    for seed in (1, 2, 3):
        torch.manual_seed(seed)
        vocab = model.embedding.weight.size(0)
        others.append(build_model(load_config(preset).model, vocab_size=vocab).eval())
    for name in engine_names:
        ways = {1: model, 2: Ensemble([model, others[0]]), 4: Ensemble([model, *others])}
        if name == "native":
            from wtnmt.decode.native.network import NativeEngine

            ways = {n: NativeEngine(m) for n, m in ways.items()}
        run(ways[2], inputs[:1], None)  # warm-up
        for beam in (1, 5):
            ratios: dict[int, list[float]] = {n: [] for n in ways}
            speed: dict[int, list[float]] = {n: [] for n in ways}
            for _ in range(rounds):
                this = {}
                for n, engine in ways.items():
                    took, tokens = run(engine, inputs, None, beam)
                    this[n] = took
                    speed[n].append(tokens / took)
                for n in ways:
                    ratios[n].append(this[n] / this[1])
            for n in ways:
                r = ratios[n]
                print(
                    f"{name:8s} beam {beam} {n} model{'s' if n > 1 else ' '} "
                    f"{statistics.median(speed[n]):8.0f} out tok/s  time "
                    f"×{statistics.median(r):.2f} of one model ({min(r):.2f}–{max(r):.2f})",
                    flush=True,
                )
            label = {"native": "native", "pytorch": "PyTorch"}[name]
            search = "greedy" if beam == 1 else f"beam {beam}"
            cells = [f"{statistics.median(speed[1]):,.0f}"]
            for n in (2, 4):
                r = ratios[n]
                cells.append(
                    f"{statistics.median(speed[n]):,.0f}: {statistics.median(r):.2f}× "
                    f"({min(r):.2f}–{max(r):.2f})"
                )
            rows.append([f"{label}, {search}", *cells])
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
