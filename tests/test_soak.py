"""The kill soak, small: `pytest -m slow` (the full one is `benchmarks/kill_soak.py`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parents[1] / "benchmarks" / "kill_soak.py"


@pytest.mark.slow
def test_killed_and_resumed_runs_end_with_the_uninterrupted_weights(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            str(SOAK),
            "--kills",
            "6",
            "--ddp-kills",
            "1",
            "--steps",
            "150",
            "--ddp-steps",
            "40",
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-8000:] + done.stderr[-2000:]
    assert done.stdout.count("EQUAL to the uninterrupted run's") == 2
    assert "0 failed" in done.stdout
