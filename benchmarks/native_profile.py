#!/usr/bin/env python3
"""Where a step of the native engine (`--engine native`) goes: its operators, one by one.

    python benchmarks/native_profile.py [--limit 256] [--threads 2]

The protocol of decode_speed.py (`weighted-small`, the synthetic test sentences sorted by
length, batches of 32, exactly 24 output tokens), greedy and beam 5, float32 and int8: the
unprofiled step (ms, the median of 3 passes), then one pass under PyTorch's profiler, every
operator the engine calls (the C++ engine calls them through the dispatcher, so the profiler
sees each one) with its own time a step, as a share of the profiled pass applied to the
unprofiled step, and its calls a step. The encoder (once a batch) is in the figures; what the
operators leave (the engine's own loops, its fused attention kernels in float32, and the host's
time between operators) is the line "outside the operators".
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_speed import LENGTH, protocol_arguments, protocol_setup
from wtnmt.decode.native.network import NativeEngine
from wtnmt.decode.search import search_batch
from wtnmt.model import quantize_decoding

SHOWN = 12  # operators listed


def decode(engine: NativeEngine, inputs: list[torch.Tensor], beam: int) -> None:
    for src in inputs:
        search_batch(engine, src, beam=beam, min_len=LENGTH, max_len=LENGTH)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    protocol_arguments(parser, limit=256)
    args = parser.parse_args()
    model, inputs = protocol_setup(args)
    engine = NativeEngine(model)
    steps = len(inputs) * (LENGTH + 1)
    for precision in ("none", "int8"):
        quantize_decoding(model, precision)
        for beam in (1, 5):
            decode(engine, inputs[:2], beam)  # packs the weights
            walls = []
            for _ in range(3):
                start = time.perf_counter()
                decode(engine, inputs, beam)
                walls.append(time.perf_counter() - start)
            wall = statistics.median(walls) * 1e3 / steps  # ms a step
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                start = time.perf_counter()
                decode(engine, inputs, beam)
                profiled = (time.perf_counter() - start) * 1e3 / steps
            events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
            scale = wall / profiled  # the profiled pass's shares, applied to the unprofiled step
            total = sum(e.self_cpu_time_total for e in events) / 1e3 / steps * scale
            calls = sum(e.count for e in events) / steps
            name = "int8" if precision == "int8" else "float32"
            search = "greedy" if beam == 1 else f"beam {beam}"
            print(f"\n{name} {search}: {wall:.2f} ms a step unprofiled; {calls:.0f} operator "
                  f"calls a step; outside the operators {wall - total:.2f} ms")  # fmt: skip
            for e in events[:SHOWN]:
                own = e.self_cpu_time_total / 1e3 / steps * scale
                print(f"  {e.key[:44]:44s} {own:6.3f} ms  {e.count / steps:6.1f} a step")
    quantize_decoding(model, "none")


if __name__ == "__main__":
    main()
