"""Inputs that can be read only once (``-`` for stdin, /dev/stdin, a pipe, a process
substitution ``<(…)``), copied to files before prepare reads them: it reads the training
pairs in several passes, and a stream gives its lines to the first pass only."""

from __future__ import annotations

import dataclasses
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from wtnmt.config import DataConfig

INPUTS = ("train_src", "train_tgt", "train_tsv", "valid_src", "valid_tgt", "test_src", "test_tgt")


def spooled(config: DataConfig, where: Path, log: Callable[[str], None]) -> DataConfig:
    """``config`` with each input that can be read only once (``-`` for stdin, /dev/stdin, a
    pipe, a process substitution ``<(…)``) copied to a file in ``where`` first: prepare reads
    the training pairs in several passes."""
    changes = {}
    for key in INPUTS:
        value = getattr(config, key)
        if value is None:
            continue
        path = Path(value)
        if value != "-" and not (path.exists() and not path.is_file() and not path.is_dir()):
            continue
        where.mkdir(parents=True, exist_ok=True)
        target = where / key
        log(f"reading {value} (a stream) into a file first: prepare reads its inputs twice")
        with (
            (
                open(sys.stdin.fileno(), "rb", closefd=False) if value == "-" else open(path, "rb")
            ) as f,
            open(target, "wb") as copy,
        ):
            shutil.copyfileobj(f, copy, 1 << 20)
        changes[key] = str(target)
    return dataclasses.replace(config, **changes) if changes else config


__all__ = ["INPUTS", "spooled"]
