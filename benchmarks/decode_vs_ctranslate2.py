#!/usr/bin/env python3
"""Decoding speed of wtnmt against CTranslate2 (C++), side by side in one process.

    pip install ctranslate2==4.8.5        # optional: only this benchmark needs it
    python benchmarks/decode_vs_ctranslate2.py [--rounds 3] [--limit 1000]

CTranslate2 runs a Transformer built through its ``ctranslate2.specs`` API from the weights of
a ``transformer-small`` wtnmt model (N=3, D=256, F=1024, H=4, post-norm, tied embeddings,
sinusoidal positions; random seeded weights: with the output length forced, the work does not
depend on them). Before timing, greedy outputs of the two engines on the same model are
checked identical token for token. Then, as ../shared/bench/PEERS.md measured the peers: the
1,000 test sentences of make_synthetic.py sorted by length, batches of 32, output length
forced to exactly 24 tokens, greedy and beam 5, 2 threads, model loading excluded.

Interleaved finely, because this machine drifts by ±25% within minutes: the batches are cut
into groups of ``--group`` batches (a few seconds of work), and every entry decodes a group
(greedy, then beam 5) before the next group starts, the entries taking turns in an order
rotated from group to group, each after a pause in which the previous entry's OpenMP threads
(both wheels bring a libgomp) stop spin-waiting. An entry's figure for a round is its tokens
over its time summed over all groups, so every ratio compares engines that met the same
conditions. Medians of ``--rounds`` such rounds are reported, with the spread of the ratios
across rounds.

CTranslate2 on 2 cores, timed fairly (PEERS.md): ``ctranslate2`` imported before ``torch``;
each translator loaded in a short-lived helper thread, one alive at a time. Its wheel carries
its own OpenMP runtime, and a second pool of its threads (a second translator, or an int8 model
converted on the main thread, whose threads live as long as the thread) stops its threads
spin-waiting: small operations then get much slower.

wtnmt's entries: the Weighted Transformer (`weighted-small`, what wtnmt is for) and the
Transformer above, each in float32 and with ``--quantize int8`` decoding, in one process on
the threads. Then both engines with 2 workers of one thread each, every worker decoding its
own batches (`translate --workers 2`, the Weighted Transformer's workers on the PyTorch and
on the native engine; CTranslate2's inter_threads=2, intra_threads=1), each ratio "x2" taken
against CTranslate2 in that same configuration. The last two lines read
`vs CT2, 1 process: WT fp32/CT2 fp32 beam5 A greedy B  best WT/CT2 int8 beam5 C greedy D` and
the same with 2 workers each (left out with ``--threads 1``: there is no thread for a second
worker).

The ONNX Runtime engine (`--engine onnxruntime`): the same two wtnmt models exported to ONNX
(float32, and int8 by ONNX Runtime's dynamic quantisation), searched by wtnmt's own greedy and
beam search, in the same rotation; their greedy outputs are checked identical to the PyTorch
engine's first. Its line reads each ratio to wtnmt's PyTorch float32 and to CTranslate2. The
native engine (`--engine native`, decode/native: the search and the decoder step in C++ over
the PyTorch engine's packed weights) likewise, float32 and int8, where it can be built.
``--onednn-int8`` adds the native int8 Weighted Transformer with its products packed for
oneDNN's int8 kernels (``WTNMT_INT8_KERNELS=onednn``: AMX where the CPU has it; multiplied by
oneDNN, not int8.h) and reads it against the default of the same rounds. The native engine
multiplies int8 in its own kernel (decode/native/int8.h) where the CPU has VNNI;
``--library-int8`` adds the native int8 Weighted Transformer multiplying through PyTorch's
``quantized::linear_dynamic`` instead (``WTNMT_NATIVE_INT8=library``), read against the
default of the same rounds. ``--native-only`` times the native engine's entries and
CTranslate2's alone (the goals' comparison, in about a third of the time); the PyTorch
engine's models are still built, for the checks that come first.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

try:  # before torch: see the docstring
    import ctranslate2  # noqa: F401  (imported first: see the docstring)
except ImportError:  # pragma: no cover - the optional dependency
    sys.exit("decode_vs_ctranslate2.py needs CTranslate2: pip install ctranslate2==4.8.5")

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ct2_bridge import (
    BATCH,
    SPECIALS,
    as_tokens,
    check_greedy_agrees,
    convert,
    load_translator,
    run_ct2,
)
from ct2_report import LIBRARY, ONEDNN, WORKERS, entries, report
from decode_speed import LENGTH, batches
from records import add_record_argument
from train_speed import ROOT, build_data
from wtnmt.config import load_config
from wtnmt.data import ParallelData
from wtnmt.decode.native import NativeUnavailable
from wtnmt.decode.native.network import NativeEngine
from wtnmt.decode.onnx_engine import OnnxNetwork
from wtnmt.decode.search import search_batch
from wtnmt.decode.workers import SearchWorkers
from wtnmt.export.onnx import export_graphs, graph_file, quantize_graphs
from wtnmt.model import build_model, quantize_decoding
from wtnmt.model.float32_kernels import float32_kernels
from wtnmt.runtime import machine_line, tune_cpu_allocator

# ------------------------------------------------------------------------------------------
# the two engines on the same batches


def run_wtnmt(model, inputs: list[torch.Tensor], beam: int) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    """In this process, or on ``model``'s workers when it is a SearchWorkers: the same search
    (search_batch) either way."""
    start = time.perf_counter()
    options = {"beam": beam, "min_len": LENGTH, "max_len": LENGTH}
    if isinstance(model, SearchWorkers):
        found = list(model.search(inputs, **options))
    else:
        found = [search_batch(model, src, **options) for src in inputs]
    return time.perf_counter() - start, sum(len(h[0].tokens) for hyps in found for h in hyps)


def check_engines_agree(model, network, inputs, limit: int) -> int:  # type: ignore[no-untyped-def]
    """Greedy outputs, unforced, of the PyTorch engine and another: identical."""
    checked = 0
    for src in inputs:
        ours = search_batch(model, src, beam=1, max_len=LENGTH)
        theirs = search_batch(network, src, beam=1, max_len=LENGTH)
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            if a[0].tokens != b[0].tokens:
                raise SystemExit(f"greedy outputs differ on sentence {checked + i}")
        checked += src.size(0)
        if checked >= limit:
            break
    return checked


def packed_for_onednn(model, src: torch.Tensor) -> NativeEngine:  # type: ignore[no-untyped-def]
    """The native engine over an int8 copy of ``model`` whose products are packed for oneDNN's
    kernels: packed by a first search with WTNMT_INT8_KERNELS=onednn, kept since (a packed
    copy keeps its library until its weights change)."""
    torch.manual_seed(0)
    q = build_model(load_config("weighted-small").model, vocab_size=model.embedding.weight.size(0))
    q.load_state_dict(model.state_dict())
    quantize_decoding(q.eval(), "int8")
    engine = NativeEngine(q)
    engine.int8_lanes = None  # oneDNN's own int8 product, not int8.h's on its weights
    before = os.environ.get("WTNMT_INT8_KERNELS")
    os.environ["WTNMT_INT8_KERNELS"] = "onednn"
    try:
        search_batch(engine, src, beam=1, max_len=2)
    finally:
        if before is None:
            del os.environ["WTNMT_INT8_KERNELS"]
        else:
            os.environ["WTNMT_INT8_KERNELS"] = before
    return engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench-dir", type=Path, default=ROOT.parent / "shared" / "bench")
    parser.add_argument("--work", type=Path, default=ROOT / "bench-data")
    parser.add_argument("--limit", type=int, default=1000, help="test sentences to decode")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (medians)")
    parser.add_argument("--group", type=int, default=4, help="batches an entry decodes in turn")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--pause", type=float, default=0.3, help="seconds before each entry")
    parser.add_argument("--check", type=int, default=256, help="sentences checked first")
    parser.add_argument(
        "--onednn-int8",
        action="store_true",
        help="also the native int8 Weighted Transformer packed for oneDNN's kernels",
    )
    parser.add_argument(
        "--library-int8",
        action="store_true",
        help="also the native int8 Weighted Transformer on PyTorch's int8 product",
    )
    parser.add_argument(
        "--native-only",
        action="store_true",
        help="the native engine's entries and CTranslate2's alone (the quicker protocol)",
    )
    add_record_argument(parser)
    args = parser.parse_args()
    print(machine_line(args.threads), flush=True)
    torch.set_num_threads(args.threads)
    tune_cpu_allocator()
    vocab_size = build_data(args.bench_dir, args.work)
    raw = (args.work / "raw" / "vocab.txt").read_text().splitlines()
    tokens = SPECIALS + [line.split("\t")[0] for line in raw]
    assert len(tokens) == vocab_size and not set(SPECIALS) & set(tokens[4:])
    data = ParallelData(args.work / "prepared", "test")
    inputs = batches(data, args.limit, BATCH)
    expected = LENGTH * min(args.limit, len(data))

    models = {}
    for flavour in ("weighted", "transformer"):
        torch.manual_seed(0)
        model = build_model(load_config(f"{flavour}-small").model, vocab_size=vocab_size)
        models[flavour] = model.eval()
    quantized = {}
    for flavour, model in models.items():
        torch.manual_seed(0)
        q = build_model(load_config(f"{flavour}-small").model, vocab_size=vocab_size).eval()
        q.load_state_dict(model.state_dict())
        quantize_decoding(q, "int8")
        quantized[flavour] = q
    # the same networks exported to ONNX, in ONNX Runtime (`--engine onnxruntime`)
    onnx_dir = tempfile.TemporaryDirectory()
    for flavour, model in [] if args.native_only else list(models.items()):
        where = Path(onnx_dir.name) / flavour
        where.mkdir()
        shapes = export_graphs(model, where)
        quantize_graphs(where)
        for p in ("fp32", "int8"):
            q = "none" if p == "fp32" else "int8"
            models[f"ort {flavour} {p}"] = OnnxNetwork(
                where / graph_file("encoder", q),
                where / graph_file("decoder_step", q),
                shapes,
                quantize=q,
                threads=args.threads,
            )
    try:  # the native engine (`--engine native`), over the same models' packed weights
        for flavour in ("weighted", "transformer"):
            models[f"native {flavour} fp32"] = NativeEngine(models[flavour])
            models[f"native {flavour} int8"] = NativeEngine(quantized[flavour])
    except NativeUnavailable as e:
        print(f"{e}: its entries left out", flush=True)
    print(f"float32 products: {float32_kernels()} (WTNMT_FLOAT32_KERNELS)", flush=True)
    if args.onednn_int8 and "native weighted int8" in models:
        models[ONEDNN] = packed_for_onednn(models["weighted"], inputs[0])
    if args.library_int8 and "native weighted int8" in models:
        models[LIBRARY] = NativeEngine(quantized["weighted"])
        models[LIBRARY].int8_lanes = None  # (WTNMT_NATIVE_INT8=library)
        print(f"native int8: int8.h's kernel, {models['native weighted int8'].int8_lanes} lanes")
    for flavour in ("weighted", "transformer"):
        for other in ("ort", "native"):
            if f"{other} {flavour} fp32" not in models:
                continue
            network = models[f"{other} {flavour} fp32"]
            n = check_engines_agree(models[flavour], network, inputs, args.check)
            print(
                f"greedy outputs identical on {n} sentences (wtnmt {flavour}: PyTorch vs {other})"
            )

    with tempfile.TemporaryDirectory() as tmp:
        paths = {
            q: convert(models["transformer"], tokens, Path(tmp) / q, q) for q in ("float32", "int8")
        }
        translator = load_translator(paths["float32"], args.threads)
        n = check_greedy_agrees(models["transformer"], translator, inputs, tokens, args.check)
        print(f"greedy outputs identical on {n} sentences (wtnmt Transformer vs CTranslate2)")
        del translator
        gc.collect()
        ct2_inputs = as_tokens(inputs, tokens)
        pools = {  # started (and their models built) before any timing; with fewer
            # threads than workers there is no two-worker configuration to measure
            (engine, p): SearchWorkers(
                models["weighted"],
                model_config=load_config("weighted-small").model,
                int8=p == "int8",
                workers=WORKERS,
                threads=args.threads // WORKERS,
                engine="pytorch" if engine == "wtnmt" else engine,
            )
            for engine in ("wtnmt", "native")
            for p in ("fp32", "int8")
            if args.threads >= WORKERS
            and (engine == "wtnmt" or "native weighted fp32" in models)
            and not (args.native_only and engine == "wtnmt")
        }
        for pool in pools.values():
            run_wtnmt(pool, inputs[: 2 * WORKERS], 5)
        try:
            rates = timed_rounds(
                args, models, quantized, pools, paths, inputs, ct2_inputs, expected
            )
        finally:
            for pool in pools.values():
                pool.close()
    report(rates, args)


def timed_rounds(args, models, quantized, pools, paths, inputs, ct2_inputs, expected):  # type: ignore[no-untyped-def]
    """{(entry, beam): [output tokens/s of each round]}, the entries interleaved group by
    group (see the module docstring)."""
    groups = [range(i, min(i + args.group, len(inputs))) for i in range(0, len(inputs), args.group)]
    rates: dict[tuple[str, int], list[float]] = {}
    timed = entries(args.threads, models, args.native_only)
    for r in range(args.rounds):
        seconds = dict.fromkeys(((e, b) for e in timed for b in (1, 5)), 0.0)
        counts = dict.fromkeys(seconds, 0)
        for g, group in enumerate(groups):
            shift = (r * len(groups) + g) % len(timed)
            for entry in timed[shift:] + timed[:shift]:
                translator = pool = model = None
                engine, *what, last = entry.split()
                workers = WORKERS if last == "x2" else 1
                if engine == "ct2":  # one translator alive at a time
                    precision = what[0] if workers > 1 else last
                    translator = load_translator(paths[precision], args.threads, workers)
                    run_ct2(translator, ct2_inputs[:1], 5)  # warm-up, untimed
                elif workers > 1:
                    pool = pools[(engine, what[1])]
                elif engine in ("ort", "native"):
                    model = models[entry]
                else:
                    model = (models if last == "fp32" else quantized)[what[0]]
                time.sleep(args.pause)  # the last entry's spinning threads go to sleep
                for beam in (1, 5):
                    if translator is not None:
                        s, n = run_ct2(translator, [ct2_inputs[i] for i in group], beam)
                    else:
                        s, n = run_wtnmt(pool or model, [inputs[i] for i in group], beam)
                    seconds[(entry, beam)] += s
                    counts[(entry, beam)] += n
                del translator
                gc.collect()
        line = []
        for key in seconds:
            assert counts[key] == expected, (key, counts[key])
            rates.setdefault(key, []).append(counts[key] / seconds[key])
            line.append(f"{key[0].removeprefix('wtnmt ')} b{key[1]} {rates[key][-1]:.0f}")
        print(f"round {r + 1}: " + ", ".join(line), flush=True)
    return rates


if __name__ == "__main__":
    main()
