#!/usr/bin/env python3
"""Where a decoding step's time goes: the PyTorch engine's time per step, by part.

    python benchmarks/decode_profile.py [--model weighted-small] [--limit 256] [--rounds 3]

The protocol of decode_speed.py and decode_vs_ctranslate2.py (the synthetic test sentences
sorted by length, batches of 32, exactly 24 output tokens, random seeded weights, 2 threads),
greedy and beam 5, in float32 and with ``--quantize int8`` decoding. For each, the wall time
a step takes without the profiler (median of ``--rounds``), then one pass under PyTorch's
profiler, each operator's own time charged to the innermost part it ran in: the products of
the linear layers (the tied output projection apart), attention's two matmuls and softmax,
layer normalisation, the rest of the decoder's operators (embedding, residuals, head
split and merge, the branches' κ/α-weighted sums and their first FFN product), the search's
own operators (log-softmax, masks, top-k, reorders) and the encoder. The profiler slows
the run; each part is shown as its share of the profiled run's wall time applied to the
unprofiled step's, and what the operators leave of it ("outside the operators") is Python and
PyTorch's dispatch around them (with the profiler's own bookkeeping, shared out the same way):
the floor a native loop would remove.

Where CTranslate2 is installed, its time per step for the same work on a Transformer of the
same shape is printed beside (float32 and int8, loaded as decode_vs_ctranslate2.py loads it),
so the gap each part would have to close is in the same run's units.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

try:  # before torch, as decode_vs_ctranslate2.py loads it
    import ctranslate2
except ImportError:  # pragma: no cover - optional
    ctranslate2 = None

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode_speed import LENGTH, protocol_arguments, protocol_setup
from wtnmt.config import load_config
from wtnmt.decode.search import search_batch
from wtnmt.model import attention_math, build_model, cache, packed, quantize_decoding

STEPS = LENGTH + 1  # 24 tokens, then the step that ends them
PARTS = (
    "output projection",
    "other linear products",
    "attention (QKᵀ, softmax, ·V)",
    "layer norm",
    "decoder, other operators",
    "search's own operators",
    "encoder",
)
_LABEL = "wtprof:"


@contextmanager
def labelled(model) -> object:  # type: ignore[no-untyped-def]
    """Name the parts for the profiler: each function wrapped in a record_function whose
    name the attribution below reads. Undone on leaving."""
    vocab = model.embedding.weight.size(0)
    patches = []

    def wrap(owner, name: str, label) -> None:  # type: ignore[no-untyped-def]
        original = getattr(owner, name)

        def wrapped(*args, **kwargs):  # type: ignore[no-untyped-def]
            with record_function(_LABEL + (label(*args) if callable(label) else label)):
                return original(*args, **kwargs)

        patches.append((owner, name, original))
        setattr(owner, name, wrapped)

    def linear_part(_self, x, weight, *rest) -> str:  # type: ignore[no-untyped-def]
        return PARTS[0] if weight.size(0) == vocab else PARTS[1]

    wrap(packed.PackedLinear, "__call__", linear_part)
    wrap(attention_math, "attention_core", PARTS[2])
    wrap(cache, "attention_core", PARTS[2])
    wrap(torch.nn.LayerNorm, "forward", PARTS[3])
    wrap(model, "decode_step", PARTS[4])
    wrap(model, "encode", PARTS[6])
    try:
        yield
    finally:
        for owner, name, original in reversed(patches):
            if isinstance(owner, torch.nn.Module) and not isinstance(owner, type):
                delattr(owner, name)  # the instance attribute; the class's method returns
            else:
                setattr(owner, name, original)


def attribute(events) -> tuple[dict[str, float], int]:  # type: ignore[no-untyped-def]
    """Each operator's own CPU time (µs) to the part of its innermost label; the encoder
    takes everything under it; no label: the search's. And how many operators ran outside
    the encoder."""
    totals: dict[str, float] = defaultdict(float)
    count = 0
    for event in events:
        if event.name.startswith(_LABEL) or event.name.startswith("ProfilerStep"):
            continue
        labels = []
        parent = event.cpu_parent
        while parent is not None:
            if parent.name.startswith(_LABEL):
                labels.append(parent.name[len(_LABEL) :])
            parent = parent.cpu_parent
        part = PARTS[6] if PARTS[6] in labels else (labels[0] if labels else PARTS[5])
        totals[part] += event.self_cpu_time_total
        count += part != PARTS[6]
    return totals, count


def decode_all(model, inputs, beam: int) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    for src in inputs:
        search_batch(model, src, beam=beam, min_len=LENGTH, max_len=LENGTH)
    return time.perf_counter() - start


def ct2_step_ms(model, inputs, rounds: int, threads: int) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """CTranslate2's ms a step for the same batches, on the Transformer of the same shape."""
    from ct2_bridge import SPECIALS, as_tokens, convert, load_translator, run_ct2

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        vocab = model.embedding.weight.size(0)
        tokens = SPECIALS + [f"t{i}" for i in range(len(SPECIALS), vocab)]
        rows = as_tokens(inputs, tokens)
        for quant in ("float32", "int8"):
            path = Path(tmp) / quant
            convert(model, tokens, path, quant)
            translator = load_translator(path, threads)
            for beam in (1, 5):
                run_ct2(translator, rows[:1], beam)
                times = [run_ct2(translator, rows, beam)[0] for _ in range(rounds)]
                out[f"{quant} b{beam}"] = statistics.median(times) / len(inputs) / STEPS * 1e3
            del translator
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    protocol_arguments(parser, limit=256)
    parser.add_argument("--rounds", type=int, default=3, help="unprofiled rounds (median)")
    args = parser.parse_args()
    model, inputs = protocol_setup(args)
    steps = len(inputs) * STEPS
    rows = []
    for quant in ("none", "int8"):
        quantize_decoding(model, quant)
        for beam in (1, 5):
            decode_all(model, inputs[:2], beam)  # packs the weights, warms the allocator
            wall = statistics.median(decode_all(model, inputs, beam) for _ in range(args.rounds))
            with labelled(model), profile(activities=[ProfilerActivity.CPU]) as prof:
                profiled = decode_all(model, inputs, beam)
            parts, count = attribute(prof.events())
            scale = wall / profiled / steps / 1e3  # µs of the profiled run → ms of a step
            parts = {part: t * scale for part, t in parts.items()}
            name = f"{'int8' if quant == 'int8' else 'fp32'} b{beam}"
            rows.append((name, wall / steps * 1e3, profiled / steps * 1e3, parts, count))
    quantize_decoding(model, "none")
    header = ["ms a step"] + [r[0] for r in rows]
    table = [header, ["-"] * len(header)]
    table.append(["wall, unprofiled"] + [f"{r[1]:.3f}" for r in rows])
    table.append(["wall, profiled"] + [f"{r[2]:.3f}" for r in rows])
    for part in PARTS:
        table.append([part] + [f"{r[3].get(part, 0.0):.3f}" for r in rows])
    table.append(["outside the operators"] + [f"{r[1] - sum(r[3].values()):.3f}" for r in rows])
    table.append(["operators a step, encoder aside"] + [f"{r[4] / steps:.0f}" for r in rows])
    if ctranslate2 is not None and args.model.startswith(("weighted", "transformer")):
        shape = build_model(
            load_config(args.model.replace("weighted", "transformer")).model,
            vocab_size=model.embedding.weight.size(0),
        ).eval()
        ct2 = ct2_step_ms(shape, inputs, args.rounds, args.threads)
        table.append(
            ["CTranslate2, same precision"]
            + [
                f"{ct2[('int8' if name.startswith('int8') else 'float32') + name[-3:]]:.3f}"
                for name, *_ in rows
            ]
        )
    for line in table:
        print("| " + " | ".join(line) + " |")


if __name__ == "__main__":
    main()
