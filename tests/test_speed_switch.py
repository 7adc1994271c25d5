"""One switch turns the speed machinery off: under plain_math() the model runs plain PyTorch
operations only (none of the oneDNN products, custom dropout forms or the branch tail's own
backward), and computes what the fast paths compute, to float32 rounding."""

from __future__ import annotations

import pytest
import torch

from wtnmt.config import load_config
from wtnmt.model import branched as branched_module
from wtnmt.model import build_model, dropout, packed
from wtnmt.model.speed import fast_paths, plain_math


def _model(attention: str) -> torch.nn.Module:
    preset = "weighted-tiny" if attention == "branched" else "transformer-tiny"
    torch.manual_seed(0)
    return build_model(load_config(preset).model, vocab_size=50)


def _loss_and_grads(model: torch.nn.Module) -> tuple[torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(1)
    src = torch.randint(4, 50, (3, 7))
    tgt = torch.randint(4, 50, (3, 6))
    model.zero_grad()
    loss = model(src, tgt).logits.float().logsumexp(-1).mean()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("attention", ["branched", "multihead"])
def test_plain_math_computes_what_the_fast_paths_compute(attention, monkeypatch):
    model = _model(attention)
    model.train()
    for module in model.modules():  # dropout draws differ between the paths: compare without
        if hasattr(module, "p") and isinstance(module.p, float):
            module.p = 0.0
    fast_loss, fast_grads = _loss_and_grads(model)

    def refused(*args, **kwargs):
        raise AssertionError("a fast path ran under plain_math()")

    with plain_math():
        assert not fast_paths()
        for owner, name in (
            (packed._OneDNNLinear, "apply"),
            (branched_module._BranchTail, "apply"),
            (dropout._MaskedScale, "apply"),
            (dropout._ResidualMaskedScale, "apply"),
        ):
            monkeypatch.setattr(owner, name, refused)
        plain_loss, plain_grads = _loss_and_grads(model)
        model.eval()
        with torch.no_grad():  # decoding's packed products too
            monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", refused, raising=False)
            monkeypatch.setattr(packed, "multiply_float32", refused)  # (MKL's too)
            monkeypatch.setattr(packed, "pack_float32", refused)
            model(torch.randint(4, 50, (2, 5)), torch.randint(4, 50, (2, 4)))
    assert fast_paths()
    torch.testing.assert_close(plain_loss, fast_loss, rtol=1e-5, atol=1e-6)
    for plain, fast in zip(plain_grads, fast_grads, strict=True):
        torch.testing.assert_close(plain, fast, rtol=1e-4, atol=1e-6)


def test_plain_math_uses_plain_dropout_with_dropout_on(monkeypatch):
    model = _model("branched").train()

    def refused(*args, **kwargs):
        raise AssertionError("a custom dropout form ran under plain_math()")

    monkeypatch.setattr(dropout._MaskedScale, "apply", refused)
    monkeypatch.setattr(dropout._ResidualMaskedScale, "apply", refused)
    with plain_math():
        loss, grads = _loss_and_grads(model)
    assert torch.isfinite(loss) and grads


@pytest.mark.parametrize(
    ("preset", "extra"),
    [
        ("weighted-tiny", []),
        ("weighted-tiny", ["model.decoder_self_attention=weighted", "model.branch_ffn=shared"]),
        ("transformer-tiny", ["model.encoder_combination=transparent", "model.norm=pre"]),
    ],
)
def test_every_packed_product_is_declared_by_its_module(preset, extra):
    """quantize_decoding and the weight caches reach a module's packed products through the
    module's own packed_linears(): one it holds but does not declare would be missed."""
    model = build_model(load_config(preset, extra).model, vocab_size=50)
    for module in model.modules():
        held = {id(v) for v in vars(module).values() if isinstance(v, packed.PackedLinear)}
        declared = {id(v) for v in getattr(module, "packed_linears", tuple)()}
        assert held == declared, type(module).__name__


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fused_attention_on_a_gpu_never_takes_cudnn_and_computes_eq_1():
    """cuDNN's attention builds a graph for every new shape (attention_math): attend must
    route around it, forward and backward, and still compute eq. 1 (here against float32
    math on the same bf16 inputs, to bf16's rounding)."""
    from torch.profiler import ProfilerActivity, profile

    from wtnmt.model.attention_math import attend

    torch.manual_seed(0)
    h, b, t, s, dk = 4, 3, 11, 13, 32
    q, k, v = (
        torch.randn(h, b, n, dk, device="cuda").bfloat16().requires_grad_() for n in (t, s, s)
    )
    key_pad = torch.zeros(b, s, dtype=torch.bool, device="cuda")
    key_pad[1, 9:] = True
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fused, _ = attend(q, k, v, key_pad=key_pad, causal=False, dropout_p=0.0, need_probs=False)
        fused.float().square().sum().backward()
    names = " ".join(e.key for e in prof.key_averages())
    assert "efficient_attention" in names or "flash_attention" in names, names
    cudnn = [n for n in names.split() if "cudnn" in n and ("attention" in n or "sdpa" in n)]
    assert not cudnn, cudnn
    q32, k32, v32 = (x.detach().float().requires_grad_() for x in (q, k, v))
    scores = (q32 @ k32.transpose(-1, -2)) / dk**0.5
    reference = scores.masked_fill(key_pad[None, :, None, :], float("-inf")).softmax(-1) @ v32
    reference.square().sum().backward()
    torch.testing.assert_close(fused.float(), reference, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(q.grad.float(), q32.grad, atol=6e-2, rtol=6e-2)
