"""A grid's small results, apart from the weights: packed into a few archives of bounded size
to carry off a machine that keeps the weights (`--pack DIR`: a rented GPU, a cluster's scratch
disk), or copied from a run trained outside the work tree to where the grid file puts it
(`--work-dir DIR`: checkpoints on a disk that outlives the work tree, results where they are
committed).

Each run directory of the grid gives what is committed of it: ``config.yaml``,
``finished.json``, ``scores.json``, ``metrics.jsonl``, ``machines.jsonl`` and ``eval/``
(scores and decodings); never weights. A run trained in a work directory and stopped before
it finished gives its curve instead, as ``interrupted/<run>.tryN.*`` beside the grid's
results. The files are laid
greedily into ``results-01.tar.gz``, ``results-02.tar.gz``, …, each at most ``max_bytes``, at
most ``max_files`` of them, paths as the grid names them (``wtnmt unpack`` in the same
working directory puts every file back where it was: experiment/unpack.py). What cannot fit
is refused before anything is written, naming the largest file and the room asked.
"""

from __future__ import annotations

import gzip
import io
import os
import re
import tarfile
from pathlib import Path

import yaml

from wtnmt import stored
from wtnmt.config import ConfigError
from wtnmt.experiment.grid import Grid, RunSpec
from wtnmt.experiment.plan import FINISHED, run_differences
from wtnmt.rundir import atomic_write
from wtnmt.rundir.run import with_defaults
from wtnmt.runtime import MACHINES

RESULT_FILES = ("config.yaml", "finished.json", "scores.json", "metrics.jsonl", MACHINES)
_ENTRY = 1024  # a tar header and padding, and a margin for gzip's framing
_ARCHIVE = re.compile(r"results-\d{2,}\.tar\.gz")
_PARTIAL = re.compile(r"\.results-\d{2,}\.tar\.gz\.partial")


def run_result_files(run_dir: Path) -> list[Path]:
    """The small results of one run directory that are there."""
    found = [run_dir / name for name in RESULT_FILES if (run_dir / name).is_file()]
    evaluated = run_dir / "eval"
    if evaluated.is_dir():
        found += sorted(p for p in evaluated.iterdir() if p.is_file())
    return found


def result_files(grid: Grid) -> list[Path]:
    """The small results of every run of ``grid`` that exists, in the grid's order."""
    return [path for spec in grid.runs for path in run_result_files(spec.run_dir)]


def copy_results(spec: RunSpec) -> int:
    """Copy the small results of a run trained in a work directory to its ``results_dir``
    (files of those names there are the same run's, checked when the grid was planned);
    returns how many files changed."""
    if spec.results_dir is None:
        return 0
    return sum(
        _write_if_changed(spec.results_dir / path.relative_to(spec.run_dir), path.read_bytes())
        for path in run_result_files(spec.run_dir)
    )


def _write_if_changed(target: Path, data: bytes) -> bool:
    """Write ``data`` to ``target`` (atomically, its folder made) unless it holds them; a
    file kept compressed stays so (``wtnmt.stored``)."""
    if stored.exists(target) and stored.read_bytes(target) == data:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    stored.write_as_kept(target, data)
    return True


def _tries_dir(results: Path) -> Path:
    """Where the grid keeps the tries of the run whose results go to ``results``."""
    return results.parent / "interrupted"


def _try_files(where: Path, run: str, number: int) -> tuple[Path, Path]:
    """The config and the curve of try ``number`` of ``run`` kept in ``where``."""
    return where / f"{run}.try{number}.config.yaml", where / f"{run}.try{number}.metrics.jsonl"


def keep_interrupted_curve(spec: RunSpec) -> tuple[Path, Path] | None:
    """A run trained in a work directory and stopped before it finished: its config and curve
    copied beside the grid's results, as ``interrupted/<run>.tryN.config.yaml`` and
    ``….tryN.metrics.jsonl``, since a work directory can be lost with its machine. The copy
    an earlier stop of the same attempt made (the same config, a curve this one goes on from)
    is brought up to date; any other try there, one a person wrote too, is left as it is and
    this one takes the next N. Returns the copies' paths (config, curve), or None where
    nothing was kept (a run trained where the grid puts it, one past training, or one that has
    logged nothing)."""
    if (spec.run_dir / FINISHED).is_file() or (attempt := _attempt(spec)) is None:
        return None
    results, settings, curve = attempt
    where = _tries_dir(results)
    number = _own_try(where, spec.name, settings, curve)
    if number is None:
        tries = _tries(where, spec.name)
        number = (tries[-1] if tries else 0) + 1
    kept = _try_files(where, spec.name, number)
    for target, data in zip(kept, (settings, curve), strict=True):
        _write_if_changed(target, data)
    return kept


def drop_finished_curve(spec: RunSpec) -> tuple[Path, Path] | None:
    """A run finished in a work directory, its results copied where the grid puts them: the
    copy of its curve that a stop of the same attempt kept in ``interrupted/`` is removed,
    since the results hold that curve whole (it is the start of theirs, under the same
    settings). Tries of other attempts, and files a person wrote, stay. Returns the removed
    copies' paths (config, curve), or None where none was removed."""
    if not (spec.run_dir / FINISHED).is_file() or (attempt := _attempt(spec)) is None:
        return None
    results, settings, curve = attempt
    copied = results / "metrics.jsonl"
    if not stored.exists(copied) or stored.read_bytes(copied) != curve:  # not copied yet: kept
        return None
    where = _tries_dir(results)
    number = _own_try(where, spec.name, settings, curve)
    if number is None:
        return None
    kept = _try_files(where, spec.name, number)
    for path in kept:
        stored.remove(path)
    return kept


def kept_tries(spec: RunSpec) -> list[Path]:
    """The curves of the tries of a run trained in a work directory that the grid keeps in
    ``interrupted/`` (``…/<run>.tryN.metrics.jsonl``), in order; none for a run trained where
    the grid puts it."""
    if spec.results_dir is None:
        return []
    where = _tries_dir(spec.results_dir)
    return [_try_files(where, spec.name, n)[1] for n in _tries(where, spec.name)]


def _attempt(spec: RunSpec) -> tuple[Path, bytes, bytes] | None:
    """Where the grid puts a run trained in a work directory, and the run's settings and curve
    there; None for a run trained where the grid puts it, or one that has logged nothing."""
    config, metrics = spec.run_dir / "config.yaml", spec.run_dir / "metrics.jsonl"
    if spec.results_dir is None or not (config.is_file() and metrics.is_file()):
        return None
    curve = metrics.read_bytes()
    return (spec.results_dir, config.read_bytes(), curve) if curve else None


def _own_try(where: Path, run: str, settings: bytes, curve: bytes) -> int | None:
    """The N of the try in ``where`` that an earlier stop of this attempt kept, if any."""
    return next(
        (n for n in _tries(where, run) if _continues(_try_files(where, run, n), settings, curve)),
        None,
    )


def _tries(where: Path, run: str) -> list[int]:
    """The numbers N of the ``<run>.tryN.metrics.jsonl`` in ``where``, in order."""
    pattern = re.compile(re.escape(run) + r"\.try(\d+)\.metrics\.jsonl(?:\.gz)?")
    return sorted(
        {
            int(found[1])
            for path in (where.iterdir() if where.is_dir() else ())
            if (found := pattern.fullmatch(path.name))
        }
    )


def _continues(kept: tuple[Path, Path], settings: bytes, curve: bytes) -> bool:
    """Whether the try ``kept`` (config, curve) is an earlier stop of this attempt."""
    config, metrics = kept
    return (
        config.is_file()
        and _same_settings(config.read_bytes(), settings)
        and stored.exists(metrics)
        and curve.startswith(stored.read_bytes(metrics))
    )


def _same_settings(kept: bytes, settings: bytes) -> bool:
    """The same bytes, or settings under which the runner resumes one run from the other
    (``run_differences``: keys added to wtnmt since at their defaults, budget and threads
    aside); a resumed run writes its config.yaml with every key of the day."""
    if kept == settings:
        return True
    try:
        before, after = yaml.safe_load(kept), yaml.safe_load(settings)
    except yaml.YAMLError:
        return False
    if not (isinstance(before, dict) and isinstance(after, dict)):
        return False
    try:
        return not run_differences(with_defaults(before), with_defaults(after))
    except (KeyError, TypeError, AttributeError):  # not a run's config: a file a person wrote
        return False


def _name(path: Path) -> str:
    """The path an archive gives ``path``: as from the working directory, so that extracting
    there puts it back (a path outside it keeps its full form, less the leading /)."""
    relative = os.path.relpath(path)
    return str(path).lstrip("/") if relative.startswith("..") else relative


def _compressed_size(data: bytes) -> int:
    return len(gzip.compress(data, compresslevel=6)) + _ENTRY


def plan_archives(
    files: list[Path], *, max_bytes: int, max_files: int, sizes: dict[Path, int] | None = None
) -> list[list[Path]]:
    """``files`` in groups whose compressed size (estimated file by file) fits ``max_bytes``;
    a ConfigError if one file alone, or all of them in ``max_files`` groups, do not fit.
    ``sizes``: the compressed size of files not written yet (a run's config before it trains)."""
    groups: list[list[Path]] = [[]]
    room = max_bytes - _ENTRY
    for path in files:
        size = (sizes or {}).get(path) or _compressed_size(path.read_bytes())
        if size > max_bytes - _ENTRY:
            raise ConfigError(
                f"--pack: {path} compresses to {size:,} bytes, over the {max_bytes:,} an "
                f"archive may hold (--pack-size)"
            )
        if size > room:
            groups.append([])
            room = max_bytes - _ENTRY
        groups[-1].append(path)
        room -= size
    if len(groups) > max_files:
        raise ConfigError(
            f"--pack: the results need {len(groups)} archives of {max_bytes:,} bytes, more "
            f"than --pack-files {max_files}; pack fewer runs (--only) or allow more"
        )
    return [g for g in groups if g]


def _packed(spec: RunSpec) -> dict[Path, Path]:
    """What a run gives the archives, each file with the path it is put back at: a run trained
    in a work directory as where the grid puts it, or, stopped before it finished, as its
    curve in the grid's ``interrupted/`` (``keep_interrupted_curve``), never as a run
    directory without its checkpoints."""
    files = run_result_files(spec.run_dir)
    if spec.results_dir is None:
        return {path: path for path in files}
    kept = keep_interrupted_curve(spec)
    if kept is not None:
        return {path: path for path in kept}
    return {path: spec.results_dir / path.relative_to(spec.run_dir) for path in files}


def _check_directory(out: Path) -> None:
    """``out`` can take a pack: a directory (or none yet) holding only archives of ours."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--pack {out}: is a file; --pack names a directory")
    if out.is_dir():
        others = sorted(
            p.name for p in out.iterdir() if not (_ARCHIVE.fullmatch(p.name) or _partial(p))
        )
        if others:
            raise ConfigError(
                f"--pack {out}: holds {others[0]!r}, not an archive of ours; give a new or "
                f"empty directory (an earlier pack's results-NN.tar.gz are replaced)"
            )


def _partial(path: Path) -> bool:
    """An archive a pack was writing when it stopped (a full disk, a kill): ours to remove."""
    return _PARTIAL.fullmatch(path.name) is not None


def check_pack(grid: Grid, out: Path, *, max_bytes: int, max_files: int) -> None:
    """Before anything trains: ``out`` can take the pack, and the results can fit the bounds,
    the config.yaml each run will write counted where it is not written yet (a call on a
    rented GPU would otherwise spend its time and be refused at the end)."""
    _check_directory(out)
    files, sizes = [], {}
    for spec in grid.runs:
        packed = list(_existing(spec))
        if not any(path.name == "config.yaml" for path in packed):
            config = spec.run_dir / "config.yaml"
            text = yaml.safe_dump(spec.config_dict(), sort_keys=False).encode()
            sizes[config] = _compressed_size(text)
            packed.append(config)
        files += packed
    plan_archives(files, max_bytes=max_bytes, max_files=max_files, sizes=sizes)


def _existing(spec: RunSpec) -> list[Path]:
    """The result files a run has now, where it trains or where its copy went."""
    return run_result_files(spec.run_dir) or (
        run_result_files(spec.results_dir) if spec.results_dir is not None else []
    )


def pack_results(grid: Grid, out: Path, *, max_bytes: int, max_files: int) -> list[Path]:
    """Write the archives of ``grid``'s results into ``out`` (made if needed); returns their
    paths. The new archives are written whole beside the old ones first
    (``.results-NN.tar.gz.partial``, fsynced), and only then moved into place, the earlier
    pack's surplus archives removed last: a pack that fails (a full disk) leaves the earlier
    one as it was, and no archive under its final name is ever a part."""
    names = {path: _name(name) for spec in grid.runs for path, name in _packed(spec).items()}
    groups = plan_archives(list(names), max_bytes=max_bytes, max_files=max_files)
    _check_directory(out)
    out.mkdir(parents=True, exist_ok=True)
    for stale in filter(_partial, out.iterdir()):
        stale.unlink()
    staged: list[tuple[Path, Path]] = []
    try:
        for i, group in enumerate(groups, start=1):
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
                for path in group:
                    tar.add(path, arcname=names[path], recursive=False)
            data = buffer.getvalue()
            if len(data) > max_bytes:  # the estimate is per file; the archive is checked whole
                raise ConfigError(
                    f"--pack: archive {i} came to {len(data):,} bytes, over {max_bytes:,}"
                )
            final = out / f"results-{i:02d}.tar.gz"
            partial = out / f".{final.name}.partial"
            staged.append((partial, final))
            atomic_write(partial, data)  # fsynced; a full disk raises here
    except BaseException as e:
        for partial, _ in staged:
            partial.unlink(missing_ok=True)
        if isinstance(e, OSError):  # the file, and that nothing of the training was lost
            raise ConfigError(
                f"--pack {out}: writing {staged[-1][1].name if staged else out} failed "
                f"({e.strerror or e}); the runs, their results and any earlier pack there are "
                f"kept as they were: free space and run the same command again to pack"
            ) from None
        raise
    for partial, final in staged:
        os.replace(partial, final)
    written = {final for _, final in staged}
    for old in out.iterdir():
        if _ARCHIVE.fullmatch(old.name) and old not in written:
            old.unlink()
    return [final for _, final in staged]


__all__ = [
    "RESULT_FILES",
    "check_pack",
    "copy_results",
    "drop_finished_curve",
    "keep_interrupted_curve",
    "kept_tries",
    "pack_results",
    "plan_archives",
    "result_files",
    "run_result_files",
]
