"""Resuming a run: bit for bit the run that was never stopped (one process and DDP, each
rank's own random state), from the last complete checkpoint when one was half written, and
clear refusals of damaged checkpoints and of a directory that holds no run or another."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers import tiny_run_config, two_processes
from wtnmt.errors import CheckpointError, TrainingError
from wtnmt.rundir import latest_checkpoint, load_state, save_checkpoint
from wtnmt.train import Trainer

QUIET = {"log_to_stderr": False}


def test_resume_equals_training_straight_through(tmp_path):
    straight = tiny_run_config(
        tmp_path, train={"max_steps": 8, "save_every": 100, "valid_every": 100}
    )
    Trainer(straight, tmp_path / "a", **QUIET).run()
    first = tiny_run_config(tmp_path, train={"max_steps": 4, "save_every": 100, "valid_every": 100})
    Trainer(first, tmp_path / "b", **QUIET).run()
    state = Trainer(straight, tmp_path / "b", resume=True, **QUIET).run()
    assert state.step == 8
    a = load_file(sorted((tmp_path / "a" / "checkpoints").glob("*.safetensors"))[-1])
    b = load_file(sorted((tmp_path / "b" / "checkpoints").glob("*.safetensors"))[-1])
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_a_run_stopped_off_its_save_cadence_keeps_and_averages_the_checkpoints_of_one_never_stopped(
    tmp_path,
):
    """A checkpoint saved where a run stopped (a pause, an interruption, an end at another
    budget) is off the run's cadence: once the run goes on it is removed, and it never pushed
    a checkpoint of the cadence out, so the last N checkpoints averaged are the straight run's
    (a grid's run paused twice had averaged its two pause checkpoints in place of the two
    oldest of its last ten)."""
    from wtnmt.rundir import list_checkpoints
    from wtnmt.rundir.average import average_weights

    train = {"save_every": 2, "valid_every": 100, "keep_checkpoints": 3}
    straight = tiny_run_config(tmp_path, train={"max_steps": 10, **train})
    Trainer(straight, tmp_path / "a", **QUIET).run()
    # stopped off the cadence twice, each time resumed: the stop's own checkpoint is kept
    # beside the cadence's last 3, none of which it pushed out
    for stop, cadence in ((5, (2, 4)), (7, (2, 4, 6))):
        first = tiny_run_config(tmp_path, train={"max_steps": stop, **train})
        Trainer(first, tmp_path / "b", resume=stop > 5, **QUIET).run()
        names = [p.name for p in list_checkpoints(tmp_path / "b" / "checkpoints")]
        assert names == [f"step_{s:07d}.state.pt" for s in (*cadence, stop)]
    Trainer(straight, tmp_path / "b", resume=True, **QUIET).run()
    kept = {run: list_checkpoints(tmp_path / run / "checkpoints") for run in ("a", "b")}
    assert (
        [p.name for p in kept["b"]]
        == [p.name for p in kept["a"]]
        == [f"step_{s:07d}.state.pt" for s in (6, 8, 10)]
    )
    a, b = (
        average_weights([p.with_name(p.name.replace(".state.pt", ".safetensors")) for p in kept[r]])
        for r in ("a", "b")
    )
    assert all(torch.equal(a[k], b[k]) for k in a)


KILLER = """
import os, signal, sys
sys.path.insert(0, {tests!r})
from helpers import tiny_run_config
from pathlib import Path
from wtnmt.train import Trainer
real_replace, calls = os.replace, [0]
def dying_replace(src, dst):
    calls[0] += 1
    if str(dst).endswith("step_0000005.state.pt"):  # mid-way through checkpoint 5
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace(src, dst)
os.replace = dying_replace  # atomic_write's os.replace
config = tiny_run_config(Path({tmp!r}), train={{"max_steps": 8, "save_every": 1,
                                               "valid_every": 100, "keep_checkpoints": 10}})
Trainer(config, Path({run!r}), log_to_stderr=False).run()
"""


@pytest.mark.slow
def test_a_run_killed_while_writing_a_checkpoint_resumes_from_the_last_complete_one(tmp_path):
    run = tmp_path / "killed"
    code = KILLER.format(tests=str(Path(__file__).parent), tmp=str(tmp_path), run=str(run))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == -9, done.stderr  # SIGKILL
    leftovers = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert "step_0000005.safetensors" in leftovers  # weights written, state not
    assert any(name.endswith(".tmp") for name in leftovers)
    _, state = latest_checkpoint(run / "checkpoints", warn=lambda _: None)
    assert state["step"] == 4
    config = tiny_run_config(
        tmp_path,
        train={"max_steps": 8, "save_every": 1, "valid_every": 100, "keep_checkpoints": 10},
    )
    assert Trainer(config, run, resume=True, **QUIET).run().step == 8
    assert not list((run / "checkpoints").glob(".*.tmp"))  # the killed writer's debris is gone
    reference = tiny_run_config(
        tmp_path, train={"max_steps": 8, "save_every": 100, "valid_every": 100}
    )
    Trainer(reference, tmp_path / "straight", **QUIET).run()
    a = load_file(run / "checkpoints" / "step_0000008.safetensors")
    b = load_file(sorted((tmp_path / "straight" / "checkpoints").glob("*.safetensors"))[-1])
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_damaged_checkpoints_give_clear_errors(tmp_path):
    path = tmp_path / "x.state.pt"
    path.write_bytes(b"definitely not a checkpoint")
    with pytest.raises(CheckpointError, match=r"x\.state\.pt: not a checkpoint state file"):
        load_state(path)
    model = torch.nn.Linear(2, 2)
    stem = save_checkpoint(tmp_path, 3, model, {"train_state": {}})
    state_file = stem.with_suffix(".state.pt")
    state_file.write_bytes(state_file.read_bytes()[:40])  # truncated
    with pytest.raises(CheckpointError, match="not a checkpoint state file"):
        load_state(state_file)
    stem = save_checkpoint(tmp_path, 4, model, {"train_state": {}})
    stem.with_suffix(".safetensors").write_bytes(b"junk")
    with pytest.raises(CheckpointError, match="does not match its state file"):
        load_state(stem.with_suffix(".state.pt"))


def test_resume_without_checkpoint_and_reuse_of_a_run_dir_are_refused(tmp_path):
    config = tiny_run_config(tmp_path)
    with pytest.raises(TrainingError, match="no complete checkpoint"):
        Trainer(config, tmp_path / "empty", resume=True, **QUIET)
    Trainer(config, tmp_path / "run", **QUIET).run()
    with pytest.raises(TrainingError, match="already holds a run: add --resume"):
        Trainer(config, tmp_path / "run", **QUIET)


DDP_RESUME_WORKER = """
import os, sys
sys.path.insert(0, {tests!r})
from pathlib import Path
import torch
from helpers import tiny_run_config
from wtnmt.train import Trainer
torch.set_num_threads(1)
config = tiny_run_config(Path({tmp!r}), n_train=300, train={{"max_steps": {steps}, "save_every": 3,
    "valid_every": 100, "max_tokens": 200}}, model={{"dropout": 0.3}})
trainer = Trainer(config, Path({run!r}), resume={resume}, log_to_stderr=False)
trainer.run()
assert not torch.distributed.is_initialized()  # the trainer made the group and took it down
if int(os.environ["RANK"]) == 0:
    torch.save(dict(trainer.model.state_dict()), {out!r})
"""


def _ddp(tmp_path: Path, run: str, steps: int, resume: bool) -> dict[str, torch.Tensor]:
    out = tmp_path / f"{run}-{steps}.pt"
    code = DDP_RESUME_WORKER.format(
        tests=str(Path(__file__).parent), tmp=str(tmp_path), run=str(tmp_path / run),
        steps=steps, resume=resume, out=str(out),
    )  # fmt: skip
    two_processes(code)
    return torch.load(out, weights_only=True)


@pytest.mark.slow
def test_a_ddp_resume_restores_every_ranks_own_random_state(tmp_path):
    # defect 6: every rank resumed with rank 0's RNG state, so dropout masks went identical
    from wtnmt.data import prepare

    config = tiny_run_config(tmp_path, n_train=300, model={"dropout": 0.3})
    prepare(config.data, config.data.prepared_path(), log=lambda m: None)  # no race to build it
    straight = _ddp(tmp_path, "straight", 6, resume=False)
    _ddp(tmp_path, "split", 3, resume=False)
    resumed = _ddp(tmp_path, "split", 6, resume=True)
    for name, value in straight.items():
        assert torch.equal(value, resumed[name]), name


def test_a_resume_with_precision_auto_keeps_the_precision_the_run_was_trained_in(tmp_path):
    config = tiny_run_config(tmp_path, train={"max_steps": 2, "precision": "fp32"})
    Trainer(config, tmp_path / "run", **QUIET).run()
    auto = tiny_run_config(tmp_path, train={"max_steps": 4, "precision": "auto"})
    assert Trainer(auto, tmp_path / "run", resume=True, **QUIET).precision == "fp32"
    stated = tiny_run_config(tmp_path, train={"max_steps": 4, "precision": "bf16"})
    assert Trainer(stated, tmp_path / "run", resume=True, **QUIET).precision == "bf16"
