"""`wtnmt unpack`: a pack's archives (`wtnmt experiment --pack DIR`) put back where the grid
puts each file, so that nothing already there is lost to an older or damaged copy.

Every archive is read whole and checked before any file is written: one cut short (a full
disk, a copy that stopped) or holding a path outside the working directory refuses them all,
nothing written. Then each file:

- not there yet, or an earlier state of it there (the archive's starts with it, as a curve
  that grew): written, whole or not at all;
- the same bytes there: left;
- a longer file there that the archive's does not continue (an older pack, a curve cut
  short): kept, and said; ``--replace-longer`` takes the archive's;
- anything else there (a rescored ``scores.json``): replaced by the archive's, and said.
"""

from __future__ import annotations

import tarfile
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from wtnmt import stored
from wtnmt.config import ConfigError


@dataclass
class Unpacked:
    written: list[Path] = field(default_factory=list)
    unchanged: list[Path] = field(default_factory=list)
    kept: list[Path] = field(default_factory=list)  # longer files the archive's would cut
    replaced: list[Path] = field(default_factory=list)  # files that differed


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


def read_archive(path: Path) -> dict[str, bytes]:
    """Every file of ``path`` by its name; a ConfigError naming the archive where it is cut
    short or damaged, or holds anything but plain files under relative paths."""
    files: dict[str, bytes] = {}
    try:
        with tarfile.open(path, mode="r:gz") as tar:
            for member in tar:
                name = PurePosixPath(member.name)
                if name.is_absolute() or ".." in name.parts or not member.isfile():
                    raise ConfigError(
                        f"{path}: holds {member.name!r}, not a file under the working "
                        f"directory; not a pack of wtnmt's"
                    )
                data = tar.extractfile(member)
                files[str(name)] = data.read() if data is not None else b""
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(
            f"{path}: damaged or cut short ({reason}); nothing was unpacked (pack again, or "
            f"copy it again)"
        ) from None
    return files


def unpack(
    paths: list[Path],
    into: Path,
    *,
    replace_longer: bool = False,
    say: Callable[[str], None] = lambda _: None,
) -> Unpacked:
    archives = archives_of(paths)
    contents = [read_archive(a) for a in archives]  # all of them checked before any write
    result = Unpacked()
    for archive, files in zip(archives, contents, strict=True):
        for name, data in files.items():
            target = into / name
            if target.is_dir():
                raise ConfigError(f"{target}: is a directory where {archive} has a file")
            old = stored.read_bytes(target) if stored.exists(target) else None
            if old == data:
                result.unchanged.append(target)
            elif old is None or data.startswith(old):
                stored.write_as_kept(target, data)
                result.written.append(target)
            elif len(old) > len(data) and not replace_longer:
                result.kept.append(target)
                say(
                    f"kept {target} ({len(old):,} bytes): {archive.name}'s is shorter "
                    f"({len(data):,}) and does not continue it (--replace-longer takes it)"
                )
            else:
                stored.write_as_kept(target, data)
                result.replaced.append(target)
                say(f"replaced {target}: {archive.name}'s differs")
    return result


__all__ = ["Unpacked", "archives_of", "read_archive", "unpack"]
