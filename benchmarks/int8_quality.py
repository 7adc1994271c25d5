#!/usr/bin/env python3
"""int8 decoding in quality: one run's test translations in float32 and in int8 on each
engine, scored with sacreBLEU (BLEU, chrF), and how many int8 lines equal float32's.

    make demo && python benchmarks/int8_quality.py [runs/demo/averaged] [--record]
        [--corpus tatoeba-deu-eng] [--beam 4] [--engines pytorch native onnxruntime]

The sentences: the named corpus's test split, split as the run's data config splits it
(`wtnmt evaluate RUN --corpus NAME` reads the same). Each engine translates them with the same
beam, float32 then int8 (``quantize="int8"``: the engine's own int8 products). Quality, not
speed: nothing is timed, so it may run beside other work.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from records import add_record_argument

HEADERS = ["engine", "float32 BLEU / chrF", "int8 BLEU / chrF", "int8 lines equal to float32"]


def test_split(run: Path, corpus: str) -> tuple[list[str], list[str]]:
    """The corpus's test sources and references, as `wtnmt evaluate --corpus` reads them."""
    from wtnmt.config import load_config
    from wtnmt.data.prepare import raw_split

    data = load_config(run / "config.yaml").data
    data = dataclasses.replace(data, corpus=corpus, train_src=None, train_tgt=None, train_tsv=None)
    pairs = raw_split(data, "test")
    return [p[0] for p in pairs], [p[1] for p in pairs]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", nargs="?", default=Path("runs/demo/averaged"), type=Path)
    parser.add_argument("--corpus", default="tatoeba-deu-eng")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--engines", nargs="+", default=["pytorch", "native", "onnxruntime"],
                        choices=["pytorch", "native", "onnxruntime"])  # fmt: skip
    add_record_argument(parser)
    args = parser.parse_args()
    if not (args.run / "model.safetensors").is_file():
        print(f"{args.run}: no trained run there (run `make demo` first)", file=sys.stderr)
        return 2
    from wtnmt import Translator
    from wtnmt.decode.evaluate import score_corpus
    from wtnmt.runtime import machine_line

    machine = machine_line()
    print(machine, flush=True)
    src, refs = test_split(args.run, args.corpus)
    rows = []
    for engine in args.engines:
        found = {}
        for quantize in ("none", "int8"):
            t = Translator.load(args.run, engine=engine, quantize=quantize)
            hyps = t.translate(src, beam=args.beam)
            found[quantize] = (hyps, score_corpus(hyps, refs, t.config.data.tgt_lang))
        same = sum(a == b for a, b in zip(found["none"][0], found["int8"][0], strict=True))
        cells = [f"{s['bleu']:.2f} / {s['chrf']:.2f}" for _, s in found.values()]
        rows.append([engine, *cells, f"{same:,} of {len(src):,}"])
        print(" | ".join(rows[-1]), flush=True)
    if args.record:
        from records import keep

        note = f"{args.run}'s weights, {args.corpus}'s test split, beam {args.beam}"
        keep("int8-quality", machine=machine, headers=HEADERS, rows=rows, note=note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
