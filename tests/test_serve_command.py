"""`wtnmt serve`, the command: its options refused in one line, a real server started as the
README says, answers on kept-alive connections, the API key from the environment, and the
light base install (the API itself: test_serve.py)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from helpers import sentence
from serving import LiveServer, served_at, shared_tiny_run
from wtnmt import Translator
from wtnmt.cli import main as cli
from wtnmt.model.packed import int8_available, int8_narrow_weights
from wtnmt.serve.app import create_app
from wtnmt.serve.settings import ServeSettings

SENTENCE = sentence(40_000, 2)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return shared_tiny_run(tmp_path_factory)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-queue", "0"], "--max-queue 0: must be a whole number ≥ 1"),
        (
            ["--max-sentences", "50", "--max-queue", "10"],
            "--max-queue 10 is less than --max-sentences 50",
        ),
        (["--beam", "40"], "--beam 40: allowed 1 to --max-beam 16"),
        (["--timeout", "0"], "--timeout 0.0: must be more than 0 seconds"),
        (["--port", "70000"], "--port 70000: allowed 0 to 65535"),
        (
            ["--device", "cuda:0"] if not torch.cuda.is_available() else ["--device", "nope"],
            "--device",
        ),
        (["--threads", "0"], "--threads 0: must be at least 1"),
        (
            ["--quantize", "int8", "--device", "cuda"],
            "--quantize int8 decodes on the CPU only, not --device cuda",
        ),
        (["--api-key", " "], "the API key (--api-key or $WTNMT_API_KEY) is empty"),
        (["--ensemble-weights", "1,2"], "--ensemble-weights weighs an --ensemble's models"),
        (["--ensemble", "x", "--engine", "onnxruntime"], "native or pytorch, not onnxruntime"),
        (["--ensemble", "x", "--ensemble-weights", "1"], "2 numbers above 0, RUN's first"),
    ],
)
def test_serve_refuses_bad_options_in_one_line(run_dir, capsys, args, message):
    assert cli(["serve", str(run_dir), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("wtnmt serve: error: ") and message in err


def test_serve_refuses_a_busy_port_and_a_missing_run(run_dir, tmp_path, capsys):
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        assert cli(["serve", str(run_dir), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err == f"wtnmt serve: error: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    assert cli(["serve", str(tmp_path / "nothing"), "--port", "0"]) == 2
    assert f"{tmp_path / 'nothing'}: no such run directory" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize(
    ("quantize", "kernels"), [("none", None), ("int8", "fbgemm"), ("int8", "onednn")]
)
def test_wtnmt_serve_runs_as_the_readme_says(run_dir, quantize, kernels, monkeypatch):
    if quantize == "int8" and not int8_available():
        pytest.skip("this PyTorch build has no FBGEMM int8 linear")
    if kernels == "onednn":  # (the server's environment and this process's)
        monkeypatch.setenv("WTNMT_INT8_KERNELS", kernels)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = ["serve", str(run_dir), "--port", "0", "--threads", "1", "--quantize", quantize]
    proc = subprocess.Popen(
        [sys.executable, "-m", "wtnmt.cli", *command],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        url, line = served_at(proc.stderr)
        assert line.startswith(f"wtnmt serve: {run_dir} at http://127.0.0.1:"), line
        deadline = time.monotonic() + 60
        while httpx.get(url + "/ready").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        model = httpx.get(url + "/v1/model").json()
        expected_engine = Translator.load(run_dir, engine="auto").engine  # native where it runs
        assert (model["quantize"], model["engine"]) == (quantize, expected_engine)
        assert model["int8_kernels"] == kernels
        bits = None if kernels is None else 7 if int8_narrow_weights(kernels) else 8
        assert model["int8_weight_bits"] == bits
        local = Translator.load(run_dir, quantize=quantize, engine=expected_engine)
        assert model["int8_product"] == local.int8_product  # (the native engine's own, or kernels)
        assert (model["int8_product"] is None) == (kernels is None)
        # (int8 quantises each batch's activations as a whole: one sentence, batched alone)
        r = httpx.post(url + "/v1/translate", json={"text": SENTENCE})
        assert r.json() == {"translations": local.translate([SENTENCE])}
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0


def test_answers_on_a_kept_alive_connection_are_not_held_back(run_dir):
    # asyncio sets TCP_NODELAY on accepted connections only when the listening socket says
    # TCP: without it each answer waited ~40 ms for a delayed ACK (Nagle)
    from wtnmt.serve.main import bind

    with bind("127.0.0.1", 0) as sock:
        assert sock.proto == socket.IPPROTO_TCP
    app = create_app(Translator.load(run_dir), ServeSettings())
    with LiveServer(app) as server, httpx.Client(base_url=server.url) as c:
        times = []
        for _ in range(15):
            start = time.perf_counter()
            assert c.get("/health").status_code == 200
            times.append(time.perf_counter() - start)
    assert sorted(times)[7] < 0.02, times  # median; it was 0.044 s


def test_the_api_key_can_come_from_the_environment(monkeypatch):
    from wtnmt.cli import build_parser
    from wtnmt.serve.main import settings_from_args

    monkeypatch.setenv("WTNMT_API_KEY", "from-env")
    args = build_parser().parse_args(["serve", "run", "--no-batching", "--max-queue", "500"])
    settings = settings_from_args(args)
    assert settings.api_key == "from-env"
    assert settings.max_batch_sentences == 1 and settings.max_queue == 500
    args = build_parser().parse_args(["serve", "run", "--api-key", "given"])
    assert settings_from_args(args).api_key == "given"  # the option wins


def test_the_base_install_stays_light_and_a_missing_extra_is_one_line(run_dir, monkeypatch, capsys):
    code = (
        "import sys, wtnmt.cli; wtnmt.cli.build_parser(); "
        "print(sorted(m for m in ('fastapi', 'uvicorn', 'torch') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"  # the command line loads neither the server nor torch
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # as if the serve extra were missing
    assert cli(["serve", str(run_dir)]) == 2
    assert capsys.readouterr().err == (
        "wtnmt serve: error: wtnmt serve needs the 'serve' extra (uvicorn is not installed): "
        "pip install 'wtnmt[serve]'\n"
    )
