#!/usr/bin/env python3
"""The native engine's own int8 product (decode/native/int8.h) against the libraries'.

    python benchmarks/int8_products.py [--threads 2] [--rounds 5] [--rows 32,160]

The products of a `weighted-small` / `transformer-small` decoding step (d 256, FFN 1,024,
vocabulary 8,000) at 32 rows (greedy, batches of 32) and 160 (beam 5), or at ``--rows`` (the
encoder's: a batch's source tokens, e.g. 640), each timed as the
native engine calls it: PyTorch's ``quantized::linear_dynamic`` on weights packed for FBGEMM
and for oneDNN, and int8.h's kernel in each build this CPU runs, on the same int8 weights
(7-bit, ±64: what every kernel multiplies exactly, FBGEMM's without VNNI too; the time does
not depend on the values). µs a product, the median of ``--rounds`` rounds of
200 calls, and the kernel's speed as a ratio to FBGEMM's measured in the same round. Every
kernel's output is checked against FBGEMM's first (the same quantisation: int8.h's equal up to
float32 rounding; oneDNN's up to a tie its quantiser rounds the other way). Run it with
nothing else on the cores.
"""

import argparse
import statistics
import time

import torch

from wtnmt.decode.native import extension
from wtnmt.model.packed import _multiplies, pack_int8
from wtnmt.runtime import machine_line

SHAPES = [
    (256, 768, "q, k, v"),
    (256, 256, "query / W^O"),
    (256, 1024, "FFN 1"),
    (1024, 256, "FFN 2 / tail"),
    (256, 8000, "output"),
]  # (in, out, what)
CALLS = 200
QMAX = 64


def timed(fn, x: torch.Tensor) -> float:
    fn(x)
    start = time.perf_counter()
    for _ in range(CALLS):
        fn(x)
    return (time.perf_counter() - start) / CALLS * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows", default="32,160", help="comma-separated")
    args = parser.parse_args()
    try:
        counts = [int(r) for r in args.rows.split(",")]
    except ValueError:
        parser.error(f"--rows {args.rows!r}: comma-separated counts of rows")
    torch.set_num_threads(args.threads)
    ext = extension(print)
    builds = [lanes for lanes in ext.int8_builds() if lanes]  # (the VNNI ones)
    print(machine_line(args.threads))
    print(f"int8.h builds: {builds}")
    libraries = [k for k in ("fbgemm", "onednn") if _multiplies(k)]
    header = ["rows", "in→out", "what", *libraries, *(f"own {b}" for b in builds)]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    torch.manual_seed(0)
    with torch.inference_mode():
        for rows in counts:
            for d_in, d_out, what in SHAPES:
                w, b = torch.randn(d_out, d_in), torch.randn(d_out)
                x = torch.randn(rows, d_in)
                fns = {}
                for library in libraries:
                    packed = pack_int8(w, b, library, QMAX)
                    fns[library] = lambda x, p=packed: torch.ops.quantized.linear_dynamic(
                        x, p, False
                    )
                qw, bias = torch.ops.quantized.linear_unpack(pack_int8(w, b, "fbgemm", QMAX))
                for lanes in builds:
                    own = ext.Int8Weight(qw.int_repr(), qw.q_per_channel_scales(), bias, lanes)
                    fns[f"own {lanes}"] = own
                reference = fns[libraries[0]](x)
                # another library may round an activation that lies on a tie the other way (an
                # output moves by a step of the activations' scale times a weight): int8.h not
                step = float(x.max().clamp_min(0) - x.min().clamp_max(0)) / 255
                for name, fn in fns.items():
                    error = (fn(x) - reference).abs().max().item()
                    tie = 0.0 if name.startswith("own") else 2 * step * w.abs().max().item()
                    assert error <= 1e-4 * reference.abs().max().item() + tie, (name, error)
                times: dict[str, list[float]] = {name: [] for name in fns}
                for _ in range(args.rounds):
                    for name, fn in fns.items():
                        times[name].append(timed(fn, x))
                base = times[libraries[0]]
                cells = []
                for name in fns:
                    t = statistics.median(times[name])
                    ratio = statistics.median(a / b for a, b in zip(base, times[name], strict=True))
                    cells.append(f"{t:.0f}" if name == libraries[0] else f"{t:.0f} ({ratio:.2f}×)")
                print(f"| {rows} | {d_in}→{d_out} | {what} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
