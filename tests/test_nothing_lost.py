"""Nothing a user has is lost or silently replaced: outputs that are inputs, runs inside
prepared data, reports over a user's files, new runs over finished models, rebuilt
vocabularies that are the same, and the one-line answers to outputs that fail."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import tiny_run_config, train_tiny
from wtnmt.cli import main as cli
from wtnmt.data import prepare
from wtnmt.data.vocab import vocabulary_sha256
from wtnmt.errors import TrainingError
from wtnmt.safe_files import atomic_write, output_file
from wtnmt.train import Trainer

QUIET = {"log_to_stderr": False}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return train_tiny(tmp_path_factory.mktemp("lost"))


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


# -------------------------------------------------------------------------------- translate


def test_translate_refuses_an_output_that_is_its_input(run_dir, tmp_path, capsys):
    text = "alpha beta\ngamma\n"
    (tmp_path / "in.txt").write_text(text)
    os.link(tmp_path / "in.txt", tmp_path / "link.txt")  # the same file under another name
    for output in ("in.txt", "./in.txt", "link.txt"):
        args = ["translate", str(run_dir), "-i", str(tmp_path / "in.txt")]
        assert cli([*args, "-o", str(tmp_path / output)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is the input file -i" in err
        assert (tmp_path / "in.txt").read_text() == text


def test_a_failed_translate_leaves_the_old_output_file(run_dir, tmp_path, capsys):
    (tmp_path / "out.txt").write_text("yesterday's translations\n")
    (tmp_path / "bad.txt").write_bytes(b"alpha\n\xff\xfe beta\n")  # not UTF-8: refused
    args = ["translate", str(run_dir), "-i", str(tmp_path / "bad.txt")]
    assert cli([*args, "-o", str(tmp_path / "out.txt")]) == 2
    assert "UTF-8" in capsys.readouterr().err
    assert (tmp_path / "out.txt").read_text() == "yesterday's translations\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt", "out.txt"]  # no debris


def test_outputs_and_atomic_files_get_the_umask_mode(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write(tmp_path / "a.json", b"{}")
        with output_file(tmp_path / "b.txt") as f:
            f.write("x\n")
    finally:
        os.umask(old)
    for name in ("a.json", "b.txt"):  # 0644, as open() gives: another account can read it
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644


def _translate(run_dir: Path, *args: str, stdin: str = "alpha beta\n" * 200, **kw):
    return subprocess.run(
        [sys.executable, "-m", "wtnmt.cli", "translate", str(run_dir), *args],
        input=stdin,
        capture_output=True,
        text=True,
        **kw,
    )


@pytest.mark.slow
def test_translate_to_a_full_device_is_one_line(run_dir):
    if not Path("/dev/full").exists():
        pytest.skip("this system has no /dev/full")
    done = _translate(run_dir, "-o", "/dev/full")
    assert done.returncode == 2
    assert done.stderr == "wtnmt translate: error: /dev/full: No space left on device\n"


@pytest.mark.slow
def test_translate_into_a_closed_pipe_is_one_line(run_dir):
    # `wtnmt translate RUN | head -1`: the reader leaves after one line
    code = (
        "import subprocess, sys\n"
        f"p = subprocess.Popen([sys.executable, '-m', 'wtnmt.cli', 'translate', {str(run_dir)!r},"
        " '--chunk', '8'],"
        " stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)\n"
        "p.stdin.write(b'alpha beta\\n' * 3000); p.stdin.close()\n"
        "p.stdout.readline(); p.stdout.close()\n"
        "sys.stderr.write(p.stderr.read().decode()); sys.exit(p.wait())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "wtnmt translate: error: the output was closed before it was all written\n"
    )


# --------------------------------------------------------------------- runs and prepared data


def test_a_run_inside_prepared_data_is_refused(tmp_path):
    config = tiny_run_config(tmp_path, train={"max_steps": 2})
    prepared = config.data.prepared_path()
    prepare(config.data, prepared, log=lambda _: None)
    before = _snapshot(prepared)
    for out in (prepared / "run", prepared / "a" / "b"):
        with pytest.raises(TrainingError, match="is inside the prepared-data directory"):
            Trainer(config, out, **QUIET)
    assert _snapshot(prepared) == before and not (prepared / "run").exists()


def test_a_rebuild_of_prepared_data_keeps_what_it_did_not_write(tmp_path):
    config = tiny_run_config(tmp_path)
    prepared = config.data.prepared_path()
    prepare(config.data, prepared, log=lambda _: None)
    (prepared / "notes.txt").write_text("mine\n")
    (prepared / "old-runs").mkdir()
    (prepared / "old-runs" / "model.safetensors").write_bytes(b"weights")
    listed = json.loads((prepared / "manifest.json").read_text())["files"]
    assert "spm.model" in listed and "notes.txt" not in listed
    changed = dataclasses.replace(config.data, vocab_size=50)  # a changed option: a rebuild
    prepare(changed, prepared, log=lambda _: None)
    assert (prepared / "notes.txt").read_text() == "mine\n"
    assert (prepared / "old-runs" / "model.safetensors").read_bytes() == b"weights"
    assert json.loads((prepared / "manifest.json").read_text())["options"]["vocab_size"] == 50
    prepare(changed, prepared, log=lambda _: None, force=True)
    assert (prepared / "notes.txt").is_file()


def test_a_killed_prepare_leaves_no_debris_after_the_next(tmp_path):
    config = tiny_run_config(tmp_path)
    prepared = config.data.prepared_path()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a PID that no process has now
    stale = prepared.parent / f".{prepared.name}.tmp-{dead.pid}"
    stale.mkdir()
    (stale / "train.src.npy").write_bytes(b"half")
    prepare(config.data, prepared, log=lambda _: None)
    assert not stale.exists()


def test_the_vocabulary_hash_does_not_change_with_the_build_directory(tmp_path):
    config = tiny_run_config(tmp_path)
    a, b = tmp_path / "a", tmp_path / "b"
    prepare(config.data, a, log=lambda _: None)
    prepare(config.data, b, log=lambda _: None)
    assert vocabulary_sha256(a / "spm.model") == vocabulary_sha256(b / "spm.model")
    other = dataclasses.replace(config.data, vocab_size=50)
    prepare(other, tmp_path / "c", log=lambda _: None)
    assert vocabulary_sha256(tmp_path / "c" / "spm.model") != vocabulary_sha256(a / "spm.model")


def test_a_run_resumes_on_a_rebuilt_identical_vocabulary(tmp_path):
    config = tiny_run_config(tmp_path, train={"max_steps": 2, "valid_every": 2})
    Trainer(config, tmp_path / "run", **QUIET).run()
    prepared = config.data.prepared_path()
    prepare(config.data, prepared, log=lambda _: None, force=True)  # the same data again
    longer = dataclasses.replace(config, train=dataclasses.replace(config.train, max_steps=4))
    state = Trainer(longer, tmp_path / "run", resume=True, **QUIET).run()
    assert state.step == 4


def test_a_new_run_never_overwrites_a_model(run_dir, tmp_path, capsys):
    averaged = tmp_path / "avg"
    assert cli(["average", str(run_dir), "--last", "1", "--out", str(averaged)]) == 0
    finished = tmp_path / "finished"
    shutil.copytree(run_dir, finished)
    shutil.rmtree(finished / "checkpoints")  # deleted to save disk
    config = tiny_run_config(tmp_path, train={"max_steps": 2})
    for out in (averaged, finished):
        before = _snapshot(out)
        with pytest.raises(TrainingError, match="already holds a model"):
            Trainer(config, out, **QUIET)
        after = _snapshot(out)
        for files in (before, after):
            files.pop(".lock", None)  # the lock a writer takes before it looks
        assert after == before


# ----------------------------------------------------------------------------------- analyze


def test_analyze_never_writes_over_a_users_directory(run_dir, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "summary.md").write_text("my notes\n")
    assert cli(["analyze", str(run_dir), "--out", str(mine), "--no-decode"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "was not made by wtnmt analyze" in err
    assert [p.name for p in mine.iterdir()] == ["summary.md"]
    assert (mine / "summary.md").read_text() == "my notes\n"
    (tmp_path / "file").write_text("x")
    assert cli(["analyze", str(run_dir), "--out", str(tmp_path / "file"), "--no-decode"]) == 2
    assert "is a file" in capsys.readouterr().err
    ours = tmp_path / "report"  # its own directory: written, then written again
    for _ in range(2):
        assert cli(["analyze", str(run_dir), "--out", str(ours), "--no-decode"]) == 0
    assert (ours / "summary.md").is_file()


# ---------------------------------------------------------------- validation on fresh weights

MODEL_KINDS = {
    "transformer": {"attention": "multihead"},
    "weighted-split": {"attention": "branched", "branch_ffn": "split"},
    "weighted-shared": {"attention": "branched", "branch_ffn": "shared"},
    "weighted-self": {"attention": "branched", "decoder_self_attention": "weighted"},
    "weighted-pre": {"attention": "branched", "norm": "pre", "positions": "learned"},
    "weighted-fixed": {"attention": "branched", "branch_weights": "fixed"},
    "transformer-transparent": {"attention": "multihead", "encoder_combination": "transparent"},
}


@pytest.mark.parametrize("kind", sorted(MODEL_KINDS))
def test_validation_during_training_equals_a_fresh_models(tmp_path, kind):
    """Fused Adam updates the weights in place without bumping their version counters: a
    cache of derived weights keyed on those counters would let a validation decode with the
    weights of the one before. Every validation must equal a fresh model's on its weights."""
    from wtnmt.model import build_model
    from wtnmt.train.state import make_adam

    config = tiny_run_config(
        tmp_path,
        model=MODEL_KINDS[kind],
        # κ, α frozen from step 3: no projection bumps their version counters any more
        train={
            "max_steps": 6,
            "valid_every": 2,
            "lr_scale": 4.0,
            "warmup": 2,
            "freeze_branch_weights": 4,
        },
    )
    trainer = Trainer(config, tmp_path / "run", **QUIET)
    probe = make_adam(
        [{"params": [torch.nn.Parameter(torch.zeros(2))]}], betas=(0.9, 0.98), eps=1e-9
    )
    assert probe.defaults.get("fused"), "this build has no fused Adam: the case is not tested"
    logged = []
    during = trainer.validate
    trainer.validate = lambda: logged.append(during()) or logged[-1]  # type: ignore[method-assign]
    trainer.run()
    assert len(logged) == 3
    last = logged[-1]
    fresh = build_model(config.model, vocab_size=len(trainer.vocab.target))
    fresh.load_state_dict(trainer.model.state_dict())
    trainer.model = fresh  # the same validation, through a model that has cached nothing
    again = during()
    assert again["valid_loss"] == pytest.approx(last["valid_loss"], rel=1e-6, abs=0)
    assert again["valid_bleu"] == last["valid_bleu"]


def test_runs_of_the_same_name_in_two_places_stay_two_models(run_dir, tmp_path):
    for place in ("A", "B"):
        shutil.copytree(run_dir, tmp_path / place / "w")
    out = tmp_path / "report"
    assert cli(["analyze", str(tmp_path / "A" / "w"), str(tmp_path / "B" / "w"),
                "--out", str(out), "--no-decode"]) == 0  # fmt: skip
    assert (out / "kappa_alpha-A_w.png").is_file() and (out / "kappa_alpha-B_w.png").is_file()
    analysis = json.loads((out / "analysis.json").read_text())
    groups = next(t for t in analysis["tables"] if t["title"].startswith("Models"))
    assert [row[0] for row in groups["rows"]] == ["A/w", "B/w"]  # not two seeds of one "w"
    assert [row[1] for row in groups["rows"]] == [1, 1]


def test_a_damaged_vocabulary_is_refused_in_one_line(run_dir, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    assert (run / "spm.model.sha256").is_file()
    data = bytearray((run / "spm.model").read_bytes())
    data[len(data) // 2] ^= 0xFF  # one byte of a piece's score
    (run / "spm.model").write_bytes(bytes(data))
    assert cli(["translate", str(run), "-i", "/dev/null"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "spm.model: the vocabulary is damaged" in err
