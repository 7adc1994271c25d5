"""int8 decoding (`translate --quantize int8`): off by default, close to float32 per layer,
and the same translations on most tokens of a trained model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers import overfit_run_config, sentence, write_pairs
from wtnmt import Translator
from wtnmt.cli import main as cli
from wtnmt.model.packed import (
    PackedLinear,
    int8_available,
    int8_reduce_range,
    quantize_decoding,
)
from wtnmt.runtime import cpu_description
from wtnmt.train import Trainer

pytestmark = pytest.mark.skipif(not int8_available(), reason="this PyTorch build has no FBGEMM")


def test_an_int8_linear_is_within_two_percent_of_float32_and_follows_weight_changes():
    g = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(300, 64, generator=g) * 0.1, torch.randn(300, generator=g)
    x = torch.randn(7, 5, 64, generator=g)
    linear = PackedLinear()
    linear.int8 = True
    with torch.no_grad():
        out = linear(x, weight, bias)
        exact = F.linear(x, weight, bias)
        assert out.shape == exact.shape
        assert ((out - exact).norm() / exact.norm()).item() < 0.02
        weight.mul_(2)  # an in-place update: the packed int8 copy must be made again
        exact = F.linear(x, weight, bias)
        assert ((linear(x, weight, bias) - exact).norm() / exact.norm()).item() < 0.02
    with torch.enable_grad():  # training never goes through int8
        assert torch.equal(linear(x, weight, bias), F.linear(x, weight, bias))


def test_int8_activations_take_8_bits_where_the_cpu_has_avx512_vnni_and_7_elsewhere():
    # Activations on the grid of 8-bit steps (k/255 of their range) through an identity (int8
    # exactly: 127·I at scale 1/127): with 8 bits they come back as they went in, with 7 they
    # are rounded to steps of 1/127.
    x = torch.arange(256, dtype=torch.float32).div(255).reshape(4, 64)
    linear = PackedLinear()
    linear.int8 = True
    with torch.no_grad():
        error = (linear(x, torch.eye(64)) - x).abs().max().item()
    if "avx512_vnni" in cpu_description()["flags"]:
        assert not int8_reduce_range()
        assert error < 1e-5
    else:
        assert int8_reduce_range()
        assert error <= 0.5 / 127 + 1e-5
    # The widest pair of products 8 bits allow, 2·255·127, does not saturate where they are used.
    ones = torch.ones(3, 64)
    with torch.no_grad():
        assert torch.allclose(linear(ones, torch.ones(4, 64)), torch.full((3, 4), 64.0))


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


def test_int8_is_off_by_default_and_agrees_with_float32_on_most_tokens(trained):
    run, sources = trained
    exact = Translator.load(run)
    assert not any(_int8_layers(exact))  # off unless asked for
    quantized = Translator.load(run, quantize="int8")
    layers = _int8_layers(quantized)
    assert layers and all(layers)
    unseen = [sentence(100 + i, 4) for i in range(20)]
    agree = total = 0
    for beam in (1, 4):
        a = [n[0] for n in exact.translate_nbest(sources + unseen, beam=beam)]
        b = [n[0] for n in quantized.translate_nbest(sources + unseen, beam=beam)]
        for x, y in zip(a, b, strict=True):
            agree += sum(p == q for p, q in zip(x.ids, y.ids, strict=False))
            total += max(len(x.ids), len(y.ids))
    assert total > 500
    assert agree / total >= 0.9, f"int8 agrees with float32 on {agree}/{total} tokens"
    assert quantized.quantize == "int8"
    quantize_decoding(quantized.model, "none")  # and back: float32 exactly
    assert quantized.quantize == "none"
    assert quantized.translate(sources, beam=4) == exact.translate(sources, beam=4)


def test_translate_quantize_int8_from_the_command_line(trained, tmp_path, capsys):
    run, sources = trained
    (tmp_path / "in.txt").write_text("".join(s + "\n" for s in sources[:5]))
    out = tmp_path / "out.txt"
    args = ["translate", str(run), "-i", str(tmp_path / "in.txt"), "-o", str(out)]
    assert cli([*args, "--quantize", "int8"]) == 0
    expected = Translator.load(run, quantize="int8").translate(sources[:5], beam=4)
    assert out.read_text().split("\n")[:-1] == expected
    if not torch.cuda.is_available():
        assert cli([*args, "--quantize", "int8", "--device", "cuda"]) == 2
        err = capsys.readouterr().err
        assert "--device cuda" in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_:  # argparse: one of none, int8
        cli([*args[:2], "--quantize", "int4"])
    assert exit_.value.code == 2 and "invalid choice: 'int4'" in capsys.readouterr().err


def test_evaluate_quantize_int8_says_so_and_keeps_the_float32_files(trained, tmp_path):
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
