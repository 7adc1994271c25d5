"""`wtnmt export onnx` and the ONNX Runtime engine: for every kind of model the toolkit
trains, the exported decoder step computes what the PyTorch step computes, step by step
through a beam search's reorders and finished sentences, and the two engines translate
alike; a damaged or mismatched export is refused in one line."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
pytest.importorskip("onnxscript", reason="the onnx extra is not installed")
import onnx  # (with onnxruntime, in the onnx extra)

from helpers import sentence, tiny_run_config
from onnx_products import beyond_simulation, instrumented
from stepping import walk
from wtnmt import Translator
from wtnmt.cli import main as cli
from wtnmt.decode.batches import padded
from wtnmt.decode.onnx_engine import OnnxNetwork, OnnxStepper
from wtnmt.decode.search import _Stepper, search_batch
from wtnmt.export.onnx import ExportError, export_onnx, graph_file
from wtnmt.rundir.files import save_weights
from wtnmt.runtime import cpu_has_vnni
from wtnmt.special import EOS
from wtnmt.train import Trainer

# every option the export must carry, each at least once, in as few models as that takes (an
# export traces two graphs: the file's time is its exports')
KINDS = {
    "weighted": {},  # post-norm, sinusoidal, multi-head decoder self-attention, split FFN
    "transformer-learned-transparent": {
        "attention": "multihead",
        "positions": "learned",
        "encoder_combination": "transparent",
    },
    "weighted-pre-weighted-self-transparent-shared-topk": {
        "norm": "pre",
        "decoder_self_attention": "weighted",
        "encoder_combination": "transparent",
        "branch_ffn": "shared",
        "branch_weights": "topk",
    },
    # `wtnmt prune`'s output: sublayers of 1 to 3 of the 4 branches (cross-attention caches
    # of as many heads)
    "weighted-pruned": {"kept_branches": {"encoder": [[0, 2], [3]], "decoder": [[1], [0, 1, 3]]}},
    # data.joint_vocab: false: a source vocabulary and embedding of its own
    "weighted-separate-vocabularies": {"data": {"joint_vocab": False}},
}
SOURCES = [sentence(i, 2 + i % 5) for i in range(24)]


def _train(tmp: Path, model: dict, steps: int) -> Path:
    model = dict(model)
    config = tiny_run_config(
        tmp,
        n_train=200,
        data=model.pop("data", {}),
        model={"d_model": 32, "d_ff": 64, "heads": 4, **model},
        train={"max_steps": steps, "valid_every": 1000, "max_tokens": 600, "lr_scale": 2.0},
    )
    Trainer(config, tmp / "run", log_to_stderr=False).run()
    return tmp / "run"


@pytest.fixture(scope="module")
def learned(tmp_path_factory) -> Path:
    """A Weighted Transformer trained until it translates, for int8 and the command line."""
    return _train(tmp_path_factory.mktemp("learned"), {"d_model": 64, "d_ff": 128}, steps=200)


def _export(run: Path) -> Path:
    """``run`` exported to RUN/onnx, once: an export costs seconds (tracing and translating
    two graphs), so the tests that need one but do not test making it share it."""
    if not (run / "onnx" / "export.json").is_file():
        export_onnx(run)
    return run / "onnx"


@pytest.fixture(scope="module", params=list(KINDS))
def exported(request, tmp_path_factory) -> tuple[Path, Translator, OnnxNetwork]:
    """A briefly trained run of each kind, exported to RUN/onnx (the plain Weighted
    Transformer's is the trained one of ``learned``)."""
    if request.param == "weighted":
        run = request.getfixturevalue("learned")
    else:
        run = _train(tmp_path_factory.mktemp(request.param), KINDS[request.param], steps=60)
    return run, Translator.load(run), OnnxNetwork.open(_export(run), run)


def _steps_agree(translator: Translator, net: OnnxNetwork, tolerance: float) -> float:
    """The PyTorch and the ONNX steps through beam search's reorders (stepping.walk) on three
    sentences, one with source padding; the largest difference of their log-probabilities."""
    src = padded([translator.vocab.source.encode([s])[0] for s in SOURCES[:3]], translator.device)
    assert src.eq(0).any()  # source padding
    with torch.inference_mode():
        ref = _Stepper(translator.model, src, True, steps=40, group=2)
        onnx = OnnxStepper(net, src, steps=40, group=2)
    return walk(ref, onnx, len(translator.vocab.target), tolerance)


def test_the_onnx_step_equals_the_pytorch_step_through_reorders_and_finished_sentences(exported):
    _, translator, net = exported
    _steps_agree(translator, net, tolerance=1e-4)


@pytest.mark.parametrize("beam", [1, 4])
def test_both_engines_translate_alike(exported, beam):
    run, translator, _ = exported
    onnx = Translator.load(run, engine="onnxruntime")
    assert onnx.engine == "onnxruntime" and translator.engine == "pytorch"
    nbest = 1 if beam == 1 else 2
    expected = translator.translate_nbest(SOURCES, beam=beam, nbest=nbest)
    got = onnx.translate_nbest(SOURCES, beam=beam, nbest=nbest)
    for want, have in zip(expected, got, strict=True):
        assert [h.ids for h in have] == [h.ids for h in want]
        assert max(abs(h.score - w.score) for h, w in zip(have, want, strict=True)) < 1e-4


def test_onnx_runtime_samples_and_forces_prefixes_as_the_pytorch_engine(learned):
    """Sampling and forced prefixes run in the search's Python loop over ONNX Runtime's step:
    the PyTorch engine's samples under the same seed, its translations after a prefix."""
    from wtnmt.decode.sampling import Sampling

    translator, onnx = Translator.load(learned), Translator.load(learned, engine="onnxruntime")
    drawn = Sampling(samples=3, seed=2, top_k=20, temperature=1.2)
    want = translator.translate_nbest(SOURCES[:4], sampling=drawn)
    got = onnx.translate_nbest(SOURCES[:4], sampling=drawn)
    assert [[t.ids for t in s] for s in got] == [[t.ids for t in s] for s in want]
    prefixes = [translator.translate([s], beam=1)[0].split(" ")[0] for s in SOURCES[:4]]
    prefixes[1] = ""
    for beam in (1, 3):
        want = translator.translate(SOURCES[:4], beam=beam, prefixes=prefixes)
        assert onnx.translate(SOURCES[:4], beam=beam, prefixes=prefixes) == want


def test_int8_products_compute_the_quantisation_they_claim(learned, tmp_path):
    """Every product of ONNX Runtime's int8 graphs, through a beam search's reorders
    (stepping.walk), against the float64 simulation of the same dynamic quantisation of its
    own input (int8_oracle, onnx_products: each product alone, never a chain that a value on
    a quantisation step's edge can send another way on another CPU): within float32 rounding.
    A wrong scale or zero point or a saturating kernel is off by whole quantisation steps (so
    is the simulation with 7-bit activations: a median 9e-3 of the largest value, where the
    worst of 186 products was 1.8e-7 on an Intel Xeon, at both levels); the weights take the
    width the export chose (7 bits where reduce_range); no product with a constant weight is
    left in float."""
    Translator.load(learned, engine="onnxruntime", quantize="int8")  # exported on first use
    directory = learned / "onnx"
    plain = OnnxNetwork.open(directory, learned, quantize="int8")
    net = OnnxNetwork.open(directory, learned, quantize="int8")
    products = instrumented(net, directory, tmp_path)
    translator = Translator.load(learned)
    src = padded([translator.vocab.source.encode([s])[0] for s in SOURCES[:3]], translator.device)
    with torch.inference_mode():  # the recording graphs compute what the plain ones do
        first = OnnxStepper(plain, src, steps=40, group=2)
        walk(first, OnnxStepper(net, src, steps=40, group=2), len(translator.vocab.target), 1e-6)
    assert len(products) >= 8 and all(p.seen for p in products)
    errors = [beyond_simulation(p, x, y) for p in products for x, y in p.seen]
    assert max(errors) < 1e-5, max(errors)
    seven_bits = [beyond_simulation(p, x, y, activations=127) for p in products for x, y in p.seen]
    assert np.median(seven_bits) > 1e-3, np.median(seven_bits)
    assert max(int(np.abs(p.weight).max()) for p in products) == (127 if cpu_has_vnni() else 64)
    for name in ("encoder", "decoder_step"):
        graph = onnx.load(str(directory / graph_file(name, "int8"))).graph
        matrices = {i.name for i in graph.initializer if len(i.dims) == 2}
        floats = [n.name for n in graph.node if n.op_type in ("MatMul", "Gemm")]
        assert not [n for n in graph.node if n.name in floats and n.input[1] in matrices]


def _copy(run: Path, to: Path) -> Path:
    shutil.copytree(run, to, ignore=shutil.ignore_patterns("checkpoints", "onnx*"))
    return to


def _one_line_error(capsys, argv: list[str], *expected: str) -> str:
    capsys.readouterr()
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    for text in expected:
        assert text in err, err
    return err


def test_a_damaged_or_mismatched_export_is_refused_in_one_line(learned, tmp_path, capsys):
    run = _copy(learned, tmp_path / "run")
    shutil.copytree(_export(learned), run / "onnx")
    inp = tmp_path / "in.txt"
    inp.write_text("alpha beta\n")
    argv = ["translate", str(run), "-i", str(inp), "--engine", "onnxruntime"]
    step = run / "onnx" / "decoder_step.onnx"
    good = step.read_bytes()
    step.write_bytes(good[:-10] + bytes(10))
    _one_line_error(capsys, argv, "decoder_step.onnx", "damaged")
    step.write_bytes(good)
    other = _copy(learned, tmp_path / "other")
    model = Translator.load(other).model
    with torch.no_grad():
        model.embedding.weight.mul_(1.01)
    save_weights(model, other / "model.safetensors")
    shutil.copytree(run / "onnx", other / "onnx")
    _one_line_error(
        capsys, [*argv[:1], str(other), *argv[2:]], "model.safetensors", f"onnx {other} --force"
    )
    # a damaged export.json: the advice is export's command (translate has no --force)
    (run / "onnx" / "export.json").write_text("{")
    _one_line_error(capsys, argv, "export.json", f"`wtnmt export onnx {run} --force`")
    (run / "onnx" / "export.json").write_text('{"format": "other"}')
    _one_line_error(capsys, argv, "not an export of format", f"`wtnmt export onnx {run} --force`")


def test_translate_exports_on_first_use_and_export_replaces_only_its_own_export(
    learned, tmp_path, capsys
):
    run = _copy(learned, tmp_path / "run")
    inp = tmp_path / "in.txt"
    inp.write_text("".join(s + "\n" for s in SOURCES[:8]))
    assert cli(["translate", str(run), "-i", str(inp), "--beam", "3"]) == 0
    expected = capsys.readouterr().out
    code = cli(["translate", str(run), "-i", str(inp), "--beam", "3", "--engine", "onnxruntime"])
    out, err = capsys.readouterr()
    assert code == 0 and out == expected
    assert "exporting" in err and "on first use" in err
    onnx = run / "onnx"
    meta = json.loads((onnx / "export.json").read_text())
    assert meta["layers"] == 2 and set(meta["files"]) == {"encoder.onnx", "decoder_step.onnx"}
    cli(["translate", str(run), "-i", str(inp), "--engine", "onnxruntime"])
    assert "exporting" not in capsys.readouterr().err  # once

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    _one_line_error(capsys, ["export", "onnx", str(run), "--out", str(mine)], "not a wtnmt export")
    assert (mine / "notes.txt").read_text() == "keep"
    _one_line_error(capsys, ["export", "onnx", str(run)], "--force")  # RUN/onnx, as made above
    (onnx / "notes.txt").write_text("keep")
    argv = ["export", "onnx", str(run), "--force", "--quantize", "int8"]
    _one_line_error(capsys, argv, "notes.txt")
    assert (onnx / "notes.txt").read_text() == "keep"
    (onnx / "notes.txt").unlink()
    assert cli(argv) == 0
    assert "exporting" in capsys.readouterr().err
    assert "decoder_step.int8.onnx" in json.loads((onnx / "export.json").read_text())["files"]
    net = OnnxNetwork.open(onnx, run, quantize="int8")
    assert net.quantize == "int8"
    # the export is a directory as any other (the umask's mode, not a temporary's 0700)
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE(onnx.stat().st_mode) == 0o777 & ~mask
    # an export whose export.json was deleted: translate says how to make it again (it has no
    # --out), and export --force does
    (onnx / "export.json").unlink()
    translate = ["translate", str(run), "-i", str(inp), "--engine", "onnxruntime"]
    err = _one_line_error(
        capsys, translate, "without its export.json", f"export onnx {run} --force"
    )
    assert "--out" not in err
    _one_line_error(capsys, ["export", "onnx", str(run)], "without its export.json", "--force")
    # the work directory a killed export left is removed by the next export
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    left = run / f".onnx.{dead.pid}.k1ll3d.tmp"
    left.mkdir()
    (left / "encoder.onnx").write_bytes(b"half")
    assert cli(["export", "onnx", str(run), "--force"]) == 0
    assert not left.exists() and (onnx / "export.json").is_file()
    assert cli(translate) == 0


def test_options_onnx_runtime_cannot_honour_are_refused(learned, tmp_path, capsys):
    inp = tmp_path / "in.txt"
    inp.write_text("alpha\n")
    base = ["translate", str(learned), "-i", str(inp), "--engine", "onnxruntime"]
    _one_line_error(capsys, [*base, "--workers", "2"], "--workers 2")
    _one_line_error(capsys, [*base, "--device", "cuda"], "CPU only")
    argv = ["evaluate", str(learned), "--src", str(inp), "--ref", str(inp)]
    _one_line_error(
        capsys, [*argv, "--engine", "onnxruntime", "--branch-weights", "uniform"], "PyTorch"
    )
    with pytest.raises(ExportError, match=r"no export\.json"):
        OnnxNetwork.open(tmp_path, learned)


def test_ctranslate2_export_refuses_a_weighted_transformer_with_the_reason(learned, capsys):
    argv = ["export", "ctranslate2", str(learned), "--out", str(learned.parent / "ct2")]
    _one_line_error(capsys, argv, "branched layers have no CTranslate2 layer spec")


def test_a_server_on_onnx_runtime_answers_as_the_pytorch_server(learned):
    from fastapi.testclient import TestClient

    from wtnmt.serve.app import create_app
    from wtnmt.serve.settings import ServeSettings

    body = {"text": SOURCES[:6], "beam": 3, "nbest": 2}
    answers = {}
    for engine in ("pytorch", "onnxruntime"):
        translator = Translator.load(learned, engine=engine)
        with TestClient(create_app(translator, ServeSettings())) as client:
            assert client.get("/v1/model").json()["engine"] == engine
            answers[engine] = client.post("/v1/translate", json=body).json()
            refused = client.post("/v1/translate", json={"text": "a", "branch_weights": "uniform"})
            assert refused.status_code == (422 if engine == "onnxruntime" else 200)
    a, b = answers["pytorch"], answers["onnxruntime"]
    assert a["translations"] == b["translations"]
    for mine, theirs in zip(a["nbest"], b["nbest"], strict=True):
        assert [c["text"] for c in mine] == [c["text"] for c in theirs]
        assert [c["score"] for c in mine] == pytest.approx([c["score"] for c in theirs], abs=1e-4)


@pytest.mark.parametrize("joint", [True, False], ids=["joint-vocab", "separate-vocabularies"])
def test_a_transformer_exported_to_ctranslate2_translates_as_wtnmt(tmp_path, joint):
    ctranslate2 = pytest.importorskip("ctranslate2", reason="ctranslate2 is not installed")
    run = _train(tmp_path, {"attention": "multihead", "data": {"joint_vocab": joint}}, steps=250)
    out = tmp_path / "ct2"
    assert cli(["export", "ctranslate2", str(run), "--out", str(out)]) == 0
    translator = Translator.load(run)
    ids = translator.encode(SOURCES)
    ours = translator.translate_ids(ids, beam=1)
    # as CTranslate2's users do: the export's own SentencePiece model, its pieces as they come
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(
        model_file=str(out / ("spm.model" if joint else "spm.src.model"))
    )
    pieces = [sp.encode(text, out_type=str) for text in SOURCES]
    assert pieces == [[translator.vocab.source.sp.id_to_piece(i) for i in seq] for seq in ids]
    theirs = ctranslate2.Translator(str(out), device="cpu").translate_batch(
        pieces,
        beam_size=1,
        max_decoding_length=max(int(1.5 * (len(seq) + 1) + 10) for seq in ids) + 1,
        suppress_sequences=[["<pad>"], ["<s>"]],
        min_decoding_length=0,  # (CTranslate2's default is 1; wtnmt's search may end at once)
    )
    for seq, mine, other in zip(ids, ours, theirs, strict=True):
        want = [translator.vocab.target.sp.id_to_piece(i) for i in mine[0].ids]
        got = [t for t in other.hypotheses[0] if t != "</s>"]
        limit = int(1.5 * (len(seq) + 1) + 10)  # where wtnmt's search forces EOS
        assert got[: len(want)] == want and (len(got) == len(want) or len(want) == limit)
    # beam search ranking by the log-probability alone (α = 0), at one length limit (with
    # α = 1 the two normalise by lengths that rank one sentence's hypotheses otherwise)
    for seq, pieces_of in zip(ids, pieces, strict=True):
        src = torch.tensor([[*seq, EOS]])
        hyp = search_batch(translator.model, src, beam=4, max_len=12, alpha=0.0,
                           penalty_form="fairseq")[0][0]  # fmt: skip
        other = ctranslate2.Translator(str(out), device="cpu").translate_batch(
            [pieces_of], beam_size=4, length_penalty=0.0, max_decoding_length=12,
            suppress_sequences=[["<pad>"], ["<s>"]], min_decoding_length=0,
        )[0].hypotheses[0]  # fmt: skip
        want = [translator.vocab.target.sp.id_to_piece(i) for i in hyp.tokens]
        assert [t for t in other if t != "</s>"] == want


def test_an_export_with_a_torch_too_old_for_it_is_refused_in_one_line(learned, capsys, monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.4.1+cpu")
    out = learned.parent / "old-torch"
    _one_line_error(capsys, ["export", "onnx", str(learned), "--out", str(out)], "torch 2.6")
    assert not out.exists()
