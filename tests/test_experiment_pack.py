"""A grid worked in time-boxed calls (`--stop-after`) and its results carried off in archives
of bounded size (`--pack`): the planning and the packing, on the CPU with tiny runs."""

from __future__ import annotations

import dataclasses
import json
import os
import tarfile
from pathlib import Path

import pytest

from test_experiment import write_grid
from wtnmt.cli import main
from wtnmt.config import ConfigError
from wtnmt.experiment import load_grid
from wtnmt.experiment.pack import RESULT_FILES, pack_results, plan_archives, result_files


def fake_results(tmp: Path, sizes: dict[str, int]) -> Path:
    """A grid whose runs have small results on disk (``sizes``: bytes of each run's one
    incompressible decoding), and weights that must stay behind."""
    path = write_grid(tmp, runs=[{"name": "w", "preset": "weighted-tiny"}], seeds=[1, 2, 3])
    for spec, size in zip(load_grid(path).runs, sizes.values(), strict=True):
        (spec.run_dir / "eval").mkdir(parents=True)
        for name in RESULT_FILES:
            (spec.run_dir / name).write_text(json.dumps({"run": spec.name}))
        (spec.run_dir / "eval" / "test.beam5.hyp").write_bytes(os.urandom(size))
        (spec.run_dir / "model.safetensors").write_bytes(b"weights")
        (spec.run_dir / "checkpoints").mkdir()
    return path


def unpack(archives: list[Path], into: Path) -> dict[str, bytes]:
    files = {}
    for archive in archives:
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                data = tar.extractfile(member).read()  # type: ignore[union-attr]
                files[member.name] = data
    return files


def test_results_are_packed_whole_within_the_size_and_count_asked(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = fake_results(Path("."), {"s1": 40_000, "s2": 40_000, "s3": 30_000})
    grid = load_grid(path)
    files = result_files(grid)
    assert len(files) == 3 * (len(RESULT_FILES) + 1)  # and the one decoding in eval/
    assert not any("safetensors" in f.name for f in files)
    archives = pack_results(grid, Path("out"), max_bytes=60_000, max_files=8)
    assert len(archives) == 3  # 40 kB of noise each, two never fit one archive of 60 kB
    assert all(a.stat().st_size <= 60_000 for a in archives)
    packed = unpack(archives, tmp_path)
    assert packed == {os.path.relpath(f): f.read_bytes() for f in files}  # paths as the grid's
    # again into the same directory: the earlier archives are replaced, not added to
    again = pack_results(grid, Path("out"), max_bytes=200_000, max_files=8)
    assert (
        [a.name for a in Path("out").iterdir()] == ["results-01.tar.gz"] == [a.name for a in again]
    )


def test_what_cannot_fit_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    grid = load_grid(fake_results(Path("."), {"s1": 40_000, "s2": 40_000, "s3": 30_000}))
    with pytest.raises(
        ConfigError, match="need 3 archives of 60,000 bytes, more than --pack-files 2"
    ):
        pack_results(grid, Path("out"), max_bytes=60_000, max_files=2)
    with pytest.raises(
        ConfigError, match=r"test.beam5.hyp compresses to 4\d,\d{3} bytes, over the"
    ):
        plan_archives(result_files(grid), max_bytes=30_000, max_files=8)
    assert not Path("out").exists()
    Path("mine").mkdir()
    (Path("mine") / "notes.txt").write_text("the user's")
    with pytest.raises(ConfigError, match=r"holds 'notes\.txt', not an archive of ours"):
        pack_results(grid, Path("mine"), max_bytes=60_000, max_files=8)
    assert (Path("mine") / "notes.txt").read_text() == "the user's"


@pytest.mark.slow
def test_time_boxed_calls_pause_resume_finish_and_pack(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # a budget no call reaches, and time for the run to start and log steps on a busy machine
    path = write_grid(Path("."), budget={"max_steps": 10**6}, seeds=[1], analyze=False)
    assert main(["experiment", str(path), "--stop-after", "30", "--pack", "out"]) == 0
    err = capsys.readouterr().err
    assert "stopped as asked (--stop-after): 1 run(s) paused at a checkpoint" in err
    assert "packed the results of" in err
    run = load_grid(path).runs[0].run_dir
    assert not (run / "finished.json").exists()
    packed = unpack(sorted(Path("out").glob("results-*.tar.gz")), tmp_path)
    assert os.path.relpath(run / "metrics.jsonl") in packed
    assert main(["experiment", str(path), "--dry-run"]) == 0
    assert "0 to train, 1 to resume" in capsys.readouterr().err
    # a budget it has passed: resumed, it stops at once, and is scored
    write_grid(Path("."), budget={"max_steps": 6}, seeds=[1], analyze=False)
    assert main(["experiment", str(path), "--pack", "out"]) == 0
    assert "resumed from step_" in (run / "train.log").read_text()
    packed = unpack(sorted(Path("out").glob("results-*.tar.gz")), tmp_path)
    for name in ("finished.json", "scores.json"):
        assert packed[os.path.relpath(run / name)] == (run / name).read_bytes()
    assert main(["experiment", str(path), "--stop-after", "0"]) == 2
    assert "--stop-after 0: must be a number of seconds above 0" in capsys.readouterr().err


def test_a_run_scoring_when_the_time_is_up_is_left_to_finish(tmp_path):
    """Its weights may not outlast the call (a GPU lent by the call): a run past training,
    scoring them, is not stopped by --stop-after; one still training (or starting) is."""
    from wtnmt.experiment import plan_task, run_grid
    from wtnmt.train import Trainer

    grid = load_grid(write_grid(tmp_path, analyze=False))
    trained, training = grid.runs
    # a budget the other cannot reach: with the grid's 6 updates, a fast machine finished
    # training it within the second before the stop, which then came while it scored
    training = dataclasses.replace(
        training, overrides=(*training.overrides, "train.max_steps=1000000")
    )
    grid = dataclasses.replace(grid, runs=(trained, training))
    Trainer(trained.config(), trained.run_dir, log_to_stderr=False).run()
    assert plan_task(trained, grid).what == "score"
    said: list[str] = []
    assert run_grid(grid, say=said.append, stop_after=0.5) == {
        "weighted-s1": "finished",
        "weighted-s2": "paused",
    }
    assert any("left to finish scoring: weighted-s1" in line for line in said), said
    assert (trained.run_dir / "scores.json").is_file() and plan_task(trained, grid) is None
    assert not (training.run_dir / "finished.json").exists()


def test_a_run_is_scoring_once_it_has_written_finished_json_since_its_launch(tmp_path):
    import time

    from wtnmt.experiment.plan import Task
    from wtnmt.experiment.runner import _scoring

    spec = load_grid(write_grid(tmp_path)).runs[0]
    spec.run_dir.mkdir(parents=True)
    marker = spec.run_dir / "finished.json"
    marker.write_text("{}")  # an earlier finish, on another budget: resumed, training again
    os.utime(marker, (time.time() - 60, time.time() - 60))
    resume = Task(spec, train=True, resume=True, evaluate=True)
    launched = time.time()
    assert not _scoring(resume, launched)
    marker.write_text("{}")  # written by this process: its training is over
    assert _scoring(resume, launched)
    assert _scoring(Task(spec, train=False, resume=False, evaluate=True), launched)


def test_a_pack_that_fails_midway_leaves_the_earlier_pack_whole(tmp_path, monkeypatch):
    """A full disk while the second archive is written: the earlier complete pack is there
    byte for byte, and nothing half-written stands under an archive's name."""
    import errno

    from wtnmt.experiment import pack

    monkeypatch.chdir(tmp_path)
    grid = load_grid(fake_results(Path("."), {"s1": 40_000, "s2": 40_000, "s3": 30_000}))
    before = pack_results(grid, Path("out"), max_bytes=200_000, max_files=8)
    earlier = {a.name: a.read_bytes() for a in before}
    for spec in grid.runs:  # the runs went on: their curves grew
        with (spec.run_dir / "metrics.jsonl").open("a") as f:
            f.write('{"step": 7}\n')
    written = pack.atomic_write

    def full_disk(path: Path, data: bytes) -> None:
        if path.name.startswith(".results-02"):
            path.write_bytes(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        written(path, data)

    monkeypatch.setattr(pack, "atomic_write", full_disk)
    with pytest.raises(ConfigError) as refused:  # the file, and that nothing was lost
        pack_results(grid, Path("out"), max_bytes=60_000, max_files=8)
    said = str(refused.value)
    assert "writing results-02.tar.gz failed (No space left on device)" in said
    assert "the runs, their results and any earlier pack there are kept" in said
    assert {a.name: a.read_bytes() for a in Path("out").iterdir()} == earlier
    monkeypatch.setattr(pack, "atomic_write", written)
    again = pack_results(grid, Path("out"), max_bytes=60_000, max_files=8)  # room again
    assert sorted(a.name for a in Path("out").iterdir()) == [a.name for a in again]
    assert len(again) == 3


def test_unpack_never_cuts_a_longer_file_and_refuses_a_damaged_archive(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    grid = load_grid(fake_results(Path("."), {"s1": 40_000, "s2": 40_000, "s3": 30_000}))
    old = pack_results(grid, Path("old"), max_bytes=200_000, max_files=8)
    curve = grid.runs[0].run_dir / "metrics.jsonl"
    with curve.open("a") as f:  # the run went on after the old pack
        f.write('{"step": 7}\n')
    grown = curve.read_bytes()
    new = pack_results(grid, Path("new"), max_bytes=60_000, max_files=8)
    assert len(new) == 3
    # a copy cut short: refused whole, nothing written, whatever the other archives hold
    damaged = Path("damaged")
    damaged.mkdir()
    for archive in new:
        (damaged / archive.name).write_bytes(archive.read_bytes())
    cut = damaged / "results-02.tar.gz"
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    target = Path("elsewhere")
    target.mkdir()
    capsys.readouterr()
    assert main(["unpack", str(damaged), "--into", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "results-02.tar.gz: damaged or cut short" in err
    assert not any(target.iterdir())
    # the older pack over the newer files: the grown curve is kept, and that is said
    assert main(["unpack", str(old[0])]) == 0
    out = capsys.readouterr()
    assert curve.read_bytes() == grown
    assert f"kept {curve}" in out.err and "1 kept as they were" in out.out
    # into an empty place, then the newer pack over the older: every file as packed last
    assert main(["unpack", "old", "--into", str(target)]) == 0
    assert main(["unpack", "new", "--into", str(target)]) == 0
    assert (target / curve).read_bytes() == grown
    assert unpack(new, tmp_path) == {
        str(p.relative_to(target)): p.read_bytes() for p in target.rglob("*") if p.is_file()
    }


def test_pack_problems_are_refused_before_anything_trains(tmp_path, capsys):
    path = write_grid(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    capsys.readouterr()
    assert main(["experiment", str(path), "--pack", str(mine)]) == 2
    assert "holds 'notes.txt', not an archive of ours" in capsys.readouterr().err
    assert (mine / "notes.txt").read_text() == "the user's"
    assert (
        main(["experiment", str(path), "--pack", str(tmp_path / "p"), "--pack-size", "1500"]) == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.yaml compresses to" in err and "--pack-size" in err
    assert not (tmp_path / "runs").exists()  # nothing trained, nothing made
    for bad in ("nan", "inf", "0"):
        assert main(["experiment", str(path), "--stop-after", bad]) == 2
        assert "must be a number of seconds above 0" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
