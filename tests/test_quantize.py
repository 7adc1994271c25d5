"""int8 decoding (`translate --quantize int8`): off by default, and exactly the dynamic
quantisation it claims, against a float64 simulation of it (int8_oracle), per layer, step by
step and in whole translations where the simulation's margins are known. Never against float32
translations of a model trained in the test: how far int8 moves a tiny model's argmax depends
on weights that differ from CPU to CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers import overfit_run_config, sentence, write_pairs
from int8_oracle import (
    checked_int8,
    dynamic_int8,
    int8_linear,
    int8_slack,
    margins,
    packed_weight_qmax,
    quantize_activations,
    simulated_int8,
)
from stepping import walk
from wtnmt import Translator
from wtnmt.cli import main as cli
from wtnmt.decode.batches import padded
from wtnmt.decode.search import _Stepper
from wtnmt.model.packed import (
    PackedLinear,
    int8_available,
    int8_narrow_weights,
    pack_int8,
    quantize_decoding,
)
from wtnmt.runtime import cpu_description
from wtnmt.special import BOS, EOS
from wtnmt.train import Trainer

pytestmark = pytest.mark.skipif(not int8_available(), reason="this PyTorch build has no FBGEMM")


def test_an_int8_linear_is_the_simulation_of_its_quantisation_and_follows_weight_changes():
    g = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(300, 64, generator=g) * 0.1, torch.randn(300, generator=g)
    how, other = dynamic_int8(int8_narrow_weights()), dynamic_int8(not int8_narrow_weights())
    linear = PackedLinear()
    linear.int8 = True
    for x in (torch.randn(7, 5, 64, generator=g), torch.rand(3, 64, generator=g) * 4):
        with torch.no_grad():
            out = linear(x, weight, bias)
            exact = F.linear(x, weight, bias)
            assert out.shape == exact.shape
            scale = exact.abs().max().item()
            # the kernel is the simulation up to float32 rounding (1e-7 measured) ...
            assert (out - int8_linear(x, weight, bias, how)).abs().max().item() < 1e-5 * scale
            # ... the other weight width, or float32, are whole quantisation steps away
            assert (out - int8_linear(x, weight, bias, other)).abs().max().item() > 1e-3 * scale
            assert 1e-3 < ((out - exact).norm() / exact.norm()).item() < 0.05
    with torch.no_grad():
        weight.mul_(2)  # an in-place update: the packed int8 copy must be made again
        expected = int8_linear(x, weight, bias, how)
        assert (linear(x, weight, bias) - expected).abs().max().item() < 1e-5 * scale * 2
    with torch.enable_grad():  # training never goes through int8: float32, up to its rounding
        exact = F.linear(x, weight, bias)
        assert (linear(x, weight, bias) - exact).abs().max().item() < 1e-5 * scale * 2


def test_the_oracle_forgives_one_step_of_an_activation_on_a_tie_and_nothing_else():
    how = dynamic_int8(False)
    x = torch.tensor([[0.0, 1.0, 0.2, 0.25]])  # the range [0, 1]: steps of 1/255
    step = quantize_activations(x.double(), qmax=255)[1]
    x[0, 2] = 1.5 * step  # half a step (in float32: within its rounding of it)
    slack = int8_slack(x, torch.eye(4), how)  # identity weights: 127 at a scale of 1/127
    assert slack[0, 2].item() == pytest.approx(step, rel=1e-6)
    assert slack[0, [0, 1, 3]].tolist() == [0.0, 0.0, 0.0]


def _fbgemm_adds_pairs_in_16_bits() -> bool:
    """Whether FBGEMM's kernels in this process add pairs of u8×s8 products in 16 bits (x86
    without AVX512-VNNI, or FBGEMM held below it by FBGEMM_ENABLE_INSTRUCTIONS): then the
    widest pair of 8-bit activations by 8-bit weights, 2·255·127, saturates. Asked of the
    kernel itself."""
    packed = pack_int8(torch.ones(4, 64), None, "fbgemm", qmax=127)
    out = torch.ops.quantized.linear_dynamic(torch.ones(3, 64), packed, False)
    return not torch.allclose(out, torch.full((3, 4), 64.0))


def test_int8_weights_take_8_bits_where_the_kernels_add_in_32_bits_and_7_elsewhere():
    linear = PackedLinear()
    linear.int8 = True
    # Activations on the grid of 8-bit steps (k/255 of their range) through an identity (int8
    # exactly, at either width) come back as they went in: 8 bits everywhere.
    x = torch.arange(256, dtype=torch.float32).div(255).reshape(4, 64)
    with torch.no_grad():
        assert (linear(x, torch.eye(64)) - x).abs().max().item() < 1e-5
    # Weights on the grid of 8-bit steps (k/127 of each row's largest, 1) through one-hot
    # activations: with 8 bits they come back as they went in, with 7 rounded to steps of 1/64.
    weight = (torch.arange(256) % 255 - 127).float().div(127).reshape(4, 64)
    weight[:, 0] = 1.0
    with torch.no_grad():
        error = (linear(torch.eye(64), weight).t() - weight).abs().max().item()
    if _fbgemm_adds_pairs_in_16_bits():
        assert int8_narrow_weights() and packed_weight_qmax(linear) == 64
        assert 0.4 / 64 < error <= 0.5 / 64 + 1e-5
    else:
        assert not int8_narrow_weights() and packed_weight_qmax(linear) == 127
        assert error < 1e-5
    if "avx512_vnni" not in cpu_description()["flags"]:
        assert _fbgemm_adds_pairs_in_16_bits()
    # The widest pair of products 8-bit activations allow does not saturate where they are used.
    ones = torch.ones(3, 64)
    with torch.no_grad():
        assert torch.allclose(linear(ones, torch.ones(4, 64)), torch.full((3, 4), 64.0))


def test_int8_weights_take_7_bits_where_fbgemm_is_held_below_vnni():
    """FBGEMM_ENABLE_INSTRUCTIONS=AVX2 (or AVX512) makes FBGEMM run its kernels without VNNI
    on any CPU, as the instruction-set ladder does: int8 weights must then take 7 bits, or
    products saturate (here 32.4 where 64 is right). A fresh process: FBGEMM reads it once."""
    probe = (
        "import torch\n"
        "from wtnmt.model.packed import PackedLinear, int8_narrow_weights\n"
        "linear = PackedLinear(); linear.int8 = True\n"
        "with torch.no_grad(): out = linear(torch.ones(3, 64), torch.ones(4, 64))\n"
        "print(int8_narrow_weights(), round(out.max().item(), 2), round(out.min().item(), 2))\n"
    )
    for isa in ("AVX2", "AVX512"):
        env = dict(os.environ, FBGEMM_ENABLE_INSTRUCTIONS=isa, WTNMT_INT8_KERNELS="fbgemm")
        done = subprocess.run(
            [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
        )
        assert done.stdout.split() == ["True", "64.0", "64.0"], (isa, done.stdout, done.stderr)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, list[str]]:
    """A tiny Weighted Transformer trained until it translates its 40 training pairs."""
    tmp = tmp_path_factory.mktemp("quantize")
    sources = [sentence(i, 3 + i % 4) for i in range(40)]
    config = overfit_run_config(tmp, n_train=40)
    write_pairs(tmp, "train", sources)
    Trainer(config, tmp / "run", log_to_stderr=False).run()
    return tmp / "run", sources


def _int8_layers(translator: Translator) -> list[bool]:
    return [
        value.int8
        for module in translator.model.modules()
        for value in vars(module).values()
        if isinstance(value, PackedLinear)
    ]


def _simulation() -> Callable:
    return lambda: simulated_int8(dynamic_int8(int8_narrow_weights()))


def test_int8_is_off_by_default_and_every_product_of_its_steps_is_the_simulation(trained):
    """Each int8 product of 20 decoding steps through beam search's reorders (the trained
    model's own layers) is the float64 simulation of its own input, up to float32 rounding;
    the other weight width is whole quantisation steps away. Compared call by call: a
    whole step compared with a whole simulated step diverges wherever float32 rounding puts an
    activation on the other side of a quantisation step (seen under SSE4.1 kernels: 6.9e-2 at
    step 19), which says nothing about the quantisation."""
    run, sources = trained
    exact = Translator.load(run)
    assert not any(_int8_layers(exact))  # off unless asked for
    quantized = Translator.load(run, quantize="int8")
    layers = _int8_layers(quantized)
    assert layers and all(layers) and quantized.quantize == "int8"
    src = padded([quantized.vocab.source.encode([s])[0] for s in sources[:3]], quantized.device)
    size = len(quantized.vocab.target)

    def kernel(model: torch.nn.Module = quantized.model) -> _Stepper:
        with torch.inference_mode():  # as decoding runs: no gradients, so int8
            return _Stepper(model, src, True, steps=40, group=2)

    errors: list[float] = []
    with checked_int8(dynamic_int8(int8_narrow_weights()), errors):
        walk(kernel(), kernel(), size, tolerance=1e-4)  # every product of every step
    assert len(errors) > 20 * 3 and max(errors) < 1e-5, max(errors)
    wrong: list[float] = []  # the other weight width: the comparison has teeth
    with checked_int8(dynamic_int8(not int8_narrow_weights()), wrong):
        walk(kernel(), kernel(), size, tolerance=1e-4)
    assert max(wrong) > 1e-3
    with pytest.raises(AssertionError):  # and float32 is far from int8, step for step
        walk(kernel(exact.model), kernel(), size, tolerance=1e-4)
    quantize_decoding(quantized.model, "none")  # and back: float32 exactly
    assert quantized.quantize == "none"
    assert quantized.translate(sources, beam=4) == exact.translate(sources, beam=4)


def _margins(translator: Translator, source: str, ids: list[int]) -> float:
    """The least lead of the best next token over the second along ``ids`` and at its end
    (where EOS was chosen; a translation cut at the length limit chose none there), as the
    simulation computes it."""
    src = padded(translator.vocab.source.encode([source]), translator.device)
    prefix = torch.tensor([[BOS, *ids]])
    with _simulation()(), torch.inference_mode():
        step = _Stepper(translator.model, src, True, steps=len(ids) + 1, group=1)
        least = float("inf")
        for t in range(len(ids) + 1):
            log_probs = step(prefix[:, : t + 1])[0]
            if t == len(ids) and int(log_probs.argmax()) != EOS:
                break  # cut at the length limit: no choice made here
            assert t == len(ids) or int(log_probs.argmax()) == ids[t]  # the greedy path
            least = min(least, float(margins(log_probs)))
    return least


def test_int8_translates_as_the_simulation_wherever_its_margins_are_known(trained):
    """Greedy, a sentence at a time (the rows an activation's quantisation spans are then the
    same in both): where the simulation's best token leads the second by 1e-3 or more at every
    step, 300 times the steps' difference, the kernel's translation must be the same."""
    run, sources = trained
    quantized = Translator.load(run, quantize="int8")
    known = 0
    for source in sources + [sentence(100 + i, 4) for i in range(20)]:
        got = quantized.translate_nbest([source], beam=1)[0][0].ids
        with _simulation()():
            expected = quantized.translate_nbest([source], beam=1)[0][0].ids
        if _margins(quantized, source, expected) >= 1e-3:
            known += 1
            assert got == expected, source
    assert known >= 45, f"only {known} of 60 sentences have margins of 1e-3 or more"


def test_translate_quantize_int8_from_the_command_line(trained, tmp_path, capsys):
    run, sources = trained
    (tmp_path / "in.txt").write_text("".join(s + "\n" for s in sources[:5]))
    out = tmp_path / "out.txt"
    args = ["translate", str(run), "-i", str(tmp_path / "in.txt"), "-o", str(out)]
    assert cli([*args, "--quantize", "int8"]) == 0
    expected = Translator.load(run, quantize="int8").translate(sources[:5], beam=4)
    assert out.read_text().split("\n")[:-1] == expected
    assert "translated: 5 lines in" in capsys.readouterr().err  # its summary
    if not torch.cuda.is_available():
        assert cli([*args, "--quantize", "int8", "--device", "cuda"]) == 2
        err = capsys.readouterr().err
        assert "--device cuda" in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_:  # argparse: one of none, int8
        cli([*args[:2], "--quantize", "int4"])
    assert exit_.value.code == 2 and "invalid choice: 'int4'" in capsys.readouterr().err


def test_evaluate_quantize_int8_says_so_and_keeps_the_float32_files(trained, tmp_path, monkeypatch):
    run, sources = trained
    (tmp_path / "src.txt").write_text("".join(s + "\n" for s in sources[:8]))
    refs = Translator.load(run).translate(sources[:8], beam=4)
    (tmp_path / "ref.txt").write_text("".join(r + "\n" for r in refs))
    args = ["evaluate", str(run), "--src", str(tmp_path / "src.txt"), "--ref"]
    assert cli([*args, str(tmp_path / "ref.txt")]) == 0
    exact = (run / "eval" / "src.hyp").read_text()
    assert cli([*args, str(tmp_path / "ref.txt"), "--quantize", "int8"]) == 0
    assert (run / "eval" / "src.hyp").read_text() == exact  # not overwritten
    assert (run / "eval" / "src.int8.hyp").is_file()
    scores = json.loads((run / "scores.json").read_text())
    assert scores["quantize"] == "int8"  # the latest evaluation says how it decoded
    assert json.loads((run / "eval" / "src.scores.json").read_text())["quantize"] == "none"
    int8 = (run / "eval" / "src.int8.hyp").read_text()
    monkeypatch.setenv("WTNMT_INT8_KERNELS", "onednn")  # oneDNN's int8 kernels: their own files
    assert cli([*args, str(tmp_path / "ref.txt"), "--quantize", "int8"]) == 0
    assert (run / "eval" / "src.int8.hyp").read_text() == int8
    assert (run / "eval" / "src.int8.onednn.hyp").is_file()
    kernels = {
        name: json.loads((run / "eval" / f"{name}.scores.json").read_text())["int8_kernels"]
        for name in ("src", "src.int8", "src.int8.onednn")
    }
    assert kernels == {"src": None, "src.int8": "fbgemm", "src.int8.onednn": "onednn"}
    products = {  # (the PyTorch engine: the library's product)
        name: json.loads((run / "eval" / f"{name}.scores.json").read_text())["int8_product"]
        for name in kernels
    }
    assert products == kernels
    bits = {
        name: json.loads((run / "eval" / f"{name}.scores.json").read_text())["int8_weight_bits"]
        for name in kernels
    }
    seven = {k: 7 if int8_narrow_weights(k) else 8 for k in ("fbgemm", "onednn")}
    assert bits == {"src": None, "src.int8": seven["fbgemm"], "src.int8.onednn": seven["onednn"]}
