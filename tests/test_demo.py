"""The demo and the figures it draws."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from wtnmt.analysis import branch_weight_rows, plot_branch_weights
from wtnmt.config import load_config


def test_branch_weight_figure_is_drawn_from_metrics(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    rows = []
    for step in (10, 20, 30):
        weights = {"kappa": [0.1, 0.2, 0.3, 0.4], "alpha": [0.25] * 4}
        rows.append(
            {
                "step": step,
                "loss": 1.0,
                "branch_weights": {
                    "encoder_layers.0.self_attn": weights,
                    "decoder_layers.0.cross_attn": weights,
                },
            }
        )
    rows.append({"step": 30, "valid_loss": 1.0})  # validation lines carry no weights
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = plot_branch_weights(metrics, tmp_path / "bw.png")
    assert out is not None and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = rows[0]["branch_weights"]
    assert "κ [0.10 0.20 0.30 0.40]" in branch_weight_rows(table)[0]
    metrics.write_text(json.dumps({"step": 1, "loss": 1.0, "branch_weights": {}}) + "\n")
    assert plot_branch_weights(metrics, tmp_path / "none.png") is None  # a Transformer run
    uniform = {"kappa": [0.25] * 4, "alpha": [0.25] * 4}
    fixed = [{**r, "branch_weights": {"decoder_layers.0.cross_attn": uniform}} for r in rows[:3]]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in fixed))
    assert plot_branch_weights(metrics, tmp_path / "fixed.png") is None  # κ, α fixed at 1/M
    assert not (tmp_path / "fixed.png").exists()
    # learned weights that did not move while logged (frozen, or logged once) are drawn
    frozen = [{**r, "branch_weights": rows[0]["branch_weights"]} for r in rows[:3]]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in frozen[:1]))
    assert plot_branch_weights(metrics, tmp_path / "one.png") is not None
    metrics.write_text("".join(json.dumps(r) + "\n" for r in frozen))
    assert plot_branch_weights(metrics, tmp_path / "frozen.png") is not None


needs_tatoeba = pytest.mark.skipif(
    not (
        Path(os.environ.get("WTNMT_DATA", "/nonexistent")) / "tatoeba-deu-eng" / "deu-eng.zip"
    ).is_file(),
    reason="set WTNMT_DATA to a folder with tatoeba-deu-eng/deu-eng.zip to run the demo",
)


@pytest.mark.slow
@pytest.mark.timeout(660)  # the demo's own limit (600 s) decides, not pytest's default 300
@needs_tatoeba
def test_a_short_demo_runs_end_to_end(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "wtnmt.cli",
            "demo",
            "--minutes",
            "0.3",
            "--out",
            str(tmp_path / "demo"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "demo" / "results.json").read_text())
    assert {"bleu", "chrf", "signature", "seconds", "steps", "branch_weights"} <= set(results)
    assert (tmp_path / "demo" / "branch_weights.png").is_file()
    assert "CC-BY 2.0" in (tmp_path / "demo" / "ATTRIBUTION.txt").read_text()
    assert "wtnmt translate" in done.stdout and "BLEU" in done.stdout
    # the schedule fitted to the updates that fit: warm-up ends inside even this short run
    schedule = results["schedule"]
    assert 1 <= schedule["warmup"] <= results["steps"] and schedule["predicted_updates"] >= 1
    assert schedule["cpu"]["model"] and schedule["precision"] in ("fp32", "bf16")
    preset = load_config("weighted-demo").train  # what it trained with, recorded
    assert (schedule["max_tokens"], schedule["lr_schedule"]) == (
        preset.max_tokens,
        preset.lr_schedule,
    )
    assert "schedule:" in done.stdout and "updates fit in 0.3 minutes" in done.stdout


@needs_tatoeba
def test_an_interrupted_demo_says_how_to_resume(tmp_path):
    import signal
    import time

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "wtnmt.cli",
            "demo",
            "--minutes",
            "5",
            "--out",
            str(tmp_path / "demo"),
            "--set",
            "train.log_every=1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    log = tmp_path / "demo" / "train.log"
    deadline = time.time() + 240
    while time.time() < deadline and not (log.is_file() and "step 2 " in log.read_text()):
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    assert "--resume" in out
    assert list((tmp_path / "demo" / "checkpoints").glob("*.state.pt"))
