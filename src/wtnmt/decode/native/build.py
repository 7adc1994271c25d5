"""Where the native engine's compiled library lives, and building it just in time without a
lock that can outlive its holder.

torch.utils.cpp_extension guards a build with a lock *file* (``BUILD/lock``) that a build
killed by SIGTERM or SIGKILL leaves behind; every later ``load`` of that extension then waits
for it forever, at 0% CPU. Here a build is guarded by an ``fcntl`` lock instead, which the
kernel releases when its holder dies however it dies, taken with a bounded wait; under it, a
lock file of torch's can only be a dead build's, and goes. A library already built is
imported directly: no compiler, no ninja, no lock, nothing written (a read-only cache, a
container image with the library built in).
"""

from __future__ import annotations

import errno
import fcntl
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from wtnmt.errors import EngineUnavailable

WAIT = 600.0  # seconds a process waits for another's build before decoding without it
POLL = 0.2
LOCK = "wtnmt.build.lock"  # the fcntl lock beside torch's own lock file


class BuildUnavailable(EngineUnavailable):
    """The build cannot be had now: its folder cannot be written, or another process's build
    outlasted the wait."""


def extensions_root() -> Path:
    """The folder torch.utils.cpp_extension builds under (``TORCH_EXTENSIONS_DIR``, else its
    default for this Python and accelerator), named without creating it."""
    import torch
    from torch.utils.cpp_extension import get_default_build_root

    own = os.environ.get("TORCH_EXTENSIONS_DIR")
    if own is not None:
        return Path(own)
    if torch.version.hip is not None:
        accelerator = f"rocm{torch.version.hip.replace('.', '')}"
    elif torch.version.cuda is not None:
        accelerator = f"cu{torch.version.cuda.replace('.', '')}"
    else:
        accelerator = "cpu"
    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return Path(get_default_build_root()) / f"{python}_{accelerator}"


def library(name: str) -> Path:
    return extensions_root() / name / f"{name}.so"


def import_library(name: str, path: Path) -> ModuleType:
    """The compiled module at ``path`` (torch imported first: it links against libtorch)."""
    import torch  # noqa: F401 -- its libraries loaded before the extension's

    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a loadable module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextmanager
def build_lock(
    directory: Path, *, wait: float = WAIT, say: Callable[[str], None] | None = None
) -> Iterator[None]:
    """Held while this process builds in ``directory`` (created); released when the block
    ends or the process dies. Waits at most ``wait`` seconds for another holder (saying so
    once), then raises BuildUnavailable; an unwritable folder is BuildUnavailable too. Under
    the lock, torch's lock file (a killed build's) is removed."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise BuildUnavailable(
            f"its build folder {directory} cannot be written ({e.strerror or e})"
        ) from None
    try:
        deadline = time.monotonic() + wait
        told = False
        while True:
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EACCES, errno.EAGAIN):
                    raise BuildUnavailable(f"{directory / LOCK}: cannot be locked ({e})") from None
            if time.monotonic() >= deadline:
                raise BuildUnavailable(
                    f"another process has been building it in {directory} for over {wait:.0f} s"
                )
            if not told and say is not None:
                say(f"waiting for another process's build of the native engine in {directory}")
                told = True
            time.sleep(POLL)
        stale = directory / "lock"  # torch's FileBaton: only a dead build leaves it now
        if stale.exists():
            stale.unlink(missing_ok=True)
        yield
    finally:
        os.close(fd)  # releases the lock


__all__ = [
    "LOCK",
    "WAIT",
    "BuildUnavailable",
    "build_lock",
    "extensions_root",
    "import_library",
    "library",
]
