"""The entries decode_vs_ctranslate2.py times, and its report of them: tokens/s and ratios to
CTranslate2 (of the same precision, with as many workers), round by round."""

from __future__ import annotations

import argparse
import statistics

ENTRIES = [
    *(f"wtnmt {f} {p}" for f in ("weighted", "transformer") for p in ("fp32", "int8")),
    # the ONNX Runtime engine: wtnmt's search over the exported network
    *(f"ort {f} {p}" for f in ("weighted", "transformer") for p in ("fp32", "int8")),
    # the native engine: search and decoder step in C++ over the PyTorch engine's weights
    *(f"native {f} {p}" for f in ("weighted", "transformer") for p in ("fp32", "int8")),
    "native weighted int8 onednn",  # (--onednn-int8) its products on oneDNN's int8 kernels
    "native weighted int8 library",  # (--library-int8) on PyTorch's int8 product
    "ct2 float32",
    "ct2 int8",
    # both engines with 2 workers of 1 thread each, each worker decoding its own batches
    "wtnmt weighted fp32 x2",
    "wtnmt weighted int8 x2",
    "native weighted fp32 x2",
    "native weighted int8 x2",
    "ct2 float32 x2",
    "ct2 int8 x2",
]
WORKERS = 2
ONEDNN = "native weighted int8 onednn"
LIBRARY = "native weighted int8 library"


def entries(threads: int, models: dict | None = None, native_only: bool = False) -> list[str]:  # type: ignore[type-arg]
    """The entries timed: the two-worker ones only where each worker gets a thread, the
    native engine's only where it was built (``models`` holds them); ``native_only``: the
    native engine's and CTranslate2's alone."""
    return [
        e
        for e in ENTRIES
        if (threads >= WORKERS or not e.endswith(" x2"))
        and (models is None or not e.startswith("native") or e.removesuffix(" x2") in models)
        and not (native_only and e.startswith(("wtnmt ", "ort ")))
    ]


def report(rates: dict[tuple[str, int], list[float]], args: argparse.Namespace) -> None:
    """Medians of the rounds, each entry as a ratio to CTranslate2 (ratio of medians, and
    in brackets the lowest and highest ratio of one round)."""

    def ratios(entry: str, beam: int, base: str) -> list[float]:
        return [a / b for a, b in zip(rates[(entry, beam)], rates[(base, beam)], strict=True)]

    def span(values: list[float]) -> str:
        return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"

    med = {key: statistics.median(values) for key, values in rates.items()}
    rows = []  # the table --record keeps
    print(f"\nmedians of {args.rounds} rounds, output tokens/s ({args.threads} threads), and "
          "ratios to CTranslate2 (median of the rounds' ratios, lowest–highest):")  # fmt: skip
    print(f"  {'entry':27s} {'greedy':>7s} {'beam 5':>7s}   ×CT2 f32 greedy / beam 5"
          "            ×CT2 int8 greedy / beam 5")  # fmt: skip
    for entry in [e for e in entries(args.threads) if (e, 1) in rates]:
        x2 = " x2" if entry.endswith(" x2") else ""  # against CTranslate2 with as many workers
        cells = [
            span(ratios(entry, b, base + x2))
            for base in ("ct2 float32", "ct2 int8")
            for b in (1, 5)
        ]
        print(f"  {entry:27s} {med[(entry, 1)]:7.0f} {med[(entry, 5)]:7.0f}   "
              f"{cells[0]} / {cells[1]}   {cells[2]} / {cells[3]}")  # fmt: skip
        rows.append([entry, f"{med[(entry, 1)]:,.0f} / {med[(entry, 5)]:,.0f}",
                     f"{cells[0]} / {cells[1]}", f"{cells[2]} / {cells[3]}"])  # fmt: skip
    if getattr(args, "record", False):
        from records import keep
        from wtnmt.runtime import machine_line

        keep(
            "decode-vs-ctranslate2",
            machine=machine_line(args.threads),
            headers=["entry", "out tok/s, greedy / beam 5", "× CT2 float32", "× CT2 int8"],
            rows=rows,
        )
    for other, name in (("ort", "ONNX Runtime"), ("native", "native")):
        for f in ("weighted", "transformer"):
            if (f"{other} {f} fp32", 1) not in rates:
                continue
            pytorch = ""  # (left out with --native-only)
            if (f"wtnmt {f} fp32", 1) in rates:
                over = {b: ratios(f"{other} {f} fp32", b, f"wtnmt {f} fp32") for b in (1, 5)}
                pytorch = f"fp32/wtnmt PyTorch fp32 greedy {span(over[1])} beam5 {span(over[5])}; "
            ct2 = {
                (p, b): ratios(f"{other} {f} {p}", b, f"ct2 {'float32' if p == 'fp32' else p}")
                for p in ("fp32", "int8")
                for b in (1, 5)
            }
            print(
                f"{name}, {f}: {pytorch}fp32/CT2 fp32 greedy {span(ct2['fp32', 1])} beam5 "
                f"{span(ct2['fp32', 5])}; int8/CT2 int8 greedy {span(ct2['int8', 1])} beam5 "
                f"{span(ct2['int8', 5])}"
            )

    if (ONEDNN, 1) in rates:
        over = {b: ratios(ONEDNN, b, "native weighted int8") for b in (1, 5)}
        print(f"native int8 on oneDNN's product / the default: greedy {span(over[1])} "
              f"beam5 {span(over[5])}")  # fmt: skip
    if (LIBRARY, 1) in rates:
        over = {b: ratios("native weighted int8", b, LIBRARY) for b in (1, 5)}
        print(f"native int8, int8.h's kernel / PyTorch's product: greedy {span(over[1])} "
              f"beam5 {span(over[5])}")  # fmt: skip

    def best(precisions: tuple[str, ...], base: str, beam: int, x2: str) -> float:
        """The fastest wtnmt engine against ``base``, round by round (workers: PyTorch's
        or native)."""
        engines = ("wtnmt", "native") if x2 else ("wtnmt", "ort", "native")
        found = [f"{e} weighted {p}{x2}" for e in engines for p in precisions]
        found += [ONEDNN, LIBRARY] if not x2 and "int8" in precisions else []
        rounds = [ratios(e, beam, base + x2) for e in found if (e, beam) in rates]
        return statistics.median(max(r) for r in zip(*rounds, strict=True))

    configurations = [("", "1 process, any engine"), (" x2", f"{WORKERS} workers each")]
    for x2, label in configurations[: 2 if args.threads >= WORKERS else 1]:
        fp32 = {b: best(("fp32",), "ct2 float32", b, x2) for b in (1, 5)}
        int8 = {b: best(("fp32", "int8"), "ct2 int8", b, x2) for b in (1, 5)}
        print(
            f"vs CT2, {label}: best WT fp32/CT2 fp32 beam5 {fp32[5]:.2f} greedy "
            f"{fp32[1]:.2f}  best WT/CT2 int8 beam5 {int8[5]:.2f} greedy {int8[1]:.2f}"
        )


__all__ = ["ENTRIES", "LIBRARY", "ONEDNN", "WORKERS", "entries", "report"]
