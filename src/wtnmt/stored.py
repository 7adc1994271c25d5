"""Results kept compressed: a run's ``metrics.jsonl`` and kept decodings (``eval/*.hyp``) may be
stored as ``NAME.gz`` where they are committed (``experiments/``), and every reader finds either.

``python -m wtnmt.stored DIR…`` compresses the finished results under each DIR: gzip at level
9 with no name or time in the header, so the same file always gives the same bytes (a
repository keeps one copy). A run directory still being written, or one that can resume (it
has ``checkpoints/`` and no ``finished.json``), is left alone: its training appends to the
plain file.
"""

from __future__ import annotations

import argparse
import gzip
import io
import os
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

GZ = ".gz"
# what is stored compressed: a run's curve, a try's curve, kept decodings
PATTERNS = ("metrics.jsonl", "*.metrics.jsonl", "*.hyp", "*.hyp.~*~")


def compressed(path: Path) -> Path:
    return path.with_name(path.name + GZ)


def stored(path: str | Path) -> Path | None:
    """The file ``path`` is kept in: itself, else its ``.gz``; None where neither is."""
    path = Path(path)
    if path.is_file():
        return path
    packed = compressed(path)
    return packed if packed.is_file() else None


def exists(path: str | Path) -> bool:
    return stored(path) is not None


def read_bytes(path: str | Path) -> bytes:
    """The bytes of ``path``, read from its ``.gz`` where only that is there; a
    FileNotFoundError naming ``path`` where neither is."""
    found = stored(path)
    if found is None:
        raise FileNotFoundError(2, "No such file or directory", str(path))
    data = found.read_bytes()
    return gzip.decompress(data) if found.name.endswith(GZ) else data


def read_text(path: str | Path, encoding: str = "utf-8") -> str:
    return read_bytes(path).decode(encoding)


def open_lines(path: str | Path) -> io.BytesIO:
    """``path`` (or its ``.gz``) as a binary file to read lines from."""
    return io.BytesIO(read_bytes(path))


def gzip_bytes(data: bytes) -> bytes:
    """``data`` gzipped the same way every time (level 9, no file name, time 0)."""
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", compresslevel=9, fileobj=out, mtime=0) as f:
        f.write(data)
    return out.getvalue()


def write_as_kept(path: Path, data: bytes) -> Path:
    """``data`` written whole to ``path``, or to its ``.gz`` (compressed) where the file is
    kept compressed (only the ``.gz`` is there); returns the file written."""
    from wtnmt.safe_files import atomic_write

    packed = compressed(path)
    if packed.is_file() and not path.exists():
        atomic_write(packed, gzip_bytes(data))
        return packed
    atomic_write(path, data)
    return path


def remove(path: str | Path) -> None:
    """``path`` gone however it is kept (plain and ``.gz``)."""
    path = Path(path)
    path.unlink(missing_ok=True)
    compressed(path).unlink(missing_ok=True)


def compress(path: Path) -> Path:
    """``path`` → ``path.gz``, written whole (a temporary file renamed) and read back before
    ``path`` is removed; returns the ``.gz``."""
    from wtnmt.safe_files import atomic_write

    data = path.read_bytes()
    target = compressed(path)
    atomic_write(target, gzip_bytes(data))
    if gzip.decompress(target.read_bytes()) != data:  # never lose the original to a bad copy
        target.unlink()
        raise OSError(f"{target}: does not read back as {path}")
    path.unlink()
    return target


def _busy(run_dir: Path) -> bool:
    """Whether a run directory may still be appended to: a process holds its lock, or it can
    resume (checkpoints and no finished.json)."""
    if (run_dir / "checkpoints").is_dir() and not (run_dir / "finished.json").is_file():
        return True
    if (run_dir / ".lock").is_file():
        from wtnmt.rundir.run import RunDirectory

        return RunDirectory(run_dir).busy()
    return False


def candidates(roots: Iterable[Path]) -> Iterator[Path]:
    """The plain files under ``roots`` that ``PATTERNS`` names and no run is writing."""
    for root in roots:
        for pattern in PATTERNS:
            for path in sorted(root.rglob(pattern)):
                if not path.is_file() or path.is_symlink():
                    continue
                run_dir = path.parent.parent if path.parent.name == "eval" else path.parent
                if not _busy(run_dir):
                    yield path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m wtnmt.stored", description=__doc__)
    parser.add_argument("dirs", nargs="+", type=Path, metavar="DIR")
    args = parser.parse_args(argv)
    for root in args.dirs:
        if not root.is_dir():
            print(f"python -m wtnmt.stored: {root}: no such directory", file=sys.stderr)
            return 2
    before = after = count = 0
    for path in candidates(args.dirs):
        size = path.stat().st_size
        if compressed(path).exists():  # both: the plain file is the newer write
            os.unlink(compressed(path))
        packed = compress(path)
        before, after, count = before + size, after + packed.stat().st_size, count + 1
    print(f"{count} files compressed: {before / 1e6:.1f} MB → {after / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
