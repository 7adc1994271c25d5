"""The run directory: a resume checked before anything changes, one writer, checked weights,
and every damaged or mismatched file answered in one line."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers import tiny_run_config
from wtnmt import Translator
from wtnmt.cli import main as cli
from wtnmt.errors import CheckpointError, TrainingError
from wtnmt.rundir import RunDirectory, latest_checkpoint, load_run
from wtnmt.train import Trainer

QUIET = {"log_to_stderr": False}
STEPS = {"max_steps": 4, "save_every": 2, "valid_every": 2}


def snapshot(run: Path) -> dict[str, bytes]:
    """Every file of a run but the append-only log and the lock."""
    return {
        str(p.relative_to(run)): p.read_bytes()
        for p in run.rglob("*")
        if p.is_file() and p.name not in ("train.log", ".lock")
    }


@pytest.fixture()
def trained(tmp_path) -> Path:
    Trainer(tiny_run_config(tmp_path, train=STEPS), tmp_path / "run", **QUIET).run()
    return tmp_path / "run"


@pytest.mark.parametrize(
    ("section", "change", "named"),
    [
        ("model", {"d_model": 64}, "model.d_model 32 → 64"),  # defect 3: config.yaml rewritten
        ("data", {"vocab_size": 50}, "data.vocab_size 60 → 50"),  # defect 2: new vocabulary
    ],
)
def test_a_resume_with_another_model_or_data_is_refused_and_changes_nothing(
    trained, tmp_path, section, change, named
):
    before, prepared = snapshot(trained), snapshot(tmp_path / "prepared")
    config = tiny_run_config(tmp_path, train=STEPS, **{section: change})
    with pytest.raises(TrainingError, match="was trained with other settings: " + named):
        Trainer(config, trained, resume=True, **QUIET)
    assert snapshot(trained) == before  # config.yaml, spm.model, weights, checkpoints
    assert snapshot(tmp_path / "prepared") == prepared  # refused before preparing anything
    assert Translator.load(trained).translate(["alpha beta"])  # the run still loads


def test_a_resume_on_a_vocabulary_rebuilt_from_changed_files_is_refused(trained, tmp_path):
    before = snapshot(trained)
    config = tiny_run_config(tmp_path, train=STEPS)  # (writes the corpus files anew)
    with open(tmp_path / "train.src", "a", encoding="utf-8") as f:
        f.write("alpha qqq beta\n" * 30)
    with open(tmp_path / "train.tgt", "a", encoding="utf-8") as f:
        f.write("AHPLA QQQ ATEB\n" * 30)
    with pytest.raises(TrainingError, match=r"is not the one .* was trained with"):
        Trainer(config, trained, resume=True, **QUIET)
    assert snapshot(trained) == before


def test_a_resume_with_other_training_settings_goes_on(trained, tmp_path):
    config = tiny_run_config(tmp_path, train={**STEPS, "max_steps": 6, "lr_scale": 0.5})
    assert Trainer(config, trained, resume=True, **QUIET).run().step == 6
    assert yaml.safe_load((trained / "config.yaml").read_text())["train"]["max_steps"] == 6


LOCKER = """
import sys, time
from wtnmt.rundir import RunDirectory
RunDirectory(sys.argv[1]).lock()
print("locked", flush=True)
time.sleep(60)
"""


def test_a_second_process_writing_the_same_run_is_refused(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(run)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(TrainingError, match=rf"another process \(pid {holder.pid}\) is"):
            Trainer(tiny_run_config(tmp_path, train=STEPS), run, **QUIET)
    finally:
        holder.kill()
        holder.wait()
    Trainer(tiny_run_config(tmp_path, train=STEPS), run, **QUIET).run()  # free again


def test_a_full_disk_keeps_the_last_checkpoint_and_stops_with_the_reason(tmp_path, monkeypatch):
    trainer = Trainer(tiny_run_config(tmp_path, train=STEPS), tmp_path / "run", **QUIET)
    real_fsync = os.fsync

    def full(fd: int) -> None:  # the disk fills up while checkpoint 4 is written
        if trainer.state.step == 4:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(TrainingError) as stopped:
        trainer.run()
    assert str(stopped.value) == (
        f"cannot write the checkpoint of step 4 in {tmp_path / 'run' / 'checkpoints'}: "
        f"No space left on device; step_0000002.state.pt is intact"
    )
    _, state = latest_checkpoint(tmp_path / "run" / "checkpoints")
    assert state["step"] == 2
    assert not [p for p in (tmp_path / "run" / "checkpoints").iterdir() if p.suffix == ".tmp"]


# ------------------------------------------------------------------------------------------
# Loading a run for decoding: one line for every damaged or mismatched file


def _translate(run: Path, capsys) -> tuple[int, str]:  # type: ignore[no-untyped-def]
    code = cli(["translate", str(run), "-i", os.devnull])
    return code, capsys.readouterr().err


def test_a_damaged_vocabulary_is_one_line(trained, capsys):
    (trained / "spm.model").write_bytes(b"this is no sentencepiece model")
    code, err = _translate(trained, capsys)
    assert code == 2 and err.count("\n") == 1
    assert f"{trained / 'spm.model'}: the vocabulary is damaged" in err  # by its checksum
    (trained / "spm.model.sha256").unlink()  # a run from before the checksum
    code, err = _translate(trained, capsys)
    assert code == 2 and err.count("\n") == 1
    assert f"{trained / 'spm.model'}: not a readable sentencepiece model" in err


def test_a_config_that_does_not_fit_the_weights_is_one_line(trained, capsys):
    config = yaml.safe_load((trained / "config.yaml").read_text())
    config["model"]["d_ff"] = 128
    (trained / "config.yaml").write_text(yaml.safe_dump(config))
    code, err = _translate(trained, capsys)
    assert code == 2 and err.count("\n") == 1
    assert "there but" in err and "in the model its config describes" in err


def test_a_damaged_tensor_payload_is_found_on_load(trained, capsys):
    data = bytearray((trained / "model.safetensors").read_bytes())
    data[-100] ^= 0xFF  # one byte of a tensor, the header intact
    (trained / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="the weights are damaged"):
        load_run(trained)
    code, err = _translate(trained, capsys)
    assert code == 2 and "the weights are damaged" in err and err.count("\n") == 1


def test_the_lock_is_let_go_when_training_ends(trained, tmp_path):
    rundir = RunDirectory(trained)  # another object, as another process would
    start = time.monotonic()
    rundir.lock()
    rundir.unlock()
    assert time.monotonic() - start < 1


def test_taking_the_lock_clears_only_the_debris_of_a_killed_writer(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    debris = [run / ".config.yaml.x1y2.tmp", run / "checkpoints" / ".step_0000003.state.pt.ab.tmp"]
    mine = [run / ".notes.tmp", run / "draft.tmp", run / "checkpoints" / "keep.tmp"]
    for path in debris + mine:
        path.write_text("x")
    rundir = RunDirectory(run)
    rundir.lock()
    rundir.unlock()
    assert not any(p.exists() for p in debris)
    assert all(p.exists() for p in mine)  # a user's files in the same directory stay


@pytest.mark.parametrize("name", ["config.yaml", "spm.model", "model.safetensors"])
def test_a_new_run_never_overwrites_run_files_it_did_not_write(tmp_path, name):
    run = tmp_path / "mine"
    run.mkdir()
    (run / name).write_text("the user's own file\n")
    with pytest.raises(TrainingError, match=rf"{name}: wtnmt did not write this file"):
        Trainer(tiny_run_config(tmp_path, train=STEPS), run, **QUIET)
    assert (run / name).read_text() == "the user's own file\n"


def test_a_new_run_may_go_where_a_killed_one_left_no_checkpoint(tmp_path):
    config = tiny_run_config(tmp_path, train=STEPS)
    Trainer(config, tmp_path / "run", **QUIET)  # wrote config.yaml and spm.model, then "died"
    assert (tmp_path / "run" / "config.yaml").read_text().startswith("# written by wtnmt")
    assert Trainer(config, tmp_path / "run", **QUIET).run().step == 4
