"""The test scores `wtnmt analyze` reads: kept in a run's ``eval/`` for the weights they were
decoded with, found under older names, given the scores added since, and made by `wtnmt
evaluate` where it decodes the run's own split as analyze would (Table 3 a sublayer at a
time too)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import scored_tiny_runs
from wtnmt.cli import main


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    return scored_tiny_runs(tmp_path_factory.mktemp("analyze-scoring"))


def test_evaluate_keeps_the_experiment_scores_of_a_run(runs, tmp_path, capsys):
    run = runs[1]
    before = json.loads((run / "scores.json").read_text())["test"]
    src, ref = tmp_path / "a.src", tmp_path / "a.ref"
    src.write_text("alpha beta\n")
    ref.write_text("AHPLA ATEB\n")
    assert main(["evaluate", str(run), "--src", str(src), "--ref", str(ref)]) == 0
    scores = json.loads((run / "scores.json").read_text())
    assert scores["test"] == before and scores["n_sentences"] == 1


def test_cached_scores_are_recomputed_for_new_weights(runs):
    from wtnmt.analysis.scoring import score_run

    run = runs[1]
    first = score_run(run)
    cache = run / "eval" / "test.beam4.json"  # named by the run's own beam, none being asked
    assert first["beam"] == 4 and first["hypotheses"] == "eval/test.beam4.hyp"
    kept = json.loads(cache.read_text())
    assert kept["weights_sha256"] is not None
    cache.write_text(json.dumps({**kept, "bleu": -1.0}))
    assert score_run(run)["bleu"] == -1.0  # the same weights: the kept result
    cache.write_text(json.dumps({**kept, "bleu": -1.0, "weights_sha256": "other"}))
    assert score_run(run)["bleu"] == first["bleu"]  # other weights: decoded again


def test_a_score_kept_from_before_moses_bleu_gets_it_from_its_hypotheses(runs, tmp_path):
    import shutil

    from wtnmt.analysis.scoring import read_hypotheses, score_run, split_pairs
    from wtnmt.decode.evaluate import moses_bleu

    clone = tmp_path / runs[1].name  # committed results: no weights to decode with
    shutil.copytree(runs[1], clone, ignore=shutil.ignore_patterns("*.safetensors", "checkpoints"))
    cache = clone / "eval" / "test.beam4.json"
    kept = json.loads(cache.read_text())
    old = {k: v for k, v in kept.items() if not k.startswith("bleu_moses")}
    cache.write_text(json.dumps(old))
    got = score_run(clone)
    hyps, refs = read_hypotheses(clone, old), split_pairs(clone, "test")[1]
    assert got == {**old, **moses_bleu(hyps, refs, "yy")} == json.loads(cache.read_text())
    assert got["bleu_moses"] == kept["bleu_moses"]


def test_scores_kept_under_the_name_without_a_beam_are_found_by_the_beam(runs, tmp_path):
    """Scores kept before names carried the run's own beam (``test.beamdefault``, the
    committed grids') answer for that beam, asked or not; another beam's do not."""
    import shutil

    from wtnmt.analysis.scoring import has_score, kept_score, score_run

    first = score_run(runs[1])
    clone = tmp_path / runs[1].name  # committed results: no weights to decode with
    shutil.copytree(runs[1], clone, ignore=shutil.ignore_patterns("*.safetensors", "checkpoints"))
    (clone / "eval" / "test.beam4.json").rename(clone / "eval" / "test.beamdefault.json")
    assert kept_score(clone).name == kept_score(clone, beam=4).name == "test.beamdefault.json"
    assert score_run(clone, beam=4) == score_run(clone) == first
    assert has_score(clone) and not has_score(clone, beam=2)
    assert kept_score(clone, beam=2).name == "test.beam2.json"


def test_analyze_reads_what_evaluate_decoded_of_the_runs_test_split(
    runs, tmp_path, monkeypatch, capsys
):
    """`wtnmt evaluate` of the run's own test files keeps its decoding where analyze looks for
    it (the same record analyze's own decoding makes), κ, α replaced (Table 3) too: analyzing
    after it decodes nothing."""
    import shutil

    from wtnmt.analysis.scoring import kept_score, read_hypotheses, score_run
    from wtnmt.config import load_config
    from wtnmt.decode.translator import Translator

    hand = tmp_path / runs[0].name  # the Weighted Transformer
    shutil.copytree(runs[0], hand, ignore=shutil.ignore_patterns("eval", "checkpoints"))
    data = load_config(hand / "config.yaml").data
    test = ["evaluate", str(hand), "--src", data.test_src, "--ref", data.test_tgt]
    ways = [  # evaluate's options, the name of its files, how analyze asks for that decoding
        ([], "test", {}),
        (["--branch-weights", "random", "--seed", "2"], "test.random-seed2",
         {"branch_weights": "random", "seed": 2}),
        (["--branch-weights", "uniform", "--seed", "3"], "test.uniform",
         {"branch_weights": "uniform"}),
    ]  # fmt: skip
    for options, stem, how in ways:
        assert main([*test, *options]) == 0
        assert f"kept for `wtnmt analyze` as {kept_score(hand, **how)}" in capsys.readouterr().err
        evaluated = json.loads((hand / "eval" / f"{stem}.scores.json").read_text())
        with monkeypatch.context() as patch:  # analyze may not decode
            patch.setattr(Translator, "load", lambda *a, **k: pytest.fail("decoded again"))
            kept = score_run(hand, **how)
        assert kept["hypotheses"] == f"eval/{stem}.hyp", options
        assert {k: kept[k] for k in ("bleu", "chrf", "bleu_lc", "bleu_moses")} == {
            k: evaluated[k] for k in ("bleu", "chrf", "bleu_lc", "bleu_moses")
        }
        kept_score(hand, **how).unlink()
        decoded = score_run(hand, **how)  # analyze's own decoding of the same weights
        assert decoded.keys() == kept.keys()
        differ = {"hypotheses", "decode_seconds"}
        assert {k: v for k, v in decoded.items() if k not in differ} == {
            k: v for k, v in kept.items() if k not in differ
        }
        assert read_hypotheses(hand, decoded) == read_hypotheses(hand, kept)

    kept_score(hand).unlink()  # decoded otherwise than analyze decodes, or other files
    kept_score(hand, branch_weights="uniform").unlink()
    assert main([*test, "--lenpen", "0.6"]) == 0
    shutil.copy(data.test_src, tmp_path / "mine.src")
    assert main([*test[:3], str(tmp_path / "mine.src"), *test[4:]]) == 0
    one = ["--branch-weights-in", "encoder_layers.0.self_attn"]  # uniform in one sublayer
    assert main([*test, "--branch-weights", "uniform", *one]) == 0
    made = sorted(p.name for p in (hand / "eval").iterdir())
    assert main([*test, "--branch-weights", "uniform", *one, *one]) == 0  # named twice
    assert sorted(p.name for p in (hand / "eval").iterdir()) == made  # the same files
    assert not kept_score(hand).exists()
    assert not kept_score(hand, branch_weights="uniform").exists()
    assert "kept for" not in capsys.readouterr().err


def test_analyze_tabulates_what_evaluate_scored_a_sublayer_at_a_time(runs, tmp_path):
    """Table 3 a sublayer at a time: a row for each `wtnmt evaluate --branch-weights-in` of the
    run's scored weights on its test split, decoded as its test score was (its own files
    too), none for other files, another beam or another length penalty; a run without any
    has no such table."""
    import shutil

    from wtnmt.analysis.runs import Run
    from wtnmt.analysis.table3 import table3_by_sublayer
    from wtnmt.config import load_config

    hand = tmp_path / runs[0].name  # the Weighted Transformer
    shutil.copytree(runs[0], hand, ignore=shutil.ignore_patterns("eval", "checkpoints"))
    assert table3_by_sublayer([Run.load(hand)]) is None
    data = load_config(hand / "config.yaml").data
    test = ["evaluate", str(hand), "--src", data.test_src, "--ref", data.test_tgt]
    one, two = "encoder_layers.0.self_attn", "decoder_layers.1.cross_attn"
    asked = [
        ["--branch-weights", "uniform", "--branch-weights-in", one],
        ["--branch-weights", "random", "--seed", "2", "--branch-weights-in", two,
         "--branch-weights-in", one],
    ]  # fmt: skip
    for options in asked:
        assert main([*test, *options]) == 0
    shutil.copy(data.test_src, tmp_path / "mine.src")  # not the run's files: no row
    assert main([*test[:3], str(tmp_path / "mine.src"), *test[4:], *asked[0]]) == 0
    for options in (["--beam", "2"], ["--lenpen", "0.2"]):  # not as its test score decoded
        assert main([*test, *asked[0], *options]) == 0
    # a tiny model scores 0 BLEU everywhere: each evaluation gets a BLEU of its own to be found
    bleu = {}
    for n, path in enumerate(sorted((hand / "eval").glob("*.scores.json")), 1):
        scores = json.loads(path.read_text())
        path.write_text(json.dumps({**scores, "bleu": 10.0 * n}))
        bleu[path.name.removesuffix(".scores.json")] = 10.0 * n
    assert len(bleu) == 5
    scores = json.loads((hand / "scores.json").read_text())
    scores["test"]["bleu"] = 1.0  # the learned weights' score
    (hand / "scores.json").write_text(json.dumps(scores))
    both = bleu[f"test.random-seed2-in-{two}+{one}"]
    alone = bleu[f"test.uniform-in-{one}"]
    table = table3_by_sublayer([Run.load(hand)])
    assert table is not None
    assert table.rows == [
        [hand.name, "random (seed 2)", f"{two} + {one}", both, both - 1.0],
        [hand.name, "uniform", one, alone, alone - 1.0],
    ]
    # scores kept before evaluate said which split of the run they are of: read by the corpus
    # and split they name, still as the run's test score decoded (beam, length penalty)
    config = (hand / "config.yaml").read_text()
    (hand / "config.yaml").write_text(config.replace("corpus: null", "corpus: multi30k", 1))
    for path in (hand / "eval").glob("*.scores.json"):
        scores = json.loads(path.read_text())
        del scores["run_split"]
        scores["source"] = {"corpus": "multi30k", "split": "test"}
        path.write_text(json.dumps(scores))
    table = table3_by_sublayer([Run.load(hand)])
    assert table is not None
    assert [row[2:4] for row in table.rows] == [
        [f"{two} + {one}", both],
        [one, bleu["mine.uniform-in-encoder_layers.0.self_attn"]],
        [one, alone],
    ]
