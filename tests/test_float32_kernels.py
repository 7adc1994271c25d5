"""float32 decoding products on either library (model/float32_kernels.py): MKL by a copy of
the weight transposed to [in, out] on Intel CPUs, oneDNN by its reordered copy elsewhere;
``WTNMT_FLOAT32_KERNELS`` chooses. Each is the product (a float64 oracle), runs on the library
asked for (oneDNN's own log), is what both engines multiply by (the same hypotheses, to the
bit with the native engine on the PyTorch engine's operators), and a name it does not know is
one line."""

from __future__ import annotations

import pytest
import torch

from helpers import one_line, translate_job
from wtnmt.cli import main as cli
from wtnmt.decode.native import unavailable_reason
from wtnmt.decode.search import search_batch
from wtnmt.errors import EngineUnavailable
from wtnmt.model import quantize_decoding
from wtnmt.model.float32_kernels import default_float32_kernels, float32_kernels
from wtnmt.model.packed import PackedLinear, onednn_available

pytestmark = pytest.mark.skipif(
    not (torch.backends.mkl.is_available() and onednn_available()),
    reason="this PyTorch build lacks MKL or oneDNN (both are in x86 builds)",
)


def test_mkl_is_the_default_on_intel_cpus_with_mkl_and_onednn_elsewhere(monkeypatch):
    assert default_float32_kernels("GenuineIntel", mkl=True) == "mkl"
    assert default_float32_kernels("GenuineIntel", mkl=False) == "onednn"
    assert default_float32_kernels("AuthenticAMD", mkl=True) == "onednn"
    assert default_float32_kernels("", mkl=True) == "onednn"
    monkeypatch.setenv("WTNMT_FLOAT32_KERNELS", " MKL ")  # (any case)
    assert float32_kernels() == "mkl"
    monkeypatch.setenv("WTNMT_FLOAT32_KERNELS", "fbgemm")
    with pytest.raises(EngineUnavailable, match=r"WTNMT_FLOAT32_KERNELS='fbgemm'.*onednn or mkl"):
        float32_kernels()


def _onednn_products(capfd, fn):  # type: ignore[no-untyped-def]
    """What ``fn()`` returns, and how many products oneDNN ran meanwhile (its verbose log)."""
    capfd.readouterr()
    with torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON):
        out = fn()
    lines = capfd.readouterr().out.splitlines()
    return out, sum(",exec,cpu," in line and "f32" in line for line in lines)


@pytest.mark.parametrize("kernels", ["onednn", "mkl"])
def test_a_float32_product_is_the_product_on_the_library_asked_for(kernels, monkeypatch, capfd):
    monkeypatch.setenv("WTNMT_FLOAT32_KERNELS", kernels)
    g = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(300, 64, generator=g), torch.randn(300, generator=g)
    x = torch.randn(7, 5, 64, generator=g)
    want = x.double() @ weight.double().t() + bias.double()
    linear = PackedLinear()
    with torch.no_grad():
        for b in (bias, None):
            got, ran = _onednn_products(capfd, lambda b=b: linear(x, weight, b))
            assert linear.kernels == kernels and got.shape == (7, 5, 300)
            expected = want if b is not None else want - bias.double()
            assert torch.allclose(got.double(), expected, rtol=1e-5, atol=1e-4)
            assert (ran > 0) == (kernels == "onednn"), ran  # MKL's leave no oneDNN log
        if kernels == "mkl":  # what the native engine calls (products.h): the same bits
            assert torch.equal(got, (x.reshape(35, 64) @ weight.t().contiguous()).view(7, 5, 300))
        monkeypatch.setenv("WTNMT_FLOAT32_KERNELS", "onednn" if kernels == "mkl" else "mkl")
        linear(x, weight)  # (the last call's weights)
        assert linear.kernels == kernels  # read as a weight is packed: the copy keeps its own
        linear(x, weight, bias)  # (the bias in the key: packed again)
        assert linear.kernels != kernels


@pytest.mark.skipif(unavailable_reason() is not None, reason="the native engine cannot be built")
@pytest.mark.parametrize("kernels", ["onednn", "mkl"])
@pytest.mark.parametrize("kind", ["weighted", "transformer-pre"])
def test_both_engines_find_the_same_on_either_library(kind, kernels, monkeypatch):
    """The native engine multiplies by the PyTorch engine's copies, on its library: on the
    PyTorch engine's operators every bit the same, with its fused attention within 1e-4."""
    from test_native_engine import _assert_same, _model, _sources
    from wtnmt.decode.native.network import NativeEngine

    monkeypatch.setenv("WTNMT_FLOAT32_KERNELS", kernels)
    model = _model(kind, 600)
    quantize_decoding(model, "none")  # (drops copies packed before)
    src = _sources(600)
    for beam, nbest in ((1, 1), (4, 2)):
        want = search_batch(model, src, beam=beam, nbest=nbest)
        for fused in (False, True):
            got = search_batch(NativeEngine(model, fused=fused), src, beam=beam, nbest=nbest)
            _assert_same(want, got, exact=not fused)
    packed = [p for m in model.modules() for p in getattr(m, "packed_linears", tuple)()]
    assert {p.kernels for p in packed if p._packed is not None} == {kernels}


def test_a_float32_library_it_does_not_know_is_one_line(tmp_path, monkeypatch, capsys):
    argv, out = translate_job(tmp_path)
    monkeypatch.setenv("WTNMT_FLOAT32_KERNELS", "cublas")
    assert cli(argv) == 2
    one_line(capsys, "translate", "WTNMT_FLOAT32_KERNELS='cublas'", "onednn or mkl")
    assert not out.exists()
    monkeypatch.setenv("WTNMT_FLOAT32_KERNELS", "oneDNN")
    assert cli(argv) == 0 and out.read_text().strip()
