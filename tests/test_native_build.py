"""The native engine's library had safely: imported without a compiler or ninja where it is
built, built just in time under a lock that dies with its holder (a build killed midway never
blocks the next: torch's own lock file did, forever), a bounded wait for another process's
build, and `--engine auto` decoding with PyTorch, in one line, wherever the engine cannot be
had (an unwritable cache)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import wtnmt.decode.native as native
from helpers import train_tiny
from wtnmt import Translator
from wtnmt.decode.native import NativeUnavailable, extension, unavailable_reason
from wtnmt.decode.native.build import LOCK, BuildUnavailable, build_lock

ROOT = Path(__file__).resolve().parents[1]


def _holder(directory: Path) -> subprocess.Popen:  # type: ignore[type-arg]
    """A process that takes the build lock of ``directory`` and keeps it until killed."""
    code = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from wtnmt.decode.native.build import build_lock\n"
        "with build_lock(Path(sys.argv[1])):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(directory)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_the_build_lock_dies_with_its_holder_and_a_wait_is_bounded(tmp_path, signum):
    build = tmp_path / "wtnmt_native_x"
    holder = _holder(build)
    try:
        said: list[str] = []
        start = time.monotonic()
        with pytest.raises(BuildUnavailable, match=r"another process has been building it"):
            with build_lock(build, wait=0.6, say=said.append):
                pass
        assert 0.5 < time.monotonic() - start < 10
        assert len(said) == 1 and "waiting for another process's build" in said[0]
        (build / "lock").write_text("")  # torch's lock file, as the killed build leaves it
    finally:
        holder.send_signal(signum)
        holder.wait(timeout=30)
    start = time.monotonic()
    with build_lock(build, wait=30):
        assert time.monotonic() - start < 5  # the dead holder's lock went with it
        assert not (build / "lock").exists()  # and torch's file is known stale, removed
    assert (build / LOCK).is_file()


def test_an_unwritable_cache_is_one_line_and_auto_decodes_with_pytorch(
    tmp_path, monkeypatch, capsys
):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(BuildUnavailable, match=r"cannot be written"):
        with build_lock(blocker / "build"):
            pass
    if unavailable_reason() is not None:
        pytest.skip(f"the build path needs the tools: {unavailable_reason()}")
    run = train_tiny(tmp_path)
    monkeypatch.setattr(native, "_loaded", [])
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(blocker / "torch_extensions"))
    monkeypatch.setenv("WTNMT_NATIVE_PACKAGED", "0")  # the just-in-time path
    with pytest.raises(NativeUnavailable, match=r"^--engine native: its build folder .* cannot"):
        extension()
    said: list[str] = []
    translator = Translator.load(run, engine="auto", say=said.append)
    assert translator.engine == "pytorch" and len(said) == 1
    assert "--engine auto: the native engine cannot run here" in said[0] and "PyTorch" in said[0]
    assert blocker.read_text() == "not a folder"


def test_a_built_engine_loads_without_a_compiler_or_ninja(tmp_path):
    if unavailable_reason() is not None:
        pytest.skip(f"building it first needs the tools: {unavailable_reason()}")
    extension()  # built (once) here, with the tools, or the package's own
    code = (
        "from wtnmt.decode.native import extension, unavailable_reason\n"
        "assert unavailable_reason() is not None, 'the tools are still found'\n"
        "print(extension().__name__)\n"
    )
    env = {**os.environ, "PATH": str(tmp_path), "CXX": "no-such-compiler"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(("wtnmt_native_", "wtnmt.decode.native._engine")), done.stdout


def test_ninja_of_the_environment_is_found_where_it_is_not_activated(tmp_path):
    """PATH as a service has it: a compiler, and not this environment's bin folder."""
    compiler = shutil.which("c++")
    if compiler is None or not (Path(sys.executable).parent / "ninja").is_file():
        pytest.skip("needs g++ and this environment's ninja (pip install 'wtnmt[native]')")
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "c++").symlink_to(compiler)
    code = "from wtnmt.decode.native import unavailable_reason\nprint(unavailable_reason())\n"
    env = {**os.environ, "PATH": str(tools)}
    env.pop("CXX", None)
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "None", done.stdout + done.stderr


@pytest.mark.slow
def test_a_build_killed_midway_never_blocks_the_next(tmp_path):
    """The hang itself: a first build SIGKILLed while compiling (torch's lock file left),
    then a translate's build: it must build and load, not wait forever."""
    if unavailable_reason() is not None:
        pytest.skip(unavailable_reason())
    env = {
        **os.environ,
        "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"),
        "WTNMT_NATIVE_PACKAGED": "0",
    }
    code = "from wtnmt.decode.native import extension\nprint(extension().__name__)\n"
    first = subprocess.Popen([sys.executable, "-c", code], env=env)
    deadline = time.monotonic() + 120
    while not list((tmp_path / "ext").glob("*/lock")) and time.monotonic() < deadline:
        time.sleep(0.1)
    first.kill()
    first.wait()
    assert list((tmp_path / "ext").glob("*/lock")), "the build never started"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=400
    )
    assert done.returncode == 0, done.stderr
    assert not list((tmp_path / "ext").glob("*/lock"))


def test_a_packaged_engine_of_another_pytorch_or_source_is_said_and_not_imported(tmp_path):
    import json

    import torch

    from wtnmt.decode.native import _import_packaged, _name

    record = tmp_path / "_engine.json"
    record.write_text(json.dumps({"name": "wtnmt_native_000000000000", "torch": "2.4.0"}))
    module, why = _import_packaged(_name(), record)
    assert module is None
    assert f"built for PyTorch 2.4.0, this is {torch.__version__}" in why
    record.write_text(json.dumps({"name": "wtnmt_native_000000000000", "torch": torch.__version__}))
    assert "of other sources" in _import_packaged(_name(), record)[1]
    record.write_text("{")
    assert "is damaged" in _import_packaged(_name(), record)[1]
    assert _import_packaged(_name(), tmp_path / "none.json") == (None, "")
