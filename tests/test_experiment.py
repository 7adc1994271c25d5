"""`wtnmt experiment`: grid files checked key by key; a finished run is skipped, an interrupted
one resumed, every run scored and the grid analyzed."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from helpers import tiny_run_config
from wtnmt.cli import main
from wtnmt.config import ConfigError, config_to_dict
from wtnmt.experiment import load_grid, plan_task, run_grid
from wtnmt.train import Trainer


def write_grid(tmp: Path, **changes) -> Path:  # type: ignore[no-untyped-def]
    config = tmp / "tiny.yaml"
    if not config.exists():
        values = config_to_dict(tiny_run_config(tmp))
        config.write_text(yaml.safe_dump(values))
    grid = {
        "out": str(tmp / "runs"),
        "base": {"train.log_every": 2, "train.valid_every": 3},
        "budget": {"max_steps": 6},
        "threads": 1,
        "parallel": 2,
        "seeds": [1, 2],
        "evaluate": {"split": "test", "beam": 2},
        "analyze": {"out": str(tmp / "report"), "random_seeds": 1},
        "runs": [{"name": "weighted", "preset": str(config)}],
        **changes,
    }
    path = tmp / "grid.yaml"
    path.write_text(yaml.safe_dump(grid, sort_keys=False))
    return path


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"epochs": 3}, "the file: unknown key 'epochs'; allowed: analyze, base"),
        ({"budget": {"max_time": 60, "max_steps": 6}}, "budget: give exactly one of"),
        ({"budget": {"max_minutes": 6}}, "budget: unknown key 'max_minutes'"),
        ({"seeds": [1, 1]}, "seeds: a seed is listed twice"),
        ({"threads": 0}, "threads: expected a positive integer, got 0"),
        ({"evaluate": {"split": "train"}}, "evaluate.split: 'train'; allowed: valid, test"),
        ({"runs": [{"name": "a b", "preset": "weighted-tiny"}]}, "runs[0].name: 'a b'"),
        (
            {"runs": [{"name": "a", "preset": "weighted-tiny", "lr": 1}]},
            "runs[0]: unknown key 'lr'",
        ),
        ({"base": {"model.dropout": 2.0}}, "run weighted-s1:"),
        ({"base": {"dropout": 0.1}}, "base.dropout: overrides are section.key"),
        (
            {"runs": [{"name": "a", "preset": "weighted-tiny"}] * 2},
            "two runs share the name 'a-s1'",
        ),
    ],
)
def test_a_bad_grid_file_is_refused_naming_the_key(tmp_path, capsys, changes, message):
    path = write_grid(tmp_path, **changes)
    with pytest.raises(ConfigError, match=None) as e:
        load_grid(path)
    assert message in str(e.value) and str(path) in str(e.value)
    assert main(["experiment", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "runs").exists()  # nothing started


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b"out: runs\nruns: []\n# caf\xe9\n", "not UTF-8 text (at byte offset 24)"),
        (b"out: a\nthreads: 1\nout: b\nruns: []\n", "key 'out' given twice (lines 1 and 3)"),
        (
            b"out: a\nruns:\n  - name: x\n    preset: weighted-tiny\n    name: y\n",
            "key 'name' given twice (lines 3 and 5)",
        ),
    ],
)
def test_a_grid_file_unreadable_as_yaml_is_one_line(tmp_path, capsys, text, message):
    path = tmp_path / "grid.yaml"
    path.write_bytes(text)
    assert main(["experiment", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and str(path) in err


def test_each_run_gets_the_grid_settings(tmp_path):
    grid = load_grid(write_grid(tmp_path))
    assert [s.name for s in grid.runs] == ["weighted-s1", "weighted-s2"]
    config = grid.runs[1].config()
    assert (config.train.seed, config.train.threads, config.train.max_steps) == (2, 1, 6)
    assert (config.train.max_time, config.train.log_every, config.train.valid_every) == (None, 2, 3)
    # two models: the runs side by side are one seed's models (each shares the machine alike)
    runs = [{"name": "a", "preset": "weighted-tiny"}, {"name": "b", "preset": "transformer-tiny"}]
    grid = load_grid(write_grid(tmp_path, runs=runs))
    assert [s.name for s in grid.runs] == ["a-s1", "b-s1", "a-s2", "b-s2"]


def _state(run: Path) -> tuple[int, str | None]:

    last = sorted((run / "checkpoints").glob("*.state.pt"))[-1]
    state = torch.load(last, weights_only=True)["train_state"]
    return state["step"], state["finished"]


@pytest.mark.slow
def test_the_runner_skips_a_finished_run_and_resumes_an_interrupted_one(tmp_path, capsys):
    path = write_grid(tmp_path)
    grid = load_grid(path)
    finished, interrupted = grid.runs
    # seed 1 trained to the end already; seed 2 killed after its checkpoint at step 3 (the
    # later checkpoint gone, its metrics past step 3 logged: the resume logs them again)
    Trainer(finished.config(), finished.run_dir, log_to_stderr=False).run()
    Trainer(interrupted.config(), interrupted.run_dir, log_to_stderr=False).run()
    for f in (interrupted.run_dir / "checkpoints").glob("step_0000006*"):
        f.unlink()
    assert _state(interrupted.run_dir) == (3, None)
    untouched = {p: p.stat().st_mtime_ns for p in (finished.run_dir / "checkpoints").iterdir()}
    assert plan_task(finished, grid).what == "score"  # trained, not scored yet
    assert plan_task(interrupted, grid).said == "resume (from step 3)"  # its checkpoint's

    assert main(["experiment", str(path)]) == 0
    err = capsys.readouterr().err
    assert "1 to resume, 1 to score" in err
    assert {
        p: p.stat().st_mtime_ns for p in (finished.run_dir / "checkpoints").iterdir()
    } == untouched
    assert "resumed from step_0000003" in (interrupted.run_dir / "train.log").read_text()
    assert _state(interrupted.run_dir) == (6, "max_steps=6 reached")
    for spec in grid.runs:
        scores = json.loads((spec.run_dir / "scores.json").read_text())
        assert scores["steps"] == 6 and scores["test"]["beam"] == 2
        assert {"bleu", "chrf", "bleu_lc", "bleu_moses"} <= set(scores["test"])
        assert plan_task(spec, grid) is None  # nothing left
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "weighted-s1" in summary and "weighted-s2" in summary

    assert main(["experiment", str(path), "--dry-run"]) == 0
    assert "2 runs, 2 done, 0 to train, 0 to resume, 0 to score" in capsys.readouterr().err


def test_a_run_trained_with_other_settings_is_refused(tmp_path):
    grid = load_grid(write_grid(tmp_path))
    spec = grid.runs[0]
    Trainer(spec.config(), spec.run_dir, log_to_stderr=False).run()
    base = {"train.log_every": 2, "train.valid_every": 3, "train.lr_scale": 0.5}
    other = load_grid(write_grid(tmp_path, base=base))
    with pytest.raises(ConfigError, match=r"trained with other settings.*train.lr_scale"):
        plan_task(other.runs[0], other)
    # a bigger budget continues the finished run
    longer = load_grid(write_grid(tmp_path, budget={"max_steps": 9}))
    assert plan_task(longer.runs[0], longer).said == "resume (from step 6)"


def test_a_run_another_process_trains_is_not_touched(tmp_path):
    grid = load_grid(write_grid(tmp_path))
    spec = grid.runs[0]
    spec.run_dir.mkdir(parents=True)
    (spec.run_dir / "metrics.jsonl").write_text('{"step": 40, "loss": 3.5, "elapsed": 9.0}\n')
    holder = subprocess.Popen(
        [
            sys.executable, "-c",
            "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
            "fcntl.lockf(fd, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(60)",
            str(spec.run_dir / ".lock"),
        ],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        said: list[str] = []
        outcome = run_grid(grid, dry_run=True, say=said.append)
        assert outcome["weighted-s1"] == "busy" and outcome["weighted-s2"] == "train"
        busy = "  weighted-s1: busy: another process is training it (at step 40); left to it"
        assert busy in said
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_a_failing_run_is_reported_and_the_others_go_on(tmp_path, capsys):
    path = write_grid(tmp_path, evaluate=False, analyze=False, seeds=[1])
    grid = yaml.safe_load(path.read_text())
    grid["runs"].append(
        {
            "name": "diverges",
            "preset": grid["runs"][0]["preset"],
            "set": {"train.lr_scale": 1.0e30, "train.max_nonfinite": 1},
        }
    )
    path.write_text(yaml.safe_dump(grid))
    assert main(["experiment", str(path)]) == 2
    err = capsys.readouterr().err
    assert "diverges-s1: FAILED (exit 2): wtnmt experiment: error: 1 non-finite updates" in err
    assert err.splitlines()[-1].endswith(
        "1 of 2 runs failed (diverges-s1); their logs are experiment.log in each run directory"
    )
    assert (tmp_path / "runs" / "weighted-s1" / "model.safetensors").is_file()


def test_a_file_where_a_run_directory_goes_is_refused_and_kept(tmp_path, capsys):
    path = write_grid(tmp_path)
    grid = load_grid(path)
    grid.out.mkdir()
    grid.runs[1].run_dir.write_text("a user's file")
    assert main(["experiment", str(path)]) == 2
    assert "is a file, not a run directory" in capsys.readouterr().err
    assert grid.runs[1].run_dir.read_text() == "a user's file"
    assert not grid.runs[0].run_dir.exists()  # nothing started


@pytest.mark.slow
def test_the_runner_shows_the_steps_of_the_running_runs(tmp_path):
    grid = load_grid(write_grid(tmp_path, evaluate=False, analyze=False, seeds=[1]))
    said: list[str] = []
    assert run_grid(grid, say=said.append, progress_every=0.0) == {"weighted-s1": "finished"}
    progress = [line for line in said if "waiting" in line]
    step = r"step \d+/6 \(\d+ s(, (about .+|under a minute) left)?\)"
    pattern = re.compile(rf"weighted-s1 (starting|{step}); 0 waiting")
    assert progress and all(pattern.search(line) for line in progress)


@pytest.mark.slow
def test_a_clone_of_committed_results_is_known_as_finished(tmp_path):
    # the weights and checkpoints are not committed: a fresh clone has only the small files
    path = write_grid(tmp_path, seeds=[1], analyze=False)
    assert main(["experiment", str(path)]) == 0
    grid = load_grid(path)
    run = grid.runs[0].run_dir
    marker = json.loads((run / "finished.json").read_text())
    assert marker["finished"] == "max_steps=6 reached" and marker["step"] == 6
    for name in ("checkpoints", "model.safetensors"):
        target = run / name
        subprocess.run(["rm", "-r", str(target)], check=True)
    assert plan_task(grid.runs[0], grid) is None  # done, nothing retrained
    longer = load_grid(write_grid(tmp_path, seeds=[1], analyze=False, budget={"max_steps": 9}))
    refused = "finished on another budget or stopping rule, and its checkpoints"
    with pytest.raises(ConfigError, match=refused):
        plan_task(longer.runs[0], longer)


@pytest.mark.slow
def test_a_run_recorded_before_a_key_existed_counts_it_at_its_default(tmp_path):
    # a key added to wtnmt after the run (train.branch_schedule came later) is not a difference
    path = write_grid(tmp_path, seeds=[1], evaluate=False, analyze=False)
    assert main(["experiment", str(path)]) == 0
    grid = load_grid(path)
    config = grid.runs[0].run_dir / "config.yaml"
    lines = config.read_text().splitlines(keepends=True)
    config.write_text("".join(x for x in lines if "branch_schedule" not in x))
    assert plan_task(grid.runs[0], grid) is None


@pytest.mark.slow
@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT", "SIGINT to the run"])
def test_a_signal_to_the_runner_alone_stops_its_runs_at_a_checkpoint(tmp_path, signum):
    import signal
    import time

    path = write_grid(
        tmp_path,
        seeds=[1],
        budget={"max_steps": 100_000},
        base={"train.log_every": 1, "train.valid_every": 100_000, "train.save_every": 100_000},
        evaluate=False,
        analyze=False,
    )
    # started as a shell starts a job in the background: SIGINT ignored, and inherited so
    proc = subprocess.Popen(
        [sys.executable, "-c",
         "import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
         "from wtnmt.cli import main; sys.exit(main(sys.argv[1:]))",
         "experiment", str(path)],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    run = tmp_path / "runs" / "weighted-s1"
    deadline = time.monotonic() + 120
    while not (run / "metrics.jsonl").is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    if signum == "SIGINT to the run":  # the run alone is stopped, from outside the runner
        job = subprocess.run(["pgrep", "-f", str(run)], capture_output=True, text=True)
        for pid in job.stdout.split():
            os.kill(int(pid), signal.SIGINT)
    else:
        proc.send_signal(getattr(signal, signum))
    assert proc.wait(60) == 130
    err = proc.stderr.read()
    assert "Traceback" not in err and "FAILED" not in err
    if signum == "SIGINT to the run":
        assert "weighted-s1: interrupted; run `wtnmt experiment" in err
        assert "again to resume it" in err
    else:
        assert "interrupted: run `wtnmt experiment" in err
    jobs = subprocess.run(["pgrep", "-f", str(run)], capture_output=True, text=True).stdout
    assert jobs == ""  # no run left training on its own
    assert "interrupted at step" in (run / "train.log").read_text()
    grid = load_grid(path)
    assert plan_task(grid.runs[0], grid).what == "resume"


GRIDS = sorted((Path(__file__).resolve().parent.parent / "experiments").glob("*.yaml"))


@pytest.mark.parametrize("path", GRIDS, ids=[p.name for p in GRIDS])
def test_every_committed_grid_loads(path):
    grid = load_grid(path)
    assert grid.runs and all(spec.config() for spec in grid.runs)


def _committable(root: Path, *, tracked_only: bool = False) -> list[Path]:
    """The files under experiments/ that git would commit: tracked, or new and not ignored
    (``tracked_only``: those committed)."""
    which = [] if tracked_only else ["-co", "--exclude-standard"]
    done = subprocess.run(
        ["git", "ls-files", *which, "experiments"],
        cwd=root, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:  # not a git checkout: every file there
        return [p for p in (root / "experiments").rglob("*") if p.is_file()]
    return [root / line for line in done.stdout.splitlines() if (root / line).is_file()]


def test_committed_results_stay_small():
    root = Path(__file__).resolve().parent.parent
    files = _committable(root)
    assert files, "no results found under experiments/"
    big = [f"{p.relative_to(root)} ({p.stat().st_size:,} bytes)" for p in files
           if p.stat().st_size > 1 << 20]  # fmt: skip
    assert not big, f"files over 1 MiB under experiments/: {big}"
    kinds = {p.suffix for p in files}
    assert not kinds & {".safetensors", ".pt", ".html", ".log"}, kinds


@pytest.mark.parametrize("path", GRIDS, ids=[p.name for p in GRIDS])
def test_every_committed_grid_knows_its_committed_runs_as_done(path):
    """A preset's defaults may change (the m30k presets' init did); a grid whose runs were
    trained before states what they were trained with, so that its finished runs stay done
    rather than refused as trained with other settings."""
    root = Path(__file__).resolve().parent.parent
    grid = load_grid(path)
    tracked = {p.relative_to(root) for p in _committable(root, tracked_only=True)}
    done = [s for s in grid.runs if Path(s.run_dir) / "finished.json" in tracked]
    for spec in done:
        assert plan_task(dataclasses.replace(spec, run_dir=root / spec.run_dir), grid) is None


@pytest.mark.parametrize("name", ["multi30k-en-de.yaml", "multi30k-ablations.yaml"])
def test_committed_runs_are_skipped_without_their_weights_logs_or_reports(tmp_path, name):
    """A clone holds only the small results: the runner knows each run as done and
    `analyze` draws its report again from them."""
    import shutil

    root = Path(__file__).resolve().parent.parent
    grid = load_grid(root / "experiments" / name)
    for spec in grid.runs:
        run = root / spec.run_dir
        assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())
        assert plan_task(dataclasses.replace(spec, run_dir=run), grid) is None, spec.name
    first = root / grid.runs[0].run_dir
    copy = tmp_path / first.name
    shutil.copytree(first, copy)
    assert main(["analyze", str(copy), "--out", str(tmp_path / "report"), "--no-decode"]) == 0
    assert (tmp_path / "report" / "report.html").is_file()


def test_every_committed_run_has_finished():
    """A run is committed once it has finished (its finished.json with it): the small files of
    one still training would be taken, on a fresh clone, for a run to start over into."""
    root = Path(__file__).resolve().parent.parent
    files = {p.relative_to(root) for p in _committable(root, tracked_only=True)}
    runs = {f.parent for f in files if f.name == "metrics.jsonl"}
    unfinished = sorted(str(r) for r in runs if r / "finished.json" not in files)
    assert not unfinished, f"runs committed before they finished: {unfinished}"


def test_only_runs_the_runs_named_and_the_report_waits_for_the_whole_grid(tmp_path, capsys):
    path = write_grid(tmp_path)  # seeds 1 and 2, a report
    assert main(["experiment", str(path), "--only", "*-s2"]) == 0
    err = capsys.readouterr().err
    assert "1 runs, 0 done, 1 to train" in err and "its report waits for them" in err
    assert (tmp_path / "runs" / "weighted-s2" / "finished.json").is_file()
    assert not (tmp_path / "runs" / "weighted-s1").exists()
    assert not (tmp_path / "report").exists()
    assert main(["experiment", str(path), "--only", "nothing-*"]) == 2
    assert "--only 'nothing-*': no run of" in capsys.readouterr().err
    # the last run named finishes the grid: the report is the whole grid's, not that run's
    assert main(["experiment", str(path), "--only", "*-s1"]) == 0
    analysis = json.loads((tmp_path / "report" / "analysis.json").read_text())
    assert sorted(Path(r).name for r in analysis["runs"]) == ["weighted-s1", "weighted-s2"]
