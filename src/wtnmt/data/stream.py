"""Training pairs as a stream: read in chunks, and read again on each pass, so that preparing
a corpus of any size never holds it whole in memory.

A ``PairStream`` yields lists of (source, target) pairs in corpus order. ``total`` is how far
its progress counts (bytes on disk, or pairs for a list; None where unknown) and ``position()``
how far a pass has come (both in ``unit``), for a progress bar with a rate and the time
left.
"""

from __future__ import annotations

import contextlib
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

from wtnmt.data.io import DataError, chunked_lines, open_binary, split_tsv

Pair = tuple[str, str]
CHUNK = 8192  # pairs a chunk: large enough for sentencepiece's batches, small in memory


class PairStream:
    total: int | None = None
    unit = "B"  # what total and position() count: bytes, or "pair"

    def chunks(self) -> Iterator[list[Pair]]:
        raise NotImplementedError

    def position(self) -> int:
        return 0

    def pairs(self) -> list[Pair]:
        """Every pair, in memory (for the seeded split of a corpus without dev and test)."""
        return [pair for chunk in self.chunks() for pair in chunk]


class PairList(PairStream):
    """Pairs already in memory (a small corpus, or what a seeded split kept for training)."""

    unit = "pair"

    def __init__(self, pairs: list[Pair]) -> None:
        self._pairs, self.total, self._done = pairs, len(pairs), 0

    def chunks(self) -> Iterator[list[Pair]]:
        for start in range(0, len(self._pairs), CHUNK):
            self._done = min(start + CHUNK, len(self._pairs))
            yield self._pairs[start : start + CHUNK]

    def position(self) -> int:
        return self._done

    def pairs(self) -> list[Pair]:
        return self._pairs


def _aligned(
    src: Iterator[tuple[int, list[str]]],
    tgt: Iterator[tuple[int, list[str]]],
    names: tuple[str, str],
) -> Iterator[list[Pair]]:
    """Two line streams chunked alike → chunks of pairs. Sides of different lengths are an
    error that counts both to their ends."""
    seen = 0
    while True:
        a, b = next(src, None), next(tgt, None)
        if a is None and b is None:
            return
        xs, ys = a[1] if a else [], b[1] if b else []
        if len(xs) != len(ys):
            lines = [
                seen + len(side) + sum(len(c) for _, c in rest)
                for side, rest in ((xs, src), (ys, tgt))
            ]
            raise DataError(
                f"the two sides are not aligned: {names[0]} has {lines[0]} lines and "
                f"{names[1]} has {lines[1]}"
            )
        seen += len(xs)
        yield list(zip(xs, ys, strict=True))


class ParallelFiles(PairStream):
    """Two line-aligned files (``.gz`` too); progress in bytes of the files on disk."""

    def __init__(self, src: str | Path, tgt: str | Path) -> None:
        self.src, self.tgt = Path(src), Path(tgt)
        self.total = self.src.stat().st_size + self.tgt.stat().st_size
        self._position: Callable[[], int] = lambda: 0

    def chunks(self) -> Iterator[list[Pair]]:
        with open_binary(self.src) as (a, where_a), open_binary(self.tgt) as (b, where_b):
            self._position = lambda: where_a() + where_b()
            src = chunked_lines(lambda: a.read(1 << 16), str(self.src), chunk=CHUNK)
            tgt = chunked_lines(lambda: b.read(1 << 16), str(self.tgt), chunk=CHUNK)
            yield from _aligned(src, tgt, (str(self.src), str(self.tgt)))

    def position(self) -> int:
        return self._position()


class TsvFile(PairStream):
    """One file of ``source<TAB>target`` lines."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.total = self.path.stat().st_size
        self._position: Callable[[], int] = lambda: 0

    def chunks(self) -> Iterator[list[Pair]]:
        with open_binary(self.path) as (f, where):
            self._position = where
            for first, lines in chunked_lines(lambda: f.read(1 << 16), str(self.path), chunk=CHUNK):
                rows = split_tsv(lines, str(self.path), columns=2, first_line=first)
                yield [(row[0], row[1]) for row in rows]

    def position(self) -> int:
        return self._position()


@contextlib.contextmanager
def _member(archive: Path, member: str) -> Iterator[Callable[[], bytes]]:
    """A member of a tar archive as a stream of bytes (decompressed for ``.gz`` members)."""
    import gzip

    try:
        tar = tarfile.open(archive)
    except (tarfile.TarError, OSError) as e:
        raise DataError(f"{archive}: not a readable tar archive ({e})") from None
    with tar:
        try:
            handle = tar.extractfile(tar.getmember(member))
        except KeyError:
            handle = None
        except (tarfile.TarError, OSError, EOFError) as e:
            raise DataError(f"{archive}: not a readable tar archive ({e})") from None
        if handle is None:
            raise DataError(f"{archive}: the archive has no member {member!r}")
        with handle:
            if member.endswith(".gz"):
                with gzip.GzipFile(fileobj=handle, mode="rb") as f:
                    yield lambda: f.read(1 << 16)
            else:
                yield lambda: handle.read(1 << 16)


class ArchivePairs(PairStream):
    """Line-aligned members of tar archives, one (archive, source member, target member) a
    corpus, read one after the other; progress in bytes of the source members read (no
    total: an archive's members are sized only by reading it)."""

    def __init__(self, parts: list[tuple[Path, str, str]]) -> None:
        self.parts = parts
        self._done, self._current = 0, 0

    def chunks(self) -> Iterator[list[Pair]]:
        self._done, self._current = 0, 0
        for archive, src, tgt in self.parts:
            with _member(archive, src) as read_src, _member(archive, tgt) as read_tgt:

                def read() -> bytes:
                    data = read_src()
                    self._current += len(data)
                    return data

                names = (f"{archive.name}:{src}", f"{archive.name}:{tgt}")
                lines = chunked_lines(read, names[0], chunk=CHUNK)
                other = chunked_lines(read_tgt, names[1], chunk=CHUNK)
                yield from _aligned(lines, other, names)
            self._done, self._current = self._done + self._current, 0

    def position(self) -> int:
        return self._done + self._current


__all__ = ["CHUNK", "ArchivePairs", "PairList", "PairStream", "ParallelFiles", "TsvFile"]
