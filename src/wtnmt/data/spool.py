"""Inputs that can be read only once (``-`` for stdin, /dev/stdin, a pipe, a process
substitution ``<(…)``), copied to files before prepare reads them: it reads the training
pairs in several passes, and a stream gives its lines to the first pass only."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from wtnmt.config import DataConfig
from wtnmt.data.io import DataError, no_such_file

INPUTS = ("train_src", "train_tgt", "train_tsv", "valid_src", "valid_tgt", "test_src", "test_tgt")


def spooled(config: DataConfig, where: Path, log: Callable[[str], None]) -> DataConfig:
    """``config`` with each input that can be read only once (``-`` for stdin, /dev/stdin, a
    pipe, a process substitution ``<(…)``) copied to a file in ``where`` first: prepare reads
    the training pairs in several passes. A named file that is not there is refused before
    any stream is read, so what was piped in is not consumed for nothing."""
    streams = []
    for key in INPUTS:
        value = getattr(config, key)
        if value is None:
            continue
        path = Path(value)
        if value == "-" or (path.exists() and not path.is_file() and not path.is_dir()):
            streams.append((key, value))
        elif not path.is_file():
            raise no_such_file(path)
    stdin = [f"data.{key}" for key, value in streams if value == "-"]
    if len(stdin) > 1:
        raise DataError(
            f"{' and '.join(stdin)} both read standard input (-), which gives its lines once:"
            " give all but one as files"
        )
    changes = {}
    for key, value in streams:
        where.mkdir(parents=True, exist_ok=True)
        target = where / key
        log(f"reading {value} (a stream) into a file first: prepare reads its inputs twice")
        with _open_stream(value) as f, open(target, "wb") as copy:
            shutil.copyfileobj(f, copy, 1 << 20)
        changes[key] = str(target)
    return dataclasses.replace(config, **changes) if changes else config


def _open_stream(value: str) -> BinaryIO:
    """The bytes of ``value``: a stream's path, or ``-`` for standard input (its descriptor,
    else its buffer where it has none, as under a test runner's capture)."""
    if value != "-":
        return open(value, "rb")
    if sys.stdin is None or sys.stdin.closed:
        raise DataError("-: standard input is closed; give the file's path instead")
    try:
        return open(sys.stdin.fileno(), "rb", closefd=False)
    except (OSError, ValueError):  # io.UnsupportedOperation: no descriptor
        buffer = getattr(sys.stdin, "buffer", None)
        if buffer is None:
            raise DataError("-: standard input cannot be read as bytes here") from None
        return contextlib.nullcontext(buffer)  # type: ignore[return-value]


__all__ = ["INPUTS", "spooled"]
