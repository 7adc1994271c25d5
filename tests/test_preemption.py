"""Pre-emption: SIGTERM (what `timeout`, `kill`, `docker stop`, systemd, Slurm and Kubernetes
send) stops `wtnmt train` at the next update with a checkpoint, as Ctrl-C does, and the run
resumed ends with the weights of one never stopped; worker processes end with the process
that started them, however it ends (SIGTERM, SIGKILL). Real processes, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from helpers import sentence, tiny_run_config, translate
from wtnmt.config import config_to_dict
from wtnmt.rundir import latest_checkpoint
from wtnmt.train import Trainer


def _wait_for(condition, timeout: float = 120.0, what: str = "") -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def _logged_step(run: Path) -> int:
    try:
        lines = (run / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return -1
    steps = [json.loads(line)["step"] for line in lines if line.strip()]
    return max(steps, default=-1)


def test_sigterm_mid_epoch_saves_a_checkpoint_and_the_resumed_run_ends_as_one_never_stopped(
    tmp_path,
):
    values = config_to_dict(
        tiny_run_config(
            tmp_path,
            n_train=400,
            train={"max_steps": 40, "log_every": 1, "valid_every": 1000, "save_every": 1000},
        )
    )
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(values))
    straight = tiny_run_config(
        tmp_path,
        n_train=400,
        train={"max_steps": 40, "log_every": 1, "valid_every": 1000, "save_every": 1000},
    )
    Trainer(straight, tmp_path / "straight", log_to_stderr=False).run()
    run = tmp_path / "stopped"
    cli = [sys.executable, "-m", "wtnmt.cli", "train", str(config), "--out", str(run)]
    proc = subprocess.Popen(cli, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: _logged_step(run) >= 3 or proc.poll() is not None, what="updates")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err  # 128 + SIGTERM, as a shell reports it
    found = latest_checkpoint(run / "checkpoints")
    assert found is not None, err
    step = found[1]["train_state"]["step"]
    assert 3 <= step < 40 and f"interrupted at step {step} (SIGTERM): saving a checkpoint" in err
    resumed = subprocess.run([*cli, "--resume"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    a, b = (load_file(tmp_path / r / "model.safetensors") for r in ("straight", "stopped"))
    ends = [latest_checkpoint(tmp_path / r / "checkpoints") for r in ("straight", "stopped")]
    assert [e[1]["train_state"]["step"] for e in ends] == [40, 40]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    try:
        return [int(c) for c in path.read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has ended; only its parent's wait is missing


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_worker_ends_with_its_parent_however_the_parent_ends(tmp_path):
    """lifeline.end_with_parent: the parent killed with SIGKILL (no handler runs), its child
    that asked is gone within a second, one that did not lives on."""
    code = (
        "import os, subprocess, sys, time\n"
        "from wtnmt.lifeline import end_with_parent\n"
        "if sys.argv[1] == 'parent':\n"
        "    for asks in ('1', '0'):\n"
        "        subprocess.Popen([sys.executable, __file__, 'child', str(os.getpid()), asks])\n"
        "    time.sleep(600)\n"
        "else:\n"
        "    if sys.argv[3] == '1':\n"
        "        end_with_parent(int(sys.argv[2]))\n"
        "    print(os.getpid(), flush=True)\n"
        "    time.sleep(600)\n"
    )
    script = tmp_path / "family.py"
    script.write_text(code)
    parent = subprocess.Popen([sys.executable, str(script), "parent"])
    try:
        _wait_for(lambda: len(_children(parent.pid)) == 2, 60, "two children")
        asked, unasked = _children(parent.pid)
        time.sleep(1.0)  # both started and made (or not) their request
        parent.kill()
        parent.wait()
        _wait_for(lambda: not _alive(asked), 10, "the child that asked to end")
        assert _alive(unasked)
    finally:
        parent.kill()
        for pid in locals().get("asked", 0), locals().get("unasked", 0):
            if pid and _alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_prepare_killed_takes_its_encoding_workers_with_it(tmp_path, signum):
    """`wtnmt prepare --workers 2` killed while it encodes: both workers end with it (they
    lived on for good, holding the build's arrays, seen 19 minutes later)."""
    n = 200_000
    with (tmp_path / "t.src").open("w") as src, (tmp_path / "t.tgt").open("w") as tgt:
        for i in range(n):
            s = sentence(i, 3 + i % 9)
            src.write(s + "\n")
            tgt.write(translate(s) + "\n")
    argv = [
        sys.executable, "-m", "wtnmt.cli", "prepare",
        "--src", str(tmp_path / "t.src"), "--tgt", str(tmp_path / "t.tgt"),
        "--src-lang", "xx", "--tgt-lang", "yy", "--vocab-size", "60",
        "--set", "data.valid_size=50", "--set", "data.test_size=50",
        "--workers", "2", "--out", str(tmp_path / "prepared"),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: list[int] = []
    try:
        _wait_for(
            lambda: len(_children(proc.pid)) >= 2 or proc.poll() is not None,
            120,
            "the encoding workers",
        )
        workers = _children(proc.pid)
        if proc.poll() is not None or len(workers) < 2:
            pytest.fail("prepare ended before its workers could be seen; give it more pairs")
        proc.send_signal(signum)
        proc.wait(60)
        _wait_for(lambda: not any(map(_alive, workers)), 10, "the workers to end")
    finally:
        proc.kill()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
