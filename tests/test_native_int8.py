"""The native engine's own int8 product (decode/native/int8.h): every build this CPU runs
(AVX512-VNNI, AVX-VNNI, portable C++) is the dynamic quantisation's float64 simulation
(tests/int8_oracle.py) up to float32 rounding, on the weights PyTorch packed, and the builds
agree to the bit (the same integer sums, the same quantisation and dequantisation in the same
arithmetic); 8-bit weights do not saturate; which build the engine takes follows the CPU, its
emulated limits and ``WTNMT_NATIVE_INT8`` (a value it does not know: one line)."""

from __future__ import annotations

import pytest
import torch

from wtnmt.decode.native import unavailable_reason

if unavailable_reason() is not None:  # pragma: no cover - machines without a compiler
    pytest.skip(f"the native engine cannot be built here: {unavailable_reason()}",
                allow_module_level=True)  # fmt: skip

from helpers import one_line, sentence, train_tiny
from int8_oracle import dynamic_int8, int8_linear, int8_slack
from wtnmt import Translator
from wtnmt.cli import main as cli
from wtnmt.decode.native import NativeUnavailable, extension
from wtnmt.decode.native import network as native_network
from wtnmt.model import packed
from wtnmt.model.packed import int8_available, int8_kernels, pack_int8
from wtnmt.runtime import cpu_description

pytestmark = pytest.mark.skipif(not int8_available(), reason="this PyTorch build has no int8")

EXT = extension()
# the builds this CPU runs: 16 with AVX512-VNNI, 8 with AVX-VNNI, 0 (portable) everywhere
BUILDS = EXT.int8_builds()
SHAPES = [(1, 5, 3), (3, 37, 17), (5, 64, 33), (13, 130, 300), (32, 256, 40)]  # rows, in, out


def own_weight(weight: torch.Tensor, bias: torch.Tensor | None, lanes: int):  # type: ignore[no-untyped-def]
    """int8.h's layout of the int8 weights pack_int8 makes (8-bit: every build has VNNI's
    32-bit sums, or is plain C++), as the native engine lays them out."""
    q, b = torch.ops.quantized.linear_unpack(pack_int8(weight, bias, qmax=127))
    return EXT.Int8Weight(q.int_repr(), q.q_per_channel_scales().float(), b, lanes)


def inputs(rows: int, d_in: int, d_out: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(d_out, d_in, generator=g) * torch.rand(d_out, 1, generator=g)
    x = torch.randn(rows, d_in, generator=g) * 3 + float(seed % 3 - 1)  # off-centre ranges
    return x, weight, torch.randn(d_out, generator=g)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_every_build_is_the_simulation_and_the_builds_agree_to_the_bit(shape):
    how = dynamic_int8(narrow_weights=False)
    for seed in range(3):
        x, weight, bias = inputs(*shape, seed)
        expected = int8_linear(x.double(), weight.double(), bias.double(), how)
        slack = int8_slack(x.double(), weight.double(), how)
        outputs = {lanes: own_weight(weight, bias, lanes)(x) for lanes in BUILDS}
        for lanes, out in outputs.items():
            beyond = ((out.double() - expected).abs() - slack).clamp_min(0).max().item()
            assert beyond <= 1e-5 * expected.abs().max().item(), (lanes, seed, beyond)
            assert torch.equal(out, outputs[0]), (lanes, seed)


@pytest.mark.parametrize("threads", [3, 8])
def test_the_work_split_among_more_threads_than_blocks_changes_no_bit(threads):
    """Where the blocks of outputs are fewer than the threads, the rows are split too (in spans
    of whole tiles, the last one short): every output as one thread computes it."""
    before = torch.get_num_threads()
    for rows, d_in, d_out in [(160, 256, 256), (37, 96, 40), (5, 512, 16), (161, 64, 100)]:
        x, weight, bias = inputs(rows, d_in, d_out, rows)
        for lanes in BUILDS:
            own = own_weight(weight, bias, lanes)
            torch.set_num_threads(1)
            alone = own(x)
            torch.set_num_threads(threads)
            try:
                assert torch.equal(own(x), alone), (rows, d_in, d_out, lanes)
            finally:
                torch.set_num_threads(before)


def test_edge_inputs_one_row_of_zeros_all_negative_and_no_bias():
    weight = torch.randn(20, 24, generator=torch.Generator().manual_seed(1))
    how = dynamic_int8(narrow_weights=False)
    for x in (torch.zeros(2, 24), -torch.rand(3, 24) - 1, torch.full((1, 24), 7.0)):
        expected = int8_linear(x.double(), weight.double(), None, how)
        for lanes in BUILDS:
            out = own_weight(weight, None, lanes)(x)
            assert torch.allclose(out.double(), expected, atol=1e-5, rtol=1e-5), (lanes, x[0, 0])
    empty = own_weight(weight, None, BUILDS[-1])(torch.zeros(0, 24))
    assert empty.shape == (0, 20)


def test_8_bit_weights_take_the_widest_products_without_saturating():
    """255·127 four at a time and over 1,024 inputs: 32-bit sums (16-bit pair sums, as x86
    adds them without VNNI, would saturate at 32,767 a pair)."""
    for lanes in BUILDS:
        out = own_weight(torch.ones(4, 1024), None, lanes)(torch.ones(3, 1024))
        assert torch.equal(out, torch.full((3, 4), 1024.0)), lanes


def test_a_build_this_cpu_cannot_run_is_refused():
    weight = torch.ones(2, 4, dtype=torch.int8)
    flags = cpu_description()["flags"]
    assert (16 in BUILDS) == ("avx512_vnni" in flags) and (8 in BUILDS) == ("avx_vnni" in flags)
    assert BUILDS[-1] == 0 and BUILDS == sorted(BUILDS, reverse=True)
    if 16 not in BUILDS:
        with pytest.raises(RuntimeError, match="AVX512-VNNI"):
            EXT.Int8Weight(weight, torch.ones(2), None, 16)
    if 8 not in BUILDS:
        with pytest.raises(RuntimeError, match="AVX-VNNI"):
            EXT.Int8Weight(weight, torch.ones(2), None, 8)
    with pytest.raises(RuntimeError, match="0, 8 or 16"):
        EXT.Int8Weight(weight, torch.ones(2), None, 4)


AVX512_VNNI_CPU = ["avx2", "avx512f", "avx512_vnni"]
AVX_VNNI_CPU = ["avx2", "avx_vnni"]


@pytest.mark.parametrize(
    ("flags", "builds", "env", "lanes"),
    [
        (AVX512_VNNI_CPU, [16, 0], {}, 16),
        (AVX512_VNNI_CPU, [16, 0], {"WTNMT_NATIVE_INT8": "library"}, None),
        (AVX512_VNNI_CPU, [16, 0], {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, None),  # held below VNNI
        ([*AVX512_VNNI_CPU, "avx_vnni"], [16, 8, 0], {"ATEN_CPU_CAPABILITY": "avx2"}, 8),
        ([*AVX512_VNNI_CPU, "avx_vnni"], [16, 8, 0], {"ONEDNN_MAX_CPU_ISA": "AVX2_VNNI"}, 8),
        (AVX512_VNNI_CPU, [16, 0], {"ATEN_CPU_CAPABILITY": "avx2"}, None),  # (no AVX-VNNI)
        (AVX_VNNI_CPU, [8, 0], {}, 8),  # an E-core Xeon: FBGEMM's AVX2 kernels, int8.h's VNNI
        (AVX_VNNI_CPU, [8, 0], {"WTNMT_NATIVE_INT8": "library"}, None),
        (AVX_VNNI_CPU, [8, 0], {"ONEDNN_MAX_CPU_ISA": "AVX2"}, None),  # held below VNNI
        (AVX_VNNI_CPU, [8, 0], {"ONEDNN_MAX_CPU_ISA": "AVX2", "WTNMT_NATIVE_INT8": "own"}, 0),
        (AVX_VNNI_CPU, [8, 0], {"ATEN_CPU_CAPABILITY": "default", "WTNMT_NATIVE_INT8": "own"}, 0),
        (["avx2"], [0], {}, None),
        (["avx2"], [0], {"WTNMT_NATIVE_INT8": " OWN "}, 0),
    ],
)
def test_the_build_the_engine_takes(flags, builds, env, lanes, monkeypatch):
    for name in ("WTNMT_NATIVE_INT8", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                 "DNNL_MAX_CPU_ISA"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    described = {**cpu_description(), "flags": flags}
    monkeypatch.setattr(packed, "cpu_description", lambda: described)  # (onednn_vnni's)
    packed.int8_narrow_weights.cache_clear()
    try:
        assert native_network.own_int8_lanes(builds) == lanes
    finally:
        packed.int8_narrow_weights.cache_clear()


@pytest.fixture(scope="module")
def run(tmp_path_factory):  # type: ignore[no-untyped-def]
    return train_tiny(tmp_path_factory.mktemp("native-int8"))


@pytest.mark.parametrize("products", ["own", "library"])
def test_the_translator_says_who_multiplies(run, products, monkeypatch):
    """``int8_product`` names int8.h's build where the native engine takes it (``own``: its
    widest here), the library otherwise (whether the two int8 engines agree is decided where
    margins are known: test_native_engine.py)."""
    monkeypatch.setenv("WTNMT_NATIVE_INT8", products)
    native = Translator.load(run, engine="native", quantize="int8")
    lanes = native_network.own_int8_lanes(BUILDS)  # (held where the ladder holds)
    assert (lanes is None) == (products == "library")
    assert native.network.int8_lanes == lanes  # what the engine multiplies with
    builds = {16: "avx512-vnni", 8: "avx-vnni", 0: "portable"}
    assert native.int8_product == (int8_kernels() if lanes is None else f"int8.h-{builds[lanes]}")
    assert Translator.load(run, quantize="int8").int8_product == int8_kernels()  # (PyTorch)
    sources = [sentence(i, 3 + i % 4) for i in range(6)]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        assert len(native.translate(sources, beam=3)) == len(sources)
    calls = {e.key: e.count for e in prof.key_averages()}
    # the encoder's products (and the cross-attention's keys and values) too: every one of them
    # on int8.h where the search's are, none where the library multiplies
    library, own = calls.get("quantized::linear_dynamic", 0), calls.get("wtnmt::int8_product", 0)
    if lanes is None:
        assert library > 0 and own == 0
    else:
        assert library == 0 and own > 0


def test_outside_the_native_search_int8_multiplies_in_the_library(run):
    """int8_multiplier holds only within itself: the PyTorch engine after a native search
    (the same model) and a multiplier that raises, left by the exception, do not leak."""
    native = Translator.load(run, engine="native", quantize="int8")
    model = native.model
    src = torch.tensor([[4, 5, 6, 7, 3]])

    def encode() -> torch.Tensor:
        with torch.inference_mode():
            return model.encode(src).memories[-1]

    before = encode()
    native.translate([sentence(0, 4)])
    calls = []

    def multiply(linear, x, packed_weight):  # type: ignore[no-untyped-def]
        calls.append(x.shape)
        raise RuntimeError("inside")

    with pytest.raises(RuntimeError, match="inside"), packed.int8_multiplier(multiply):
        encode()
    assert len(calls) == 1
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        after = encode()
    assert torch.equal(before, after)
    assert "wtnmt::int8_product" not in {e.key for e in prof.key_averages()}


def test_a_value_it_does_not_know_is_one_line(run, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WTNMT_NATIVE_INT8", "fast")
    with pytest.raises(NativeUnavailable, match="WTNMT_NATIVE_INT8='fast'"):
        native_network.own_int8_lanes(BUILDS)
    source = tmp_path / "in.txt"
    source.write_text(sentence(0, 4) + "\n")
    code = cli(["translate", str(run), "-i", str(source), "--engine", "native",
                "--quantize", "int8"])  # fmt: skip
    assert code == 2
    one_line(capsys, "translate", "WTNMT_NATIVE_INT8='fast'", "auto, own, library")
