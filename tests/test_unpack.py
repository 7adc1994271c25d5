"""`wtnmt unpack` against archives that are not the packs it expects: members twice, a file
where another member needs a directory, more bytes than a pack of results, paths outside the
working directory. Each is refused in one line before any file is written; a large member
goes through a chunk at a time, never whole in memory."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import tracemalloc
from pathlib import Path

import pytest

from wtnmt.cli import main
from wtnmt.experiment.unpack import STAGING, unpack


def archive(path: Path, members: list[tuple[str, bytes]], *, link: str | None = None) -> Path:
    """A results-NN.tar.gz holding ``members`` in order (and a symlink ``link`` if asked)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link is not None:
            info = tarfile.TarInfo(link)
            info.type = tarfile.SYMTYPE
            info.linkname = "/etc/passwd"
            tar.addfile(info)
    return path


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink()
    }


def refused(args: list[str], capsys) -> str:
    capsys.readouterr()
    assert main(["unpack", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    ("members", "words"),
    [
        ([("exp/w/metrics.jsonl", b"1\n"), ("exp/w/metrics.jsonl", b"2\n")], "twice"),
        ([("exp/w/a", b"a"), ("exp/./w/a", b"b")], "twice"),  # the same path, spelt two ways
        ([("exp/w", b"a file"), ("exp/w/x", b"under it")], "holds 'exp/w/x' under 'exp/w'"),
        ([("exp/w/x", b"under it"), ("exp/w", b"a file")], "holds 'exp/w/x' under 'exp/w'"),
        ([("exp/ok", b"fine"), ("../outside", b"x")], "not a file under the working"),
        ([("exp/ok", b"fine"), ("/etc/evil", b"x")], "not a file under the working"),
    ],
)
def test_an_archive_that_is_no_pack_is_refused_before_any_write(tmp_path, capsys, members, words):
    into = tmp_path / "into"
    into.mkdir()
    bad = archive(tmp_path / "pack" / "results-01.tar.gz", members)
    err = refused([str(bad), "--into", str(into)], capsys)
    assert words in err and str(bad) in err and "nothing was unpacked" in err
    assert not any(into.iterdir())  # no file, no staging left behind


def test_a_symlink_member_is_refused(tmp_path, capsys):
    into = tmp_path / "into"
    into.mkdir()
    bad = archive(tmp_path / "results-01.tar.gz", [("exp/ok", b"x")], link="exp/link")
    assert "'exp/link', not a file" in refused([str(bad), "--into", str(into)], capsys)
    assert not any(into.iterdir())


def test_clashes_across_archives_and_with_the_disk_refuse_them_all(tmp_path, capsys):
    into = tmp_path / "into"
    pack = tmp_path / "pack"
    archive(pack / "results-01.tar.gz", [("exp/a", b"a"), ("exp/w", b"a file")])
    archive(pack / "results-02.tar.gz", [("exp/w/x", b"under it")])
    err = refused([str(pack), "--into", str(into)], capsys)
    assert "results-02.tar.gz: holds 'exp/w/x' under 'exp/w'" in err
    assert not into.exists() or not any(into.iterdir())
    # a file of the user's where a member needs a directory: kept, nothing else written
    into.mkdir(exist_ok=True)
    (into / "exp").write_bytes(b"the user's")
    good = archive(tmp_path / "one" / "results-01.tar.gz", [("top", b"t"), ("exp/w/x", b"x")])
    err = refused([str(good), "--into", str(into)], capsys)
    assert f"{into / 'exp'}: is a file where" in err and "(for exp/w/x)" in err
    assert tree(into) == {"exp": b"the user's"}
    # a directory where a member's file goes, found before the member before it is written
    (into / "exp").unlink()
    (into / "exp" / "w" / "x").mkdir(parents=True)
    err = refused([str(good), "--into", str(into)], capsys)
    assert f"{into / 'exp' / 'w' / 'x'}: is a directory where" in err
    assert not (into / "top").exists()


def test_an_archive_that_expands_past_the_bound_is_refused(tmp_path, capsys):
    into = tmp_path / "into"
    into.mkdir()
    zeros = b"\0" * (3 << 20)  # 3 MiB that compress to a few KiB
    bomb = archive(tmp_path / "results-01.tar.gz", [("exp/small", b"s"), ("exp/big", zeros)])
    assert bomb.stat().st_size < 64 << 10
    err = refused([str(bomb), "--into", str(into), "--max-expanded", "2M"], capsys)
    assert "more than 2,097,152 bytes (--max-expanded" in err
    assert not any(into.iterdir())
    # the same archive within the bound goes through whole
    assert main(["unpack", str(bomb), "--into", str(into), "--max-expanded", "4M"]) == 0
    assert tree(into) == {"exp/big": zeros, "exp/small": b"s"}


def test_a_large_member_is_never_held_in_memory_whole(tmp_path):
    data = os.urandom(1 << 20) * 12  # 12 MiB
    big = archive(tmp_path / "results-01.tar.gz", [("exp/w/eval/test.hyp", data)])
    into = tmp_path / "into"
    tracemalloc.start()
    try:
        done = unpack([big], into)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (into / "exp/w/eval/test.hyp").read_bytes() == data
    assert done.written == [into / "exp/w/eval/test.hyp"]
    assert peak < 4 << 20, f"peak {peak:,} bytes for a {len(data):,}-byte member"


def test_a_killed_unpacks_staging_is_removed_by_the_next(tmp_path):
    into = tmp_path / "into"
    into.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = into / f"{STAGING}{dead.pid}-abc"
    orphan.mkdir()
    (orphan / "0").write_bytes(b"half")
    live = into / f"{STAGING}{os.getppid()}-def"  # a process that still runs: left alone
    live.mkdir()
    unpack([archive(tmp_path / "results-01.tar.gz", [("a", b"a")])], into)
    assert not orphan.exists() and live.is_dir()
    assert tree(into) == {"a": b"a"}
