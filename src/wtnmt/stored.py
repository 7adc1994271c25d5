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
import json
import sys
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from wtnmt.safe_files import atomic_write, locked_by_another

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
    return _gunzip(found, data) if found.name.endswith(GZ) else data


def _gunzip(path: Path, data: bytes) -> bytes:
    """``data`` (the bytes of ``path``) decompressed; an OSError naming ``path`` where they
    are not whole gzip (cut short by a full disk or a kill, or not gzip at all)."""
    try:
        return gzip.decompress(data)
    except EOFError:
        reason = "a gzip file cut short (damaged: truncated by a full disk or a kill)"
    except (gzip.BadGzipFile, zlib.error) as e:
        reason = f"not a whole gzip file ({e})"
    raise OSError(None, reason, str(path))


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
    packed = compressed(path)
    if packed.is_file() and not path.exists():
        atomic_write(packed, gzip_bytes(data))
        return packed
    atomic_write(path, data)
    return path


def reopen(path: Path) -> str | None:
    """``path`` made the one plain file a writer appends to, its earlier lines whole: where
    only ``path.gz`` is kept (a finished run compressed, now resumed), it is decompressed back
    (written whole, then the ``.gz`` goes); where both are (a resume before this was done),
    they are joined when the ``.gz`` ends before the plain file begins, or the plain file goes
    on from the ``.gz``'s lines. Returns what was done (None: nothing to do); an OSError naming
    both where neither holds: nothing is removed then."""
    packed = compressed(path)
    if not packed.is_file():
        return None
    earlier = _gunzip(packed, packed.read_bytes())
    if earlier and not earlier.endswith(b"\n"):
        earlier += b"\n"  # a last line cut short stays one line
    if not path.exists():
        atomic_write(path, earlier)
        packed.unlink()
        return f"{packed.name} decompressed to {path.name} to append to"
    later = path.read_bytes()
    if later.startswith(earlier):
        whole = later
    elif _last_step(earlier) < _first_step(later):
        whole = earlier + later
    else:
        raise OSError(
            None,
            f"both {path.name} and {packed.name} are here and neither goes on from the other "
            f"(steps overlap): join them by hand",
            str(path),
        )
    atomic_write(path, whole)
    packed.unlink()
    return f"{packed.name} and {path.name} joined into {path.name}"


def _steps(data: bytes) -> list[int]:
    found = []
    for line in data.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("step"), int):
            found.append(entry["step"])
    return found


def _first_step(data: bytes) -> float:
    return min(_steps(data), default=float("inf"))


def _last_step(data: bytes) -> float:
    return max(_steps(data), default=float("-inf"))


def remove(path: str | Path) -> None:
    """``path`` gone however it is kept (plain and ``.gz``)."""
    path = Path(path)
    path.unlink(missing_ok=True)
    compressed(path).unlink(missing_ok=True)


def compress(path: Path) -> Path:
    """``path`` → ``path.gz``, written whole (a temporary file renamed) and read back before
    ``path`` is removed; returns the ``.gz``."""
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
    return locked_by_another(run_dir / ".lock")


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
        if compressed(path).exists() and not path.name.endswith("metrics.jsonl"):
            compressed(path).unlink()  # a decoding, written whole: the plain one is newer
        elif compressed(path).exists():  # a curve: joined (never a part dropped), or left
            try:
                print(f"{path.parent}: {reopen(path)}", file=sys.stderr)
            except OSError as e:
                print(
                    f"python -m wtnmt.stored: {e.filename}: {e.strerror}; left as they are",
                    file=sys.stderr,
                )
                continue
        size = path.stat().st_size
        packed = compress(path)
        before, after, count = before + size, after + packed.stat().st_size, count + 1
    print(f"{count} files compressed: {before / 1e6:.1f} MB → {after / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
