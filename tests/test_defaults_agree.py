"""Round four's smaller mends, each as a user meets it: `average` with its defaults on a run
trained with the defaults, --threads above the cores said, WTNMT_FLOAT32_KERNELS checked under
int8 too, whole first sentences in `wtnmt presets`, both vocabulary choices in `prepare
--help`, and a Transformer's log without a κ/α learning rate it has not got."""

from __future__ import annotations

import json
import os

from helpers import one_line, tiny_run_config, translate_job
from wtnmt.cli import main as cli
from wtnmt.config import TrainConfig
from wtnmt.runtime import threads_warning
from wtnmt.train import Trainer


def test_average_with_its_defaults_fits_a_run_trained_with_the_defaults(tmp_path, capsys):
    keep = TrainConfig.keep_checkpoints
    config = tiny_run_config(tmp_path, train={"max_steps": 2 * (keep + 1), "valid_every": 2})
    assert config.train.keep_checkpoints == keep  # the default, as a user's run has it
    Trainer(config, tmp_path / "run", log_to_stderr=False).run()
    assert cli(["average", str(tmp_path / "run"), "--out", str(tmp_path / "avg")]) == 0
    record = json.loads((tmp_path / "avg" / "averaged.json").read_text())
    assert len(record["checkpoints"]) == keep
    # a short run that saved fewer: all of them
    (tmp_path / "short").mkdir()
    short = tiny_run_config(tmp_path / "short", train={"max_steps": 2, "valid_every": 2})
    Trainer(short, tmp_path / "short" / "run", log_to_stderr=False).run()
    assert cli(["average", str(tmp_path / "short" / "run"), "--out", str(tmp_path / "a2")]) == 0
    assert len(json.loads((tmp_path / "a2" / "averaged.json").read_text())["checkpoints"]) == 1


def test_threads_above_the_usable_cores_are_said(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert threads_warning(2) is None and threads_warning(None) is None
    said = threads_warning(1000)
    assert said is not None and "--threads 1000: more than the 2 cores" in said
    args, out = translate_job(tmp_path)
    capsys.readouterr()
    assert cli([*args, "--threads", "3"]) == 0
    err = capsys.readouterr().err
    assert "wtnmt translate: warning: --threads 3: more than the 2 cores" in err
    assert out.read_text().strip()


def test_a_misspelt_float32_kernels_name_is_refused_under_int8_too(tmp_path, capsys, monkeypatch):
    args, out = translate_job(tmp_path)
    monkeypatch.setenv("WTNMT_FLOAT32_KERNELS", "bogus")
    for extra in ([], ["--quantize", "int8"]):
        capsys.readouterr()
        assert cli([*args, *extra]) == 2
        one_line(capsys, "translate", "WTNMT_FLOAT32_KERNELS='bogus'", "onednn")
    assert not out.exists()


def test_presets_print_whole_first_sentences(capsys):
    capsys.readouterr()
    assert cli(["presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 10
    for line in lines:
        text = line.split(maxsplit=1)[1]
        assert text.endswith(".") and text.count("(") == text.count(")"), line


def test_prepare_help_names_both_vocabulary_choices(capsys):
    capsys.readouterr()
    try:
        cli(["prepare", "--help"])
    except SystemExit as e:
        assert e.code == 0
    help_text = capsys.readouterr().out
    assert "--joint-vocab" in help_text and "--no-joint-vocab" in help_text


def test_a_transformers_log_has_no_branch_learning_rate(tmp_path):
    for kind, has in (("multihead", False), ("branched", True)):
        (tmp_path / kind).mkdir()
        config = tiny_run_config(tmp_path / kind, model={"attention": kind})
        Trainer(config, tmp_path / kind / "run", log_to_stderr=False).run()
        log = (tmp_path / kind / "run" / "train.log").read_text()
        steps = [json.loads(line) for line in (tmp_path / kind / "run" / "metrics.jsonl").open()]
        logged = [s for s in steps if "lr" in s]
        assert logged and ("lr κα" in log) == has
        assert all(("lr_branch" in s) == has for s in logged)
