"""The native engine (`--engine native`, decode/native): for every kind of decoder the toolkit
builds, in float32 and int8, its greedy and beam search find what the PyTorch engine finds
(the same tokens, scores within 1e-4; with its fused attention off, every bit the same) under
every search setting: both length penalties, n-best, min and max length, sentences ending at
different steps, source padding. int8 with the fused attention translates as the PyTorch
engine's int8 wherever that one's margins leave room for a rounding's difference. Behind
`--engine`, the Python API and `serve`; where it cannot be built, one line says why."""

from __future__ import annotations

import pytest
import torch

from wtnmt.decode.native import unavailable_reason

if unavailable_reason() is not None:  # pragma: no cover - machines without a compiler
    pytest.skip(f"the native engine cannot be built here: {unavailable_reason()}",
                allow_module_level=True)  # fmt: skip

from helpers import sentence, train_tiny
from int8_oracle import margins
from wtnmt import Translator
from wtnmt.cli import main as cli
from wtnmt.config import load_config
from wtnmt.decode.native import NativeUnavailable
from wtnmt.decode.native.network import NativeEngine
from wtnmt.decode.search import _constrain, _Stepper, search_batch
from wtnmt.model import (
    branch_weights_overridden,
    build_model,
    named_branch_weights,
    quantize_decoding,
)
from wtnmt.model.packed import int8_available
from wtnmt.special import BOS, EOS, PAD

# every decoder the builder makes, each option at least once (model/build.py)
KINDS = {
    "weighted": ("weighted-tiny", []),  # post-norm, multi-head self-attention, split FFNs
    "transformer-learned-transparent": (
        "transformer-tiny",
        ["model.positions=learned", "model.encoder_combination=transparent"],
    ),
    "transformer-pre": ("transformer-tiny", ["model.norm=pre"]),
    "weighted-pre-weighted-self-shared-topk": (
        "weighted-tiny",
        [
            "model.norm=pre",
            "model.decoder_self_attention=weighted",
            "model.branch_ffn=shared",
            "model.branch_weights=topk",
            "model.encoder_combination=transparent",
        ],
    ),
    "weighted-pruned": (  # `wtnmt prune`'s output: 1 to 3 of the 4 branches a sublayer
        "weighted-tiny",
        ["model.kept_branches={encoder: [[0, 2], [3]], decoder: [[1], [0, 1, 3]]}"],
    ),
}
COMMON = ["model.d_model=32", "model.d_ff=64", "model.heads=4"]
# (beam, nbest, α, form, min_len, max_len): every setting the search takes
SETTINGS = [
    (1, 1, 0.6, "gnmt", 0, None),
    (1, 1, 0.6, "gnmt", 3, 7),
    (4, 2, 0.6, "gnmt", 0, None),
    (3, 3, 1.0, "fairseq", 2, None),
    (5, 1, 0.0, "gnmt", 0, 6),
]


def _model(kind: str, vocab: int, dims: list[str] = COMMON) -> torch.nn.Module:
    """A model of ``kind`` with random weights whose output leans on EOS, so that sentences
    and hypotheses end at many different steps."""
    preset, overrides = KINDS[kind]
    torch.manual_seed(sum(map(ord, kind)))
    model = build_model(load_config(preset, [*dims, *overrides]).model, vocab_size=vocab)
    with torch.no_grad():
        model.embedding.weight.mul_(3.0)  # sharper distributions than at initialisation
        model.embedding.weight[EOS].mul_(2.5)
    return model.eval()


def _sources(vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    src = torch.randint(4, vocab, (6, 9), generator=g)
    src[:, -1] = EOS
    for row, length in ((1, 5), (3, 3), (4, 7)):  # source padding
        src[row, length:] = PAD
        src[row, length - 1] = EOS
    return src


def _assert_same(want, got, exact: bool = False) -> None:  # type: ignore[no-untyped-def]
    """The same hypotheses, scores within 1e-4 (``exact``: the same numbers)."""
    for mine, theirs in zip(want, got, strict=True):
        assert [h.tokens for h in theirs] == [h.tokens for h in mine]
        for a, b in zip(mine, theirs, strict=True):
            if exact:
                assert (a.score, a.log_prob) == (b.score, b.log_prob)
            assert abs(a.score - b.score) < 1e-4 and abs(a.log_prob - b.log_prob) < 1e-4


@pytest.mark.parametrize(
    ("precision", "fused"),
    [("float32", True), ("float32", False), ("int8", False)],
    ids=["float32-fused", "float32-pytorch-operators", "int8-pytorch-operators"],
)
@pytest.mark.parametrize("kind", list(KINDS))
def test_native_search_finds_what_the_pytorch_engine_finds(kind, precision, fused):
    if precision == "int8" and not int8_available():
        pytest.skip("this PyTorch build has no FBGEMM int8")
    vocab = 600 if kind != "transformer-pre" else 300  # both top-k paths (blocked above 512)
    model = _model(kind, vocab)
    quantize_decoding(model, "int8" if precision == "int8" else "none")
    native = NativeEngine(model, fused=fused)
    src = _sources(vocab)
    lengths = set()
    for beam, nbest, alpha, form, min_len, max_len in SETTINGS:
        options = {"beam": beam, "nbest": nbest, "alpha": alpha, "penalty_form": form,
                   "min_len": min_len, "max_len": max_len}  # fmt: skip
        want = search_batch(model, src, **options)
        _assert_same(want, search_batch(native, src, **options), exact=not fused)
        lengths |= {len(h.tokens) for hyps in want for h in hyps}
        if min_len:
            assert min(len(h.tokens) for hyps in want for h in hyps) >= min_len - 1
    assert len(lengths) >= 4  # hypotheses ended at many steps: every path of the search ran


@pytest.mark.parametrize(
    ("how", "seed", "only"),
    [("uniform", 0, None), ("random", 3, None), ("uniform", 0, "decoder_layers.1.")],
    ids=["uniform", "random", "one-sublayer"],
)
@pytest.mark.parametrize(
    "kind", ["weighted", "weighted-pre-weighted-self-shared-topk", "weighted-pruned"]
)
def test_replaced_branch_weights_are_decoded_as_the_pytorch_engine_decodes_them(
    kind, how, seed, only
):
    """Paper Table 3 (`evaluate --branch-weights`, a server's per-request κ, α): the engine
    reads the model's weights at every batch, so it decodes with the replaced ones inside the
    block and with the learned ones again after it."""
    model = _model(kind, 600)
    src, options = _sources(600), {"beam": 3, "nbest": 2}
    sublayers = None
    if only is not None:  # the first branched sublayer of that decoder layer
        sublayers = [n for n in named_branch_weights(model) if n.startswith(only)][:1]
        assert sublayers, list(named_branch_weights(model))
    runs = [("none", True), ("none", False)] + ([("int8", False)] if int8_available() else [])
    for precision, fused in runs:  # (int8 with the PyTorch engine's operators: to the bit)
        quantize_decoding(model, precision)
        native = NativeEngine(model, fused=fused)
        learned = search_batch(native, src, **options)
        with branch_weights_overridden(model, how, seed=seed, only=sublayers):
            want = search_batch(model, src, **options)
            _assert_same(want, search_batch(native, src, **options), exact=not fused)
        assert [h[0].score for h in want] != [h[0].score for h in learned]  # they differ
        _assert_same(search_batch(model, src, **options), learned, exact=not fused)


# head sizes and branch widths the kernels take in whole vectors of 16, 8 and 4 floats (64 and
# 128), and with a remainder for each (24 and 50); COMMON's 8 and 16 are mostly remainders
WIDE = {
    "whole": ["model.d_model=128", "model.d_ff=256", "model.heads=2"],
    "ragged": ["model.d_model=96", "model.d_ff=200", "model.heads=4"],
}


@pytest.mark.parametrize("width", [16, 8, 4])
@pytest.mark.parametrize("dims", list(WIDE))
@pytest.mark.parametrize("kind", ["weighted", "weighted-pre-weighted-self-shared-topk"])
def test_every_build_of_the_kernels_finds_what_the_pytorch_engine_finds(kind, dims, width):
    """The kernels are compiled for AVX-512, AVX2 and any x86-64 CPU (vectors.h); each build
    this CPU can run, run in turn, finds the PyTorch engine's translations."""
    model = _model(kind, 600, WIDE[dims])
    native = NativeEngine(model)
    ext = native._ext
    if width > ext.cpu_kernels():
        pytest.skip(f"this CPU runs kernels of at most {ext.cpu_kernels()} floats a vector")
    before = ext.kernels()
    ext.set_kernels(width)
    try:
        src = _sources(600)
        for beam, nbest, alpha, form, min_len, max_len in SETTINGS[:3]:
            options = {"beam": beam, "nbest": nbest, "alpha": alpha, "penalty_form": form,
                       "min_len": min_len, "max_len": max_len}  # fmt: skip
            want = search_batch(model, src, **options)
            _assert_same(want, search_batch(native, src, **options))
    finally:
        ext.set_kernels(before)


MARGIN = 0.05  # a lead no rounding's difference in an int8 step comes near (seen: < 0.015)


@pytest.mark.parametrize("products", ["auto", "own"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_int8_with_fused_attention_translates_as_pytorch_int8_where_its_margins_are_known(
    kind, products, monkeypatch
):
    """The fused attention's float32 sums differ from the batched products' in their last bits,
    and int8 quantises each product's input afresh: a value on the edge of a quantisation step
    may fall on the other side, so the two int8 engines may differ by a quantisation step, not
    to the bit. Greedy, a sentence at a time: wherever the PyTorch int8 engine's best token
    leads the second by MARGIN at every step, the native engine must choose the same: with
    the int8 products this CPU's default takes, and in int8.h's kernel (``own``: its widest
    build here, the portable one where the CPU has no VNNI)."""
    if not int8_available():
        pytest.skip("this PyTorch build has no FBGEMM int8")
    monkeypatch.setenv("WTNMT_NATIVE_INT8", products)
    vocab = 600
    model = _model(kind, vocab)
    quantize_decoding(model, "int8")
    native, known = NativeEngine(model), 0
    assert products == "auto" or native.int8_lanes is not None
    for row in _sources(vocab):
        src = row[None, : int(row.ne(PAD).sum())]
        ids = search_batch(model, src, beam=1)[0][0].tokens
        prefix = torch.tensor([[BOS, *ids]])
        least = float("inf")
        with torch.inference_mode():
            step = _Stepper(model, src, True, steps=len(ids) + 1, group=1)
            for t in range(len(ids) + 1):
                log_probs = _constrain(step(prefix[:, : t + 1]), t, 0, None)[0]
                if t == len(ids) and int(log_probs.argmax()) != EOS:
                    break  # cut at the length limit: no choice made here
                least = min(least, float(margins(log_probs)))
        if least >= MARGIN:
            known += 1
            assert search_batch(native, src, beam=1)[0][0].tokens == ids
    assert known >= 3, f"only {known} of 6 sentences have margins of {MARGIN} or more"


def test_a_change_of_weights_or_precision_is_seen_at_the_next_batch():
    model = _model("weighted", 600)
    native, src = NativeEngine(model), _sources(600)
    before = search_batch(native, src, beam=2)
    with torch.no_grad():
        for p in model.decoder_layers[0].cross_attn.parameters():
            p.add_(0.5 * torch.randn_like(p))
    after = search_batch(native, src, beam=2)
    _assert_same(search_batch(model, src, beam=2), after)
    assert [h[0].score for h in after] != [h[0].score for h in before]
    if int8_available():
        quantize_decoding(model, "int8")
        assert native.quantize == "int8"
        _assert_same(search_batch(model, src, beam=2), search_batch(native, src, beam=2))
        native.int8_lanes = 0  # int8.h's portable build: its layout of the weights is kept
        search_batch(native, src, beam=2)  # until they change (then laid out again)
        kept = {id(linear): own for linear, (_, own) in native._own.items()}
        assert kept
        search_batch(native, src, beam=2)
        assert {id(linear): own for linear, (_, own) in native._own.items()} == kept
        with torch.no_grad():
            for p in model.decoder_layers[0].cross_attn.parameters():
                p.add_(0.5 * torch.randn_like(p))
        _assert_same(search_batch(model, src, beam=2), search_batch(native, src, beam=2))
        again = {id(linear): own for linear, (_, own) in native._own.items()}
        assert any(again[k] is not kept[k] for k in kept)


def test_bad_settings_are_refused_as_by_the_pytorch_engine():
    native = NativeEngine(_model("weighted", 600))
    src = _sources(600)
    with pytest.raises(ValueError, match="nbest=3 must be between 1 and beam=2"):
        search_batch(native, src, beam=2, nbest=3)
    with pytest.raises(ValueError, match="length penalty form 'wu'"):
        search_batch(native, src, beam=2, penalty_form="wu")


@pytest.fixture(scope="module")
def run(tmp_path_factory):  # type: ignore[no-untyped-def]
    return train_tiny(tmp_path_factory.mktemp("native"), max_steps=40)


SOURCES = [sentence(i, 2 + i % 5) for i in range(12)]


def test_translator_cli_and_server_on_the_native_engine(run, tmp_path, capsys):
    from fastapi.testclient import TestClient

    from wtnmt.serve.app import create_app
    from wtnmt.serve.settings import ServeSettings

    pytorch, native = Translator.load(run), Translator.load(run, engine="native")
    assert (pytorch.engine, native.engine) == ("pytorch", "native")
    want = pytorch.translate_nbest(SOURCES, beam=3, nbest=2)
    got = native.translate_nbest(SOURCES, beam=3, nbest=2)
    for mine, theirs in zip(want, got, strict=True):
        assert [h.ids for h in theirs] == [h.ids for h in mine]
        assert [h.score for h in theirs] == pytest.approx([h.score for h in mine], abs=1e-4)
    with TestClient(create_app(native, ServeSettings())) as client:
        assert client.get("/v1/model").json()["engine"] == "native"
        answer = client.post("/v1/translate", json={"text": SOURCES[:4], "beam": 3}).json()
        assert answer["translations"] == [n[0].text for n in want[:4]]
        uniform = {"text": SOURCES[:4], "beam": 3, "branch_weights": "uniform"}
        answer = client.post("/v1/translate", json=uniform).json()
    with branch_weights_overridden(pytorch.model, "uniform"):
        assert answer["translations"] == pytorch.translate(SOURCES[:4], beam=3)
    for engine in ("pytorch", "native"):  # paper Table 3 on either engine: the same file
        argv = ["evaluate", str(run), "--branch-weights", "random", "--seed", "5"]
        assert cli([*argv, "--engine", engine]) == 0
    hyps = {p.name: p.read_text() for p in (run / "eval").glob("*.random-seed5*.hyp")}
    assert len(hyps) == 2 and len(set(hyps.values())) == 1, sorted(hyps)
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(SOURCES) + "\n")
    outputs = {}
    for engine in ("pytorch", "native", None):  # None: translate's default, auto
        out = tmp_path / f"{engine}.txt"
        argv = ["translate", str(run), "-i", str(inp), "-o", str(out)]
        argv += ["--engine", engine] if engine else []
        assert cli([*argv, "--beam", "3"]) == 0
        outputs[engine] = out.read_text()
    assert outputs["native"] == outputs["pytorch"] == outputs[None]
    assert Translator.load(run, engine="auto").engine == "native"  # (where it can run)
    capsys.readouterr()
    assert cli(["translate", str(run), "-i", str(inp), "--device", "cuda"]) == 2  # auto: PyTorch
    err = capsys.readouterr().err
    assert "CPU only" not in err and "--engine" not in err
    argv = ["translate", str(run), "-i", str(inp), "--engine", "native", "--device", "cuda"]
    assert cli(argv) == 2  # (workers: tests/test_workers.py)
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "CPU only" in err


def test_where_it_cannot_be_built_one_line_says_why(run, tmp_path, capsys, monkeypatch):
    import wtnmt.decode.native as native

    monkeypatch.setattr(native, "_loaded", [])
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))  # nothing built there
    monkeypatch.setenv("WTNMT_NATIVE_PACKAGED", "0")  # nor the package's own engine used
    monkeypatch.setenv("CXX", "no-such-compiler-here")
    with pytest.raises(NativeUnavailable, match=r"no C\+\+ compiler \('no-such-compiler-here'"):
        NativeEngine(_model("weighted", 600))
    inp = tmp_path / "in.txt"
    inp.write_text("alpha\n")
    assert cli(["translate", str(run), "-i", str(inp), "--engine", "native"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no C++ compiler" in err
    said: list[str] = []
    assert Translator.load(run, engine="auto", say=said.append).engine == "pytorch"
    assert len(said) == 1 and "no C++ compiler" in said[0] and "PyTorch engine" in said[0]
    out = tmp_path / "out.txt"
    assert cli(["translate", str(run), "-i", str(inp), "-o", str(out)]) == 0  # auto
    err = capsys.readouterr().err
    assert "--engine auto: the native engine cannot run here (no C++ compiler" in err
    assert out.read_text().count("\n") == 1
