"""The measures `wtnmt analyze` reads from a run's metrics.jsonl, on hand-made files: steps and
seconds to a dev BLEU, a resumed run's lost continuation dropped, the smoothing filter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wtnmt.analysis.metrics import RunMetrics, read_metrics, smooth, steps_to_bleu


def write_metrics(path: Path, entries: list[dict]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in entries), encoding="utf-8")
    return path


def train_entry(step: int, elapsed: float, loss: float = 5.0) -> dict:
    return {"step": step, "loss": loss, "elapsed": elapsed, "tokens_per_s": 100.0}


def valid_entry(step: int, bleu: float, loss: float = 4.0) -> dict:
    return {"step": step, "valid_loss": loss, "valid_bleu": bleu}


def test_steps_to_bleu_on_a_hand_made_metrics_file(tmp_path):
    # dev BLEU 3.0 at 100, 7.5 at 200, 12.0 at 300, 11.0 at 400: 10.0 is first reached at 300;
    # the seconds at step 300 lie between the logged 250 (50 s) and 350 (90 s): 70 s
    entries = [train_entry(s, t) for s, t in ((50, 10.0), (150, 30.0), (250, 50.0), (350, 90.0))]
    entries += [valid_entry(s, b) for s, b in ((100, 3.0), (200, 7.5), (300, 12.0), (400, 11.0))]
    entries.sort(key=lambda e: e["step"])
    run = RunMetrics.from_file(write_metrics(tmp_path / "metrics.jsonl", entries))
    assert steps_to_bleu(run, 10.0) == (300, pytest.approx(70.0))
    assert steps_to_bleu(run, 7.5) == (200, pytest.approx(40.0))
    assert steps_to_bleu(run, 12.5) is None
    assert run.best_valid["step"] == 300


def test_a_validation_with_its_own_elapsed_uses_it(tmp_path):
    entries = [train_entry(10, 5.0), {**valid_entry(10, 4.0), "elapsed": 5.0}]
    entries += [train_entry(20, 11.0), {**valid_entry(20, 6.0), "elapsed": 11.0}]
    run = RunMetrics.from_file(write_metrics(tmp_path / "metrics.jsonl", entries))
    assert steps_to_bleu(run, 5.0) == (20, 11.0)


def test_metrics_of_a_resumed_run_drop_the_lost_continuation(tmp_path):
    # killed after logging steps 40 and 50 (and the validation at 50) past its checkpoint at
    # 30; the resume logs 40 and 50 again: the first 40/50 entries are gone
    entries = [train_entry(s, s / 10, loss=9.0) for s in (10, 20, 30, 40, 50)]
    entries.insert(5, valid_entry(50, 1.0))
    entries += [train_entry(40, 4.0, loss=1.0), train_entry(50, 5.0, loss=1.0)]
    entries += [valid_entry(50, 2.0)]
    got = read_metrics(write_metrics(tmp_path / "metrics.jsonl", entries))
    assert [(e["step"], e.get("loss"), e.get("valid_bleu")) for e in got] == [
        (10, 9.0, None), (20, 9.0, None), (30, 9.0, None), (40, 1.0, None), (50, 1.0, None),
        (50, None, 2.0),
    ]  # fmt: skip


def test_smoothing_is_a_centred_mean_filter():
    assert smooth([0.0, 3.0, 6.0, 9.0], 3) == [1.5, 3.0, 6.0, 7.5]
    assert smooth([1.0, 2.0], 1) == [1.0, 2.0]
