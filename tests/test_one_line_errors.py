"""A user's mistake is one line on stderr and exit status 2, never a traceback: bad option
values, files that are not what they should be, damaged logs, grid values checked before
anything trains."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers import one_line, tiny_run_config, train_tiny
from wtnmt.analysis.metrics import read_metrics
from wtnmt.cli import main as cli
from wtnmt.config import ConfigError, config_to_dict, load_config
from wtnmt.errors import TrainingError
from wtnmt.experiment import load_grid
from wtnmt.train import Trainer

QUIET = {"log_to_stderr": False}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return train_tiny(tmp_path_factory.mktemp("errors"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--samples", "0"], "argument --samples: 0: must be at least 1"),
        (["--samples", "-5"], "argument --samples: -5: must be at least 1"),
        (["--beam", "0"], "argument --beam: 0: must be at least 1"),
    ],
)
def test_evaluate_options_are_checked(run_dir, tmp_path, capsys, args, message):
    (tmp_path / "s").write_text("alpha\n")
    with pytest.raises(SystemExit) as e:
        cli(
            [
                "evaluate",
                str(run_dir),
                "--src",
                str(tmp_path / "s"),
                "--ref",
                str(tmp_path / "s"),
                *args,
            ]
        )
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("command", ["translate", "evaluate"])
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lenpen", "1e308"], "--lenpen 1e+308: allowed -10 to 10"),
        (["--lenpen=-1e6"], "--lenpen -1000000.0: allowed -10 to 10"),
        (["--lenpen", "nan"], "--lenpen nan: allowed -10 to 10"),
        (["--beam", "100000"], "--beam 100000: allowed 1 to 1024"),
        (["--beam", "1000000000"], "--beam 1000000000: allowed 1 to 1024"),
    ],
)
def test_search_settings_out_of_bounds_are_one_line(
    run_dir, tmp_path, capsys, command, args, message
):
    (tmp_path / "s").write_text("alpha\n")
    files = ["-i", str(tmp_path / "s")]
    if command == "evaluate":
        files = ["--src", str(tmp_path / "s"), "--ref", str(tmp_path / "s")]
    assert cli([command, str(run_dir), *files, *args]) == 2
    one_line(capsys, command, message)
    assert not (run_dir / "eval" / "s.hyp").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("decode:\n  length_penalty: 1e308\n", "decode.length_penalty=1e+308: allowed -10 to 10"),
        ("decode:\n  beam: 5000\n", "decode.beam=5000: allowed 1 to 1024"),
        ("decode:\n  beam: 4\n  beam: 5\n", "key 'beam' given twice (lines 2 and 3)"),
    ],
)
def test_search_settings_of_a_config_are_bounded(tmp_path, capsys, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    assert cli(["train", str(path), "--out", str(tmp_path / "run")]) == 2
    one_line(capsys, "train", message, str(path))
    assert not (tmp_path / "run").exists()


def test_the_python_api_bounds_the_beam(run_dir):
    from wtnmt import Translator

    with pytest.raises(ValueError, match="beam=100000: allowed 1 to 1024"):
        Translator.load(run_dir).translate(["alpha"], beam=100_000)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--threads", "0"], "argument --threads: 0: must be at least 1"),
        (["--minutes", "0"], "argument --minutes: 0: must be a finite number above 0"),
        (["--minutes", "nan"], "argument --minutes: nan: must be a finite number above 0"),
    ],
)
def test_demo_options_are_checked_and_blame_the_option(capsys, args, message):
    with pytest.raises(SystemExit) as e:
        cli(["demo", *args])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "weighted-small" not in err


@pytest.mark.slow
def test_stdin_and_process_substitution_are_inputs(run_dir):
    done = subprocess.run(
        [sys.executable, "-m", "wtnmt.cli", "translate", str(run_dir), "-i", "/dev/stdin"],
        input="alpha beta\n",
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and done.stdout.count("\n") == 1, done.stderr
    fifo = subprocess.run(  # a pipe given by name, as bash's <(...) gives /dev/fd/63
        ["bash", "-c", f"{sys.executable} -m wtnmt.cli translate {run_dir} -i <(echo alpha)"],
        capture_output=True,
        text=True,
    )
    assert fifo.returncode == 0 and fifo.stdout.count("\n") == 1, fifo.stderr


def test_a_directory_as_input_is_one_line(run_dir, tmp_path, capsys):
    assert cli(["translate", str(run_dir), "-i", str(tmp_path)]) == 2
    one_line(capsys, "translate", "is a directory")


def test_paths_through_a_file_are_one_line(run_dir, tmp_path, capsys):
    (tmp_path / "FILE").write_text("x")
    blocked = str(tmp_path / "FILE" / "x")
    src, tgt = tmp_path / "a.xx", tmp_path / "a.yy"
    src.write_text("alpha\n")
    tgt.write_text("AHPLA\n")
    prepare = ["prepare", "--src", str(src), "--tgt", str(tgt), "--src-lang", "xx"]
    assert cli([*prepare, "--tgt-lang", "yy", "--out", blocked]) == 2
    one_line(capsys, "prepare", "FILE is a file, not a directory")
    assert cli(["analyze", str(run_dir), "--out", blocked, "--no-decode"]) == 2
    one_line(capsys, "analyze", "FILE is a file, not a directory")
    report = tmp_path / "report"
    assert cli(["analyze", str(run_dir), "--out", str(report), "--pair", "a:b"]) == 2
    one_line(capsys, "analyze", "--pair a:b: no model 'a' (models: ")
    assert not report.exists()  # refused before anything was written
    assert cli(["train", "weighted-tiny", "--out", blocked]) == 2
    one_line(capsys, "train", "FILE is a file, not a directory")


def test_language_names_that_would_name_other_paths_are_refused(tmp_path, capsys):
    src, tgt = tmp_path / "a.xx", tmp_path / "a.yy"
    src.write_text("alpha\n")
    tgt.write_text("AHPLA\n")
    args = ["prepare", "--src", str(src), "--tgt", str(tgt), "--out", str(tmp_path / "p")]
    assert cli([*args, "--src-lang", "x/y", "--tgt-lang", "yy"]) == 2
    one_line(capsys, "prepare", "data.src_lang='x/y'")
    assert not (tmp_path / "p").exists()


def test_config_files_that_are_not_utf8_or_not_yaml_are_one_line(tmp_path, capsys):
    (tmp_path / "latin.yaml").write_bytes(b"data:\n  corpus: caf\xe9\n")
    assert cli(["train", str(tmp_path / "latin.yaml"), "--out", str(tmp_path / "r")]) == 2
    one_line(capsys, "train", "latin.yaml: not UTF-8 text (at byte offset 19)")
    (tmp_path / "broken.yaml").write_text("data:\n  corpus: [a\n model: {\n")
    assert cli(["train", str(tmp_path / "broken.yaml"), "--out", str(tmp_path / "r")]) == 2
    one_line(capsys, "train", "broken.yaml: not valid YAML (", "line 3, column 7")


@pytest.mark.parametrize("seed", ["-1", "99999999999999999999", "true"])
def test_a_bad_seed_is_refused_before_anything_is_written(tmp_path, capsys, seed):
    out = tmp_path / "run"
    assert cli(["train", "weighted-tiny", "--set", f"train.seed={seed}", "--out", str(out)]) == 2
    one_line(capsys, "train", f"--set 'train.seed={seed}'", "train.seed=")
    assert not out.exists()


def test_a_full_disk_while_logging_stops_the_run_in_one_line(tmp_path, monkeypatch):
    import errno

    from wtnmt.train import report

    config = tiny_run_config(tmp_path, train={"max_steps": 6, "log_every": 2, "valid_every": 6})
    trainer = Trainer(config, tmp_path / "run", **QUIET)
    real_write, calls = report.os.write, []

    def full_after_a_while(fd, data):  # the third entry finds the disk full half-way
        calls.append(data)
        entries = sum(b'"loss"' in c for c in calls)  # metrics.jsonl's, not the log's lines
        if b'"step": 6' in data or (entries > 2 and b'"loss"' in data):
            real_write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(report.os, "write", full_after_a_while)
    with pytest.raises(TrainingError, match=r"metrics\.jsonl: could not be written") as e:
        trainer.run()
    assert "\n" not in str(e.value)
    raw = (tmp_path / "run" / "metrics.jsonl").read_bytes()
    assert raw.endswith(b"\n")
    assert all(json.loads(line) for line in raw.splitlines())  # no half line


@pytest.mark.parametrize(
    "damage", [b'{"step": 4, "loss": 1.0', b'{"foo": 1}', b"[1, 2]", b'{"step": "x"}', b"\xff\xfe"]
)
def test_a_damaged_metrics_line_is_skipped_with_a_warning(run_dir, tmp_path, capsys, damage):
    lines = (run_dir / "metrics.jsonl").read_bytes().splitlines(keepends=True)
    damaged = tmp_path / "metrics.jsonl"
    damaged.write_bytes(lines[0] + damage + b"\n" + b"".join(lines[1:]))
    entries = read_metrics(damaged)
    assert len(entries) == len(lines)
    err = capsys.readouterr().err
    assert f"{damaged}:2: not a metrics entry; skipped" in err


def write_grid(tmp: Path, **changes) -> Path:  # type: ignore[no-untyped-def]
    config = tmp / "tiny.yaml"
    config.write_text(yaml.safe_dump(config_to_dict(tiny_run_config(tmp))))
    grid = {"out": str(tmp / "runs"), "budget": {"max_steps": 2}, "runs": [
        {"name": "w", "preset": str(config)}], **changes}  # fmt: skip
    path = tmp / "grid.yaml"
    path.write_text(yaml.safe_dump(grid, sort_keys=False))
    return path


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"analyze": {"smooth": "abc"}}, "analyze.smooth: expected a positive integer, got 'abc'"),
        ({"analyze": {"random_seeds": 0}}, "analyze.random_seeds: expected a positive integer"),
        ({"analyze": {"target_bleu": "x"}}, "analyze.target_bleu: expected a BLEU between"),
        ({"analyze": {"attention_sentence": -1}}, "analyze.attention_sentence: expected an"),
        ({"analyze": {"decode": "yes"}}, "analyze.decode: expected true or false"),
        ({"out": None}, "out: expected a directory path, got None"),
        ({"analyze": {"out": 3}}, "analyze.out: expected a directory path, got 3"),
        ({"analyze": {"pairs": "w:v"}}, "analyze.pairs: expected a list of MODEL:BASELINE"),
        ({"analyze": {"pairs": ["w"]}}, "analyze.pairs: 'w': expected MODEL:BASELINE"),
        ({"analyze": {"pairs": ["w:v"]}}, "analyze.pairs: w:v: no model 'v' (models: w)"),
    ],
)
def test_grid_values_are_checked_before_anything_trains(tmp_path, changes, message):
    with pytest.raises(ConfigError, match=None) as e:
        load_grid(write_grid(tmp_path, **changes))
    assert message in str(e.value)
    assert not (tmp_path / "runs").exists() and not (tmp_path / "None").exists()


def test_a_grid_out_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "taken").write_text("x")
    with pytest.raises(ConfigError, match=r"out: .*taken: is a file; give a directory"):
        load_grid(write_grid(tmp_path, out=str(tmp_path / "taken")))


def test_evaluating_empty_files_is_one_line(run_dir, tmp_path, capsys):
    (tmp_path / "src").write_bytes(b"")
    (tmp_path / "ref").write_bytes(b"")
    args = [
        "evaluate",
        str(run_dir),
        "--src",
        str(tmp_path / "src"),
        "--ref",
        str(tmp_path / "ref"),
    ]
    assert cli(args) == 2
    one_line(capsys, "evaluate", "no lines to evaluate")


def test_prepare_workers_and_vocabulary_sample_out_of_range_are_one_line(tmp_path, capsys):
    src, tgt = tmp_path / "a.xx", tmp_path / "a.yy"
    src.write_text("alpha\n")
    tgt.write_text("AHPLA\n")
    args = ["prepare", "--src", str(src), "--tgt", str(tgt), "--src-lang", "xx"]
    args += ["--tgt-lang", "yy", "--out", str(tmp_path / "p")]
    assert cli([*args, "--workers", "0"]) == 2
    one_line(capsys, "prepare", "--workers 0: must be at least 1")
    assert cli([*args, "--vocab-sample", "0"]) == 2
    one_line(capsys, "prepare", "data.spm_max_sentences")
    assert not (tmp_path / "p").exists()


def test_every_option_of_every_command_says_what_it_does(capsys):
    import argparse

    from wtnmt.cli import build_parser

    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    silent = [
        f"{name} {action.option_strings or action.dest}"
        for name, sub in commands.choices.items()
        for action in sub._actions
        if action.help is None and not isinstance(action, argparse._HelpAction)
    ]
    assert silent == []
    with pytest.raises(SystemExit) as done:
        cli(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("wtnmt 0.")
    assert cli(["presets"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert any(line.startswith("weighted-m30k ") for line in listed)
    assert len(listed) == len(
        list((Path(__file__).parents[1] / "src/wtnmt/configs").glob("*.yaml"))
    )


def test_translate_takes_weights_and_a_run_without_its_best_yet_says_what_to_decode(
    tmp_path, capsys
):
    from wtnmt import Translator

    config = tiny_run_config(tmp_path, train={"max_steps": 3, "valid_every": 100})
    Trainer(config, tmp_path / "run", **QUIET).run()  # stopped before any validation...
    run = tmp_path / "run"
    (run / "model.safetensors").unlink(missing_ok=True)  # ... as an interrupted run is
    (tmp_path / "in.txt").write_text("alpha beta\n")
    base = ["translate", str(run), "-i", str(tmp_path / "in.txt")]
    capsys.readouterr()
    assert cli(base) == 2
    err = one_line(capsys, "translate", "no model.safetensors yet", "--weights checkpoints/step_")
    checkpoint = err.split("--weights ")[1].split(",")[0]
    assert cli([*base, "--weights", checkpoint]) == 0
    out = capsys.readouterr().out
    assert out == Translator.load(run, weights=checkpoint).translate(["alpha beta"])[0] + "\n"
    assert cli([*base, "--weights", "/etc/passwd"]) == 2
    one_line(capsys, "translate", "--weights /etc/passwd: a file in the run directory")


def test_config_mistakes_name_the_key_they_meant_and_where_files_were_looked_for(
    tmp_path, capsys, monkeypatch
):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  valid_evry: 10\n")
    assert cli(["train", str(path), "--out", str(tmp_path / "r")]) == 2
    one_line(capsys, "train", str(path), "train.valid_evry (did you mean train.valid_every?)")
    path.write_text("train:\n  max_steps: 3\n")
    assert (
        cli(["train", str(path), "--set", "train.max_stepz=4", "--out", str(tmp_path / "r")]) == 2
    )
    err = one_line(capsys, "train", "--set 'train.max_stepz=4'", "did you mean train.max_steps?")
    assert str(path) not in err  # the override's mistake, not the file's
    # one's own files and no corpus named: the default corpus does not stand beside them
    path.write_text("data:\n  train_src: nowhere.en\n  train_tgt: nowhere.de\n")
    config = load_config(path)
    assert config.data.corpus is None and config.data.train_src == "nowhere.en"
    monkeypatch.chdir(tmp_path)
    assert cli(["prepare", str(path), "--out", str(tmp_path / "p")]) == 2
    one_line(capsys, "prepare", f"nowhere.en: no such file in {tmp_path} (the working directory)")
