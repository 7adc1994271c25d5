"""int8 products packed for oneDNN's kernels (``WTNMT_INT8_KERNELS=onednn``) instead of
FBGEMM's: the same dynamic quantisation (int8_oracle's float64 simulation of a product; through
a whole beam search, FBGEMM's product of each call's own input), multiplied by oneDNN (its own
log says so: FBGEMM's products leave none there), on both engines; a library it does not know
is one line."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from helpers import one_line, sentence, train_tiny
from int8_oracle import checked_int8, dynamic_int8, int8_linear, packed_weight_qmax
from wtnmt.cli import main as cli
from wtnmt.config import load_config
from wtnmt.decode.native import unavailable_reason
from wtnmt.decode.search import search_batch
from wtnmt.model import build_model, quantize_decoding
from wtnmt.model.packed import (
    PackedLinear,
    int8_available,
    int8_kernels,
    int8_narrow_weights,
    pack_int8,
)
from wtnmt.special import EOS

pytestmark = pytest.mark.skipif(
    not int8_available() or "onednn" not in torch.backends.quantized.supported_engines,
    reason="this PyTorch build lacks FBGEMM's or oneDNN's int8 linear",
)


@contextlib.contextmanager
def onednn_log(capfd, matmuls: list[str]) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """oneDNN's verbose log meanwhile: the int8 products it ran into ``matmuls``."""
    capfd.readouterr()
    with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
        yield
    lines = capfd.readouterr().out.splitlines()
    matmuls += [line for line in lines if ",exec,cpu,matmul," in line and "src:u8" in line]


@pytest.mark.parametrize("kernels", ["fbgemm", "onednn", ""])
def test_an_int8_product_is_the_simulation_on_the_library_asked_for(kernels, monkeypatch, capfd):
    monkeypatch.setenv("WTNMT_INT8_KERNELS", kernels)  # (empty: the default, FBGEMM)
    g = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(300, 64, generator=g) * 0.1, torch.randn(300, generator=g)
    x = torch.randn(7, 5, 64, generator=g)
    narrow = int8_narrow_weights(int8_kernels())  # (oneDNN's below VNNI too, as the ladder runs)
    how, other = dynamic_int8(narrow), dynamic_int8(not narrow)
    linear = PackedLinear()
    linear.int8 = True
    matmuls: list[str] = []
    with torch.no_grad(), onednn_log(capfd, matmuls):
        out = linear(x, weight, bias)
    assert packed_weight_qmax(linear) == how.weight_qmax  # (the width it was packed at)
    scale = F.linear(x, weight, bias).abs().max().item()
    assert (out - int8_linear(x, weight, bias, how)).abs().max().item() < 1e-5 * scale
    assert (out - int8_linear(x, weight, bias, other)).abs().max().item() > 1e-3 * scale
    if kernels == "onednn":  # u8 activations by s8 weights, in oneDNN
        assert len(matmuls) == 1 and "wei:s8" in matmuls[0], matmuls
    else:
        assert matmuls == []


def fbgemm_product(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """FBGEMM's int8 product of ``x`` by ``weight``, as the default packs it. (Compared with
    it rather than with the float64 simulation through a whole search: there an activation
    sometimes falls exactly half a step between two, and float32 arithmetic, both libraries',
    rounds it the other way than float64.)"""
    qmax = dynamic_int8(int8_narrow_weights(int8_kernels())).weight_qmax  # (oneDNN's width)
    packed = pack_int8(weight.detach(), None if bias is None else bias.detach(), "fbgemm", qmax)
    flat = x.reshape(-1, x.size(-1))
    out = torch.ops.quantized.linear_dynamic(flat, packed, False)
    return out.view(*x.shape[:-1], out.size(-1))


def _model() -> torch.nn.Module:
    torch.manual_seed(5)
    dims = ["model.d_model=32", "model.d_ff=64", "model.heads=4"]
    model = build_model(load_config("weighted-tiny", dims).model, vocab_size=300)
    with torch.no_grad():
        model.embedding.weight.mul_(3.0)  # sharper distributions than at initialisation
        model.embedding.weight[EOS].mul_(2.5)  # sentences end at different steps
    return model.eval()


def test_a_search_packed_for_onednn_is_the_simulation_on_both_engines(monkeypatch, capfd):
    """Every int8 product of a beam search (the encoder's, each step's, the output
    projection) on oneDNN, each FBGEMM's product of its own input up to float32 rounding; the
    native engine, on the PyTorch engine's operators, finds exactly the same hypotheses over
    those packed weights."""
    monkeypatch.setenv("WTNMT_INT8_KERNELS", "onednn")
    model = _model()
    assert quantize_decoding(model, "int8") > 0
    g = torch.Generator().manual_seed(7)
    src = torch.randint(4, 300, (4, 8), generator=g)
    src[:, -1] = EOS
    errors: list[float] = []
    matmuls: list[str] = []
    # (held to AVX2, FBGEMM's activation quantiser adds the zero point before it rounds: a tie
    # can go the other way than in oneDNN's)
    ties = dynamic_int8(int8_narrow_weights("onednn"))
    with onednn_log(capfd, matmuls), checked_int8(fbgemm_product, errors, ties=ties):
        found = search_batch(model, src, beam=4, nbest=2)
    assert len(errors) > 30 and max(errors) < 1e-5, (len(errors), max(errors))
    assert len(matmuls) == len(errors), (len(matmuls), len(errors))  # every one in oneDNN
    if unavailable_reason() is None:
        from wtnmt.decode.native.network import NativeEngine

        native = search_batch(NativeEngine(model, fused=False), src, beam=4, nbest=2)
        assert [[(h.tokens, h.score) for h in hyps] for hyps in native] == [
            [(h.tokens, h.score) for h in hyps] for hyps in found
        ]


def test_an_int8_library_it_does_not_know_is_one_line(tmp_path, monkeypatch, capsys):
    run = train_tiny(tmp_path)
    source = tmp_path / "in.txt"
    source.write_text(sentence(1, 4) + "\n")
    out = tmp_path / "out.txt"
    monkeypatch.setenv("WTNMT_INT8_KERNELS", "mkl")
    argv = ["translate", str(run), "-i", str(source), "-o", str(out), "--quantize", "int8"]
    assert cli(argv) == 2
    one_line(capsys, "translate", "WTNMT_INT8_KERNELS='mkl'", "fbgemm or onednn")
    assert not out.exists()
    assert cli(argv[:-2]) == 0  # float32 does not read it
    monkeypatch.setenv("WTNMT_INT8_KERNELS", "oneDNN")  # (any case)
    assert cli([*argv, "--engine", "pytorch"]) == 0 and out.read_text().strip()
