"""The directory ``prepare`` writes: whether it is ours, and how a new build replaces an
old one without touching anything it did not write."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from wtnmt.data.io import DataError
from wtnmt.safe_files import atomic_write, process_gone, remove_orphans

SPLITS = ("train", "valid", "test")


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
    if out.is_dir() and any(out.iterdir()) and not (made_by_prepare(out) or _moving(out)):
        raise DataError(
            f"{out}: this directory was not made by wtnmt prepare (it has no manifest.json of "
            f"ours) and is not empty; refusing to replace it: give --out a new or empty "
            f"directory"
        )


def _names(values: object) -> list[str]:
    if not isinstance(values, list):
        return []
    return [f for f in values if isinstance(f, str) and f and "/" not in f and f not in (".", "..")]


def listed_files(directory: Path) -> list[str]:
    """The files the manifest of ``directory`` says prepare wrote (none for a manifest of
    before that list was kept); in a directory a move was cut short in, every file of the old
    build and of the new one."""
    moving = _moving(directory)
    if moving is not None:
        return sorted({*_names(moving.get("files")), *_names(moving.get("old"))})
    try:
        manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return _names(manifest.get("files") if isinstance(manifest, dict) else None)


# In a prepared directory while a new build's files are moved into it: the build's name, its
# files and the old build's. A kill in between leaves it, so the directory is still known as
# ours (its manifest is gone, so nothing trains on it) and the next prepare finishes the move.
MOVING = ".moving.json"


def _moving(directory: Path) -> dict | None:
    try:
        record = json.loads((directory / MOVING).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("build"), str) else None


def is_current(directory: Path, key: str) -> bool:
    """Whether ``directory`` holds a whole build of the inputs and options ``key`` names."""
    manifest_path = directory / "manifest.json"
    if not manifest_path.is_file():
        return False
    try:
        manifest = json.loads(manifest_path.read_text())
    except json.JSONDecodeError:
        return False
    if manifest.get("fingerprint") != key:
        return False
    from wtnmt.data.vocab import vocabularies_sha256, vocabulary_files

    joint = (manifest.get("options") or {}).get("joint_vocab", True)
    models = [directory / name for name in vocabulary_files(joint)]
    needed = [*models, directory / "summary.json"] + [
        directory / f"{split}.{side}{ext}"
        for split in SPLITS
        for side in ("src", "tgt")
        for ext in (".npy", ".idx.npy")
    ]
    return all(p.is_file() for p in needed) and vocabularies_sha256(
        directory, joint, pieces=False
    ) == manifest.get("vocab_sha256")


def move_into_place(built: Path, out: Path) -> None:
    """The files of a finished build into ``out``, each replaced atomically; the manifest
    first removed and last written, so that a build cut short in between is never taken for
    current, and a record of the move (``MOVING``) kept in ``out`` meanwhile, so that a kill
    in between leaves a directory the next prepare knows as its own and finishes
    (``finish_interrupted_move``). Only the files the old manifest lists are removed:
    anything else in ``out`` (a user's file, a run trained there) stays as it is."""
    if not out.exists():
        os.replace(built, out)
        return
    new = sorted(f.name for f in built.iterdir())
    old = sorted(set(listed_files(out)) - {MOVING})
    record = {"build": built.name, "files": new, "old": old}
    atomic_write(out / MOVING, json.dumps(record).encode())
    (out / "manifest.json").unlink(missing_ok=True)
    _move(built, out, new, old)


def _move(built: Path, out: Path, new: list[str], old: list[str]) -> None:
    for name in new:
        if name != "manifest.json" and (built / name).exists():
            os.replace(built / name, out / name)
    for name in sorted(set(old) - set(new)):
        path = out / name
        if path.is_file() or path.is_symlink():
            path.unlink()
    os.replace(built / "manifest.json", out / "manifest.json")
    (out / MOVING).unlink()


def finish_interrupted_move(out: Path, log) -> None:  # type: ignore[no-untyped-def]
    """A move into ``out`` that a kill cut short: finished where its build (``.NAME.tmp-PID``
    of a process that is gone) still holds every file not yet moved, manifest included;
    otherwise ``out`` stays without a manifest, ours, and the prepare builds it again."""
    record = _moving(out)
    if record is None:
        return
    built = out.parent / record["build"]
    pid = built.name.rpartition("-")[2]
    if pid.isdigit() and not process_gone(int(pid)):
        raise DataError(f"{out}: another prepare (process {pid}) is moving its build in")
    new, old = _names(record.get("files")), _names(record.get("old"))
    whole = (
        built.is_dir()
        and (built / "manifest.json").is_file()
        and all((built / n).exists() or (out / n).exists() for n in new)
    )
    if whole:
        _move(built, out, new, old)
        shutil.rmtree(built, ignore_errors=True)
        log(f"{out}: finished moving in the build an interrupted prepare left")


def remove_stale_builds(out: Path) -> None:
    """Builds of ``out`` left by a prepare that was killed (``.NAME.tmp-PID`` of a process
    that is gone): ours, by their name, and of no use to anyone."""
    remove_orphans(
        [
            *out.parent.glob(f".{out.name}.tmp-*"),
            *out.parent.glob(f".{out.name}.spool.tmp-*"),  # inputs read from a pipe
        ],
        lambda path: path.name.rpartition("-")[2],
    )


__all__ = [
    "check_output_directory",
    "finish_interrupted_move",
    "is_current",
    "listed_files",
    "made_by_prepare",
    "move_into_place",
    "remove_stale_builds",
]
