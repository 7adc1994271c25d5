"""Ctrl-C (SIGINT) during training is a request to stop at the next update boundary, never
lost: not while a grid's run still imports torch (which can swallow a KeyboardInterrupt
raised inside it: a run stopped 0.6 s after it started trained on), not before the first
update; and a command stopped while it imports torch stops once the import is done."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml
from safetensors.torch import load_file

from helpers import tiny_run_config
from wtnmt import interrupt
from wtnmt.config import config_to_dict
from wtnmt.rundir import latest_checkpoint
from wtnmt.train import Trainer

QUIET = {"log_to_stderr": False}


def test_a_first_sigint_is_a_request_and_a_second_interrupts():
    before = signal.getsignal(signal.SIGINT)
    previous = interrupt.take_over()
    try:
        assert previous.sigint is before and not interrupt.requested()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # delivered at the next bytecode boundary
        assert interrupt.requested()
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        # taken over again by an inner owner (the training loop): the request stands
        inner = interrupt.take_over()
        assert inner.ours and interrupt.requested()
        interrupt.give_back(inner)
        assert interrupt.requested()
    finally:
        interrupt.give_back(previous)
    assert signal.getsignal(signal.SIGINT) is before and not interrupt.requested()


def test_sigint_held_during_an_import_is_raised_when_the_import_is_done():
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with interrupt.held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            assert interrupt.requested()  # held, not raised inside the import
    assert signal.getsignal(signal.SIGINT) is before and not interrupt.requested()
    with interrupt.held():  # nothing came: nothing raised
        pass
    # where SIGINT is already a request (a grid's run), it stays one for the training loop
    previous = interrupt.take_over()
    try:
        with interrupt.held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        assert interrupt.requested() and signal.getsignal(signal.SIGINT) is interrupt._handle
    finally:
        interrupt.give_back(previous)
    assert signal.getsignal(signal.SIGINT) is before and not interrupt.requested()


def test_a_request_before_the_first_update_stops_with_a_checkpoint_to_resume(tmp_path):
    config = tiny_run_config(tmp_path, train={"max_steps": 6, "save_every": 100})
    Trainer(config, tmp_path / "straight", **QUIET).run()
    previous = interrupt.take_over()  # as a grid's run does before its imports
    try:
        os.kill(os.getpid(), signal.SIGINT)  # while it imports, prepares, builds the model
        time.sleep(0.05)
        with pytest.raises(KeyboardInterrupt):
            Trainer(config, tmp_path / "stopped", **QUIET).run()
    finally:
        interrupt.give_back(previous)
    saved = latest_checkpoint(tmp_path / "stopped" / "checkpoints")
    assert saved is not None and saved[1]["train_state"]["step"] == 0  # before any update
    state = Trainer(config, tmp_path / "stopped", resume=True, **QUIET).run()
    assert state.step == 6
    a, b = (load_file(tmp_path / run / "model.safetensors") for run in ("straight", "stopped"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_the_launcher_takes_sigint_over_before_the_module_imports_anything(tmp_path):
    (tmp_path / "probe.py").write_text(
        "import signal, sys\n"
        "handler = signal.getsignal(signal.SIGINT)\n"
        "print(handler.__module__, handler.__name__, 'torch' in sys.modules, sys.argv[1:])\n"
        "assert __name__ == '__main__'\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-m", "wtnmt.interrupt", "probe", "a", "b"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert done.stdout.split() == ["wtnmt.interrupt", "_handle", "False", "['a',", "'b']"]


@pytest.mark.slow
def test_a_grid_run_stopped_at_any_moment_of_its_start_stops(tmp_path):
    """A run of a grid stopped (--stop-after, Ctrl-C) while it starts: at every moment of its
    first seconds it stops, with a checkpoint once it has taken SIGINT over."""
    from wtnmt.experiment.runner import job_argv

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(config_to_dict(tiny_run_config(tmp_path))))
    for delay in (0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 1.0, 1.5, 2.5):
        run_dir = tmp_path / f"run-{delay}"
        payload = {
            "run_dir": str(run_dir),
            "preset": str(config),
            "overrides": ["train.max_steps=1000000", "train.threads=1"],
            "train": True,
            "resume": False,
            "evaluate": None,
            "table3": None,
        }
        proc = subprocess.Popen(
            job_argv(payload),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        try:
            code = proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"a run stopped {delay} s after it started trained on")
        assert code in (130, -signal.SIGINT), (delay, code)
        if code == 130:  # stopped by the request, at the update boundary: a checkpoint
            assert latest_checkpoint(run_dir / "checkpoints") is not None, delay


PROBE = """
import signal, sys
class Probe:  # what SIGINT does when torch's import begins
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            handler = signal.getsignal(signal.SIGINT)
            with open({out!r}, "w") as f:
                f.write(f"{{handler.__module__}}.{{handler.__name__}}")
sys.meta_path.insert(0, Probe())
"""


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "missing.yaml"],
        ["translate", "missing-run"],
        ["analyze", "missing-run"],
        ["serve", "missing-run", "--port", "0"],
    ],
)
def test_a_command_holds_sigint_while_it_imports_torch(tmp_path, argv):
    """torch's import can lose a SIGINT that comes at one moment of it (`python -c 'import
    torch'` stopped 0.55–0.75 s after it started went on, on a busy 2-core machine), fail with
    "cannot load module more than once per process" or abort; the commands that import it
    hold SIGINT meanwhile."""
    out = tmp_path / "handler"
    (tmp_path / "sitecustomize.py").write_text(PROBE.format(out=str(out)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-m", "wtnmt.cli", *argv], capture_output=True, text=True, env=env,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr  # the missing file, after the import
    assert out.read_text() == "wtnmt.interrupt._handle"
