"""Training's progress as a user sees it, in a real pseudo-terminal and in a log: on a
terminal a bar, with every log line kept visible above it and never past 100%; without one
(or on a terminal too narrow to draw in), each log line says how far the run is and the time
left."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest
import yaml

from helpers import tiny_run_config
from wtnmt.config import config_to_dict

pytestmark = pytest.mark.slow

PROGRAM = "import sys; from wtnmt.cli import main; sys.exit(main(sys.argv[1:]))"


def _config(tmp: Path, **train) -> Path:  # type: ignore[no-untyped-def]
    values = config_to_dict(tiny_run_config(tmp, train={"log_every": 2, "valid_every": 1000}))
    values["train"].update(train)
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def _in_a_terminal(argv: list[str], columns: int, cwd: Path) -> str:
    """stdout and stderr of a command run in a pseudo-terminal ``columns`` wide."""
    parent, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    process = subprocess.Popen(argv, stdin=child, stdout=child, stderr=child, cwd=cwd)
    os.close(child)
    out = b""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([parent], [], [], 1)
        if ready:
            try:
                data = os.read(parent, 1 << 16)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            out += data
        elif process.poll() is not None:
            break
    process.wait(timeout=30)
    os.close(parent)
    assert process.returncode == 0, out.decode(errors="replace")[-3000:]
    return out.decode(errors="replace")


def test_a_time_bounded_run_on_a_terminal_shows_its_log_above_a_bar_that_ends_at_100(tmp_path):
    config = _config(tmp_path, max_steps=None, max_time=8.0)
    argv = [sys.executable, "-c", PROGRAM, "train", str(config), "--out", str(tmp_path / "r")]
    shown = _in_a_terminal(argv, columns=120, cwd=tmp_path)
    assert "TqdmWarning" not in shown and "102%" not in shown and "<-" not in shown
    assert "100%" in shown  # the bar reached its end, not past it
    assert "| nll " in shown and "| lr " in shown  # the log lines, not only the bar's summary
    assert "stopped: max_time" in shown


def test_a_terminal_too_narrow_for_a_bar_gets_log_lines_with_the_time_left(tmp_path):
    config = _config(tmp_path, max_steps=8)
    argv = [sys.executable, "-c", PROGRAM, "train", str(config), "--out", str(tmp_path / "r")]
    shown = _in_a_terminal(argv, columns=0, cwd=tmp_path)
    assert " parameters on " in shown
    training = shown[shown.index(" parameters on ") :]  # (prepare's bars come before)
    lines = [line for line in training.splitlines() if "] step " in line]
    assert lines and all(" left" in line and "%" in line for line in lines), training
    assert "step/s" not in training  # no bar drawn where it cannot be seen


def test_without_a_terminal_each_log_line_says_how_far_and_the_time_left(tmp_path):
    config = _config(tmp_path, max_steps=8)
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, "train", str(config), "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if "] step " in line]
    assert [line.split(" | ")[-2] for line in lines] == ["25%", "50%", "75%", "100%"]
    assert lines[-1].endswith("| 00:00 left")
