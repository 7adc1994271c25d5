"""`wtnmt translate` and `wtnmt evaluate` on a briefly trained tiny run."""

from __future__ import annotations

import hashlib
import json
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers import sentence, tiny_run_config
from wtnmt import Translator
from wtnmt.cli import main as cli
from wtnmt.train import Trainer


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("decode")
    config = tiny_run_config(tmp, train={"max_steps": 30, "valid_every": 30})
    Trainer(config, tmp / "run", log_to_stderr=False).run()
    return tmp / "run"


def test_translate_keeps_order_and_line_count(run_dir, tmp_path, capsys):
    lines = [sentence(1, 6), "", sentence(2, 2), " ".join(["alpha"] * 400), sentence(3, 4), ""]
    (tmp_path / "in.txt").write_text("".join(line + "\n" for line in lines))
    assert (
        cli(
            [
                "translate",
                str(run_dir),
                "-i",
                str(tmp_path / "in.txt"),
                "-o",
                str(tmp_path / "out.txt"),
                "--beam",
                "2",
            ]
        )
        == 0
    )
    out = (tmp_path / "out.txt").read_text().split("\n")
    assert out[-1] == "" and len(out) - 1 == len(lines)
    assert out[1] == "" and out[5] == ""
    err = capsys.readouterr().err
    assert "line 4:" in err and "cut to the model's maximum" in err
    translator = Translator.load(run_dir)
    alone = [translator.translate([line], beam=2)[0] for line in lines]
    assert out[:-1] == alone  # batching by length and restoring the order changes nothing


def test_translate_reads_stdin_and_writes_nbest(run_dir):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "wtnmt.cli",
            "translate",
            str(run_dir),
            "--beam",
            "3",
            "--nbest",
            "2",
        ],
        input="alpha beta\n\ngamma\n",
        capture_output=True,
        text=True,
        check=True,
    )
    rows = [row.split(" ||| ") for row in done.stdout.split("\n")[:-1]]
    assert [row[0] for row in rows] == ["0", "0", "1", "1", "2", "2"]  # N lines per input
    expected = Translator.load(run_dir).translate_nbest(["alpha beta", "gamma"], beam=3, nbest=2)
    for row, option in zip(rows[:2] + rows[4:], expected[0] + expected[1], strict=True):
        assert row[1] == option.text and float(row[2]) == pytest.approx(option.score, abs=1e-4)
    assert rows[2] == ["1", "", "0.0000"] and rows[3] == ["1", "", "-inf"]  # the empty line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--beam", "0"], "--beam 0: must be at least 1"),
        (["--nbest", "0"], "--nbest 0: must be at least 1"),
        (["--chunk", "0"], "--chunk 0: must be at least 1"),
        (["--threads", "-1"], "--threads -1: must be at least 1"),
        (["--nbest", "5"], "--nbest 5 is more than the beam size 4: raise --beam"),
        (["--beam", "2", "--nbest", "3"], "--nbest 3 is more than the beam size 2: raise --beam"),
        (["-o", "no/such/dir/out.txt"], "-o no/such/dir/out.txt: the directory no/such/dir does"),
        (["-o", "."], "-o .: is a directory; -o names the file to write"),
        (["--device", "cuda"], "--device cuda: this machine has no CUDA device; use --device cpu"),
        (["-i", "missing.txt"], "missing.txt: no such file"),
    ],
)
def test_translate_answers_bad_options_in_one_line(run_dir, capsys, args, message):
    if args[0] == "--device" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert cli(["translate", str(run_dir), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wtnmt translate: error: ") and message in err and err.count("\n") == 1


def test_translate_reads_decode_nbest_from_the_run(run_dir, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    text = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(text.replace("  nbest: 1\n", "  nbest: 2\n"))
    (tmp_path / "in.txt").write_text("alpha beta\n")
    assert cli(["translate", str(run), "-i", str(tmp_path / "in.txt")]) == 0
    assert [r.split(" ||| ")[0] for r in capsys.readouterr().out.split("\n")[:-1]] == ["0", "0"]
    assert cli(["translate", str(run), "-i", str(tmp_path / "in.txt"), "--beam", "1"]) == 2
    err = capsys.readouterr().err
    assert "decode.nbest=2 (the run's config) is more than the beam size 1: raise --beam" in err


def test_translate_answers_each_line_while_the_pipe_stays_open(run_dir):
    proc = subprocess.Popen(
        [sys.executable, "-m", "wtnmt.cli", "translate", str(run_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    expected = Translator.load(run_dir).translate(["alpha beta", "gamma delta"])
    try:
        for line, translation in zip(["alpha beta", "gamma delta"], expected, strict=True):
            proc.stdin.write(line.encode() + b"\n")
            proc.stdin.flush()  # and keep the pipe open: the answer must come before EOF
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            assert ready, "no translation while the input stays open"
            assert proc.stdout.readline().decode() == translation + "\n"
        proc.stdin.close()
        assert proc.wait(30) == 0 and proc.stdout.read() == b""
    finally:
        proc.kill()


def test_evaluate_reproduces_sacrebleu_on_the_same_files(run_dir, tmp_path):
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("".join(sentence(i, 3) + "\n" for i in range(30)))
    ref.write_text("".join(sentence(i + 1, 3).upper() + "\n" for i in range(30)))
    assert cli(["evaluate", str(run_dir), "--src", str(src), "--ref", str(ref), "--beam", "2"]) == 0

    scores = json.loads((run_dir / "scores.json").read_text())
    hyp = run_dir / "eval" / "src.beam2.hyp"  # not the run's beam (4): named apart
    theirs = subprocess.run(
        [sys.executable, "-m", "sacrebleu", str(ref), "-i", str(hyp), "-b"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert scores["bleu"] == pytest.approx(float(theirs.stdout.strip()), abs=0.01)
    # lowercased BLEU as sacreBLEU -lc scores it, and the literature's on Moses tokens
    lowercased = subprocess.run(
        [sys.executable, "-m", "sacrebleu", str(ref), "-i", str(hyp), "-b", "-lc"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert scores["bleu_lc"] == pytest.approx(float(lowercased.stdout.strip()), abs=0.01)
    from wtnmt.config import load_config
    from wtnmt.decode.evaluate import moses_bleu

    lines = [hyp.read_text().splitlines(), ref.read_text().splitlines()]
    lang = load_config(run_dir / "config.yaml").data.tgt_lang
    assert scores["bleu_moses"] == moses_bleu(*lines, lang)["bleu_moses"]
    theirs_hyp = hyp.read_text()
    assert set(scores) >= {"bleu", "chrf", "signature", "n_sentences"}
    assert scores["n_sentences"] == 30 and scores["beam"] == 2  # what was scored says how
    # the run's own beam next: its files beside beam 2's, not over them
    assert cli(["evaluate", str(run_dir), "--src", str(src), "--ref", str(ref)]) == 0
    assert json.loads((run_dir / "eval" / "src.scores.json").read_text())["beam"] == 4
    assert json.loads((run_dir / "eval" / "src.beam2.scores.json").read_text())["beam"] == 2
    assert hyp.read_text() == theirs_hyp


def test_evaluate_with_replaced_branch_weights_and_compare(run_dir, tmp_path):
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("alpha beta\ngamma delta\n")
    ref.write_text("AHPLA ATEB\nAMMAG ATLED\n")
    assert (
        cli(
            [
                "evaluate",
                str(run_dir),
                "--src",
                str(src),
                "--ref",
                str(ref),
                "--branch-weights",
                "uniform",
                "--compare",
                str(run_dir),
                "--samples",
                "50",
            ]
        )
        == 0
    )
    assert (run_dir / "eval" / "src.uniform.hyp").is_file()


def test_evaluate_keeps_each_random_draw_apart(run_dir, tmp_path):
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("alpha beta\ngamma delta\n")
    ref.write_text("AHPLA ATEB\nAMMAG ATLED\n")
    argv = ["evaluate", str(run_dir), "--src", str(src), "--ref", str(ref)]
    for seed in (1, 2):
        assert cli([*argv, "--branch-weights", "random", "--seed", str(seed)]) == 0
    for seed in (1, 2):  # the second draw wrote beside the first, not over it
        scores = json.loads((run_dir / "eval" / f"src.random-seed{seed}.scores.json").read_text())
        assert scores["branch_weights"] == "random" and scores["seed"] == seed
        assert (run_dir / "eval" / f"src.random-seed{seed}.hyp").is_file()
    assert json.loads((run_dir / "scores.json").read_text())["seed"] == 2  # the latest


def test_evaluate_replaces_branch_weights_in_the_named_sublayers_alone(run_dir, tmp_path, capsys):
    """`--branch-weights-in` scores κ, α replaced in one sublayer: its own files, what was
    replaced in its scores, the same translations as a model replaced there by hand; a name
    the model does not have, or no replacement to make, is one line and exit 2; where the
    sublayers' names would make a file name too long, their count and digest name the files."""
    from wtnmt.model import branch_weight_table, override_branch_weights

    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("alpha beta\ngamma delta\nalpha\n")
    ref.write_text("AHPLA ATEB\nAMMAG ATLED\nAHPLA\n")
    argv = ["evaluate", str(run_dir), "--src", str(src), "--ref", str(ref)]
    one = "decoder_layers.1.cross_attn"
    assert cli([*argv, "--branch-weights", "uniform", "--branch-weights-in", one]) == 0
    stem = run_dir / "eval" / f"src.uniform-in-{one}"
    scores = json.loads(Path(f"{stem}.scores.json").read_text())
    assert scores["branch_weights"] == "uniform" and scores["branch_weights_in"] == [one]
    by_hand = Translator.load(run_dir)
    override_branch_weights(by_hand.model, "uniform", only=[one])
    hyps = by_hand.translate(["alpha beta", "gamma delta", "alpha"], beam=scores["beam"])
    assert Path(f"{stem}.hyp").read_text().splitlines() == hyps
    every = list(branch_weight_table(by_hand.model))
    long_src = tmp_path / f"{'s' * 150}.txt"  # a name with no room left for every sublayer's
    long_src.write_text(src.read_text())
    options = [f"--branch-weights-in={name}" for name in every]
    argv_long = ["evaluate", str(run_dir), "--src", str(long_src), "--ref", str(ref)]
    assert cli([*argv_long, "--branch-weights", "random", "--seed", "2", *options]) == 0
    digest = hashlib.sha256("+".join(every).encode()).hexdigest()[:12]
    stem = run_dir / "eval" / f"{long_src.stem}.random-seed2-in-{len(every)}-sublayers-{digest}"
    assert json.loads(Path(f"{stem}.scores.json").read_text())["branch_weights_in"] == every
    assert max(len(p.name) for p in (run_dir / "eval").iterdir()) <= 255
    capsys.readouterr()
    for options, message in [
        (["--branch-weights", "uniform", "--branch-weights-in", "encoder_layers.9.self_attn"],
         "--branch-weights-in encoder_layers.9.self_attn: not a branched sublayer of this model; "
         "it has encoder_layers.0.self_attn, "),
        (["--branch-weights-in", one], "--branch-weights-in names where --branch-weights "),
    ]:  # fmt: skip
        assert cli([*argv, *options]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"wtnmt evaluate: error: {message}") and err.count("\n") == 1, err


def test_loading_something_that_is_not_a_run_is_a_clear_error(tmp_path, capsys):
    assert cli(["translate", str(tmp_path)]) == 2
    assert "no config.yaml there" in capsys.readouterr().err
