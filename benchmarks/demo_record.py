#!/usr/bin/env python3
"""`wtnmt demo`'s figures as a row of docs/BENCHMARKS.md's demo table: what a demo run wrote
(its results.json: updates, the dev BLEU of the weights kept, the test BLEU and chrF, the
minutes of the whole command) and the precision it trained in (its config's
``train.precision``, ``auto`` resolved as the trainer resolves it on this CPU).

    make demo && python benchmarks/demo_record.py [runs/demo] [--record]

The machine line is this process's: run it where the demo ran, nothing else running there
while the demo trained (its updates in 12 minutes are the speed figure).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from records import add_record_argument

HEADERS = ["precision", "threads", "updates", "dev BLEU", "test BLEU / chrF", "minutes in all"]


def row(run: Path) -> list[str]:
    """The demo table's row of the demo run ``run``."""
    import torch

    from wtnmt.config import load_config
    from wtnmt.runtime import resolve_precision

    results = json.loads((run / "results.json").read_text(encoding="utf-8"))
    config = load_config(run / "config.yaml")
    precision = resolve_precision(config.train.precision, torch.device("cpu"))
    dev = results["dev_bleu"]
    dev = max(dev.values()) if isinstance(dev, dict) else dev
    return [
        precision,
        str(config.train.threads),
        f"{results['steps']:,}",
        f"{dev:.1f}",
        f"**{results['bleu']:.1f} / {results['chrf']:.1f}**",
        f"{results['seconds'] / 60:.1f}",
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", nargs="?", default=Path("runs/demo"), type=Path)
    add_record_argument(parser)
    args = parser.parse_args()
    if not (args.run / "results.json").is_file():
        print(f"{args.run}: no demo results there (run `make demo` first)", file=sys.stderr)
        return 2
    from wtnmt.runtime import machine_line

    machine = machine_line()
    print(machine)
    cells = row(args.run)
    print(" | ".join(f"{h}: {c}" for h, c in zip(HEADERS, cells, strict=True)))
    if args.record:
        from records import keep

        keep("demo", machine=machine, headers=HEADERS, rows=[cells],
             note=f"`make demo` ({args.run}), nothing else running")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
