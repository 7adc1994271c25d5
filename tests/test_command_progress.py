"""The progress of long commands in a log (no terminal): a line now and then with the rate
and time left, and a summary; the line count it is measured against."""

from __future__ import annotations

from wtnmt.cli import main as cli
from wtnmt.commands.progress import Progress, count_lines


def test_progress_lines_say_how_far_and_the_summary_how_much(capsys):
    progress = Progress("translated", 10, "line", every=0)
    progress.done(4)
    progress.done(6)
    progress.close()
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("translated: 4 lines, ") and "(40% of 10; " in lines[0]
    assert lines[1].startswith("translated: 10 lines, ") and "; 00:00 left)" in lines[1]
    assert lines[2].startswith("translated: 10 lines in ")


def test_lines_are_counted_as_the_reader_counts_them(tmp_path):
    for text, lines in [("", 0), ("a\n", 1), ("a\nb", 2), ("a\nb\n", 2), ("\n\n", 2)]:
        (tmp_path / "f").write_text(text)
        assert count_lines(str(tmp_path / "f")) == lines, text
    assert count_lines(None) is None and count_lines("-") is None


def test_translate_says_what_it_did(tmp_path, capsys):
    from helpers import train_tiny

    run = train_tiny(tmp_path)
    (tmp_path / "in.txt").write_text("alpha beta\ngamma\n")
    assert cli(["translate", str(run), "-i", str(tmp_path / "in.txt")]) == 0
    assert "translated: 2 lines in " in capsys.readouterr().err


def test_export_and_analyze_say_each_long_step(tmp_path, capsys):
    import pytest

    pytest.importorskip("onnxscript", reason="the onnx extra is not installed")
    from helpers import train_tiny
    from wtnmt.analysis.scoring import score_run

    run = train_tiny(tmp_path)
    assert cli(["export", "onnx", str(run)]) == 0
    err = capsys.readouterr().err
    assert "the encoder traced (" in err and "the decoder step traced (" in err
    score_run(run, split="test")
    err = capsys.readouterr().err
    assert f"decoding {run}'s test split (8 sentences, beam" in err and "decoded in " in err
