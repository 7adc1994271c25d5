"""A briefly trained tiny run, and a real uvicorn server on loopback, for the serving tests."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from filelock import FileLock

from helpers import tiny_run_config
from wtnmt.serve.main import bind
from wtnmt.train import Trainer


def served_at(stderr) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """A `wtnmt serve` process's URL and its line saying so, read from its stderr: the first
    line, or the second where the first says the native engine (its default, `--engine auto`)
    is being compiled, its first use on this machine."""
    line = stderr.readline()
    if line.startswith("wtnmt: compiling the native engine"):
        line = stderr.readline()
    assert line.startswith("wtnmt serve: ") and " at http://" in line, line
    return line.split(" at ")[1].split("/ ")[0], line


def train_tiny_run(directory: Path, **model) -> Path:
    """A weighted-tiny model trained long enough (200 steps, ~5 s) that its translations
    differ from one input to the next, so answers that reach the wrong request are seen."""
    config = tiny_run_config(
        directory,
        n_train=400,
        train={"max_steps": 200, "valid_every": 1000, "max_tokens": 600, "lr_scale": 2.0},
        model={"d_model": 64, "d_ff": 128, **model},
    )
    Trainer(config, directory / "run", log_to_stderr=False).run()
    return directory / "run"


def shared_tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``train_tiny_run``'s weighted-tiny run, trained once in a test session for every module
    that only reads it (serving writes nothing into a run): under pytest-xdist the workers'
    base directories share the session's, and a lock lets one worker train while the others
    wait for it."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    directory = root / "shared-tiny-run"
    with FileLock(str(root / "shared-tiny-run.lock")):
        if not (directory / "trained").is_file():
            directory.mkdir()  # a half-trained one left by a failed worker: fail here too
            train_tiny_run(directory)
            (directory / "trained").touch()
    return directory / "run"


class LiveServer:
    """uvicorn serving ``app`` on 127.0.0.1 in a thread, ready once /ready says so."""

    def __init__(self, app) -> None:  # type: ignore[no-untyped-def]
        self.sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/ready", timeout=5).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError("the server did not become ready in 60 s")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def metric(text: str, name: str, labels: str = "") -> float:
    """The value of one sample of Prometheus text, e.g. metric(t, "wtnmt_batches_total")."""
    wanted = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(wanted + " "):
            return float(line.split()[-1])
    return 0.0
