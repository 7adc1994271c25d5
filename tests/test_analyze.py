"""`wtnmt analyze`: every figure and table drawn from a tiny trained run, with the numbers in the
summary equal to the ones the run recorded (the measures on hand-made metrics:
test_analysis_metrics.py)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image

from helpers import scored_tiny_runs
from wtnmt.analysis.figures import frozen_from, loss_pairs
from wtnmt.analysis.metrics import RunMetrics, steps_to_bleu
from wtnmt.analysis.report import analyze
from wtnmt.analysis.scoring import branch_weight_ablation
from wtnmt.cli import main
from wtnmt.model import branch_weight_table
from wtnmt.rundir import load_run


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    return scored_tiny_runs(tmp_path_factory.mktemp("analyze"))


def _markdown_table(text: str, title: str) -> list[list[str]]:
    block = text.split(f"## {title}\n\n", 1)[1].split("\n\n", 1)[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in block.splitlines()[2:]]


def test_analyze_draws_every_figure_and_the_numbers_are_the_recorded_ones(runs, tmp_path):
    out = tmp_path / "report"
    result = analyze(runs, out, random_seeds=2, say=lambda _: None)
    for name in (
        "validation.png", "loss_vs_loss.png", "kappa_alpha-weighted-s1.png",
        "steps_to_bleu.png", "attention-weighted-s1.png", "disagreement.png", "summary.md",
        "report.html", "analysis.json",
    ):  # fmt: skip
        assert (out / name).stat().st_size > 1000, name
    assert not (out / "kappa_alpha-transformer-s1.png").exists()  # no κ, α to draw
    html = (out / "report.html").read_text()
    linked = re.findall(r"<img alt='[^']*' src='([^']+)'>", html)
    assert linked == [f["file"] for f in result["figures"]] and len(linked) == 6
    assert all((out / name).is_file() for name in linked) and "base64" not in html
    assert all(Image.open(out / name).mode == "P" for name in linked)  # small enough to commit
    assert "http://" not in html and "https://" not in html  # nothing fetched
    summary = (out / "summary.md").read_text()
    rows = {r[0]: r for r in _markdown_table(summary, "Runs")}
    for run in runs:
        metrics = RunMetrics.load(run)
        scores = json.loads((run / "scores.json").read_text())
        best = metrics.best_valid
        row = rows[run.name]
        config = yaml.safe_load((run / "config.yaml").read_text().split("\n", 1)[1])
        assert row[2] == config["train"]["precision"]
        assert row[3] == str(metrics.train[-1]["step"]) == "12"
        assert row[4] == "max_steps"  # its train.log: "stopped: max_steps=12 reached"
        assert row[6] == str(round(1000 * metrics.train[-1]["elapsed"] / 12))  # ms/step
        assert row[8] == f"{best['valid_bleu']:.2f} ({best['step']})"
        # where the run reached its own plateau: the first validation within 0.5 of its best
        near = [v["step"] for v in metrics.valid if v["valid_bleu"] >= best["valid_bleu"] - 0.5]
        assert row[9] == str(near[0])
        assert row[10] == f"{scores['test']['bleu']:.2f}"
        assert row[11] == f"{scores['test']['chrf']:.2f}"
    models = {r[0]: r for r in _markdown_table(summary, "Models (mean ± sd over seeds)")}
    for run in runs:  # one seed a model: its own numbers, no spread
        test = json.loads((run / "scores.json").read_text())["test"]
        assert models[run.name.removesuffix("-s1")][9] == f"{test['bleu']:.2f}"
    # steps to the first run's best dev BLEU: the first run reaches it where it was best
    target = RunMetrics.load(runs[0]).best_valid
    assert result["target_bleu"] == target["valid_bleu"]
    first = _markdown_table(summary, f"Steps and seconds to dev BLEU {target['valid_bleu']:.2f}")
    reached = steps_to_bleu(RunMetrics.load(runs[0]), target["valid_bleu"])
    assert first[0][:3] == ["weighted-s1", str(reached[0]), "1.00"]
    table3 = _markdown_table(summary, "Branch weights at test time (paper Table 3)")
    assert [r[:2] for r in table3] == [["weighted-s1", "model.safetensors"]]  # one seed
    learned = json.loads((runs[0] / "scores.json").read_text())["test"]
    assert table3[0][2] == f"{learned['bleu']:.2f}"  # the learned row is the run's own score
    kept = runs[0] / "eval" / f"uniform0.test.beam{learned['beam']}.json"  # its beam, by name
    uniform = json.loads(kept.read_text())
    assert uniform["branch_weights"] == "uniform" and table3[0][3] == f"{uniform['bleu']:.2f}"
    assert re.fullmatch(r"\d+\.\d\d ± \d+\.\d\d", table3[0][4]) and table3[0][5] == "2"
    assert table3[0][6] == f"{round(uniform['bleu'] - learned['bleu'], 2):.2f}"
    equal = _markdown_table(summary, "Test scores at equal update steps (12)")
    assert [r[0] for r in equal] == ["weighted-s1", "transformer-s1"]


def test_table_3_over_seeds_reads_each_runs_kept_decodings_of_the_weights_it_scored(runs, tmp_path):
    """Clones of committed results: no weights, the decodings a grid kept of its averaged
    weights. Each seed's row is its own files; the model's row is the mean ± sd of the rows;
    a run with κ, α fixed at 1/M has no Table 3 (uniform is what it has)."""
    import shutil

    from wtnmt.analysis.runs import Run
    from wtnmt.analysis.table3 import table3

    # seed: (learned, uniform, random draws kept)
    made = {"weighted-s1": (40.0, 36.0, [30.0, 20.0]), "weighted-s2": (38.0, 35.0, [26.0])}
    clones = []
    for name, (learned, uniform, randoms) in made.items():
        clone = tmp_path / name
        shutil.copytree(runs[0], clone, ignore=shutil.ignore_patterns("*.safetensors", "eval"))
        test = {"bleu": learned, "beam": 5, "weights": "average-last10.safetensors"}
        (clone / "scores.json").write_text(json.dumps({"test": test}))
        (clone / "eval").mkdir()
        kept = [("uniform0", uniform)] + [(f"random{s}", b) for s, b in enumerate(randoms, 1)]
        for how, bleu in kept:
            path = clone / "eval" / f"average-last10.{how}.test.beam5.json"
            path.write_text(json.dumps({"bleu": bleu}))
        clones.append(Run.load(clone))
    fixed = tmp_path / "weighted-fixed-s1"
    shutil.copytree(clones[0].path, fixed)
    config = yaml.safe_load((fixed / "config.yaml").read_text().split("\n", 1)[1])
    config["model"]["branch_weights"] = "fixed"
    (fixed / "config.yaml").write_text("#\n" + yaml.safe_dump(config))
    table = table3([*clones, Run.load(fixed)], random_seeds=3, decode=False)
    assert table is not None
    assert table.rows == [
        ["weighted-s1", "average-last10.safetensors", 40.0, 36.0, "25.00 ± 7.07", 2, -4.0, -15.0],
        ["weighted-s2", "average-last10.safetensors", 38.0, 35.0, "26.00", 1, -3.0, -12.0],
        # means over seeds: learned (40, 38), uniform (36, 35), random means (25, 26)
        ["weighted (2 seeds)", None, "39.00 ± 1.41", "35.50 ± 0.71", "25.50 ± 0.71", 3,
         "-3.50 ± 0.71", "-13.50 ± 2.12"],
    ]  # fmt: skip
    assert table3([Run.load(fixed)], random_seeds=3, decode=False) is None


def test_kappa_alpha_figure_shades_the_freeze_window_and_pairs_losses(runs):
    metrics = RunMetrics.load(runs[0])
    frozen = frozen_from(metrics)
    assert frozen is not None and 8 <= frozen <= 10  # the last 4 of 12 steps (logged every 2)
    assert frozen_from(RunMetrics.load(runs[1])) is None
    pairs = loss_pairs(metrics)
    assert len(pairs) == len(metrics.valid)
    assert [p[1] for p in pairs] == [v["valid_loss"] for v in metrics.valid]
    # validations at 4, 8, 12 and logging every 2: the means of the losses at (2, 4), (6, 8)...
    by_step = {e["step"]: e["loss"] for e in metrics.train}
    expected = [(by_step[s - 2] + by_step[s]) / 2 for s in (4, 8, 12)]
    assert [v["step"] for v in metrics.valid] == [4, 8, 12]
    assert [p[0] for p in pairs] == pytest.approx(expected)


def test_table_3_leaves_the_learned_weights_as_they_were(runs):
    run = runs[0]
    _, _, model = load_run(run)
    before = branch_weight_table(model)
    row = branch_weight_ablation(run, random_seeds=2)
    assert row["uniform"]["branch_weights"] == "uniform"
    assert [r["seed"] for r in row["random"]] == [1, 2]
    _, _, again = load_run(run)
    assert branch_weight_table(again) == before
    # and the context manager the ablation decodes under restores them in place
    from wtnmt.model import branch_weights_overridden

    with branch_weights_overridden(model, "random", seed=1):
        assert branch_weight_table(model) != before
    assert branch_weight_table(model) == before
    pairs = zip(model.state_dict().values(), again.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


def test_analyze_command_line(runs, tmp_path, capsys):
    assert main(["analyze", str(runs[1]), "--out", str(tmp_path / "a"), "--no-decode"]) == 0
    assert (tmp_path / "a" / "summary.md").is_file()
    assert not (tmp_path / "a" / "attention-transformer-s1.png").exists()
    capsys.readouterr()
    assert main(["analyze", str(tmp_path), "--out", str(tmp_path / "b")]) == 2
    assert "not a run directory" in capsys.readouterr().err
    assert main(["analyze", str(runs[0]), "--smooth", "0"]) == 2
    assert "--smooth 0: must be at least 1" in capsys.readouterr().err


def test_disagreement_scores_of_analyze_equal_the_training_regularizer(runs, tmp_path):
    from wtnmt.analysis.deep import dev_batches, disagreement_on
    from wtnmt.disagreement import MODULE_KINDS, TERMS, disagreement

    run = runs[0]  # a Weighted Transformer: its branches are the heads
    _, _, model = load_run(run)
    batch = dev_batches(run)[:1]
    scores = disagreement_on(model, batch)
    model.eval()
    with torch.no_grad():
        internals = model(batch[0].src, batch[0].tgt_in, need_internals=True).internals
    for kind in MODULE_KINDS:
        for term in TERMS:
            # the regularizer of one term on one kind is the mean over that kind's layers
            regularizer = float(disagreement(internals, terms=[term], modules=[kind]))
            layers = scores[kind][term]
            assert sum(layers) / len(layers) == pytest.approx(regularizer, abs=1e-6)
            assert all(-1.0 <= x <= 0.0 for x in layers)
    result = analyze([run], tmp_path, say=lambda _: None)
    title = "Disagreement of attention heads (Li et al., Table 4), mean over layers"
    table = _markdown_table((tmp_path / "summary.md").read_text(), title)
    full = result["data"]["disagreement"]["weighted-s1"]
    for row in table:
        kind = row[1]
        for term, cell in zip(TERMS, row[2:], strict=True):
            assert cell == f"{sum(full[kind][term]) / len(full[kind][term]):.4f}"
    # the per-layer figure draws the same numbers (one seed: the model's mean is the run's)
    assert result["data"]["disagreement.png"]["weighted"] == full
    assert (tmp_path / "disagreement.png").stat().st_size > 1000


def test_a_clone_without_weights_reports_the_same_numbers(runs, tmp_path):
    # what is committed: no weights, no checkpoints; the decoded scores kept in eval/
    import shutil

    analyze(runs, tmp_path / "full", random_seeds=2, say=lambda _: None)
    clones = []
    for run in runs:
        clone = tmp_path / "clone" / run.name
        shutil.copytree(run, clone, ignore=shutil.ignore_patterns("*.safetensors", "checkpoints"))
        clones.append(clone)
    analyze(clones, tmp_path / "again", random_seeds=2, say=lambda _: None)
    full, again = ((tmp_path / d / "summary.md").read_text() for d in ("full", "again"))
    for title in (
        "Runs",
        "Branch weights at test time (paper Table 3)",
        "Test scores at equal update steps (12)",
        "Paired bootstrap on the test split (1000 samples), best seeds by dev BLEU",
    ):
        assert _markdown_table(again, title) == _markdown_table(full, title), title
    assert not (tmp_path / "again" / "attention-weighted-s1.png").exists()  # needs the weights


def test_report_cells_give_one_form_a_column():
    """A mean over one seed (a float) reads as the runs' own rows do: counts, milliseconds and
    seconds whole from 100 on, scores and ratios to two decimals."""
    from wtnmt.analysis.report import _cell

    assert [_cell(193.0), _cell(939.8), _cell(1278.3), _cell(38.471), _cell(0.78)] == [
        "193",
        "940",
        "1,278",
        "38.47",
        "0.78",
    ]
    assert _cell(None) == "–" and _cell(7000) == "7000"
    assert [_cell(0.00042), _cell(-0.0031), _cell(0.0), _cell(0.005)] == [
        "0.0004",
        "-0.003",
        "0.00",
        "0.01",
    ]


def test_a_run_trained_by_hand_is_scored_on_its_test_split(runs, tmp_path):
    """A run with no grid's test scores (trained with `wtnmt train`, evaluated by hand or not
    at all) shows its best weights' test scores: decoded, then read back without decoding."""
    import shutil

    hand = tmp_path / "runs" / runs[1].name
    shutil.copytree(runs[1], hand, ignore=shutil.ignore_patterns("eval", "checkpoints"))
    evaluated = {"bleu": 99.0, "source": {"src": "mine.en", "ref": "mine.de"}}  # `evaluate`'s
    (hand / "scores.json").write_text(json.dumps(evaluated))
    expected = json.loads((runs[1] / "scores.json").read_text())["test"]  # the grid's way

    def test_row(name: str, decode: bool) -> list[str]:
        analyze([hand], tmp_path / name, decode=decode, say=lambda _: None)
        return _markdown_table((tmp_path / name / "summary.md").read_text(), "Runs")[0][-3:]

    scored = [f"{expected[k]:.2f}" for k in ("bleu", "chrf", "bleu_lc")]
    assert test_row("decoded", decode=True) == scored
    assert json.loads((hand / "scores.json").read_text()) == evaluated  # not written
    (hand / "model.safetensors").unlink()  # a clone of the results: what eval/ kept
    assert test_row("kept", decode=False) == scored
    shutil.rmtree(hand / "eval")
    assert test_row("none", decode=False) == ["–", "–", "–"]


def test_a_pair_asked_of_one_seed_a_side_is_said_to_be_untested(runs, tmp_path):
    said: list[str] = []
    analyze(runs, tmp_path, decode=False, pairs=["transformer:weighted"], say=said.append)
    assert "--pair transformer:weighted: not tested, 1 + 1 seeds (a test needs two a side)" in said
    across = (tmp_path / "summary.md").read_text().split("## Across seeds", 1)[1]
    assert "transformer against weighted (1 + 1 seeds)" in across.split("##", 1)[0]


def test_the_runs_table_says_which_weights_its_test_scores_are_of(runs, tmp_path):
    import shutil

    clones = [tmp_path / "runs" / run.name for run in runs]
    for run, clone in zip(runs, clones, strict=True):
        shutil.copytree(run, clone, ignore=shutil.ignore_patterns("*.safetensors", "checkpoints"))

    def note(name: str) -> str:
        analyze(clones, tmp_path / name, decode=False, say=lambda _: None)
        summary = (tmp_path / name / "summary.md").read_text()
        return summary.split("test: beam search with ", 1)[1].split(";", 1)[0]

    assert note("best") == "the weights of the best dev BLEU"
    for clone in clones:  # as `wtnmt experiment` scores with train.average
        scores = json.loads((clone / "scores.json").read_text())
        scores["test"]["average"] = 10
        (clone / "scores.json").write_text(json.dumps(scores))
    assert note("averaged") == "the mean of the last 10 checkpoints"
    scores = json.loads((clones[0] / "scores.json").read_text())
    del scores["test"]["average"]
    (clones[0] / "scores.json").write_text(json.dumps(scores))
    assert note("mixed").startswith("the weights each run's scores.json names")


def test_the_default_report_goes_beside_the_runs_not_into_the_working_directory(
    runs, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    shared = Path(os.path.commonpath([str(r.resolve().parent) for r in runs]))
    assert main(["analyze", *map(str, runs), "--no-decode"]) == 0
    assert (shared / "analysis" / "summary.md").is_file()
    assert not (tmp_path / "analysis").exists()


def test_analyze_tokenize_scores_every_test_bleu_as_asked(runs, tmp_path):
    from sacrebleu.metrics import BLEU

    from wtnmt.analysis.runs import Run
    from wtnmt.analysis.scoring import read_hypotheses, scored_with, split_pairs, with_test_score

    assert main(["analyze", *map(str, runs), "--no-decode", "--tokenize", "char",
                 "--out", str(tmp_path / "r")]) == 0  # fmt: skip
    assert json.loads((tmp_path / "r" / "analysis.json").read_text())["tokenize"] == "char"
    run = Run.load(runs[0])
    plain = with_test_score(run, decode=False).scores["test"]
    with scored_with("char"):
        test = with_test_score(run, decode=False).scores["test"]
    refs = split_pairs(runs[0], "test")[1]
    expected = BLEU(tokenize="char").corpus_score(read_hypotheses(runs[0], plain), [refs])
    assert test["bleu"] == round(expected.score, 2) and test["tokenize"] == "char"
    assert "tok:char" in test["signature"] and plain.get("tokenize", "13a") == "13a"
    assert main(["analyze", str(runs[0]), "--tokenize", "moses", "--out", str(tmp_path / "x")]) == 2
