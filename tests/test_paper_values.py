"""The numbers RESULTS' and the README's prose quotes (wtnmt.analysis.paper_values): each is
made from the committed results as the tables are, a changed or unknown one is found, and the
rule's words follow the rule written before the runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from wtnmt.analysis.paper import differences, fill, make_tables
from wtnmt.analysis.paper_tables import load_settings
from wtnmt.analysis.paper_values import value_differences, values, verdict

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("diff", "low", "high", "p", "perm", "seeds", "word"),
    [
        (-1.31, -2.28, -0.33, 0.02, 0.10, 3, "ends lower"),  # 3 + 3: the permutation floor
        (+0.90, +0.10, +1.70, 0.03, 0.10, 3, "ends higher"),
        (-0.80, -1.56, -0.05, 0.04, 0.10, 5, "no difference shown"),  # 5 + 5 asks p < 0.05
        (-0.80, -1.30, -0.30, 0.01, 0.03, 5, "ends lower"),
        (-0.10, -0.40, +0.20, 0.50, 0.60, 5, "level"),  # inside ±0.5
        (-0.28, -0.85, +0.30, 0.28, 0.25, 5, "no difference shown"),
        (-0.05, -0.50, +0.40, 0.80, 0.90, 5, "no difference shown"),  # touching −0.5: not inside
    ],
)
def test_the_rules_words(diff, low, high, p, perm, seeds, word):
    assert verdict(diff, low, high, p, perm, seeds) == word


def test_a_changed_or_unknown_value_in_the_prose_is_found(monkeypatch):
    monkeypatch.chdir(ROOT)
    named = values(load_settings(Path("docs/results.yaml")))
    document = (ROOT / "docs" / "RESULTS.md").read_text(encoding="utf-8")
    key = "equal.weighted.diff"
    quoted = f"<!-- value:{key} -->{named[key]}<!-- /value -->"
    assert quoted in document and value_differences(document, named) == []
    changed = document.replace(quoted, f"<!-- value:{key} -->−0.18<!-- /value -->", 1)
    assert value_differences(changed, named) == [
        f"value {key}: the text says '−0.18', the results give {named[key]!r}"
    ]
    assert fill(changed, {}, named) == document  # --write puts it back
    unknown = document + "\n<!-- value:equal.weighted.nonsense -->1<!-- /value -->\n"
    assert value_differences(unknown, named)[0].startswith("value equal.weighted.nonsense: no such")
    runs = (ROOT / "docs" / "RESULTS-RUNS.md").read_text(encoding="utf-8")
    assert differences([changed, runs], make_tables(), named) != []


def test_every_comparison_has_its_word_and_interval():
    named = values(load_settings(ROOT / "docs" / "results.yaml"))
    for key in ("gpu.weighted", "cpu.weighted", "equal.weighted", "gpu.fixed", "cpu.fixed"):
        assert named[f"{key}.word"] in {"ends higher", "ends lower", "level", "no difference shown"}
        low, high = named[f"{key}.low"], named[f"{key}.high"]
        assert named[f"{key}.ci"] == f"[{low}, {high}]"
    assert "enfr.weighted.word" not in named  # (one seed a model: no test, no word)
