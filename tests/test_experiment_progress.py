"""The runner's progress line: each running run's step of its cap and the time it has left,
from the pace the runner has seen (wall time, so validations count) or its time budget."""

from __future__ import annotations

import json
from pathlib import Path

from wtnmt.experiment.grid import RunSpec
from wtnmt.experiment.progress import Budget, Sightings, progress_line


def spec_at(tmp: Path, *steps: tuple[int, float]) -> RunSpec:
    run_dir = tmp / "weighted-s1"
    run_dir.mkdir(exist_ok=True)
    lines = [{"step": s, "loss": 5.0, "elapsed": e} for s, e in steps]
    lines.append({"step": steps[-1][0], "valid_loss": 4.0, "valid_bleu": 1.0})  # not a step
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return RunSpec("weighted-s1", "weighted", "weighted-tiny", (), 1, run_dir)


def test_the_time_left_comes_from_the_pace_the_runner_saw(tmp_path):
    seen: Sightings = {}
    capped = Budget(max_steps=1500, max_time=None, patience=False)
    assert progress_line(RunSpec("x-s1", "x", "p", (), 1, tmp_path / "x"), capped, seen, 0.0) == (
        "x-s1 starting"
    )
    # a resumed run first seen at step 300: no pace yet
    line = progress_line(spec_at(tmp_path, (300, 400.0)), capped, seen, 1000.0)
    assert line == "weighted-s1 step 300/1500 (400 s)"
    # 200 steps in 300 s of wall time since: 1,000 steps left take 1,500 s, 25 minutes
    line = progress_line(spec_at(tmp_path, (300, 400.0), (500, 650.0)), capped, seen, 1300.0)
    assert line == "weighted-s1 step 500/1500 (650 s, about 25 min left)"
    # a minute on, no new step logged yet (a validation, say): the time counts down, the
    # pace stays the one between the steps seen
    line = progress_line(spec_at(tmp_path, (300, 400.0), (500, 650.0)), capped, seen, 1360.0)
    assert line == "weighted-s1 step 500/1500 (650 s, about 24 min left)"
    # patience may stop it sooner; 3,000 steps at that pace: 4,500 s, 1 h 15 min
    patient = Budget(max_steps=3500, max_time=None, patience=True)
    line = progress_line(spec_at(tmp_path, (300, 400.0), (500, 650.0)), patient, seen, 1300.0)
    assert line == "weighted-s1 step 500/3500 (650 s, at most 1 h 15 min left)"


def test_a_time_budget_gives_the_seconds_it_has_left(tmp_path):
    timed = Budget(max_steps=None, max_time=900.0, patience=False)
    line = progress_line(spec_at(tmp_path, (40, 870.0)), timed, {}, 5.0)
    assert line == "weighted-s1 step 40 (870 s, under a minute left)"
    line = progress_line(spec_at(tmp_path, (40, 300.0)), timed, {}, 5.0)
    assert line == "weighted-s1 step 40 (300 s, about 10 min left)"


def test_a_curve_ends_at_its_last_validation_when_that_came_after_its_last_training_entry(
    tmp_path,
):
    """A run stopped just after validating at step 45 (training logged at 44): its curve goes
    to 45, as the runner's plan says of an earlier try; a last line cut off while being
    written is passed over; no entry with a step, no end."""
    from wtnmt.experiment.progress import curve_end

    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": 44, "loss": 5.0, "elapsed": 9.5},
            {"step": 45, "elapsed": 9.8, "valid_loss": 4.0, "valid_bleu": 1.0}]  # fmt: skip
    metrics.write_text("".join(json.dumps(x) + "\n" for x in rows))
    assert curve_end(metrics) == (45, 9.8)
    for cut in ('{"step": 46, "loss": 5.0, "ela', '{"step": 46, "loss": 5.0, "elapsed": 1'):
        (tmp_path / "cut.jsonl").write_text(metrics.read_text() + cut)
        assert curve_end(tmp_path / "cut.jsonl") == (45, 9.8)
    metrics.write_text('{"note": 1}\n{"step": 4')
    assert curve_end(metrics) is None
