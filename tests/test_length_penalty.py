"""The beam's length normalization: GNMT's and fairseq's forms against a hand computation,
and the command line's --lenpen / --lenpen-form."""

from __future__ import annotations

import json
import math

import pytest
import torch

from helpers import train_tiny
from test_decode import A, B, ScriptedModel
from wtnmt.cli import main as cli
from wtnmt.decode import beam_search, length_penalty
from wtnmt.special import EOS

SHORT_OR_LONG = {  # a short hypothesis more probable in all than a longer one, less a token
    (): {A: 0.5, B: 0.4, EOS: 0.1},
    (A,): {EOS: 0.6, B: 0.4},
    (B,): {A: 0.625, EOS: 0.375},
    (A, B): {EOS: 1.0},
    (B, A): {EOS: 1.0},
}


class ShortOrLong(ScriptedModel):
    script = SHORT_OR_LONG


def test_fairseq_normalization_prefers_the_longer_hypothesis_the_unnormalized_beam_drops():
    src = torch.tensor([[7, EOS]])
    # beam 2, by hand. Step 0: A .5 and B .4 live (EOS .1 ranks 3rd, beyond the beam).
    # Step 1: A·EOS .30 ranks 1st and finishes (|y| = 2 with EOS); B·A .25 and A·B .20 live.
    # Step 2: B·A·EOS .25 finishes (|y| = 3): 2 finished, done.
    short, long = math.log(0.5 * 0.6), math.log(0.4 * 0.625 * 1.0)  # -1.204, -1.386
    unnormalized = beam_search(ShortOrLong(), src, beam=2, nbest=2, alpha=0.0)[0]
    assert [h.tokens for h in unnormalized] == [[A], [B, A]]
    assert [h.score for h in unnormalized] == pytest.approx([short, long], abs=1e-6)
    # fairseq (--lenpen 1): -1.204 / 2 = -0.602 < -1.386 / 3 = -0.462, the longer one wins
    fairseq = beam_search(ShortOrLong(), src, beam=2, nbest=2, alpha=1.0, penalty_form="fairseq")
    assert [h.tokens for h in fairseq[0]] == [[B, A], [A]]
    assert [h.score for h in fairseq[0]] == pytest.approx([long / 3, short / 2], abs=1e-6)
    assert [h.log_prob for h in fairseq[0]] == pytest.approx([long, short], abs=1e-6)
    # GNMT's α = 0.6 divides by (7/6)^.6 = 1.097 and (8/6)^.6 = 1.188: -1.098 > -1.167, short
    gnmt = beam_search(ShortOrLong(), src, beam=2, nbest=2, alpha=0.6)[0]
    assert [h.tokens for h in gnmt] == [[A], [B, A]]
    assert gnmt[0].score == pytest.approx(short / (7 / 6) ** 0.6, abs=1e-6)
    assert length_penalty(3, 1.0, "fairseq") == 3.0
    with pytest.raises(ValueError, match="'moses' is not one of gnmt, fairseq"):
        beam_search(ShortOrLong(), src, beam=2, penalty_form="moses")


def test_lenpen_options_reach_the_search_and_are_recorded(tmp_path, capsys):
    run_dir = train_tiny(tmp_path)
    src = tmp_path / "src.txt"
    src.write_text("alpha beta\ngamma delta\n")
    args = ["evaluate", str(run_dir), "--src", str(src), "--ref", str(src), "--beam", "2"]
    assert cli([*args, "--lenpen", "0"]) == 0
    scores = json.loads((run_dir / "eval" / "src.lenpen0-gnmt.beam2.scores.json").read_text())
    assert scores["length_penalty"] == {"alpha": 0.0, "form": "gnmt"}
    assert cli([*args, "--lenpen-form", "fairseq"]) == 0
    scores = json.loads((run_dir / "scores.json").read_text())
    assert scores["length_penalty"]["form"] == "fairseq"
    capsys.readouterr()
    assert cli([*args, "--lenpen", "nan"]) == 2
    assert "--lenpen nan: allowed -10 to 10" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli(["translate", str(run_dir), "--lenpen-form", "moses"])
    assert "invalid choice: 'moses'" in capsys.readouterr().err


def test_evaluate_decodes_with_the_weights_named(tmp_path, capsys):
    import shutil

    run_dir = train_tiny(tmp_path)
    src = tmp_path / "src.txt"
    src.write_text("alpha beta\ngamma delta\n")
    args = ["evaluate", str(run_dir), "--src", str(src), "--ref", str(src), "--beam", "2"]
    assert cli(args) == 0
    shutil.copy(run_dir / "model.safetensors", run_dir / "copy.safetensors")
    assert cli([*args, "--weights", "copy.safetensors"]) == 0
    same = (run_dir / "eval" / "src.copy.beam2.hyp").read_text()
    assert same == (run_dir / "eval" / "src.beam2.hyp").read_text()
    assert json.loads((run_dir / "scores.json").read_text())["weights"] == "copy.safetensors"
    capsys.readouterr()
    assert cli([*args, "--weights", "../model.safetensors"]) == 2
    assert "a file in the run directory, by its path there" in capsys.readouterr().err
    assert cli([*args, "--weights", "missing.safetensors"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing.safetensors" in err


def test_length_limits_on_the_command_line_reach_the_search_and_are_recorded(tmp_path, capsys):
    import dataclasses

    from wtnmt import Translator

    run_dir = train_tiny(tmp_path)
    src = tmp_path / "src.txt"
    lines = ["alpha beta gamma delta", "zeta eta"]
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.txt"
    limits = ["--max-len-a", "0", "--max-len-b", "2"]
    args = ["translate", str(run_dir), "-i", str(src), "-o", str(out), "--engine", "pytorch"]
    assert cli([*args, *limits]) == 0
    oracle = Translator.load(run_dir)  # the same limits set in the run's decode config
    decode = dataclasses.replace(oracle.config.decode, max_len_a=0.0, max_len_b=2)
    oracle.config = dataclasses.replace(oracle.config, decode=decode)
    assert out.read_text().splitlines() == oracle.translate(lines)
    for ids in oracle.translate_ids(oracle.encode(lines)):
        assert len(ids[0].ids) <= 2  # a·|x| + b = 2 tokens at most
    evaluate = ["evaluate", str(run_dir), "--src", str(src), "--ref", str(src)]
    assert cli([*evaluate, *limits]) == 0
    scores = json.loads((run_dir / "eval" / "src.maxlen0-2.scores.json").read_text())
    assert scores["max_len"] == {"a": 0.0, "b": 2}
    capsys.readouterr()
    assert cli([*evaluate, "--max-len-a", "1e308"]) == 2
    assert "--max-len-a 1e+308: allowed 0 to 64" in capsys.readouterr().err
