"""A grid trained in a work directory (`wtnmt experiment FILE --work-dir DIR`): checkpoints
and weights there, on a disk that outlives the work tree; each finished run's small results
copied to where the grid file puts the run, where they are committed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from test_experiment import write_grid
from wtnmt.cli import main
from wtnmt.config import ConfigError, config_to_dict, load_config
from wtnmt.experiment import in_work_dir, load_grid, plan_task
from wtnmt.experiment.pack import (
    RESULT_FILES,
    drop_finished_curve,
    keep_interrupted_curve,
    run_result_files,
)


def _files(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*") if p.is_file()}


def test_runs_train_in_the_work_dir_and_their_results_go_where_the_grid_puts_them(tmp_path, capsys):
    path = write_grid(tmp_path, seeds=[1])
    work = tmp_path / "scratch"
    assert main(["experiment", str(path), "--work-dir", str(work)]) == 0
    err = capsys.readouterr().err
    grid = load_grid(path)
    results = grid.runs[0].run_dir
    trained = work / str(grid.out).lstrip("/") / "weighted-s1"
    assert f"weighted-s1: results copied to {results} (no weights)" in err
    assert (trained / "model.safetensors").is_file() and (trained / "checkpoints").is_dir()
    copied = _files(results)
    assert set(copied) == {*RESULT_FILES, *(f"eval/{p.name}" for p in (trained / "eval").iterdir())}
    assert copied == {k: v for k, v in _files(trained).items() if k in copied}
    assert (tmp_path / "report" / "summary.md").is_file()  # the grid's report, where it says

    assert main(["experiment", str(path), "--work-dir", str(work), "--dry-run"]) == 0
    assert "1 runs, 1 done, 0 to train" in capsys.readouterr().err
    # the work directory lost (another machine): the committed results say the run is done
    shutil.rmtree(work)
    assert main(["experiment", str(path), "--work-dir", str(work)]) == 0
    assert "1 runs, 1 done, 0 to train" in capsys.readouterr().err
    assert not work.exists() and _files(results) == copied


def test_results_of_another_run_where_the_copy_goes_are_refused_and_kept(tmp_path, capsys):
    path = write_grid(tmp_path, seeds=[1], analyze=False)
    assert main(["experiment", str(path), "--work-dir", str(tmp_path / "a")]) == 0
    results = load_grid(path).runs[0].run_dir
    kept = _files(results)
    base = {"train.log_every": 2, "train.valid_every": 3, "train.lr_scale": 0.5}
    other = write_grid(tmp_path, seeds=[1], analyze=False, base=base)
    capsys.readouterr()
    assert main(["experiment", str(other), "--work-dir", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"{results}: holds the results of a run with other settings" in err
    assert "train.lr_scale" in err
    assert _files(results) == kept and not (tmp_path / "b").exists()


def test_a_run_trained_where_the_copy_goes_is_refused(tmp_path, capsys):
    path = write_grid(tmp_path, seeds=[1], analyze=False, evaluate=False)
    assert main(["experiment", str(path)]) == 0  # trained in place, its checkpoints there
    capsys.readouterr()
    assert main(["experiment", str(path), "--work-dir", str(tmp_path / "scratch")]) == 2
    assert "holds the checkpoints of a run trained there" in capsys.readouterr().err


def test_a_foreign_file_in_the_results_directory_is_refused_and_kept(tmp_path):
    grid = in_work_dir(load_grid(write_grid(tmp_path, seeds=[1])), tmp_path / "scratch")
    spec = grid.runs[0]
    spec.results_dir.mkdir(parents=True)
    (spec.results_dir / "config.yaml").write_text("a user's notes\n")
    with pytest.raises(ConfigError, match="not written by wtnmt"):
        plan_task(spec, grid)
    assert (spec.results_dir / "config.yaml").read_text() == "a user's notes\n"


def test_a_work_dir_that_is_a_file_is_refused(tmp_path, capsys):
    path = write_grid(tmp_path, seeds=[1])
    (tmp_path / "scratch").write_text("x")
    assert main(["experiment", str(path), "--work-dir", str(tmp_path / "scratch")]) == 2
    assert "--work-dir" in capsys.readouterr().err and (tmp_path / "scratch").read_text() == "x"


def test_grids_with_other_outs_never_share_a_run_directory(tmp_path):
    first = load_grid(write_grid(tmp_path, seeds=[1], out="a/runs"))
    second = load_grid(write_grid(tmp_path, seeds=[1], out="b/runs"))
    work = tmp_path / "scratch"
    one, two = (in_work_dir(g, work).runs[0] for g in (first, second))
    assert one.run_dir == work / "a/runs/weighted-s1" and one.results_dir == Path(
        "a/runs/weighted-s1"
    )
    assert two.run_dir == work / "b/runs/weighted-s1"


def test_a_pack_names_the_files_where_the_grid_puts_them_and_lost_copies_come_back(
    tmp_path, monkeypatch, capsys
):
    import tarfile

    monkeypatch.chdir(tmp_path)
    path = write_grid(Path("."), seeds=[1], analyze=False, evaluate=False)
    work = tmp_path / "scratch"
    assert main(["experiment", str(path), "--work-dir", str(work), "--pack", "out"]) == 0
    with tarfile.open(next(Path("out").glob("results-*.tar.gz"))) as tar:
        names = sorted(tar.getnames())
    spec = in_work_dir(load_grid(path), work).runs[0]
    assert names == sorted(str(p) for p in run_result_files(spec.results_dir))  # runs/...
    # the copies lost (the runner stopped between finishing and copying, say): the next
    # call copies them again
    shutil.rmtree(spec.results_dir)
    capsys.readouterr()
    assert main(["experiment", str(path), "--work-dir", str(work)]) == 0
    assert "results copied to" in capsys.readouterr().err
    assert [p.name for p in run_result_files(spec.results_dir)] == [
        p.name for p in run_result_files(spec.run_dir)
    ]


def test_a_run_the_cap_stopped_goes_on_under_a_grid_with_a_larger_cap(tmp_path, capsys):
    """How a run stopped at its grid's cap still improving goes on to patience: its work
    directory copied under a grid that asks the same with a larger cap resumes it from its
    last checkpoint; it ends as the run trained straight to the larger cap, and its results
    (finished.json, scores.json) say the new end, not the cap's."""
    import json

    from safetensors.torch import load_file

    from wtnmt.train import Trainer

    capped = write_grid(tmp_path, seeds=[1], analyze=False, out=str(tmp_path / "capped"))
    work = tmp_path / "scratch"
    assert main(["experiment", str(capped), "--work-dir", str(work)]) == 0
    first = in_work_dir(load_grid(capped), work).runs[0]
    assert json.loads((first.results_dir / "finished.json").read_text())["step"] == 6
    uncapped = write_grid(
        tmp_path, seeds=[1], analyze=False, out=str(tmp_path / "uncapped"),
        budget={"max_steps": 9},
    )  # fmt: skip
    spec = in_work_dir(load_grid(uncapped), work).runs[0]
    shutil.copytree(first.run_dir, spec.run_dir)  # cp -a, as the grid file's comment says
    assert main(["experiment", str(uncapped), "--work-dir", str(work), "--dry-run"]) == 0
    assert "1 to resume" in capsys.readouterr().err
    assert main(["experiment", str(uncapped), "--work-dir", str(work)]) == 0
    finished = json.loads((spec.results_dir / "finished.json").read_text())
    assert finished["step"] == 9 and finished["finished"] == "max_steps=9 reached"
    scores = json.loads((spec.results_dir / "scores.json").read_text())
    assert scores["steps"] == 9  # scored again, on the weights it ended with
    straight = tmp_path / "straight"
    Trainer(spec.config(), straight, log_to_stderr=False).run()
    a, b = (load_file(run / "model.safetensors") for run in (straight, spec.run_dir))
    assert a.keys() == b.keys() and all(a[k].equal(b[k]) for k in a)
    # the capped grid's copy is as it was
    assert json.loads((first.results_dir / "finished.json").read_text())["step"] == 6


def test_a_stopped_runs_curve_is_kept_beside_the_results_and_other_tries_are_left(tmp_path):
    """A work directory can be lost with its machine: a run stopped before it finished leaves
    its config and curve in the grid's interrupted/, as <run>.tryN.*; a later stop of the same
    attempt updates its copy, a new attempt takes the next N, nothing else there changes."""
    grid = in_work_dir(load_grid(write_grid(tmp_path, seeds=[1])), tmp_path / "scratch")
    spec = grid.runs[0]
    assert keep_interrupted_curve(spec) is None  # nothing trained yet
    spec.run_dir.mkdir(parents=True)
    (spec.run_dir / "config.yaml").write_text("seed: 1\n")
    metrics = spec.run_dir / "metrics.jsonl"
    metrics.write_text('{"step": 2}\n')
    where = spec.results_dir.parent / "interrupted"
    where.mkdir(parents=True)
    theirs = '{"step": 2}\n{"step": 4, "a lost attempt": 1}\n'
    (where / "weighted-s1.try1.config.yaml").write_text("seed: 1\n")
    (where / "weighted-s1.try1.metrics.jsonl").write_text(theirs)
    (where / "weighted-s10.try7.metrics.jsonl").write_text("another run's\n")

    config, kept = keep_interrupted_curve(spec)
    assert (config, kept) == tuple(
        where / f"weighted-s1.try2.{f}" for f in ("config.yaml", "metrics.jsonl")
    )
    assert kept.read_text() == '{"step": 2}\n'
    assert config.read_text() == "seed: 1\n"
    metrics.write_text('{"step": 2}\n{"step": 4}\n')  # resumed, stopped again
    assert keep_interrupted_curve(spec) == (config, kept)
    assert kept.read_text() == metrics.read_text()
    metrics.write_text('{"step": 2, "from the start": 1}\n')  # its work directory lost
    assert keep_interrupted_curve(spec)[1] == where / "weighted-s1.try3.metrics.jsonl"
    assert kept.read_text() == '{"step": 2}\n{"step": 4}\n'
    assert (where / "weighted-s1.try1.metrics.jsonl").read_text() == theirs
    assert (where / "weighted-s10.try7.metrics.jsonl").read_text() == "another run's\n"

    (spec.run_dir / "finished.json").write_text("{}")  # past training: scored, not stopped
    assert keep_interrupted_curve(spec) is None
    in_place = load_grid(write_grid(tmp_path, seeds=[1])).runs[0]  # its curve is there
    assert keep_interrupted_curve(in_place) is None
    assert sorted(p.name for p in where.iterdir()) == [
        *(f"weighted-s1.try{n}.{f}" for n in (1, 2, 3) for f in ("config.yaml", "metrics.jsonl")),
        "weighted-s10.try7.metrics.jsonl",
    ]


def test_a_pack_gives_a_stopped_run_as_its_curve_in_interrupted(tmp_path, monkeypatch):
    """`tar xzf` of a pack must not leave a run directory without its checkpoints where the
    grid puts the run: a run stopped before it finished comes back as its curve."""
    import tarfile

    from wtnmt.experiment.pack import pack_results

    monkeypatch.chdir(tmp_path)
    grid = in_work_dir(load_grid(write_grid(Path("."), seeds=[1, 2])), tmp_path / "scratch")
    stopped, finished = grid.runs
    for spec in grid.runs:
        spec.run_dir.mkdir(parents=True)
        (spec.run_dir / "config.yaml").write_text(f"{spec.name}\n")
        (spec.run_dir / "metrics.jsonl").write_text('{"step": 2}\n')
    (finished.run_dir / "finished.json").write_text("{}")
    pack_results(grid, Path("out"), max_bytes=60_000, max_files=8)
    with tarfile.open(next(Path("out").glob("results-*.tar.gz"))) as tar:
        packed = {name: tar.extractfile(name).read() for name in tar.getnames()}  # type: ignore[union-attr]
    assert packed == {
        "runs/interrupted/weighted-s1.try1.config.yaml": b"weighted-s1\n",
        "runs/interrupted/weighted-s1.try1.metrics.jsonl": b'{"step": 2}\n',
        "runs/weighted-s2/config.yaml": b"weighted-s2\n",
        "runs/weighted-s2/finished.json": b"{}",
        "runs/weighted-s2/metrics.jsonl": b'{"step": 2}\n',
    }
    assert not stopped.results_dir.exists()


def test_the_runner_keeps_the_curve_of_a_run_it_stops(tmp_path):
    """Ctrl-C, then --stop-after on the resumed run: one try, brought up to date."""
    from wtnmt.experiment import run_grid

    path = write_grid(tmp_path, seeds=[1], analyze=False, budget={"max_steps": 10**6})
    grid = in_work_dir(load_grid(path), tmp_path / "scratch")
    spec = grid.runs[0]
    metrics = spec.run_dir / "metrics.jsonl"
    said: list[str] = []

    def say(line: str) -> None:  # Ctrl-C once the run has logged two rows, then listen
        said.append(line)
        if "interrupted" not in "".join(said) and metrics.is_file():
            if metrics.read_text().count("\n") >= 2:
                said.append("interrupted here")
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_grid(grid, say=say, progress_every=0.2)
    kept = spec.results_dir.parent / "interrupted" / "weighted-s1.try1.metrics.jsonl"
    assert any(f"weighted-s1: its curve so far kept as {kept}" in line for line in said), said
    first = kept.read_bytes()
    assert first == metrics.read_bytes() and first.count(b"\n") >= 2

    assert run_grid(grid, say=said.append, stop_after=3) == {"weighted-s1": "paused"}
    assert kept.read_bytes() == metrics.read_bytes() and kept.read_bytes().startswith(first)
    assert sorted(p.name for p in kept.parent.iterdir()) == [
        "weighted-s1.try1.config.yaml",
        "weighted-s1.try1.metrics.jsonl",
    ]
    # the work directory lost with its machine: the run starts over, and the plan says so and
    # where the earlier try's curve stays
    step = json.loads(kept.read_text().splitlines()[-1])["step"]
    shutil.rmtree(tmp_path / "scratch")
    said.clear()
    assert run_grid(grid, say=said.append, dry_run=True) == {"weighted-s1": "train"}
    assert (
        f"  weighted-s1: train from its first update: no checkpoint in {spec.run_dir}; the "
        f"curves of its earlier tries stay in {kept.parent}: weighted-s1.try1.metrics.jsonl "
        f"(to step {step:,})"
    ) in said, said


def test_a_resumed_run_whose_config_gained_a_key_updates_its_try(tmp_path):
    # a resumed run writes its config.yaml with every key of the day: a key added to wtnmt
    # since the last stop (at its default) is the same attempt, not a new try
    grid = in_work_dir(load_grid(write_grid(tmp_path, seeds=[1])), tmp_path / "scratch")
    spec = grid.runs[0]
    spec.run_dir.mkdir(parents=True)
    values = config_to_dict(load_config("weighted-tiny"))
    now = yaml.safe_dump(values)
    del values["train"]["compile"]
    then = yaml.safe_dump(values)
    (spec.run_dir / "config.yaml").write_text(now)
    (spec.run_dir / "metrics.jsonl").write_text('{"step": 2}\n{"step": 4}\n')
    where = spec.results_dir.parent / "interrupted"
    where.mkdir(parents=True)
    (where / "weighted-s1.try1.config.yaml").write_text(then)
    (where / "weighted-s1.try1.metrics.jsonl").write_text('{"step": 2}\n')
    config, kept = keep_interrupted_curve(spec)
    assert kept == where / "weighted-s1.try1.metrics.jsonl"
    assert kept.read_text() == '{"step": 2}\n{"step": 4}\n' and config.read_text() == now
    values["train"]["max_steps"] = 10**6  # a larger budget: the runner resumes the run
    (where / "weighted-s1.try1.config.yaml").write_text(yaml.safe_dump(values))
    assert keep_interrupted_curve(spec)[1] == kept
    values["train"]["seed"] = 99  # another setting is another attempt
    (where / "weighted-s1.try1.config.yaml").write_text(yaml.safe_dump(values))
    assert keep_interrupted_curve(spec)[1] == where / "weighted-s1.try2.metrics.jsonl"


def test_a_finished_runs_kept_curve_goes_once_its_results_hold_it_and_other_tries_stay(tmp_path):
    """The curve a stop kept in interrupted/ is the start of the finished run's, copied with its
    results: that try goes, a try of another attempt (a lost work directory) stays."""
    from wtnmt.experiment.runner import copy_finished_results

    grid = in_work_dir(load_grid(write_grid(tmp_path, seeds=[1])), tmp_path / "scratch")
    spec = grid.runs[0]
    spec.run_dir.mkdir(parents=True)
    (spec.run_dir / "config.yaml").write_text("seed: 1\n")
    metrics = spec.run_dir / "metrics.jsonl"
    metrics.write_text('{"step": 2, "a lost attempt": 1}\n')
    lost = keep_interrupted_curve(spec)
    metrics.write_text('{"step": 2}\n')  # started again, stopped
    kept = keep_interrupted_curve(spec)
    assert kept != lost
    metrics.write_text('{"step": 2}\n{"step": 4}\n')  # resumed, not yet copied
    (spec.run_dir / "finished.json").write_text("{}")
    assert drop_finished_curve(spec) is None and kept[1].is_file()

    said: list[str] = []
    copy_finished_results(spec, said.append)
    assert (spec.results_dir / "metrics.jsonl").read_bytes() == metrics.read_bytes()
    assert not kept[0].exists() and not kept[1].exists()
    assert any(f"{kept[1]} removed" in line for line in said), said
    assert lost[1].read_text() == '{"step": 2, "a lost attempt": 1}\n' and lost[0].is_file()
    said.clear()
    copy_finished_results(spec, said.append)  # the next call: nothing to copy or remove
    assert said == [] and lost[1].is_file()
