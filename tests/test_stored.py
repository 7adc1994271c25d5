"""Results kept compressed (``wtnmt.stored``): every reader finds a run's curve and kept
decodings as ``.gz`` as it finds them plain; compressing is deterministic, loses nothing, and
leaves runs that may still be written alone; the grid runner's copies keep a compressed file
compressed."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

from helpers import scored_tiny_runs
from wtnmt import stored
from wtnmt.analysis.metrics import RunMetrics
from wtnmt.analysis.runs import Run
from wtnmt.analysis.scoring import read_hypotheses
from wtnmt.analysis.tables import runs_table


def test_a_file_is_read_plain_or_from_its_gz(tmp_path):
    plain, packed = tmp_path / "a.txt", tmp_path / "b.txt"
    plain.write_bytes(b"one\ntwo\n")
    (tmp_path / "b.txt.gz").write_bytes(gzip.compress(b"three\n"))
    assert stored.read_bytes(plain) == b"one\ntwo\n"
    assert stored.read_text(packed) == "three\n" and stored.stored(packed).name == "b.txt.gz"
    assert stored.exists(packed) and not stored.exists(tmp_path / "c.txt")
    with pytest.raises(FileNotFoundError, match=r"c\.txt"):
        stored.read_bytes(tmp_path / "c.txt")


def test_compressing_is_deterministic_and_checked_before_the_original_goes(tmp_path):
    data = b"".join(b'{"step": %d, "loss": 1.5}\n' % i for i in range(500))
    first, second = tmp_path / "a" / "metrics.jsonl", tmp_path / "b" / "metrics.jsonl"
    for path in (first, second):
        path.parent.mkdir()
        path.write_bytes(data)
    packed = [stored.compress(first), stored.compress(second)]
    assert packed[0].read_bytes() == packed[1].read_bytes()  # the same bytes: git keeps one
    assert not first.exists() and gzip.decompress(packed[0].read_bytes()) == data
    assert len(packed[0].read_bytes()) < len(data) / 4


def _run(tmp_path, name):  # type: ignore[no-untyped-def]
    run = tmp_path / name
    (run / "eval").mkdir(parents=True)
    (run / "config.yaml").write_text("model: {}\n")
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0, "elapsed": 1.0}\n')
    (run / "eval" / "test.beam5.hyp").write_text("a\n")
    return run


def test_the_command_leaves_a_run_that_may_still_be_written_alone(tmp_path, capsys):
    finished, resumable, copied = (_run(tmp_path, n) for n in ("finished", "resumable", "copy"))
    for run in (finished, resumable):
        (run / "checkpoints").mkdir()
    (finished / "finished.json").write_text("{}")
    tries = tmp_path / "interrupted"
    tries.mkdir()
    (tries / "x-s1.try1.metrics.jsonl").write_text('{"step": 1}\n')
    (tries / "notes.txt").write_text("a person's file\n")
    assert stored.main([str(tmp_path)]) == 0
    assert "files compressed" in capsys.readouterr().out
    for run in (finished, copied):
        assert not (run / "metrics.jsonl").exists() and (run / "metrics.jsonl.gz").is_file()
        assert (run / "eval" / "test.beam5.hyp.gz").is_file()
    assert (resumable / "metrics.jsonl").is_file() and not (resumable / "metrics.jsonl.gz").exists()
    assert (tries / "x-s1.try1.metrics.jsonl.gz").is_file() and (tries / "notes.txt").is_file()
    assert stored.main([str(tmp_path / "nowhere")]) == 2


def test_analysis_reads_compressed_results_as_it_reads_plain_ones(tmp_path):
    (tmp_path / "plain").mkdir()
    runs = scored_tiny_runs(tmp_path / "plain")
    copies = []
    for run in runs:
        copy = tmp_path / "packed" / run.name
        shutil.copytree(run, copy, ignore=shutil.ignore_patterns("*.safetensors", "checkpoints"))
        copies.append(copy)
    assert stored.main([str(tmp_path / "packed")]) == 0
    for plain, packed in zip(runs, copies, strict=True):
        assert not (packed / "metrics.jsonl").exists()
        assert RunMetrics.load(packed).valid == RunMetrics.load(plain).valid
        scores = json.loads((plain / "scores.json").read_text())["test"]
        assert not (packed / scores["hypotheses"]).exists()
        assert read_hypotheses(packed, scores) == read_hypotheses(plain, scores)
    tables = [runs_table([Run.load(r) for r in group]).as_dict() for group in (runs, copies)]
    assert tables[0]["rows"] and tables[0] == tables[1]  # steps, dev and test scores alike


def test_the_runners_copies_keep_a_compressed_file_compressed(tmp_path):
    from wtnmt.experiment.pack import _tries, _write_if_changed

    target = tmp_path / "results" / "metrics.jsonl"
    target.parent.mkdir()
    target.write_bytes(b"a\n")
    stored.compress(target)
    assert not _write_if_changed(target, b"a\n")  # the same content: nothing written
    assert _write_if_changed(target, b"a\nb\n")  # grown: written, compressed as it was
    assert not target.exists() and stored.read_bytes(target) == b"a\nb\n"
    fresh = tmp_path / "results" / "finished.json"
    assert _write_if_changed(fresh, b"{}") and fresh.read_bytes() == b"{}"  # new: plain
    tries = tmp_path / "interrupted"
    tries.mkdir()
    (tries / "r-s1.try1.metrics.jsonl.gz").write_bytes(stored.gzip_bytes(b"x\n"))
    (tries / "r-s1.try2.metrics.jsonl").write_bytes(b"y\n")
    assert _tries(tries, "r-s1") == [1, 2]


def test_a_resumed_run_reopens_its_compressed_curve_and_never_splits_it(tmp_path, capsys):
    """`python -m wtnmt.stored RUN` (before a commit), then a resume with a larger budget: the
    curve stays one file holding every step, which the next compression keeps whole (the
    resume wrote a second, plain curve of its own steps only, and compressing again dropped
    the first); the earlier end's finished.json goes while training goes on."""
    from helpers import tiny_run_config
    from wtnmt.analysis.metrics import read_metrics
    from wtnmt.train import Trainer

    short = tiny_run_config(tmp_path, train={"max_steps": 4, "log_every": 1})
    run = tmp_path / "run"
    Trainer(short, run, log_to_stderr=False).run()
    (run / "finished.json").write_text('{"finished": "max_steps"}\n')  # as a grid marks it
    assert [e["step"] for e in read_metrics(run / "metrics.jsonl") if "loss" in e] == [1, 2, 3, 4]
    assert stored.main([str(run)]) == 0 and not (run / "metrics.jsonl").exists()
    longer = tiny_run_config(tmp_path, train={"max_steps": 8, "log_every": 1})
    trainer = Trainer(longer, run, resume=True, log_to_stderr=False)
    assert (run / "metrics.jsonl").is_file() and not (run / "metrics.jsonl.gz").exists()
    trainer.run()
    assert not (run / "finished.json").exists()
    steps = [e["step"] for e in read_metrics(run / "metrics.jsonl") if "loss" in e]
    assert steps == list(range(1, 9))  # the first four from before the resume, kept
    (run / "finished.json").write_text('{"finished": "max_steps"}\n')
    assert stored.main([str(run)]) == 0
    assert [e["step"] for e in read_metrics(run / "metrics.jsonl") if "loss" in e] == steps


def test_a_split_curve_is_joined_never_dropped_and_overlapping_ones_are_left(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    early = b"".join(b'{"step": %d, "loss": 2.0}\n' % i for i in range(1, 5))
    late = b"".join(b'{"step": %d, "loss": 1.0}\n' % i for i in range(5, 9))
    (run / "metrics.jsonl.gz").write_bytes(stored.gzip_bytes(early))
    (run / "metrics.jsonl").write_bytes(late)  # what a resume wrote before this was fixed
    assert stored.main([str(tmp_path)]) == 0
    assert stored.read_bytes(run / "metrics.jsonl") == early + late
    assert "joined" in capsys.readouterr().err
    (run / "metrics.jsonl.gz").unlink()
    (run / "metrics.jsonl.gz").write_bytes(stored.gzip_bytes(early))
    (run / "metrics.jsonl").write_bytes(early[:30] + b"\n" + late)  # steps that overlap
    assert stored.main([str(tmp_path)]) == 0
    assert "neither goes on from the other" in capsys.readouterr().err
    assert (run / "metrics.jsonl").is_file() and (run / "metrics.jsonl.gz").is_file()  # both kept


@pytest.mark.parametrize("damage", ["cut short", "plain"])
def test_a_damaged_compressed_curve_is_one_line_naming_it(tmp_path, capsys, damage):
    from helpers import train_tiny
    from wtnmt.cli import main

    run = train_tiny(tmp_path)
    curve = (run / "metrics.jsonl").read_bytes()
    (run / "metrics.jsonl").unlink()
    packed = stored.gzip_bytes(curve)
    content = packed[: len(packed) // 2] if damage == "cut short" else curve
    reason = "a gzip file cut short" if damage == "cut short" else "not a whole gzip file"
    (run / "metrics.jsonl.gz").write_bytes(content)
    assert main(["analyze", str(run), "--no-decode", "--out", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(run / "metrics.jsonl.gz") in err and reason in err
