"""int8 products packed for oneDNN's kernels (``WTNMT_INT8_KERNELS=onednn``) instead of
FBGEMM's: the same dynamic quantisation (int8_oracle's float64 simulation of a product, and of
each call's own input through a whole beam search), multiplied by oneDNN (its own log says so:
FBGEMM's products leave none there), on both engines, 8-bit weights wherever oneDNN has VNNI
(AVX-VNNI too); a library it does not know is one line."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from helpers import one_line, translate_job
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
)
from wtnmt.runtime import cpu_description
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


@pytest.mark.parametrize(
    ("flags", "limit", "fbgemm", "onednn"),
    [
        (["avx2"], "", True, True),  # no VNNI at all
        (["avx2", "avx_vnni"], "", True, False),  # AVX-VNNI (Intel E-core Xeons): oneDNN's
        (["avx2", "avx_vnni"], "AVX2_VNNI", True, False),
        (["avx2", "avx_vnni"], "AVX2", True, True),  # held below it
        (["avx2", "avx_vnni"], "AVX512_CORE_VNNI", True, True),  # not known to reach it
        (["avx512_vnni"], "", False, False),
        (["avx512_vnni"], "AVX2_VNNI", False, True),  # a kernel this CPU lacks: AVX2's
        (["avx512_vnni"], "AVX512_CORE", False, True),
        (["avx512_vnni", "avx_vnni"], "AVX2_VNNI_2", False, False),
        (["avx512_vnni", "avx_vnni"], "AVX512_CORE_AMX", False, False),
    ],
)
def test_int8_weights_take_8_bits_where_the_kernels_reach_a_vnni(
    flags, limit, fbgemm, onednn, monkeypatch
):
    """Whether weights narrow to 7 bits, by the CPU's flags and oneDNN's limit: FBGEMM has
    only AVX512-VNNI kernels, oneDNN AVX-VNNI ones too."""
    from wtnmt.model import packed

    monkeypatch.setattr(packed, "cpu_description", lambda: {"flags": flags})
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", limit)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("FBGEMM_ENABLE_INSTRUCTIONS", raising=False)
    packed.int8_narrow_weights.cache_clear()
    try:
        assert (packed.int8_narrow_weights("fbgemm"), packed.int8_narrow_weights("onednn")) == (
            fbgemm,
            onednn,
        )
    finally:
        packed.int8_narrow_weights.cache_clear()


@pytest.mark.skipif("avx_vnni" not in cpu_description()["flags"], reason="this CPU lacks AVX-VNNI")
def test_onednn_held_to_avx_vnni_multiplies_8_bit_weights_without_saturating():
    """oneDNN held to AVX-VNNI (what a CPU with it and no AVX-512 runs) packs 8-bit weights,
    and its kernel adds the widest pair, 2·255·127, without saturating (held to AVX2, 32.4
    where 64 is right); its log names the kernel. A fresh process: oneDNN reads the limit
    once."""
    probe = (
        "import torch\n"
        "from wtnmt.model.packed import PackedLinear, int8_narrow_weights\n"
        "linear = PackedLinear(); linear.int8 = True\n"
        "torch.backends.mkldnn.verbose(torch.backends.mkldnn.VERBOSE_ON).__enter__()\n"
        "with torch.no_grad(): out = linear(torch.ones(3, 64), torch.ones(4, 64))\n"
        "print('result', int8_narrow_weights('onednn'), round(out.min().item(), 2))\n"
    )
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2_VNNI", WTNMT_INT8_KERNELS="onednn")
    env.pop("DNNL_MAX_CPU_ISA", None)
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    lines = done.stdout.splitlines()
    assert [line.split() for line in lines if line.startswith("result")] == [
        ["result", "False", "64.0"]
    ], done.stdout
    assert any("matmul" in line and ":avx2_vnni" in line for line in lines), done.stdout


def _model() -> torch.nn.Module:
    torch.manual_seed(5)
    dims = ["model.d_model=32", "model.d_ff=64", "model.heads=4"]
    model = build_model(load_config("weighted-tiny", dims).model, vocab_size=300)
    with torch.no_grad():
        model.embedding.weight.mul_(3.0)  # sharper distributions than at initialisation
        model.embedding.weight[EOS].mul_(2.5)  # sentences end at different steps
    return model.eval()


def checked_search(model: torch.nn.Module, capfd, beam: int, **options):  # type: ignore[no-untyped-def]
    """A beam search of 4 seeded sources by ``model``, packed for oneDNN, each int8 product
    checked against the simulation of its own input: (hypotheses, the products' relative
    errors beyond the oracle's slack, oneDNN's int8 matmuls in its log)."""
    g = torch.Generator().manual_seed(7)
    src = torch.randint(4, 300, (4, 8), generator=g)
    src[:, -1] = EOS
    errors: list[float] = []
    matmuls: list[str] = []
    how = dynamic_int8(int8_narrow_weights("onednn"))
    with onednn_log(capfd, matmuls), checked_int8(how, errors):
        found = search_batch(model, src, beam=beam, **options)
    return src, found, errors, matmuls


def test_a_search_packed_for_onednn_is_the_simulation_on_both_engines(monkeypatch, capfd):
    """Every int8 product of a beam search (the encoder's, each step's, the output
    projection) on oneDNN, each the simulation of its own input up to float32 rounding (and
    its rounding of ties); the native engine, on the PyTorch engine's operators, finds exactly
    the same hypotheses over those packed weights."""
    monkeypatch.setenv("WTNMT_INT8_KERNELS", "onednn")
    model = _model()
    assert quantize_decoding(model, "int8") > 0
    src, found, errors, matmuls = checked_search(model, capfd, beam=4, nbest=2)
    assert len(errors) > 30 and max(errors) < 1e-5, (len(errors), max(errors))
    assert len(matmuls) == len(errors), (len(matmuls), len(errors))  # every one in oneDNN
    if unavailable_reason() is None:
        from wtnmt.decode.native.network import NativeEngine

        native = search_batch(NativeEngine(model, fused=False), src, beam=4, nbest=2)
        assert [[(h.tokens, h.score) for h in hyps] for hyps in native] == [
            [(h.tokens, h.score) for h in hyps] for hyps in found
        ]


def test_an_int8_library_it_does_not_know_is_one_line(tmp_path, monkeypatch, capsys):
    argv, out = translate_job(tmp_path)
    argv += ["--quantize", "int8"]
    monkeypatch.setenv("WTNMT_INT8_KERNELS", "mkl")
    assert cli(argv) == 2
    one_line(capsys, "translate", "WTNMT_INT8_KERNELS='mkl'", "fbgemm or onednn")
    assert not out.exists()
    assert cli(argv[:-2]) == 0  # float32 does not read it
    monkeypatch.setenv("WTNMT_INT8_KERNELS", "oneDNN")  # (any case)
    assert cli([*argv, "--engine", "pytorch"]) == 0 and out.read_text().strip()


def test_without_fbgemm_int8_runs_on_onednn_and_without_either_it_is_one_line(
    tmp_path, monkeypatch, capfd
):
    """A build without FBGEMM (aarch64's) packs int8 products for oneDNN by itself, each the
    simulation of its own input; one where neither multiplies refuses --quantize int8 in one
    line, and float32 still translates. (This build's libraries hidden, as such a build lists
    them.)"""
    from wtnmt.model import packed

    argv, out = translate_job(tmp_path)
    monkeypatch.delenv("WTNMT_INT8_KERNELS", raising=False)
    monkeypatch.setattr(packed, "_quantized_engines", lambda: frozenset({"onednn", "none"}))
    packed._multiplies.cache_clear()
    try:
        assert int8_kernels() == "onednn" and int8_available()
        model = _model()
        quantize_decoding(model, "int8")
        _, _, errors, matmuls = checked_search(model, capfd, beam=2)
        assert errors and max(errors) < 1e-5 and len(matmuls) == len(errors)

        monkeypatch.setattr(packed, "_quantized_engines", lambda: frozenset({"none"}))
        packed._multiplies.cache_clear()
        assert not int8_available()
        argv += ["--quantize", "int8"]
        capfd.readouterr()
        assert cli([*argv, "--engine", "pytorch"]) == 2
        one_line(capfd, "translate", "int8 decoding needs", "fbgemm's does not run", "'none'")
        assert not out.exists()
        assert cli([*argv[:-2], "--engine", "pytorch"]) == 0 and out.read_text().strip()
    finally:
        packed._multiplies.cache_clear()
