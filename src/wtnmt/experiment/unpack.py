"""`wtnmt unpack`: a pack's archives (`wtnmt experiment --pack DIR`) put back where the grid
puts each file, so that nothing already there is lost to an older or damaged copy.

Every archive is read through and its members staged on disk, a chunk at a time, before any
file is written, and nothing is written unless all of them hold: one cut short (a full disk,
a copy that stopped), one holding a path outside the working directory, a member twice, a
file where another member needs a directory (``exp/w`` and ``exp/w/x``), or more than
``--max-expanded`` bytes in all (an archive's sizes are not trusted to be a pack's) refuses
them all. Then each file:

- not there yet, or an earlier state of it there (the archive's starts with it, as a curve
  that grew): written, whole or not at all;
- the same bytes there: left;
- a longer file there that the archive's does not continue (an older pack, a curve cut
  short): kept, and said; ``--replace-longer`` takes the archive's;
- anything else there (a rescored ``scores.json``): replaced by the archive's, and said.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from wtnmt import stored
from wtnmt.config import ConfigError
from wtnmt.safe_files import atomic_copy, file_in_the_way, remove_orphans

MAX_EXPANDED = 2 << 30  # bytes all the archives named may expand to (--max-expanded)
CHUNK = 1 << 20
STAGING = ".wtnmt-unpack-"  # + pid + random: where members wait until all are checked


@dataclass
class Unpacked:
    written: list[Path] = field(default_factory=list)
    unchanged: list[Path] = field(default_factory=list)
    kept: list[Path] = field(default_factory=list)  # longer files the archive's would cut
    replaced: list[Path] = field(default_factory=list)  # files that differed


@dataclass(frozen=True)
class Member:
    archive: Path
    name: str  # normalized: "exp/./w" and "exp//w" are both "exp/w"
    staged: Path  # its bytes, on disk
    size: int


def archives_of(paths: list[Path]) -> list[Path]:
    """The archives named: files as given, directories as their results-NN.tar.gz in order."""
    found = []
    for path in paths:
        if path.is_dir():
            inside = sorted(path.glob("results-*.tar.gz"))
            if not inside:
                raise ConfigError(f"{path}: holds no results-NN.tar.gz (a --pack directory)")
            found += inside
        elif path.is_file():
            found.append(path)
        else:
            raise ConfigError(f"{path}: no such archive or directory")
    return found


def _name(archive: Path, member: tarfile.TarInfo) -> str:
    name = PurePosixPath(member.name)
    if not name.parts or name.is_absolute() or ".." in name.parts or not member.isfile():
        raise ConfigError(
            f"{archive}: holds {member.name!r}, not a file under the working directory; not "
            f"a pack of wtnmt's, nothing was unpacked"
        )
    return str(name)


def stage(archives: list[Path], staging: Path, max_expanded: int = MAX_EXPANDED) -> list[Member]:
    """Every member of ``archives``, in order, copied into ``staging`` a chunk at a time; a
    ConfigError naming the archive where one is damaged, holds a member twice or a name
    outside the working directory, or where they would expand past ``max_expanded`` bytes
    (counted from the headers before a byte is copied, and again as the bytes come)."""
    members: list[Member] = []
    total = 0

    def too_big(archive: Path) -> ConfigError:
        return ConfigError(
            f"{archive}: the archives would expand to more than {max_expanded:,} bytes "
            f"(--max-expanded; a pack of results is far less); nothing was unpacked"
        )

    for archive in archives:
        seen: set[str] = set()
        try:
            with tarfile.open(archive, mode="r:gz") as tar:
                for member in tar:
                    name = _name(archive, member)
                    if name in seen:
                        raise ConfigError(
                            f"{archive}: holds {name!r} twice (which one is meant?); not a "
                            f"pack of wtnmt's, nothing was unpacked"
                        )
                    seen.add(name)
                    if total + member.size > max_expanded:
                        raise too_big(archive)
                    source = tar.extractfile(member)
                    path = staging / str(len(members))
                    size = 0
                    with _staged(path) as out:
                        while source is not None and (chunk := source.read(CHUNK)):
                            size += len(chunk)
                            if total + size > max_expanded:
                                raise too_big(archive)
                            out(chunk)
                    total += size
                    members.append(Member(archive, name, path, size))
        except (tarfile.TarError, EOFError, zlib.error) as e:
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ConfigError(
                f"{archive}: damaged or cut short ({reason}); nothing was unpacked (pack "
                f"again, or copy it again)"
            ) from None
        except OSError as e:
            raise ConfigError(f"{archive}: cannot be read ({e}); nothing was unpacked") from None
    return members


@contextmanager
def _staged(path: Path) -> Iterator[Callable[[bytes], None]]:
    """A writer of the file ``path`` in the staging directory; where the disk refuses, a
    ConfigError that says so (not an archive's damage)."""

    def refused(e: OSError) -> ConfigError:
        return ConfigError(
            f"{path.parent}: staging the archives' files failed ({e.strerror or e}); nothing "
            f"was unpacked"
        )

    try:
        f = open(path, "wb")  # closed below, its errors told apart
    except OSError as e:
        raise refused(e) from None

    def write(chunk: bytes) -> None:
        try:
            f.write(chunk)
        except OSError as e:
            raise refused(e) from None

    try:
        yield write
    finally:
        try:
            f.close()
        except OSError as e:
            raise refused(e) from None


def check_places(members: list[Member], into: Path) -> None:
    """A ConfigError, before anything is written, where a member's file cannot go: another
    member (or a file already there) holds a name it needs as a directory, or a directory
    is where it goes."""
    where = {m.name: m.archive for m in members}
    for m in members:
        for parent in PurePosixPath(m.name).parents:
            if str(parent) in where:
                raise ConfigError(
                    f"{m.archive}: holds {m.name!r} under {str(parent)!r}, which "
                    f"{where[str(parent)].name} holds as a file; nothing was unpacked"
                )
        target = into / m.name
        if target.is_dir() and not target.is_symlink():
            raise ConfigError(
                f"{target}: is a directory where {m.archive} has a file; nothing was unpacked"
            )
        blocker = file_in_the_way(target.parent)
        if blocker is not None:
            raise ConfigError(
                f"{blocker}: is a file where {m.archive} needs a directory (for {m.name}); "
                f"nothing was unpacked"
            )


def _relation(member: Member, old: bytes) -> str:
    """``same``, ``continues`` (the member starts with ``old``) or ``other``."""
    if member.size < len(old):
        return "other"
    with open(member.staged, "rb") as f:
        if f.read(len(old)) != old:
            return "other"
    return "same" if member.size == len(old) else "continues"


def _write(target: Path, member: Member) -> None:
    """The member's bytes into ``target``, as the file is kept (its ``.gz`` where only that
    is there), whole or not at all."""
    if stored.compressed(target).is_file() and not target.exists():
        stored.write_as_kept(target, member.staged.read_bytes())
    else:
        atomic_copy(target, member.staged)


def _staging_base(into: Path) -> Path:
    """The nearest directory at or above ``into`` that exists: staging there keeps the
    members on the same disk as where they go."""
    base = into
    while not base.is_dir():
        base = base.parent
    return base


def unpack(
    paths: list[Path],
    into: Path,
    *,
    replace_longer: bool = False,
    max_expanded: int = MAX_EXPANDED,
    say: Callable[[str], None] = lambda _: None,
) -> Unpacked:
    archives = archives_of(paths)
    base = _staging_base(into)
    remove_orphans(base.glob(f"{STAGING}*"), lambda p: p.name[len(STAGING) :].split("-")[0])
    try:
        staging = Path(tempfile.mkdtemp(prefix=f"{STAGING}{os.getpid()}-", dir=base))
    except OSError as e:
        raise ConfigError(f"{base}: cannot stage the archives there ({e.strerror})") from None
    try:
        members = stage(archives, staging, max_expanded)  # all of them checked ...
        check_places(members, into)  # ... and placed before any write
        return _put(members, into, replace_longer, say)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _put(
    members: list[Member], into: Path, replace_longer: bool, say: Callable[[str], None]
) -> Unpacked:
    result = Unpacked()
    for m in members:
        target = into / m.name
        old = stored.read_bytes(target) if stored.exists(target) else None
        relation = "continues" if old is None else _relation(m, old)
        if relation == "same":
            result.unchanged.append(target)
        elif relation == "continues":
            _write(target, m)
            result.written.append(target)
        elif old is not None and len(old) > m.size and not replace_longer:
            result.kept.append(target)
            say(
                f"kept {target} ({len(old):,} bytes): {m.archive.name}'s is shorter "
                f"({m.size:,}) and does not continue it (--replace-longer takes it)"
            )
        else:
            _write(target, m)
            result.replaced.append(target)
            say(f"replaced {target}: {m.archive.name}'s differs")
    return result


__all__ = ["MAX_EXPANDED", "Member", "Unpacked", "archives_of", "check_places", "stage", "unpack"]
