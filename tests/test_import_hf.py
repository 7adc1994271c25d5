"""`wtnmt import hf` (export/hf_import.py, export/marian_vocab.py): Marian models of OPUS-MT's
configuration (swish, attention biases, ``final_logits_bias``, ``<pad>`` starting the decoder,
``</s>`` 0 and ``<unk>`` 1 in a ``vocab.json``; one vocabulary over two SentencePiece models, or
separate vocabularies), built and trained here a few hundred updates (random weights give
tie-prone outputs) with SentencePiece models trained here, become wtnmt runs whose
translations on every engine are ``generate``'s, greedy and beam; they evaluate, serve and
fine-tune; pruning is refused in one line, as is a folder wtnmt cannot import. Offline."""

from __future__ import annotations

import json
import random

import pytest
import torch

pytest.importorskip("transformers", reason="import hf needs transformers (pip install 'wtnmt[hf]')")

from helpers import one_line, sentence, translate, write_pairs
from wtnmt import Translator
from wtnmt.cli import main as cli
from wtnmt.decode.search import search_batch
from wtnmt.special import BOS, EOS

SENTENCES = [sentence(40_000 + i, 2 + i % 6) for i in range(14)]
LIMIT = 14  # tokens before EOS is forced, in both searches
LAYOUTS = ("shared", "separate")


def _spm(texts: list[str], prefix, size: int) -> None:  # type: ignore[no-untyped-def]
    """A SentencePiece model as OPUS-MT's: unigram, <unk> 0, <s> 1, </s> 2, no <pad>."""
    import sentencepiece as spm

    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_prefix=str(prefix),
        vocab_size=size,
        model_type="unigram",
        hard_vocab_limit=False,
        minloglevel=2,
    )
    prefix.with_suffix(".model").rename(prefix.with_suffix(".spm"))


def _pieces(path) -> list[str]:  # type: ignore[no-untyped-def]
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(path))
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if sp.is_unused(i) is False
            and not sp.is_control(i) and not sp.is_unknown(i)]  # fmt: skip


def _first_piece(path, text: str) -> str:  # type: ignore[no-untyped-def]
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(path)).encode(text, out_type=str)[0]


def _vocab(pieces: list[str], dropped: set[str]) -> dict[str, int]:
    """Marian's vocab.json: </s> 0, <unk> 1, the pieces, <pad> last; ``dropped`` left out
    (pieces Marian's vocabulary lacks: read as <unk>)."""
    table = {"</s>": 0, "<unk>": 1}
    for piece in pieces:
        if piece not in table and piece not in dropped:
            table[piece] = len(table)
    table["<pad>"] = len(table)
    return table


def _marian(tmp, layout: str):  # type: ignore[no-untyped-def]
    """A Marian folder of OPUS-MT's kind, trained 300 updates on the helpers' corpus."""
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

    folder = tmp / f"opus-mt-{layout}-xx-yy"
    folder.mkdir()
    sources = [sentence(i, 2 + i % 5) for i in range(400)]
    targets = [translate(s) for s in sources]
    _spm(sources, folder / "source", 40)
    _spm(targets, folder / "target", 48)
    src_pieces, tgt_pieces = _pieces(folder / "source.spm"), _pieces(folder / "target.spm")
    # pieces of the SentencePiece models the vocabulary lacks (Marian reads them as <unk>),
    # one that the test's first sentence has
    dropped = {_first_piece(folder / "source.spm", SENTENCES[0]), tgt_pieces[-2]}
    separate = layout == "separate"
    if separate:
        source, target = _vocab(src_pieces, dropped), _vocab(tgt_pieces, dropped)
        (folder / "target_vocab.json").write_text(json.dumps(target))
    else:
        source = target = _vocab(src_pieces + tgt_pieces, dropped)
    (folder / "vocab.json").write_text(json.dumps(source))
    tokenizer = MarianTokenizer(
        source_spm=str(folder / "source.spm"),
        target_spm=str(folder / "target.spm"),
        vocab=str(folder / "vocab.json"),
        target_vocab_file=str(folder / "target_vocab.json") if separate else None,
        separate_vocabs=separate,
        source_lang="xx",
        target_lang="yy",
    )
    pad = source["<pad>"]
    config = MarianConfig(
        vocab_size=len(source),
        decoder_vocab_size=len(target),
        share_encoder_decoder_embeddings=not separate,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        activation_function="swish",
        scale_embedding=True,
        max_position_embeddings=64,
        pad_token_id=pad,
        eos_token_id=0,
        decoder_start_token_id=target["<pad>"],
        forced_eos_token_id=0,
        dropout=0.0,
    )
    torch.manual_seed(0)
    model = MarianMTModel(config)
    with torch.no_grad():  # biases Marian's training would give, and OPUS-MT's logits bias
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
        model.final_logits_bias.normal_(0, 0.5)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    rng = random.Random(0)
    model.train()
    for _ in range(300):
        batch = rng.sample(range(len(sources)), 32)
        inputs = tokenizer(
            [sources[i] for i in batch],
            text_target=[targets[i] for i in batch],
            return_tensors="pt",
            padding=True,
        )
        inputs["labels"] = inputs["labels"].masked_fill(inputs["labels"] == pad, -100)
        loss = model(**inputs).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():  # as OPUS-MT's conversion from Marian leaves it (tying trained it)
        model.get_output_embeddings().weight[target["<pad>"]] = 0.0
    model.eval().save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    GenerationConfig(
        num_beams=4,
        max_length=64,
        bad_words_ids=[[target["<pad>"]]],
        decoder_start_token_id=target["<pad>"],
        eos_token_id=0,
        pad_token_id=pad,
        forced_eos_token_id=0,
    ).save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module", params=LAYOUTS)
def imported(request, tmp_path_factory):  # type: ignore[no-untyped-def]
    tmp = tmp_path_factory.mktemp(request.param)
    folder = _marian(tmp, request.param)
    assert cli(["import", "hf", str(folder), "--out", str(tmp / "run")]) == 0
    return folder, tmp / "run"


def _loaded(folder):  # type: ignore[no-untyped-def]
    from transformers import MarianMTModel, MarianTokenizer

    return MarianTokenizer.from_pretrained(str(folder)), MarianMTModel.from_pretrained(
        str(folder)
    ).eval()


def _generated(hf, tokenizer, text: str, **options) -> list[str]:  # type: ignore[no-untyped-def]
    """generate's pieces for ``text``, after the decoder's start, with its </s>."""
    batch = tokenizer([text], return_tensors="pt")
    with torch.no_grad():
        out = hf.generate(**batch, max_new_tokens=LIMIT + 1, **options)[0].tolist()
    pad = hf.config.pad_token_id
    return tokenizer.convert_ids_to_tokens([t for t in out[1:] if t != pad])


def test_the_import_keeps_marians_segmentation_and_reads_its_missing_pieces_as_unk(imported):
    folder, run = imported
    tokenizer, _ = _loaded(folder)
    t = Translator.load(run)
    record = json.loads((run / "imported.json").read_text())
    table = json.loads((folder / "vocab.json").read_text())
    assert record["read_as_unk"] and not set(record["read_as_unk"]) & set(table)
    by_id = {i: piece for piece, i in table.items()}
    # (the tokenizer's convert_ids_to_tokens reads the target's vocabulary where it has two)
    for text, ids in zip(SENTENCES, t.encode(SENTENCES), strict=True):
        theirs = [by_id[i] for i in tokenizer([text]).input_ids[0]]
        ours = t.pieces([*ids, EOS], source=True)
        assert theirs == [piece if piece in table else "<unk>" for piece in ours]
    used = {p for ids in t.encode(SENTENCES) for p in t.pieces(ids, source=True)}
    assert used & set(record["read_as_unk"])  # (the sentences have one)


@pytest.mark.parametrize("engine", ["pytorch", "native", "onnxruntime"])
def test_every_engine_translates_as_generate_greedy_and_beam(imported, engine):
    folder, run = imported
    tokenizer, hf = _loaded(folder)
    t = Translator.load(run, engine=engine)
    assert t.engine == engine
    for text, ids in zip(SENTENCES, t.encode(SENTENCES), strict=True):
        src = torch.tensor([[*ids, EOS]])
        greedy = search_batch(t.network, src, beam=1, max_len=LIMIT)[0][0]
        want = _generated(hf, tokenizer, text, num_beams=1, do_sample=False)
        assert t.pieces([*greedy.tokens, EOS]) == want, text
        for alpha in (1.0, 0.6):  # generate's |y|^α: wtnmt's fairseq form
            found = search_batch(
                t.network, src, beam=4, max_len=LIMIT, alpha=alpha, penalty_form="fairseq"
            )[0][0]
            got = _generated(
                hf, tokenizer, text, num_beams=4, length_penalty=alpha, early_stopping=True
            )
            assert t.pieces([*found.tokens, EOS]) == got, (text, alpha)
    assert any(len(s.split()) > 1 for s in t.translate(SENTENCES))  # (not degenerate)


def test_the_imported_run_evaluates_serves_and_refuses_pruning(imported, tmp_path, capsys):
    from fastapi.testclient import TestClient

    from wtnmt.serve.app import create_app
    from wtnmt.serve.settings import ServeSettings

    _, run = imported
    src, ref = write_pairs(tmp_path, "test", SENTENCES)
    assert cli(["evaluate", str(run), "--src", str(src), "--ref", str(ref), "--beam", "2"]) == 0
    assert "BLEU" in capsys.readouterr().out
    t = Translator.load(run)
    with TestClient(create_app(t, ServeSettings())) as client:
        got = client.post("/v1/translate", json={"text": SENTENCES[:3], "beam": 2}).json()
    assert got == {"translations": t.translate(SENTENCES[:3], beam=2)}
    assert cli(["prune", str(run), "--out", str(tmp_path / "pruned"), "--keep", "1"]) == 2
    one_line(capsys, "prune", str(run), "has no branches")
    assert not (tmp_path / "pruned").exists()


def test_a_fine_tune_starts_from_the_imported_weights(imported, tmp_path):
    """README's recipe: `base:` the run's config, `train.init_from: RUN`, one's own files."""
    from wtnmt.config import load_config
    from wtnmt.rundir.files import read_weights
    from wtnmt.train import Trainer

    _, run = imported
    train = write_pairs(tmp_path, "domain", [sentence(60_000 + i, 3 + i % 4) for i in range(60)])
    valid = write_pairs(tmp_path, "dev", SENTENCES[:6])
    (tmp_path / "domain.yaml").write_text(  # README's recipe
        f"base: {run / 'config.yaml'}\n"
        f"train: {{init_from: {run}, max_steps: 6, valid_every: 3, warmup: 2, "
        f"max_tokens: 512, threads: 1}}\n"
        f"data: {{train_src: {train[0]}, train_tgt: {train[1]}, valid_src: {valid[0]}, "
        f"valid_tgt: {valid[1]}, test_src: {valid[0]}, test_tgt: {valid[1]}, "
        f"prepared_dir: {tmp_path / 'prepared'}}}\n"
    )
    config = load_config(tmp_path / "domain.yaml")
    trainer = Trainer(config, tmp_path / "tuned", log_to_stderr=False)
    weights = read_weights(run / "model.safetensors")
    for name, tensor in trainer.model.state_dict().items():
        assert torch.equal(tensor, weights[name]), name
    state = trainer.run()
    assert state.step == 6
    tuned = Translator.load(tmp_path / "tuned")
    assert tuned.translate(SENTENCES[:2])  # (it decodes; its weights moved)
    after = read_weights(tmp_path / "tuned" / "model.safetensors")
    assert not torch.equal(after["embedding.bias"], weights["embedding.bias"])
    # Marian starts from a zero vector (its start row zero): the run says so, and the
    # fine-tune kept that row at zero while every other moved
    assert config.model.decoder_start == "zero"
    assert not after["embedding.weight"][BOS].any() and not weights["embedding.weight"][BOS].any()
    assert not torch.equal(after["embedding.weight"][EOS], weights["embedding.weight"][EOS])


def test_export_hf_of_the_imported_run_is_marians_model_again(imported, tmp_path):
    """The way back: `wtnmt export hf` writes a Marian folder (biases, swish, the logits'
    bias) that generates the original folder's tokens."""
    folder, run = imported
    tokenizer, hf = _loaded(folder)
    assert cli(["export", "hf", str(run), "--out", str(tmp_path / "back")]) == 0
    again_tokenizer, again = _loaded(tmp_path / "back")
    assert again.config.activation_function == "swish"
    for text in SENTENCES[:8]:
        for beams in (1, 4):
            want = _generated(hf, tokenizer, text, num_beams=beams, early_stopping=True)
            got = _generated(again, again_tokenizer, text, num_beams=beams, early_stopping=True)
            assert got == want, (text, beams)


def test_what_cannot_be_imported_is_one_line_and_writes_nothing(imported, tmp_path, capsys):
    folder, _ = imported
    out = tmp_path / "run"
    other = tmp_path / "bart"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "bart"}))
    assert cli(["import", "hf", str(other), "--out", str(out)]) == 2
    one_line(capsys, "import", "model_type 'bart'", "Marian")
    assert cli(["import", "hf", str(tmp_path / "nowhere"), "--out", str(out)]) == 2
    one_line(capsys, "import", "nowhere", "no such directory")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    assert cli(["import", "hf", str(folder), "--out", str(taken)]) == 2
    one_line(capsys, "import", str(taken), "not an empty directory")
    assert [p.name for p in taken.iterdir()] == ["notes.txt"]
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in folder.iterdir():
        if f.name != "vocab.json":
            (broken / f.name).write_bytes(f.read_bytes())
    assert cli(["import", "hf", str(broken), "--out", str(out)]) == 2
    one_line(capsys, "import", "no vocab.json")
    assert not out.exists() and not list(tmp_path.glob(".run.*"))


def test_ctranslate2s_own_conversion_of_the_folder_translates_as_the_import(imported, tmp_path):
    """An independent path to the same network: CTranslate2's converter of the Marian folder,
    fed Marian's pieces, finds the imported run's greedy tokens. (Its beam search may rank
    otherwise: the converter drops ``<pad>`` from the vocabulary, so its log-probabilities are
    normalised without the share Marian's and wtnmt's softmax give ``<pad>``.)"""
    ctranslate2 = pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed")
    folder, run = imported
    converter = ctranslate2.converters.TransformersConverter(str(folder))
    converter.convert(str(tmp_path / "ct2"))
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    tokenizer, _ = _loaded(folder)
    t = Translator.load(run, engine="native")
    table = json.loads((folder / "vocab.json").read_text())
    by_id = {i: piece for piece, i in table.items()}
    target = {}  # CTranslate2's converter names separate targets' ids with vocab.json's pieces
    if (folder / "target_vocab.json").is_file():
        theirs = json.loads((folder / "target_vocab.json").read_text())
        target = {piece: {i: p for p, i in theirs.items()}[i] for piece, i in table.items()}
    for text, ids in zip(SENTENCES, t.encode(SENTENCES), strict=True):
        pieces = [by_id[i] for i in tokenizer([text]).input_ids[0]]  # with its </s>
        found = translator.translate_batch(
            [pieces],
            beam_size=1,
            max_decoding_length=LIMIT,
            length_penalty=0,
            min_decoding_length=0,  # (CTranslate2's default 1 forbids an empty output)
        )[0].hypotheses[0]
        ours = search_batch(t.network, torch.tensor([[*ids, EOS]]), beam=1,
                            max_len=LIMIT)[0][0]  # fmt: skip
        assert t.pieces(ours.tokens) == [target.get(p, p) for p in found], text


def test_the_imported_run_exports_to_ctranslate2_and_translates_the_same(imported, tmp_path):
    """`wtnmt export ctranslate2` maps the biases, swish and the logits' bias too."""
    ctranslate2 = pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed")
    _, run = imported
    out = tmp_path / "ct2"
    assert cli(["export", "ctranslate2", str(run), "--out", str(out)]) == 0
    translator = ctranslate2.Translator(str(out), device="cpu")
    t = Translator.load(run)
    for ids in t.encode(SENTENCES):
        found = translator.translate_batch(
            [t.pieces(ids, source=True)],
            beam_size=1,
            max_decoding_length=LIMIT,
            min_decoding_length=0,
            suppress_sequences=[["<pad>"], ["<s>"]],
        )[0].hypotheses[0]
        ours = search_batch(t.model, torch.tensor([[*ids, EOS]]), beam=1, max_len=LIMIT)[0][0]
        assert t.pieces(ours.tokens) == found
