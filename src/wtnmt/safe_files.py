"""Writing files so that nothing a user has is lost: a file appears whole or not at all, an
output never replaces its own input, and what we write gets the permissions the user's umask
gives (as ``open`` would), not the 0600 of a temporary file.

The lowest layer of the package: it imports nothing of wtnmt.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def umask_mode() -> int:
    """The mode ``open(path, "w")`` would give a new file: 0666 less the umask."""
    return 0o666 & ~current_umask()


def process_gone(pid: int) -> bool:
    """Whether no process ``pid`` runs (this process counts as gone: its own leftovers are
    its to handle); one of another user's counts as running."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, under another user
        return False
    return False


def locked_by_another(lock: Path) -> bool:
    """Whether another process holds the ``fcntl`` lock on the file ``lock`` (a run being
    written now). Reads only: a lock taken here to ask is released at once."""
    if not lock.is_file():
        return False
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing releases it again where it was taken
    return False


def remove_orphans(paths: Iterable[Path], pid_of: Callable[[Path], str]) -> None:
    """The work directories among ``paths`` (named by the process that made them, as
    ``pid_of`` reads it) whose process is gone, a killed one: ours by their name, and of no
    use to anyone. This process's own are left to it."""
    for path in paths:
        pid = pid_of(path)
        if pid.isdigit() and path.is_dir() and int(pid) != os.getpid() and process_gone(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


@contextmanager
def _replacing(path: Path, mode: str, encoding: str | None) -> Iterator[IO]:  # type: ignore[type-arg]
    """A temporary file beside ``path`` (the umask's mode), fsynced and moved into place
    when the block ends without an error; removed when it does not."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, umask_mode())
        with os.fdopen(fd, mode, encoding=encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write(path: Path, data: bytes) -> None:
    """``data`` into ``path`` through a temporary file in the same directory, fsynced and
    moved into place: a reader sees the old file or the new one, never a part."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _replacing(path, "wb", None) as f:
        f.write(data)


def atomic_copy(path: Path, source: Path, chunk: int = 1 << 20) -> None:
    """The file ``source`` copied into ``path`` as ``atomic_write`` writes, a chunk at a
    time (never held in memory whole)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _replacing(path, "wb", None) as f, open(source, "rb") as src:
        shutil.copyfileobj(src, f, chunk)


def file_in_the_way(directory: str | Path) -> Path | None:
    """The file (not a directory) that stands where ``directory`` or one of its parents
    should be, so that it cannot be made: ``FILE/x`` → ``FILE``; None when there is none."""
    path = Path(directory)
    for candidate in (path, *path.parents):
        if candidate.exists() or candidate.is_symlink():
            return None if candidate.is_dir() else candidate
    return None


def is_same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one existing file (the same inode: links and ./ included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


@contextmanager
def output_file(path: str | Path, *, encoding: str = "utf-8") -> Iterator[IO[str]]:
    """A text file to write the output of a command into: a regular file (or a new one) is
    written to a temporary file beside it and moved into place when the block ends without an
    error, so that a failed command leaves the old file as it was; a device or a pipe
    (``/dev/stdout``, ``/dev/full``, a FIFO) is written directly."""
    path = Path(path)
    try:
        special = not stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        special = False
    try:
        with (
            open(path, "w", encoding=encoding) if special else _replacing(path, "w", encoding) as f
        ):
            yield f
    except OSError as e:
        if e.filename is not None:
            raise
        raise OSError(e.errno, e.strerror, str(path)) from None  # a write: name the file


__all__ = [
    "atomic_write",
    "current_umask",
    "file_in_the_way",
    "is_same_file",
    "output_file",
    "process_gone",
    "remove_orphans",
    "umask_mode",
]
