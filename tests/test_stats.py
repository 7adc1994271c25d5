"""Tests across seeds against oracles: Student's t tail by numerical integration of its
density and closed forms, Welch's t by hand, the permutation test by counting splits."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from wtnmt.analysis.metrics import RunMetrics
from wtnmt.analysis.runs import Run
from wtnmt.analysis.stats import (
    incomplete_beta,
    permutation_test,
    student_t_two_sided,
    t_critical,
    welch_interval,
    welch_t,
)
from wtnmt.analysis.tables import seeds_test_table


def t_tail_by_integration(t: float, df: float, steps: int = 200_000) -> float:
    """2 · ∫_|t|^∞ of Student's density, by Simpson's rule after x = |t| + u/(1-u)."""
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def integrand(u: float) -> float:
        if u >= 1.0:
            return 0.0
        x = abs(t) + u / (1 - u)
        return math.exp(log_c - (df + 1) / 2 * math.log1p(x * x / df)) / (1 - u) ** 2

    h = 1.0 / steps
    total = integrand(0.0) + integrand(1.0)
    total += sum((4 if i % 2 else 2) * integrand(i * h) for i in range(1, steps))
    return 2 * total * h / 3


@pytest.mark.parametrize(("t", "df"), [(0.5, 1), (2.0, 2), (3.674, 4), (1.2, 7.3), (2.5, 30)])
def test_student_t_tail_against_integration(t, df):
    assert student_t_two_sided(t, df) == pytest.approx(t_tail_by_integration(t, df), abs=1e-5)


def test_student_t_closed_forms():
    assert student_t_two_sided(1.0, 1) == pytest.approx(0.5)  # Cauchy: 1 - 2·atan(t)/π
    assert student_t_two_sided(0.5, 1) == pytest.approx(1 - 2 * math.atan(0.5) / math.pi)
    assert student_t_two_sided(2.0, 2) == pytest.approx(1 - 2 / math.sqrt(6))
    assert student_t_two_sided(1.959964, 1e7) == pytest.approx(0.05, abs=1e-5)  # the normal
    assert incomplete_beta(1.0, 1.0, 0.3) == pytest.approx(0.3)  # I_x(1, 1) = x
    assert incomplete_beta(2.0, 3.0, 0.0) == 0.0 and incomplete_beta(2.0, 3.0, 1.0) == 1.0


def test_welch_by_hand():
    # means 2 and 5, variances 1 and 1: t = -3 / √(2/3), df = (2/3)² / (2 · (1/3)² / 2) = 4
    t, df, p = welch_t([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])
    assert t == pytest.approx(-3 / math.sqrt(2 / 3))
    assert df == pytest.approx(4.0)
    assert p == pytest.approx(t_tail_by_integration(t, 4.0), abs=1e-6)
    # unequal variances: df falls between the smaller side's n-1 and n_a + n_b - 2
    t, df, _ = welch_t([1.0, 1.1, 0.9], [3.0, 7.0, 5.0, 1.0])
    assert 2.0 < df < 5.0
    assert welch_t([2.0, 2.0], [2.0, 2.0]) == (0.0, 2.0, 1.0)
    with pytest.raises(ValueError, match="at least two values"):
        welch_t([1.0], [2.0, 3.0])


@pytest.mark.parametrize(
    ("df", "expected"), [(1, 12.7062047), (2, 4.30265273), (4, 2.77644511), (30, 2.04227246)]
)
def test_the_t_critical_value_against_tables(df, expected):
    # Student's t quantiles at 0.975 (the standard tables); 1.96 as df grows
    assert t_critical(df) == pytest.approx(expected, abs=1e-6)
    assert student_t_two_sided(t_critical(df), df) == pytest.approx(0.05, abs=1e-9)
    assert t_critical(1e7) == pytest.approx(1.959964, abs=1e-5)


def test_welch_interval_by_hand():
    a, b = [39.41, 39.76, 39.72], [39.98, 39.90, 39.33]
    diff, low, high = welch_interval(a, b)
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    var = lambda v: sum((x - mean(v)) ** 2 for x in v) / (len(v) - 1)  # noqa: E731
    se = math.sqrt(var(a) / 3 + var(b) / 3)
    df = se**4 / ((var(a) / 3) ** 2 / 2 + (var(b) / 3) ** 2 / 2)
    assert diff == pytest.approx(mean(a) - mean(b))
    assert (high - low) / 2 == pytest.approx(t_critical(df) * se)
    assert low < 0 < high  # this pair's interval holds zero: p > 0.05
    assert welch_t(a, b)[2] > 0.05


def test_permutation_test_counts_splits():
    # 3+3 fully separated: only the two splits that keep them apart are as extreme, of 20
    assert permutation_test([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]) == pytest.approx(2 / 20)
    assert permutation_test([1.0, 2.0, 3.0], [1.0, 2.0, 3.0]) == 1.0
    # [1,2] against [3,10]: |mean diff| 5; as extreme: {1,2}|{3,10} and {3,10}|{1,2},
    # {1,3}|{2,10} gives 4, {2,3}|{1,10} gives 3: 2 of 6
    assert permutation_test([1.0, 2.0], [3.0, 10.0]) == pytest.approx(2 / 6)
    sampled = permutation_test([float(i) for i in range(12)], [float(i) for i in range(12)])
    assert sampled > 0.9  # 24 choose 12 splits: sampled, not counted


def _run(tmp: Path, name: str, bleu: float) -> Run:
    directory = tmp / name
    directory.mkdir()
    (directory / "metrics.jsonl").write_text("")
    scores = {"test": {"bleu": bleu, "bleu_lc": bleu + 1.0, "chrf": 50.0 + bleu}}
    return Run(directory, RunMetrics.load(directory), scores, {})


def _seeds(tmp: Path, **bleus: list[float]) -> list[Run]:
    """A run per seed of each model (``weighted_fixed`` names weighted-fixed), test BLEU each."""
    return [
        _run(tmp, f"{model.replace('_', '-')}-s{seed}", bleu)
        for model, scores in bleus.items()
        for seed, bleu in enumerate(scores, 1)
    ]


def _test_bleu_row(runs: list[Run]) -> list:
    table = seeds_test_table(runs)
    assert table is not None
    return next(row for row in table.rows if row[2] == "test BLEU")


def test_the_seeds_table_tests_each_model_against_the_first(tmp_path):
    runs = _seeds(tmp_path, transformer=[30.0, 31.0, 29.0], weighted=[32.0, 33.0, 34.0])
    bleu = _test_bleu_row(runs)
    t, df, p = welch_t([32.0, 33.0, 34.0], [30.0, 31.0, 29.0])
    assert bleu[:4] == ["weighted", "transformer", "test BLEU", 3.0]
    assert bleu[4:7] == [round(t, 2), round(df, 1), round(p, 4)]
    assert bleu[7] == pytest.approx(0.1)
    assert bleu[8] == 20  # the splits of 3 + 3 seeds its p counts
    three_two = seeds_test_table(runs[:5])  # a run lost: 3 + 2 seeds, 10 splits
    assert three_two is not None and three_two.rows[0][8] == 10
    assert three_two.rows[0][7] == pytest.approx(permutation_test([32.0, 33.0], [30.0, 31.0, 29.0]))
    assert seeds_test_table(runs[:1] + runs[3:4]) is None  # one seed a side: nothing to test


def test_the_seeds_table_keeps_a_p_too_small_for_four_decimals(tmp_path):
    # seeds 0.1 apart, models 10 apart: Welch's p is about 3e-8, which 4 decimals read as 0
    bleu = _test_bleu_row(
        _seeds(tmp_path, transformer=[30.0, 30.1, 29.9], weighted=[40.0, 40.1, 39.9])
    )
    p = welch_t([40.0, 40.1, 39.9], [30.0, 30.1, 29.9])[2]
    assert 0 < p < 5e-5 and round(p, 4) == 0.0
    assert bleu[6] == float(f"{p:.2g}") and bleu[6] > 0


def test_the_seeds_table_tests_the_pairs_asked_too(tmp_path):
    runs = _seeds(
        tmp_path,
        transformer=[30.0, 31.0, 29.0],
        weighted=[32.0, 33.0, 34.0],
        weighted_fixed=[33.5, 34.5],
    )
    pairs = [("weighted-fixed", "weighted"), ("weighted", "transformer")]  # the second: given
    table = seeds_test_table(runs, pairs)
    assert table is not None and table.title.endswith(", and the pairs asked")
    tested = [(row[0], row[1]) for row in table.rows if row[2] == "test BLEU"]
    assert tested == [
        ("weighted", "transformer"),
        ("weighted-fixed", "transformer"),
        ("weighted-fixed", "weighted"),
    ]
    fixed = next(r for r in table.rows if r[:3] == ["weighted-fixed", "weighted", "test BLEU"])
    t, df, p = welch_t([33.5, 34.5], [32.0, 33.0, 34.0])
    assert fixed[3:9] == [1.0, round(t, 2), round(df, 1), round(p, 4), fixed[7], 10]
    assert fixed[7] == pytest.approx(permutation_test([33.5, 34.5], [32.0, 33.0, 34.0]))


def test_the_seeds_table_names_what_one_seed_a_side_leaves_untested(tmp_path):
    runs = _seeds(tmp_path, transformer=[30.0, 31.0, 29.0], weighted=[32.0, 33.0, 34.0])
    runs += _seeds(tmp_path, weighted_d03=[35.0])  # a model with its first seed finished
    table = seeds_test_table(runs, [("weighted-d03", "weighted")])
    assert table is not None
    assert {(row[0], row[1]) for row in table.rows} == {("weighted", "transformer")}
    assert table.note.endswith(
        "; not tested, fewer than two seeds a side: weighted-d03 against transformer "
        "(1 + 3 seeds), weighted-d03 against weighted (1 + 3 seeds)"
    )
    # a pair asked of single seeds: the table says why it has no rows
    alone = seeds_test_table(runs[:1] + runs[3:4], [("weighted", "transformer")])
    assert alone is not None and alone.rows == []
    assert alone.note.endswith("weighted against transformer (1 + 1 seeds)")


def test_the_seeds_table_tests_best_dev_bleu_moses_bleu_and_ter_too(tmp_path):
    runs = []
    for model, devs in (
        ("transformer", [[20.0, 35.0, 34.8], [21.0, 36.0, 35.9]]),
        ("weighted", [[33.0, 32.0, 30.0], [31.9, 32.5, 31.0]]),
    ):
        for seed, dev in enumerate(devs, 1):
            run = _run(tmp_path, f"{model}-s{seed}", 40.0 + seed)
            losses = [4.0, 2.5 + seed / 10 + (model == "weighted"), 3.9]
            lines = [
                {"step": 100 * (i + 1), "valid_loss": loss, "valid_bleu": b}
                for i, (b, loss) in enumerate(zip(dev, losses, strict=True))
            ]
            (run.path / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
            run.scores["test"]["bleu_moses"] = 41.0 + seed + (model == "weighted")
            run.scores["test"]["ter"] = 50.0 - seed - 2 * (model == "weighted")
            runs.append(Run(run.path, RunMetrics.load(run.path), run.scores, {}))
    table = seeds_test_table(runs)
    assert table is not None
    rows = {row[2]: row for row in table.rows}
    # each run's best dev BLEU, not its last or its first: 35, 36 against 33, 32.5
    t, df, p = welch_t([33.0, 32.5], [35.0, 36.0])
    assert rows["best dev BLEU"][3:7] == [-2.75, round(t, 2), round(df, 1), round(p, 4)]
    # the lowest dev loss, wherever it fell: 2.6, 2.7 against 3.6, 3.7 (by hand)
    assert rows["lowest dev loss"][3] == 1.0
    # the first validation within 0.5 of the run's own best: 200, 200 against 100, 200
    t, df, p = welch_t([100.0, 200.0], [200.0, 200.0])
    assert rows["steps to best − 0.5"][3:7] == [-50.0, round(t, 2), round(df, 1), round(p, 4)]
    assert rows["test BLEU Moses"][3] == 1.0
    assert rows["test BLEU"][3] == 0.0
    assert rows["test TER"][3] == -2.0  # TER where scores.json has it (lower: better)


def test_moses_bleu_scores_lowercased_moses_tokens_and_counts_them_as_bleu_4():
    from wtnmt.decode.evaluate import moses_bleu

    # casing and the tokens Moses splits off do not count: the same sentence either way
    hyp, ref = ["Ein Mann, der „etwas“ anstarrt."], ['ein mann , der "etwas" anstarrt .']
    assert moses_bleu(hyp, ref, "de")["bleu_moses"] == 100.0
    # by hand: "a b c d e" against "a b c d f": 4/5, 3/4, 2/3, 1/2 n-gram precisions and no
    # brevity penalty, BLEU = (4/5 · 3/4 · 2/3 · 1/2)^(1/4) = 0.2^(1/4)
    got = moses_bleu(["A b c d e"], ["a b c d f"], "en")
    assert got["bleu_moses"] == round(100 * 0.2**0.25, 2)
    assert got["bleu_moses_signature"].startswith("lc+moses-norm+moses-tok:en|")


def test_the_tables_say_how_each_run_stopped_and_how_many_a_model_stopped_by_patience(tmp_path):
    """§4 asks for each model at patience: the runs table says what ended each run (its
    finished.json, else its train.log's last word), the models table how many of each."""
    from wtnmt.analysis.runs import stop_reason
    from wtnmt.analysis.tables import groups_table, runs_table

    patience = "no validation improvement in 10 validations (patience)"
    logs = {  # run: (finished.json's reason, or None; train.log's lines)
        "transformer-s1": (patience, []),
        "transformer-s2": (None, ["[09:26:49] stopped: max_steps=12000 reached"]),
        "transformer-s3": (None, [
            "[09:26:49] stopped: max_steps=12000 reached",  # then continued under a larger cap
            "[10:01:02] resumed from step_0012000.state.pt: step 12000, epoch 187, batch 3",
        ]),
        "weighted-s1": (None, [f"[01:00:00] stopped: {patience}", "[01:00:05] validation"]),
        "weighted-s2": (None, ["[01:00:00] interrupted at step 7: saving a checkpoint"]),
        "weighted-s3": (None, []),  # no log: not recorded
    }  # fmt: skip
    runs = []
    for name, (finished, lines) in logs.items():
        run = _run(tmp_path, name, 30.0)
        if finished:
            (run.path / "finished.json").write_text(json.dumps({"finished": finished}))
        if lines:
            (run.path / "train.log").write_text("\n".join(lines) + "\n")
        runs.append(Run(run.path, run.metrics, run.scores, {}, stop=stop_reason(run.path)))
    table = runs_table(runs)
    column = table.headers.index("stopped by")
    assert [row[column] for row in table.rows] == [
        "patience", "max_steps", None, "patience", None, None,
    ]  # fmt: skip
    groups = groups_table(runs)
    column = groups.headers.index("stopped by")
    assert [row[column] for row in groups.rows] == [
        "max_steps ×1, not recorded ×1, patience ×1",
        "not recorded ×2, patience ×1",
    ]
    assert groups_table(runs[:1]).rows[0][column] == "patience"
    (runs[5].path / "finished.json").write_text("[]")  # not one a grid wrote: not trusted
    assert stop_reason(runs[5].path) is None


def test_the_tables_say_each_runs_precision_and_a_models_mix_of_them(tmp_path):
    from wtnmt.analysis.tables import groups_table, runs_table

    runs = []
    for name, precision in (
        ("transformer-s1", "bf16"),
        ("transformer-s2", "fp32"),
        ("transformer-s3", "fp32"),
        ("weighted-s1", "bf16"),
        ("weighted-s2", None),  # recorded before train.precision existed: float32 then
    ):
        run = _run(tmp_path, name, 30.0)
        config = {"train": {"precision": precision}} if precision else {}
        runs.append(Run(run.path, run.metrics, run.scores, config))
    table = runs_table(runs)
    column = table.headers.index("precision")
    assert [row[column] for row in table.rows] == ["bf16", "fp32", "fp32", "bf16", "fp32"]
    groups = groups_table(runs[:3])
    assert groups.rows[0][:3] == ["transformer", 3, "bf16 ×1, fp32 ×2"]
    assert groups_table(runs[1:3]).rows[0][2] == "fp32"
