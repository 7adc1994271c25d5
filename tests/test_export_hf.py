"""`wtnmt export hf` (export/huggingface.py): a Transformer run trained here, exported, loaded by
`transformers`' own Auto classes (no remote code), gives wtnmt's own tokens: its tokenizer
wtnmt's ids, ``generate`` wtnmt's greedy search and its beam search where the settings match
(fairseq's length penalty, the same length limit), for a joint and a separate vocabulary;
``pipeline("translation")`` wtnmt's text. Where ``generate`` cannot express a run's setting
(GNMT's length penalty) the test shows what it does instead. Refusals are one line and write
nothing; the model card carries the run's scores with their signatures. Offline: the models
are trained in the test (a few hundred updates: random weights give tie-prone outputs)."""

from __future__ import annotations

import json
import sys

import pytest
import torch

pytest.importorskip("transformers", reason="export hf needs transformers (pip install 'wtnmt[hf]')")

from helpers import one_line, sentence, tiny_run_config
from wtnmt import Translator
from wtnmt.cli import main as cli
from wtnmt.decode.search import search_batch
from wtnmt.special import EOS, PAD
from wtnmt.train import Trainer

SENTENCES = [sentence(30_000 + i, 2 + i % 6) for i in range(16)]
LIMIT = 12  # tokens before EOS is forced, in both searches


@pytest.fixture(scope="module", params=[True, False], ids=["joint", "separate"])
def exported(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    """A Transformer run of 250 updates and its export (joint or separate vocabularies)."""
    tmp = tmp_path_factory.mktemp("hf")
    config = tiny_run_config(
        tmp,
        model={"attention": "multihead"},
        data={"joint_vocab": request.param},
        train={"max_steps": 250, "valid_every": 250, "log_every": 50},
    )
    Trainer(config, tmp / "run", log_to_stderr=False).run()
    assert cli(["evaluate", str(tmp / "run"), "--beam", "2"]) == 0
    assert cli(["export", "hf", str(tmp / "run"), "--out", str(tmp / "hf")]) == 0
    return tmp / "run", tmp / "hf"


def _loaded(out):  # type: ignore[no-untyped-def]
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    return (
        AutoTokenizer.from_pretrained(str(out)),
        AutoModelForSeq2SeqLM.from_pretrained(str(out)).eval(),
    )


def _generated(hf, tokenizer, text: str, **options) -> list[int]:  # type: ignore[no-untyped-def]
    batch = tokenizer([text], return_tensors="pt")
    with torch.no_grad():
        out = hf.generate(**batch, max_new_tokens=LIMIT + 1, **options)[0].tolist()
    return [t for t in out[1:] if t != PAD]  # after the decoder's start, before padding


def test_the_auto_classes_load_a_marian_model_with_wtnmts_ids(exported):
    from transformers import MarianMTModel, MarianTokenizer

    run, out = exported
    tokenizer, hf = _loaded(out)
    assert isinstance(hf, MarianMTModel) and isinstance(tokenizer, MarianTokenizer)
    config = json.loads((out / "config.json").read_text())
    assert "auto_map" not in config  # transformers' own code, none shipped
    t = Translator.load(run)
    for text, ids in zip(SENTENCES, t.encode(SENTENCES), strict=True):
        assert tokenizer([text]).input_ids[0] == [*ids, EOS]


def test_generate_finds_wtnmts_greedy_and_beam_tokens(exported):
    run, out = exported
    tokenizer, hf = _loaded(out)
    model = Translator.load(run).model
    t = Translator.load(run)
    for text, ids in zip(SENTENCES, t.encode(SENTENCES), strict=True):
        src = torch.tensor([[*ids, EOS]])
        greedy = search_batch(model, src, beam=1, max_len=LIMIT)[0][0]
        assert _generated(hf, tokenizer, text, num_beams=1, do_sample=False) == [
            *greedy.tokens,
            EOS,
        ]
        for alpha in (1.0, 0.6):  # generate's |y|^α is wtnmt's fairseq form
            found = search_batch(
                model, src, beam=4, max_len=LIMIT, alpha=alpha, penalty_form="fairseq"
            )[0][0]
            got = _generated(
                hf, tokenizer, text, num_beams=4, length_penalty=alpha, early_stopping=True
            )
            assert got == [*found.tokens, EOS], (text, alpha)


def test_generate_with_the_runs_settings_ranks_by_fairseqs_length_penalty(exported):
    """The run ranks beam hypotheses by GNMT's ((5 + |y|) / 6)^α; ``generate``, with the
    exported generation_config (the run's beam and α), ranks by |y|^α: it finds wtnmt's
    search in the fairseq form, not the run's own (docs/EXPORT.md names the difference)."""
    run, out = exported
    tokenizer, hf = _loaded(out)
    t = Translator.load(run)
    d = t.config.decode
    assert (d.length_penalty_form, d.length_penalty) == ("gnmt", 0.6)
    assert (hf.generation_config.num_beams, hf.generation_config.length_penalty) == (d.beam, 0.6)
    for text, ids in zip(SENTENCES, t.encode(SENTENCES), strict=True):
        src = torch.tensor([[*ids, EOS]])
        fairseq = search_batch(t.model, src, beam=d.beam, max_len=LIMIT, alpha=0.6,
                               penalty_form="fairseq")[0][0]  # fmt: skip
        assert _generated(hf, tokenizer, text) == [*fairseq.tokens, EOS]


def test_the_translation_pipeline_translates_as_wtnmt(exported):
    import transformers
    from transformers import pipeline
    from transformers.pipelines import SUPPORTED_TASKS

    if "translation" not in SUPPORTED_TASKS:  # (transformers 5 removed it: generate stays)
        pytest.skip(f"transformers {transformers.__version__} has no translation pipeline")

    run, out = exported
    translate = pipeline("translation", model=str(out), tokenizer=str(out), device="cpu")
    t = Translator.load(run)
    got = translate(SENTENCES[:6], num_beams=1, max_new_tokens=LIMIT + 1)
    model = t.model
    want = []
    for ids in t.encode(SENTENCES[:6]):
        hyp = search_batch(model, torch.tensor([[*ids, EOS]]), beam=1, max_len=LIMIT)[0][0]
        want.append(t.vocab.target.decode(hyp.tokens))
    assert [g["translation_text"] for g in got] == want


def test_the_model_card_states_the_runs_scores(exported):
    import yaml

    run, out = exported
    card = (out / "README.md").read_text()
    assert card.startswith("---\n")
    meta = yaml.safe_load(card.split("---\n")[1])
    assert meta["pipeline_tag"] == "translation" and meta["language"] == ["xx", "yy"]
    scores = json.loads((run / "scores.json").read_text())  # `wtnmt evaluate`'s
    metrics = meta["model-index"][0]["results"][0]["metrics"]
    assert metrics[0] == {"type": "bleu", "value": scores["bleu"], "name": "BLEU"}
    for key in ("signature", "chrf_signature"):  # (in a table: each | escaped)
        assert scores[key].replace("|", "\\|") in card
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["decoder_start_token_id"] == 1 and generation["bad_words_ids"] == [[0], [1]]


def test_refusals_are_one_line_and_write_nothing(exported, tmp_path, capsys, monkeypatch):
    run, _ = exported
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("keep")
    assert cli(["export", "hf", str(run), "--out", str(taken)]) == 2
    one_line(capsys, "export", "is not an empty directory")
    assert [p.name for p in taken.iterdir()] == ["mine.txt"]
    assert cli(["export", "hf", str(run)]) == 2
    one_line(capsys, "export", "give --out DIR")
    assert cli(["export", "hf", str(run), "--out", str(tmp_path / "q"), "--quantize", "int8"]) == 2
    one_line(capsys, "export", "not a Hugging Face format")
    monkeypatch.setitem(sys.modules, "transformers", None)  # as where it is not installed
    assert cli(["export", "hf", str(run), "--out", str(tmp_path / "none")]) == 2
    one_line(capsys, "export", "pip install 'wtnmt[hf]'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_a_failed_export_leaves_nothing(exported, tmp_path, monkeypatch):
    import wtnmt.export.model_card as card

    run, _ = exported

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError("disk full")

    monkeypatch.setattr(card, "model_card", broken)
    with pytest.raises(OSError, match="disk full"):
        from wtnmt.export.huggingface import export_hf

        export_hf(run, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_a_weighted_transformer_is_refused_in_one_line(tmp_path, capsys):
    config = tiny_run_config(tmp_path, train={"max_steps": 2, "valid_every": 2})
    Trainer(config, tmp_path / "weighted", log_to_stderr=False).run()
    assert cli(["export", "hf", str(tmp_path / "weighted"), "--out", str(tmp_path / "o")]) == 2
    one_line(capsys, "export", "branched layers have no Marian counterpart")
    assert not (tmp_path / "o").exists()
