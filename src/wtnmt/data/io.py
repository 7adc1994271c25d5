"""Reading parallel text: strict UTF-8, lines split on ``\\n`` only, errors that say where.

A sentence may contain any character but ``\\n``: U+2028, U+0085 or a form feed inside a
sentence stay inside it (``str.splitlines`` would split there and silently misalign the two
sides). A ``\\r`` before the ``\\n`` (Windows line ends) is removed.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import select
import stat
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO


class DataError(ValueError):
    """Input data that cannot be used as it is: the message says which file and where."""


def no_such_file(path: Path) -> DataError:
    """The error for an input that is not there, with the directory a relative path meant."""
    where = "" if path.is_absolute() else f" in {Path.cwd()} (the working directory)"
    return DataError(f"{path}: no such file{where}")


def decode_lines(data: bytes, name: str, *, first_line: int = 1, first_byte: int = 0) -> list[str]:
    """UTF-8 bytes → lines. Invalid UTF-8, or a NUL byte, raises DataError naming the line
    (and the byte offset; counted from ``first_line`` and ``first_byte`` when ``data`` is a
    piece of a stream)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + first_line
        start = data.rfind(b"\n", 0, e.start) + 1
        raise DataError(
            f"{name}: invalid UTF-8 on line {line} at byte offset {first_byte + e.start} "
            f"(byte {e.start - start} of the line): {data[e.start : e.start + 1]!r}"
        ) from None
    nul = text.find("\x00")
    if nul >= 0:  # no sentence holds one: binary data, or a damaged file
        raise DataError(
            f"{name}: line {text.count(chr(10), 0, nul) + first_line} holds a NUL byte (binary "
            f"data, or a damaged file): remove it"
        )
    if first_line == 1 and text.startswith("\ufeff"):  # a byte-order mark is no sentence
        text = text[1:]
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def stream_lines(path: str | Path | None, *, chunk: int) -> Iterator[tuple[int, list[str]]]:
    """Lines of a file (``.gz`` too), or of stdin for None or "-", as (number of the first
    line, up to ``chunk`` lines), strict UTF-8, split on ``\\n`` only.

    A chunk is handed on as soon as it is full or, on stdin, as soon as no more input is
    waiting: a pipe that stays open or a terminal gets each line answered before the input
    ends, and a long file is never read whole before its first line is answered.
    """
    stdin = path in (None, "-")
    name = "<stdin>" if stdin else str(path)
    regular = not stdin and _check_readable(path)  # type: ignore[arg-type]
    if stdin or not regular:  # stdin, /dev/stdin, a pipe, a process substitution
        source = contextlib.nullcontext() if stdin else open(path, "rb", buffering=0)  # type: ignore[arg-type]
        fd = sys.stdin.fileno() if stdin else source.fileno()  # type: ignore[union-attr]
        read = lambda: os.read(fd, 1 << 16)  # noqa: E731  (what is there, without waiting)
        waiting = lambda: bool(select.select([fd], [], [], 0)[0])  # noqa: E731
        with source:
            yield from chunked_lines(read, name, chunk=chunk, waiting=waiting)
        return
    with open_binary(path) as (f, _):  # type: ignore[arg-type]
        yield from chunked_lines(lambda: f.read(1 << 16), name, chunk=chunk)


@contextlib.contextmanager
def open_binary(path: str | Path) -> Iterator[tuple[BinaryIO, Callable[[], int]]]:
    """A file's bytes (decompressed for ``.gz``) and a function giving how many bytes of the
    file on disk have been consumed so far (the compressed ones for ``.gz``), for progress."""
    _check_readable(path)
    with open(path, "rb") as raw:
        if str(path).endswith(".gz"):
            with gzip.GzipFile(fileobj=raw, mode="rb") as f:
                yield f, raw.tell  # type: ignore[misc]
        else:
            yield raw, raw.tell


def chunked_lines(
    read: Callable[[], bytes],
    name: str,
    *,
    chunk: int,
    waiting: Callable[[], bool] = lambda: True,
) -> Iterator[tuple[int, list[str]]]:
    """(number of the first line, up to ``chunk`` lines) of the bytes ``read`` gives (b"" at
    the end), strict UTF-8, errors naming ``name``, line and byte offset. A chunk is handed on
    when full, at the end, or when ``waiting()`` says no more input is at hand."""
    line, offset = 1, 0
    pending: list[bytes] = []
    partial = b""
    while True:
        try:
            data = read()
        except (OSError, EOFError) as e:  # a damaged gzip stream, a member cut short
            raise DataError(f"{name}: cannot be read to its end ({e})") from None
        if data:
            *complete, partial = (partial + data).split(b"\n")
            pending.extend(complete)
        elif partial:
            pending.append(partial)
        while pending and (len(pending) >= chunk or not data or not waiting()):
            lines, pending = pending[:chunk], pending[chunk:]
            raw = b"\n".join(lines) + b"\n"
            yield line, decode_lines(raw, name, first_line=line, first_byte=offset)
            line, offset = line + len(lines), offset + len(raw)
        if not data:
            return


def _check_readable(path: str | Path) -> bool:
    """A DataError unless ``path`` is something to read lines from: a file, or a pipe or
    device (``/dev/stdin``, a process substitution). Returns whether it is a regular file."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e.strerror})") from None
    if stat.S_ISDIR(mode):
        raise DataError(f"{path}: is a directory, not a file of lines")
    return stat.S_ISREG(mode)


def read_bytes(path: str | Path) -> bytes:
    path = Path(path)
    if not _check_readable(path):
        with open(path, "rb") as f:  # a pipe or device: read to its end
            return f.read()
    if path.suffix == ".gz":
        with gzip.open(path, "rb") as f:
            try:
                return f.read()
            except (OSError, EOFError) as e:
                raise DataError(f"{path}: not a readable gzip file ({e})") from None
    return path.read_bytes()


def read_lines(path: str | Path) -> list[str]:
    """All lines of a UTF-8 text file (``.gz`` is decompressed)."""
    return decode_lines(read_bytes(path), str(path))


def read_parallel(src: str | Path, tgt: str | Path) -> list[tuple[str, str]]:
    """Two files, one sentence per line, line i of one the translation of line i of the other."""
    src_lines, tgt_lines = read_lines(src), read_lines(tgt)
    if len(src_lines) != len(tgt_lines):
        raise DataError(
            f"the two sides are not aligned: {src} has {len(src_lines)} lines and "
            f"{tgt} has {len(tgt_lines)}"
        )
    return list(zip(src_lines, tgt_lines, strict=True))


def split_tsv(
    lines: list[str], name: str, *, columns: int | tuple[int, ...] = 2, first_line: int = 1
) -> list[list[str]]:
    """Tab-separated lines → fields. Every line must have the same allowed number of columns
    (the first line decides among several allowed); a line that differs is named. Lines are
    numbered from ``first_line``; past line 1, ``columns`` is what line 1 had."""
    allowed = (columns,) if isinstance(columns, int) else columns
    rows = [line.split("\t") for line in lines]
    if not rows:
        return rows
    expected = len(rows[0]) if first_line == 1 else allowed[0]
    if expected not in allowed:
        raise DataError(
            f"{name}: line 1 has {expected} tab-separated columns; expected "
            f"{' or '.join(map(str, allowed))}"
        )
    for number, row in enumerate(rows, start=first_line):
        if len(row) != expected:
            raise DataError(
                f"{name}: line {number} has {len(row)} tab-separated columns, expected "
                f"{expected} like line 1"
            )
    return rows


def read_tsv(path: str | Path) -> list[tuple[str, str]]:
    """A TSV file of ``source<TAB>target`` lines."""
    rows = split_tsv(read_lines(path), str(path), columns=2)
    return [(row[0], row[1]) for row in rows]


def read_zip_member(path: str | Path, member: str) -> bytes:
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.read(member)
    except KeyError:
        raise DataError(f"{path}: the archive has no member {member!r}") from None
    except (zipfile.BadZipFile, OSError) as e:
        raise DataError(f"{path}: not a readable zip file ({e})") from None


__all__ = [
    "DataError",
    "chunked_lines",
    "decode_lines",
    "no_such_file",
    "open_binary",
    "read_bytes",
    "read_lines",
    "read_parallel",
    "read_tsv",
    "read_zip_member",
    "split_tsv",
    "stream_lines",
]
