"""`wtnmt evaluate`'s records: the scores file and what it says of the source, the compare
block of a later evaluation dropped, BLEU under another tokenizer as sacreBLEU scores it, the
run's own split, and an earlier decoding kept when a new one differs. (Its mistakes in one
line: test_one_line_errors.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import one_line, train_tiny
from wtnmt.cli import main as cli


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return train_tiny(tmp_path_factory.mktemp("evaluate"))


def test_a_later_evaluate_drops_the_compare_block_and_records_its_source(run_dir, tmp_path):
    src, ref = tmp_path / "s.txt", tmp_path / "r.txt"
    src.write_text("alpha beta\n")
    ref.write_text("AHPLA ATEB\n")
    base = ["evaluate", str(run_dir), "--src", str(src), "--ref", str(ref)]
    assert cli([*base, "--compare", str(run_dir), "--samples", "10"]) == 0
    assert "compare" in json.loads((run_dir / "scores.json").read_text())
    assert cli(base) == 0
    scores = json.loads((run_dir / "scores.json").read_text())
    assert "compare" not in scores  # it compared an earlier evaluation, not this one
    assert scores["source"] == {"src": str(src), "ref": str(ref)}


def test_evaluate_tokenize_scores_bleu_as_sacrebleu_does_and_records_it(run_dir, tmp_path, capsys):
    from sacrebleu.metrics import BLEU

    src, ref = tmp_path / "s.txt", tmp_path / "r.txt"
    src.write_text("alpha beta\ngamma\n")
    ref.write_text("ALPHA 的 BETA\n猫 GAMMA\n")
    base = ["evaluate", str(run_dir), "--src", str(src), "--ref", str(ref)]
    assert cli([*base, "--tokenize", "zh"]) == 0
    scores = json.loads((run_dir / "scores.json").read_text())
    hyps = (run_dir / "eval" / "s.tok-zh.hyp").read_text().splitlines()
    expected = BLEU(tokenize="zh").corpus_score(hyps, [ref.read_text().splitlines()])
    assert scores["tokenize"] == "zh" and "tok:zh" in scores["signature"]
    assert scores["bleu"] == round(expected.score, 2)
    capsys.readouterr()
    assert cli([*base, "--tokenize", "moses"]) == 2
    one_line(capsys, "evaluate", "--tokenize moses: one of 13a, intl, zh")
    try:
        BLEU(tokenize="ja-mecab").corpus_score(["a"], [["a"]])
    except RuntimeError:  # sacrebleu[ja] is not installed: said before anything is decoded
        assert cli([*base, "--tokenize", "ja-mecab"]) == 2
        one_line(capsys, "evaluate", "--tokenize ja-mecab", "pip install")
        assert not (run_dir / "eval" / "s.tok-ja-mecab.hyp").exists()


def test_flores_tokenization_offline_says_it_needs_a_download(
    run_dir, tmp_path, capsys, monkeypatch
):
    """spBLEU's SentencePiece model is downloaded by sacreBLEU on first use: with no network
    (here urllib refuses, as an offline machine's would) the one line names the URL, the file
    and what to do, before anything is decoded."""
    import urllib.error
    import urllib.request

    from sacrebleu.tokenizers import tokenizer_spm

    def offline(*args, **kwargs):
        raise urllib.error.URLError("[Errno -2] Name or service not known")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    monkeypatch.setattr(tokenizer_spm, "SACREBLEU_DIR", str(tmp_path / "sacrebleu"))
    src, ref = tmp_path / "s.txt", tmp_path / "r.txt"
    src.write_text("alpha beta\n")
    ref.write_text("ALPHA BETA\n")
    capsys.readouterr()
    args = ["evaluate", str(run_dir), "--src", str(src), "--ref", str(ref)]
    assert cli([*args, "--tokenize", "flores200"]) == 2
    model = tmp_path / "sacrebleu" / "models" / "flores200sacrebleuspm"
    one_line(
        capsys, "evaluate", "--tokenize flores200: needs sacreBLEU's SentencePiece", str(model)
    )
    assert not (run_dir / "eval" / "s.tok-flores200.hyp").exists()


def test_evaluate_scores_the_runs_own_split_of_its_own_files(run_dir, tmp_path, capsys):
    from wtnmt import Translator
    from wtnmt.config import load_config

    data = load_config(run_dir / "config.yaml").data
    assert data.corpus is None and data.test_src  # trained on its own files
    assert cli(["evaluate", str(run_dir), "--split", "test"]) == 0
    scores = json.loads((run_dir / "scores.json").read_text())
    assert scores["source"] == {"run_split": "test"}
    refs = Path(data.test_tgt).read_text().splitlines()
    hyps = Translator.load(run_dir).translate(Path(data.test_src).read_text().splitlines())
    assert (run_dir / "eval" / "run.test.hyp").read_text().splitlines() == hyps
    assert scores["n_sentences"] == len(refs)
    capsys.readouterr()
    assert cli(["evaluate", str(run_dir), "--src", data.test_src]) == 2
    one_line(capsys, "evaluate", "--src and --ref go together", "wtnmt evaluate --help")


def test_evaluating_again_keeps_the_earlier_decoding_and_scores(run_dir, tmp_path, capsys):
    import shutil

    import torch

    from wtnmt import Translator
    from wtnmt.rundir.files import save_weights

    run = tmp_path / "run"
    shutil.copytree(run_dir, run, ignore=shutil.ignore_patterns("checkpoints", "eval"))
    (tmp_path / "s").write_text("alpha beta\ngamma delta epsilon\n")
    args = ["evaluate", str(run), "--src", str(tmp_path / "s"), "--ref", str(tmp_path / "s")]
    assert cli(args) == 0
    first = (run / "eval" / "s.hyp").read_text()
    assert cli(args) == 0  # the same decoding again: nothing kept twice
    assert not list((run / "eval").glob("s.hyp.~*~"))
    model = Translator.load(run).model
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))  # other weights: another decoding
    save_weights(model, run / "model.safetensors")
    capsys.readouterr()
    assert cli(args) == 0
    assert "the earlier s.hyp differed: kept as" in capsys.readouterr().err
    assert (run / "eval" / "s.hyp.~1~").read_text() == first
    assert (run / "eval" / "s.hyp").read_text() != first
    history = [json.loads(line) for line in (run / "eval" / "history.jsonl").open()]
    assert [h["name"] for h in history] == ["s", "s", "s"]
    assert history[0]["hypotheses_sha256"] == history[1]["hypotheses_sha256"]
    assert history[2]["hypotheses_sha256"] != history[0]["hypotheses_sha256"]


def test_evaluate_hyp_scores_a_given_translation_as_evaluate_scores_its_own(
    run_dir, tmp_path, capsys
):
    from sacrebleu.metrics import BLEU, CHRF, TER

    src, ref = tmp_path / "s.txt", tmp_path / "r.txt"
    src.write_text("alpha beta\ngamma delta\nzeta\n")
    ref.write_text("AHPLA ATEB\nAMMAG ATLED\nATEZ\n")
    assert cli(["evaluate", str(run_dir), "--src", str(src), "--ref", str(ref)]) == 0
    own = json.loads((run_dir / "scores.json").read_text())
    hyps = (run_dir / "eval" / "s.hyp").read_text().splitlines()
    refs = ref.read_text().splitlines()
    metric = TER()
    assert own["ter"] == round(metric.corpus_score(hyps, [refs]).score, 2)
    assert (
        own["ter_signature"] == str(metric.get_signature()) and "tok:tercom" in own["ter_signature"]
    )
    given = tmp_path / "given.txt"
    given.write_text("\n".join(hyps) + "\n")
    before = (
        sorted(p.name for p in (run_dir / "eval").iterdir()),
        (run_dir / "scores.json").read_bytes(),
    )
    capsys.readouterr()
    assert cli(["evaluate", str(run_dir), "--hyp", str(given), "--ref", str(ref)]) == 0
    out = capsys.readouterr().out
    bleu = BLEU().corpus_score(hyps, [refs]).score
    chrf = CHRF().corpus_score(hyps, [refs]).score
    ter = TER().corpus_score(hyps, [refs]).score
    assert f"BLEU {bleu:.2f}  chrF {chrf:.2f}  TER {ter:.2f}  (3 sentences)" in out
    assert own["ter_signature"] in out
    after = (
        sorted(p.name for p in (run_dir / "eval").iterdir()),
        (run_dir / "scores.json").read_bytes(),
    )
    assert after == before  # nothing decoded, nothing written into the run
    # the run's own split as the references
    split = run_dir.parent / "test.tgt"
    split_refs = split.read_text().splitlines()
    given.write_text("\n".join(split_refs) + "\n")  # the references themselves
    assert cli(["evaluate", str(run_dir), "--hyp", str(given), "--split", "test"]) == 0
    assert "chrF 100.00  TER 0.00  (8 sentences)" in capsys.readouterr().out
    # refused in one line: decoding options, a count that differs
    assert (
        cli(["evaluate", str(run_dir), "--hyp", str(given), "--ref", str(ref), "--beam", "2"]) == 2
    )
    one_line(capsys, "evaluate", "--hyp scores a translation already made: --beam")
    assert cli(["evaluate", str(run_dir), "--hyp", str(given), "--ref", str(ref)]) == 2
    one_line(capsys, "evaluate", f"--hyp {given} has {len(split_refs)} lines", "have 3")
