"""The files of an ONNX export and the directory that holds them: names, the metadata file,
what counts as ours, and work directories left by a killed export."""

from __future__ import annotations

from pathlib import Path

from wtnmt.errors import CheckpointError
from wtnmt.safe_files import remove_orphans

META = "export.json"
GRAPHS = ("encoder", "decoder_step")


class ExportError(CheckpointError):
    """An export that cannot be made or used; the message names the file or the reason."""


def graph_file(name: str, quantize: str) -> str:
    return f"{name}.onnx" if quantize == "none" else f"{name}.{quantize}.onnx"


def remove_stale_exports(target: Path) -> None:
    """The work directories of exports to ``target`` that were killed (``.NAME.PID.*.tmp`` of
    a process that is gone)."""
    remove_orphans(
        target.parent.glob(f".{target.name}.*.tmp"),
        lambda path: path.name[len(target.name) + 2 :].split(".", 1)[0],
    )


def ours() -> set[str]:
    return {META} | {graph_file(n, q) for n in GRAPHS for q in ("none", "int8")}


def lost_metadata(target: Path) -> bool:
    """An export of ours without its META: only our graphs' names there, and no META."""
    names = {p.name for p in target.iterdir()} if target.is_dir() else set()
    return bool(names) and META not in names and names <= ours()


def check_target(target: Path, force: bool) -> None:
    if target.exists() and not target.is_dir():
        raise ExportError(f"{target}: exists and is not a directory")
    if not target.is_dir() or not any(target.iterdir()):
        return
    if lost_metadata(target):
        if not force:
            raise ExportError(
                f"{target}: an export without its {META} (damaged); --force makes it again"
            )
        return
    if not (target / META).is_file():
        raise ExportError(f"{target}: not empty and not a wtnmt export; choose another --out")
    if not force:
        raise ExportError(f"{target}: holds an export already; --force replaces it")
    known = ours()
    others = sorted(p.name for p in target.iterdir() if p.name not in known)
    if others:
        raise ExportError(
            f"{target}: holds files an export did not write ({', '.join(others[:3])}); "
            "move them or choose another --out"
        )


__all__ = [
    "GRAPHS",
    "META",
    "ExportError",
    "check_target",
    "graph_file",
    "lost_metadata",
    "ours",
    "remove_stale_exports",
]
