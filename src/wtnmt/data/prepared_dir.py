"""The directory ``prepare`` writes: whether it is ours, and how a new build replaces an
old one without touching anything it did not write."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from wtnmt.data.io import DataError


def made_by_prepare(directory: Path) -> bool:
    """Whether ``directory`` holds a manifest that ``prepare`` wrote."""
    try:
        manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and {"version", "fingerprint", "inputs"} <= manifest.keys()


def check_output_directory(out: Path) -> None:
    """Refuse, before any work, an ``out`` that is not ours to replace: a file, or a
    non-empty directory that ``prepare`` did not make (a corpus folder, the working
    directory). Nothing a user gave us is ever moved or deleted."""
    from wtnmt.safe_files import file_in_the_way

    blocked = file_in_the_way(out)
    if blocked == out:
        raise DataError(f"{out}: is a file; --out names the directory to prepare into")
    if blocked is not None:
        raise DataError(f"{out}: {blocked} is a file, not a directory")
    if out.is_dir() and any(out.iterdir()) and not made_by_prepare(out):
        raise DataError(
            f"{out}: this directory was not made by wtnmt prepare (it has no manifest.json of "
            f"ours) and is not empty; refusing to replace it: give --out a new or empty "
            f"directory"
        )


def listed_files(directory: Path) -> list[str]:
    """The files the manifest of ``directory`` says prepare wrote (none for a manifest of
    before that list was kept)."""
    try:
        manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, list):
        return []
    return [f for f in files if isinstance(f, str) and f and "/" not in f and f not in (".", "..")]


def move_into_place(built: Path, out: Path) -> None:
    """The files of a finished build into ``out``, each replaced atomically; the manifest
    first removed and last written, so that a build cut short in between is never taken for
    current. Only the files the old manifest lists are removed: anything else in ``out`` (a
    user's file, a run trained there) stays as it is."""
    if not out.exists():
        os.replace(built, out)
        return
    old = set(listed_files(out))
    (out / "manifest.json").unlink(missing_ok=True)
    new = {f.name for f in built.iterdir()}
    for name in sorted(new - {"manifest.json"}):
        os.replace(built / name, out / name)
    for name in sorted(old - new):
        path = out / name
        if path.is_file() or path.is_symlink():
            path.unlink()
    os.replace(built / "manifest.json", out / "manifest.json")


def remove_stale_builds(out: Path) -> None:
    """Builds of ``out`` left by a prepare that was killed (``.NAME.tmp-PID`` of a process
    that is gone): ours, by their name, and of no use to anyone."""
    for path in out.parent.glob(f".{out.name}.tmp-*"):
        pid = path.name.rpartition("-")[2]
        if not (pid.isdigit() and path.is_dir()) or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:  # alive, under another user
            continue


__all__ = [
    "check_output_directory",
    "listed_files",
    "made_by_prepare",
    "move_into_place",
    "remove_stale_builds",
]
