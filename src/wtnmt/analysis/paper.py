"""The tables of docs/RESULTS.md, made from the committed results of the runs that
``docs/results.yaml`` names, and written into (or checked against) the document.

    python -m wtnmt.analysis.paper                          # the tables, to stdout
    python -m wtnmt.analysis.paper --write docs/RESULTS*.md  # replace them in the documents
    python -m wtnmt.analysis.paper --check docs/RESULTS*.md  # exit 1 where they differ
    python -m wtnmt.analysis.paper --figures docs/figures   # draw the figures there

A table lives in one of the documents between ``<!-- table:NAME -->`` and ``<!-- /table:NAME -->``;
everything else in it is prose, which quotes the tables, and whose numbers and the rule's words
for them live between ``<!-- value:NAME -->`` and ``<!-- /value -->`` (paper_values.py), filled
and checked as the tables are. Every number comes from each run's
``config.yaml``, ``finished.json``, ``scores.json``, ``metrics.jsonl`` and ``eval/`` as
committed: nothing is decoded or trained here.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from wtnmt.analysis.paper_side import (
    init_table,
    load_curves,
    load_short,
    load_tuning,
    pruning_table,
    short_table,
    tune_table,
)
from wtnmt.analysis.paper_tables import (
    curve_table,
    load_settings,
    main_table,
    runs_table,
    seeds_needed,
    sublayer_table,
    table3_table,
)
from wtnmt.analysis.paper_values import (
    fill_values,
    secondary_table,
    value_differences,
    values,
)

SPEC = Path("docs/results.yaml")  # from the repository's root


TABLES = {
    "main": main_table,
    "runs": runs_table,
    "curves": curve_table,
    "table3": table3_table,
    "sublayers": sublayer_table,
    "seeds-needed": seeds_needed,
    "secondary": secondary_table,
}


def make_tables(spec: Path = SPEC) -> dict[str, str]:
    settings = load_settings(spec)
    return {
        **{name: make(settings) for name, make in TABLES.items()},
        "init": init_table(load_curves(spec)),
        "tuning": tune_table(load_tuning(spec)),
        "short": short_table(load_short(spec)),
        "pruning": pruning_table(spec),
    }


def _block(name: str) -> re.Pattern[str]:
    """A table's block: its opening line, what it holds (maybe nothing), its closing line."""
    return re.compile(
        rf"(<!-- table:{re.escape(name)} -->\n)(.*?)\n?(<!-- /table:{re.escape(name)} -->)",
        re.DOTALL,
    )


def fill(document: str, tables: dict[str, str], named: dict[str, str] | None = None) -> str:
    """``document`` with each table's block replaced by the table made now, and each value
    the prose quotes (``named``) made now."""
    for name, text in tables.items():
        document = _block(name).sub(lambda m, t=text: f"{m[1]}{t}\n{m[3]}", document)
    return document if named is None else fill_values(document, named)


def differences(
    documents: str | list[str], tables: dict[str, str], named: dict[str, str] | None = None
) -> list[str]:
    """The tables whose block is in none of ``documents``, or holds other numbers in one; and
    the values a document quotes that differ from ``named``."""
    texts = [documents] if isinstance(documents, str) else documents
    found = [] if named is None else [f for t in texts for f in value_differences(t, named)]
    for name, text in tables.items():
        matches = [m for document in texts if (m := _block(name).search(document))]
        if not matches:
            found.append(f"{name}: no <!-- table:{name} --> block")
        elif any(m[2] != text for m in matches):
            found.append(f"{name}: differs from what the committed results give")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wtnmt.analysis.paper", description=__doc__)
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--write", type=Path, nargs="+", metavar="DOC", help="replace the tables in each DOC"
    )
    group.add_argument(
        "--check", type=Path, nargs="+", metavar="DOC", help="exit 1 where the DOCs differ"
    )
    parser.add_argument("--figures", type=Path, metavar="DIR", help="draw the figures into DIR")
    parser.add_argument("--spec", type=Path, default=SPEC, help=f"the runs (default {SPEC})")
    args = parser.parse_args(argv)
    tables = make_tables(args.spec)
    named = values(load_settings(args.spec))
    if args.figures is not None:
        from wtnmt.analysis.paper_figures import make_figures

        for path in make_figures(load_settings(args.spec), args.figures):
            print(f"drew {path}", file=sys.stderr)
    if args.write is not None:
        for document in args.write:
            text = fill(document.read_text(encoding="utf-8"), tables, named)
            document.write_text(text, "utf-8")
        return 0
    if args.check is not None:
        found = differences([d.read_text(encoding="utf-8") for d in args.check], tables, named)
        for line in found:
            print(f"{' '.join(map(str, args.check))}: {line}", file=sys.stderr)
        return 1 if found else 0
    for name, text in tables.items():
        print(f"<!-- table:{name} -->\n{text}\n<!-- /table:{name} -->\n")
    for name, text in named.items():
        print(f"<!-- value:{name} -->{text}<!-- /value -->")
    return 0


if __name__ == "__main__":
    sys.exit(main())
