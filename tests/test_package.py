"""wtnmt as a package, not a checkout: the sdist and the wheel built from a clean copy of the
project, the native engine compiled into the wheel, `twine check` clean, nothing but the
package inside (no tests, no experiments); the wheel installed into a fresh environment whose
PATH has no compiler and no ninja decodes with `--engine native`, the same tokens as the
PyTorch engine, without building anything; `pip install .` from the sdist leaves its tree as
it found it. About 1.5 minutes on 2 cores, most of it the engine's compile (marked slow)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

import wtnmt
from helpers import train_tiny
from wtnmt import Translator
from wtnmt.decode.native import unavailable_reason

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _clean_copy(into: Path) -> Path:
    """The project's files as a fresh clone has them (tracked, or new and not ignored)."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("needs the git checkout to know the project's own files")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


def _tree(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _fresh_environment(where: Path) -> Path:
    """A new virtual environment of this Python whose dependencies (torch, numpy, …) are this
    one's, found through a .pth file: nothing downloaded, and no wtnmt in it yet."""
    base = Path(sys.base_prefix) / "bin" / "python3"
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (Path(purelib) / "wtnmt_test_dependencies.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n"
    )
    return python


def test_the_wheel_carries_the_compiled_engine_and_installs_without_a_compiler(tmp_path):
    if unavailable_reason() is not None:
        pytest.skip(f"building the wheel compiles the engine: {unavailable_reason()}")
    project = _clean_copy(tmp_path / "project")
    before = _tree(project)
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(project)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    assert _tree(project) == before  # the build wrote nothing into the tree
    wheel = next(dist.glob("wtnmt-*.whl"))
    sdist = next(dist.glob("wtnmt-*.tar.gz"))
    assert f"wtnmt-{wtnmt.__version__}-" in wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.startswith("wtnmt/decode/native/_engine.") and n.endswith(".so") for n in names)
    assert (
        "wtnmt/decode/native/_engine.json" in names and "wtnmt/configs/weighted-m30k.yaml" in names
    )
    assert all(n.startswith(("wtnmt/", f"wtnmt-{wtnmt.__version__}.dist-info/")) for n in names)
    checked = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr

    # a fresh environment, a PATH without g++ or ninja, no extension cache to build into
    python = _fresh_environment(tmp_path / "env")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-index", "-q", str(wheel)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    (tmp_path / "tiny").mkdir()
    run = train_tiny(tmp_path / "tiny")
    source = tmp_path / "in.txt"
    lines = ["alpha beta gamma", "delta", "zeta eta theta iota"]
    source.write_text("\n".join(lines) + "\n")
    cache = tmp_path / "no-cache" / "torch_extensions"
    env = {"HOME": str(tmp_path / "home"), "PATH": str(python.parent),
           "TORCH_EXTENSIONS_DIR": str(cache)}  # fmt: skip
    out = tmp_path / "out.txt"
    wtnmt_bin = python.parent / "wtnmt"
    done = subprocess.run(
        [str(wtnmt_bin), "translate", str(run), "-i", str(source), "-o", str(out),
         "--engine", "native"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "compiling" not in done.stderr and not cache.exists()
    expected = Translator.load(run, engine="pytorch").translate(lines)
    assert out.read_text().splitlines() == expected
    where = subprocess.run(
        [str(python), "-c", "import wtnmt, sys; print(wtnmt.__file__)"],
        env=env, capture_output=True, text=True,
    ).stdout  # fmt: skip
    assert where.startswith(str(tmp_path / "env"))  # the wheel's, not the checkout's
    version = subprocess.run([str(wtnmt_bin), "--version"], env=env, capture_output=True, text=True)
    assert version.stdout.strip() == f"wtnmt {wtnmt.__version__}"

    # the sdist: `pip install .` from its unpacked tree leaves the tree as it found it
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path / "sdist", filter="data")
    tree = next((tmp_path / "sdist").iterdir())
    before = _tree(tree)
    from_sdist = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q",
         "--target", str(tmp_path / "target"), str(tree)],
        env={**os.environ, "WTNMT_NATIVE_BUILD": "0"}, capture_output=True, text=True,
    )  # fmt: skip
    assert from_sdist.returncode == 0, from_sdist.stderr
    assert _tree(tree) == before
    assert (tmp_path / "target" / "wtnmt" / "cli.py").is_file()
