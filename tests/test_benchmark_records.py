"""docs/BENCHMARKS.md's generated tables (benchmarks/records.py): each block is the latest
record of its benchmark on each machine, with its machine line, date and command; a changed
figure is found, a record appended by a benchmark becomes the table."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import records  # noqa: E402


def test_the_guides_tables_are_the_ones_the_records_make():
    document = (ROOT / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8")
    assert "<!-- bench:" in document
    assert records.differences(document) == []
    assert len(document.splitlines()) <= 400, "a guide: the history in benchmarks/records/NOTES.md"


def test_every_table_of_the_guide_is_made_from_records():
    """No hand-written table: each table row of BENCHMARKS.md is inside a ``bench:`` block."""
    inside, loose = False, []
    for number, line in enumerate(
        (ROOT / "docs" / "BENCHMARKS.md").read_text(encoding="utf-8").splitlines(), 1
    ):
        if line.startswith("<!-- bench:"):
            inside = True
        elif line.startswith("<!-- /bench:"):
            inside = False
        elif line.startswith("|") and not inside:
            loose.append(number)
    assert loose == [], f"table rows outside the records' blocks at lines {loose}"


def test_a_changed_figure_is_found_and_a_new_record_becomes_the_table(tmp_path):
    head = ["engine", "greedy"]
    records.keep("probe", machine="cpu A", command="python x.py", headers=head,
                 rows=[["native", "9,116"]], directory=tmp_path)  # fmt: skip
    document = "# t\n\n<!-- bench:probe -->\n<!-- /bench:probe -->\n"
    filled = records.fill(document, tmp_path)
    assert "| native | 9,116 |" in filled and "`cpu A`" in filled and "python x.py" in filled
    assert records.differences(filled, tmp_path) == []
    assert records.differences(filled.replace("9,116", "9,200"), tmp_path) == [
        "probe: differs from benchmarks/records/probe.jsonl"
    ]
    # a later record on the same machine replaces it; another machine's is shown beside
    records.keep("probe", machine="cpu A", command="python x.py", headers=head,
                 rows=[["native", "9,300"]], directory=tmp_path)  # fmt: skip
    records.keep("probe", machine="cpu B", command="python x.py", headers=head,
                 rows=[["native", "7,000"]], directory=tmp_path)  # fmt: skip
    again = records.fill(filled, tmp_path)
    assert "9,116" not in again and "| native | 9,300 |" in again and "| native | 7,000 |" in again
