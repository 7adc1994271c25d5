"""`wtnmt prepare` on the command line: nothing a user gave it is replaced (a directory it did
not make, a file, the current directory, a corpus used as prepared data), and a bad option is
one line."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_data import write_corpus
from wtnmt.cli import main as cli
from wtnmt.data import DataError


def _prepare_args(src: Path, tgt: Path, out: str) -> list[str]:
    return [
        "prepare", "--src", str(src), "--tgt", str(tgt), "--src-lang", "xx", "--tgt-lang", "yy",
        "--vocab-size", "60", "--set", "data.valid_size=10", "--set", "data.test_size=10",
        "--out", out,
    ]  # fmt: skip


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


def test_prepare_refuses_to_replace_a_directory_it_did_not_make(tmp_path, capsys):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    src, tgt = write_corpus(corpus)
    before = _snapshot(tmp_path)
    assert cli(_prepare_args(src, tgt, str(corpus))) == 2
    err = capsys.readouterr().err
    assert err == (
        f"wtnmt prepare: error: {corpus}: this directory was not made by wtnmt prepare (it has "
        f"no manifest.json of ours) and is not empty; refusing to replace it: give --out a new "
        f"or empty directory\n"
    )
    assert _snapshot(tmp_path) == before  # the corpus is there, nothing added or hidden


def test_prepare_refuses_a_file_and_the_current_directory(tmp_path, capsys, monkeypatch):
    src, tgt = write_corpus(tmp_path)
    before = _snapshot(tmp_path)
    assert cli(_prepare_args(src, tgt, str(src))) == 2
    assert capsys.readouterr().err == (
        f"wtnmt prepare: error: {src}: is a file; --out names the directory to prepare into\n"
    )
    monkeypatch.chdir(tmp_path)
    assert cli(_prepare_args(src, tgt, ".")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "refusing to replace it" in err and str(tmp_path) in err
    assert _snapshot(tmp_path) == before


def test_prepare_fills_an_empty_directory_and_rebuilds_its_own(tmp_path):
    src, tgt = write_corpus(tmp_path)
    out = tmp_path / "empty"
    out.mkdir()
    assert cli(_prepare_args(src, tgt, str(out))) == 0
    assert (out / "manifest.json").is_file()
    assert cli([*_prepare_args(src, tgt, str(out)), "--force"]) == 0  # its own: replaced
    assert not list(tmp_path.glob(".empty.*"))  # no temporary or old copy left behind


def test_train_refuses_a_prepared_dir_that_is_the_users_corpus(tmp_path):
    from helpers import tiny_run_config
    from wtnmt.train import Trainer

    config = tiny_run_config(tmp_path)  # writes the corpus files into tmp_path
    config = dataclasses.replace(
        config, data=dataclasses.replace(config.data, prepared_dir=str(tmp_path))
    )
    before = _snapshot(tmp_path)
    with pytest.raises(DataError, match="was not made by wtnmt prepare"):
        Trainer(config, tmp_path / "runs" / "r", log_to_stderr=False)
    after = _snapshot(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("runs/")} == before


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--set", "data.max_words=2.5"], "data.max_words=2.5 is not allowed: expected int"),
        (["--set", "data.max_tokens_per_side=x"], "data.max_tokens_per_side='x' is not allowed"),
        (["--set", "data.no_such_key=1"], "unknown config key data.no_such_key"),
        (["--corpus", "multi30k"], "--corpus and --src/--tgt name two sources of training data"),
        (["--tsv", "pairs.tsv"], "--tsv and --src/--tgt name two sources of training data"),
    ],
)
def test_prepare_options_are_validated_like_a_config(tmp_path, capsys, extra, message):
    src, tgt = write_corpus(tmp_path)
    assert cli([*_prepare_args(src, tgt, str(tmp_path / "out")), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wtnmt prepare: error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_prepare_src_without_tgt_is_one_line(tmp_path, capsys):
    src, _ = write_corpus(tmp_path)
    assert cli(["prepare", "--src", str(src), "--out", str(tmp_path / "o")]) == 2
    assert (
        capsys.readouterr().err == "wtnmt prepare: error: --src and --tgt go together: give both\n"
    )


def test_prepare_reads_its_inputs_from_pipes_too(tmp_path):
    """--src /dev/stdin, - and a process substitution: read once into a file, then prepared
    as the same files are."""
    src, tgt = write_corpus(tmp_path)
    expected = tmp_path / "files"
    assert cli(_prepare_args(src, tgt, str(expected))) == 0
    for how in ("stdin", "dash", "fifo"):
        out = tmp_path / how
        if how == "fifo":  # what bash makes of <(cat FILE)
            fifo = tmp_path / "tgt.fifo"
            os.mkfifo(fifo)
            writer = subprocess.Popen(["sh", "-c", f"cat {tgt} > {fifo}"])
            argv = _prepare_args(src, fifo, str(out))
        else:
            argv = _prepare_args(Path("/dev/stdin" if how == "stdin" else "-"), tgt, str(out))
        program = "import sys; from wtnmt.cli import main; sys.exit(main(sys.argv[1:]))"
        done = subprocess.run(  # stdin a pipe
            [sys.executable, "-c", program, *argv],
            input=src.read_bytes() if how != "fifo" else b"",
            capture_output=True,
            timeout=120,
        )
        if how == "fifo":
            writer.wait(timeout=10)
            fifo.unlink()
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        assert b"(a stream) into a file first" in done.stderr
        for name in ("train.src.npy", "train.tgt.npy", "valid.xx", "test.yy"):
            assert (out / name).read_bytes() == (expected / name).read_bytes(), (how, name)
        assert not list(tmp_path.glob(f".{how}.spool.tmp-*"))


def test_a_nul_byte_in_an_input_is_one_line_naming_it(tmp_path, capsys):
    src, tgt = write_corpus(tmp_path)
    lines = src.read_bytes().split(b"\n")
    lines[6] = lines[6][:3] + b"\x00" + lines[6][3:]
    src.write_bytes(b"\n".join(lines))
    out = tmp_path / "o"
    assert cli(_prepare_args(src, tgt, str(out))) == 2
    *_, error = capsys.readouterr().err.splitlines()  # its progress, then the error
    assert error.startswith("wtnmt prepare: error: ") and f"{src}: line 7 holds a NUL" in error
    assert not out.exists()


def test_the_prepare_log_says_the_kept_count_its_table_says(tmp_path):
    """Pairs over the length limits are dropped after encoding: the log's "kept" is the
    table's, not the count before that."""
    from test_prepare_scale import config, corpus_pairs, write
    from wtnmt.data import prepare

    files = write(tmp_path / "raw", corpus_pairs(300))
    said: list[str] = []
    summary = prepare(config(files, max_tokens_per_side=12), tmp_path / "out", log=said.append)
    kept = summary["splits"]["train"]["pairs_kept"]
    assert summary["splits"]["train"]["dropped"].get("too_long")  # some dropped by length
    line = next(s for s in said if "training pairs kept" in s)
    assert f"{kept:,} training pairs kept" in line
    assert not any(" kept (" in s for s in said)  # no earlier count called kept


def _prepare_with_stdin(argv: list[str], **kw) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    program = "import sys; from wtnmt.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", program, *argv], capture_output=True, timeout=120, **kw
    )


def test_a_missing_file_is_refused_before_standard_input_is_read(tmp_path):
    """--src missing, --tgt -: the missing file is named and what was piped in is left
    unread (the spool never starts)."""
    done = _prepare_with_stdin(
        _prepare_args(tmp_path / "nope.src", Path("-"), str(tmp_path / "out")), input=b"x\n"
    )
    assert done.returncode == 2
    err = done.stderr.decode()
    assert err.count("\n") == 1 and "nope.src: no such file" in err, err
    assert "(a stream)" not in err and not list(tmp_path.glob(".out.spool.tmp-*"))


def test_standard_input_for_two_inputs_is_one_line_naming_both(tmp_path):
    done = _prepare_with_stdin(
        _prepare_args(Path("-"), Path("-"), str(tmp_path / "out")), input=b"x\n"
    )
    assert done.returncode == 2
    err = done.stderr.decode()
    assert err.count("\n") == 1, err
    assert "data.train_src and data.train_tgt both read standard input (-)" in err


def test_a_closed_standard_input_is_one_line(tmp_path):
    src, _ = write_corpus(tmp_path)
    argv = _prepare_args(src, Path("-"), str(tmp_path / "out"))
    done = _prepare_with_stdin(argv, preexec_fn=lambda: os.close(0))  # as `<&-` leaves it
    assert done.returncode == 2
    err = done.stderr.decode()
    assert "-: standard input is closed" in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


def test_standard_input_without_a_descriptor_is_read_from_its_buffer(tmp_path, monkeypatch):
    """As under a test runner's capture, or an embedding program's replaced sys.stdin."""
    import io

    src, tgt = write_corpus(tmp_path)
    fake = io.TextIOWrapper(io.BytesIO(tgt.read_bytes()), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", fake)
    assert cli(_prepare_args(src, Path("-"), str(tmp_path / "dash"))) == 0
    assert cli(_prepare_args(src, tgt, str(tmp_path / "files"))) == 0
    for name in ("train.tgt.npy", "valid.yy", "test.yy"):
        assert (tmp_path / "dash" / name).read_bytes() == (tmp_path / "files" / name).read_bytes()


def test_runs_that_differ_in_build_options_get_folders_of_their_own(tmp_path):
    """The default prepared_dir ends in {options}: nothing for the defaults (the folder every
    earlier run used), a digest of the differing options otherwise; two runs that differ in
    their vocabulary each keep their build, neither rebuilding the other's."""
    from helpers import tiny_run_config
    from wtnmt.config.sections import DataConfig
    from wtnmt.data import prepare

    assert DataConfig().prepared_path() == Path("data-bin/tatoeba-deu-eng.en-de")
    assert DataConfig(corpus="multi30k").prepared_path() == Path("data-bin/multi30k.en-de")
    default = DataConfig.prepared_dir
    base = tiny_run_config(tmp_path).data
    small = dataclasses.replace(base, prepared_dir=str(tmp_path / default))
    large = dataclasses.replace(small, vocab_size=70)
    separate = dataclasses.replace(small, joint_vocab=False)
    paths = [c.prepared_path() for c in (small, large, separate)]
    assert len(set(paths)) == 3 and all(p.parent == tmp_path / "data-bin" for p in paths)
    assert dataclasses.replace(large, prepared_dir="mine").prepared_path() == Path("mine")
    logs: list[str] = []
    for config in (small, large, separate):
        prepare(config, config.prepared_path(), log=logs.append)
    made = {p: (p / "train.src.npy").stat().st_mtime_ns for p in paths}
    logs.clear()
    for config in (small, large, separate):  # again, in turn: each is up to date
        prepare(config, config.prepared_path(), log=logs.append)
    assert {p: (p / "train.src.npy").stat().st_mtime_ns for p in paths} == made
    assert sum("up to date" in line for line in logs) == 3, logs
