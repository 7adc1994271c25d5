#!/usr/bin/env python3
"""wtnmt's decoding engines on a trained run, through the API a user calls.

    python benchmarks/engines.py runs/demo/averaged [--rounds 3] [--beams 1,4]

Translates the run's test split (or ``--input``) with ``Translator.translate`` on the PyTorch
engine, the native engine (``engine="native"``, where it can be built) and ONNX Runtime
(``engine="onnxruntime"``; exported first if the run has no export), each in float32 and
int8, taking turns round by round in a rotated order; sentences/s, medians of the rounds, and
each engine's ratio to PyTorch float32 in the same round (median, lowest–highest). The float32
engines' outputs are checked identical to PyTorch's first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from wtnmt import Translator
from wtnmt.config import load_config
from wtnmt.decode.native import unavailable_reason
from wtnmt.runtime import machine_line, tune_cpu_allocator

ENGINES = [(e, q) for e in ("pytorch", "native", "onnxruntime") for q in ("none", "int8")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--input", type=Path, help="sentences, one per line (default: test split)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--beams", default="1,4")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(machine_line(args.threads), flush=True)
    torch.set_num_threads(args.threads)
    tune_cpu_allocator()
    data = load_config(args.run_dir / "config.yaml").data
    source = args.input or data.prepared_path() / f"test.{data.src_lang}"
    sentences = [s for s in source.read_text(encoding="utf-8").splitlines() if s.strip()]
    beams = [int(b) for b in args.beams.split(",")]
    if unavailable_reason() is not None:
        print(f"the native engine is left out: {unavailable_reason()}")
        ENGINES[:] = [(e, q) for e, q in ENGINES if e != "native"]
    translators = {
        (e, q): Translator.load(args.run_dir, engine=e, quantize=q)  # type: ignore[arg-type]
        for e, q in ENGINES
    }
    for beam in beams:
        a = translators["pytorch", "none"].translate(sentences, beam=beam)
        for engine in sorted({e for e, _ in ENGINES} - {"pytorch"}):
            b = translators[engine, "none"].translate(sentences, beam=beam)
            same = sum(x == y for x, y in zip(a, b, strict=True))
            print(f"beam {beam}: {engine} float32 outputs identical to PyTorch's on {same} of "
                  f"{len(a)} sentences")  # fmt: skip
    rates: dict[tuple[str, str, int], list[float]] = {}
    for r in range(args.rounds):
        order = ENGINES[r % len(ENGINES) :] + ENGINES[: r % len(ENGINES)]
        for engine, quantize in order:
            for beam in beams:
                start = time.perf_counter()
                translators[engine, quantize].translate(sentences, beam=beam)
                rate = len(sentences) / (time.perf_counter() - start)
                rates.setdefault((engine, quantize, beam), []).append(rate)
    print(f"\n{len(sentences):,} sentences from {source}; sentences/s, medians of {args.rounds}")
    print(f"  {'engine':<24} " + "  ".join(f"{'beam ' + str(b):>26}" for b in beams))
    for engine, quantize in ENGINES:
        cells = []
        for beam in beams:
            mine, base = rates[engine, quantize, beam], rates["pytorch", "none", beam]
            ratios = [x / y for x, y in zip(mine, base, strict=True)]
            cells.append(
                f"{statistics.median(mine):8.1f} ×{statistics.median(ratios):.2f} "
                f"({min(ratios):.2f}–{max(ratios):.2f})"
            )
        label = f"{engine} {'float32' if quantize == 'none' else quantize}"
        print(f"  {label:<24} " + "  ".join(f"{c:>26}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
