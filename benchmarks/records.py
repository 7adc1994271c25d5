"""What the benchmarks measured, kept, and docs/BENCHMARKS.md's tables made from it.

A benchmark that keeps its figures (``--record``) appends one record a table to
``benchmarks/records/NAME.jsonl``: the date, the machine line (``wtnmt.runtime.machine_line``),
the command, the table's headers and rows as printed. A table of docs/BENCHMARKS.md lives between
``<!-- bench:NAME -->`` and ``<!-- /bench:NAME -->`` and is the latest record of NAME on each
machine line, made by

    python benchmarks/records.py --write docs/BENCHMARKS.md   # the tables, into the document
    python benchmarks/records.py --check docs/BENCHMARKS.md   # exit 1 where they differ

(tests/test_benchmark_records.py runs ``--check``), so that a figure in the guide is one a
benchmark printed, with its machine, date and command beside it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
from pathlib import Path

RECORDS = Path(__file__).resolve().parent / "records"


def add_record_argument(parser: argparse.ArgumentParser) -> None:
    """A benchmark's ``--record``: keep what it prints as records (``keep``)."""
    parser.add_argument(
        "--record", action="store_true", help="keep the tables in benchmarks/records/ (records.py)"
    )


def keep(name: str, *, machine: str, headers: list[str], rows: list[list[str]], note: str = "",
         command: str | None = None, directory: Path = RECORDS) -> Path:  # fmt: skip
    """Append a record of table ``name`` (its cells as printed) to ``directory/NAME.jsonl``;
    ``machine``: ``machine_line()``'s; ``command``: by default this process's own."""
    directory.mkdir(parents=True, exist_ok=True)
    if command is None:
        command = " ".join(["python", f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]])
    record = {
        "date": datetime.date.today().isoformat(),
        "machine": machine_only(machine),
        "command": command,
        "headers": headers,
        "rows": rows,
        "note": note,
    }
    path = directory / f"{name}.jsonl"
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def machine_only(line: str) -> str:
    """``machine_line()``'s machine, without its ``machine:`` label and the command."""
    return line.split("; command:")[0].removeprefix("machine: ").strip()


def latest(name: str, directory: Path = RECORDS) -> list[dict]:  # type: ignore[type-arg]
    """The latest record of ``name`` on each machine line, in the order first recorded."""
    path = directory / f"{name}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no records of {name}")
    by_machine: dict[str, dict] = {}  # type: ignore[type-arg]
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            record = json.loads(line)
            by_machine[record["machine"]] = record
    return list(by_machine.values())


def render(name: str, directory: Path = RECORDS) -> str:
    """The block's text: each machine's latest table under its machine, date and command."""
    parts = []
    for record in latest(name, directory):
        head = f"`{record['machine']}`, {record['date']}: `{record['command']}`"
        table = [
            "| " + " | ".join(record["headers"]) + " |",
            "|" + "---|" * len(record["headers"]),
            *("| " + " | ".join(row) + " |" for row in record["rows"]),
        ]
        note = ["", record["note"]] if record["note"] else []
        parts.append("\n".join([head, "", *table, *note]))
    return "\n\n".join(parts)


_BLOCK = re.compile(r"(<!-- bench:([\w\-]+) -->\n)(.*?)\n?(<!-- /bench:\2 -->)", re.DOTALL)


def fill(document: str, directory: Path = RECORDS) -> str:
    return _BLOCK.sub(lambda m: f"{m[1]}{render(m[2], directory)}\n{m[4]}", document)


def differences(document: str, directory: Path = RECORDS) -> list[str]:
    """The blocks of ``document`` that differ from what their records make."""
    return [
        f"{m[2]}: differs from benchmarks/records/{m[2]}.jsonl"
        for m in _BLOCK.finditer(document)
        if m[3] != render(m[2], directory)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", type=Path, metavar="DOC")
    group.add_argument("--check", type=Path, metavar="DOC")
    args = parser.parse_args(argv)
    if args.write:
        args.write.write_text(fill(args.write.read_text(encoding="utf-8")), encoding="utf-8")
        return 0
    found = differences(args.check.read_text(encoding="utf-8"))
    for line in found:
        print(f"{args.check}: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
