"""Oracles for the branched sublayer: the fused forward is eq. 5–7, to rounding."""

from __future__ import annotations

import pytest
import torch

from wtnmt.model.attention import MultiHeadAttention
from wtnmt.model.branched import BranchedAttention, WeightedAttention
from wtnmt.model.reference import branch_ffn, naive_branched, naive_weighted

D, M, FF = 24, 4, 32


def make_branched(ffn: str, weights: str, seed: int = 0) -> BranchedAttention:
    torch.manual_seed(seed)
    module = BranchedAttention(
        d_model=D,
        branches=M,
        d_ff=FF,
        ffn=ffn,
        weights=weights,
        topk=2,
        init="random",
        attention_dropout=0.0,
        activation_dropout=0.0,
    ).double()
    with torch.no_grad():  # non-zero biases, so that a misplaced bias shows
        module.b1.normal_()
        module.b2.normal_()
        if weights == "softmax":
            module.branch_weights.kappa.normal_()
            module.branch_weights.alpha.normal_()
    return module.eval()


def inputs(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 5, D, generator=g, dtype=torch.float64)  # [B, T, D]
    memory = torch.randn(3, 7, D, generator=g, dtype=torch.float64)  # [B, S, D]
    key_pad = torch.zeros(3, 7, dtype=torch.bool)
    key_pad[1, 4:] = True
    key_pad[2, 6:] = True
    return x, memory, key_pad


def assert_same_function(module, fused_fn, naive_fn) -> None:
    """Forward outputs and the gradient of every parameter agree within 1e-9 relative."""
    g = torch.Generator().manual_seed(7)
    fused = fused_fn()
    probe = torch.randn(fused.shape, generator=g, dtype=torch.float64)
    fused_grads = torch.autograd.grad(
        (fused * probe).sum(), list(module.parameters()), allow_unused=True
    )
    naive = naive_fn()
    naive_grads = torch.autograd.grad(
        (naive * probe).sum(), list(module.parameters()), allow_unused=True
    )
    torch.testing.assert_close(fused, naive, rtol=1e-9, atol=1e-12)
    names = [n for n, _ in module.named_parameters()]
    for name, a, b in zip(names, fused_grads, naive_grads, strict=True):
        assert (a is None) == (b is None), name
        if a is not None:
            scale = b.abs().max().clamp_min(1e-300)
            assert (a - b).abs().max() / scale < 1e-9, f"gradient of {name} differs"


@pytest.mark.parametrize("ffn", ["split", "shared"])
@pytest.mark.parametrize("weights", ["simplex", "softmax", "topk"])
def test_fused_self_attention_equals_per_branch_loop(ffn, weights):
    module = make_branched(ffn, weights)
    x, _, _ = inputs()
    pad = torch.zeros(3, 5, dtype=torch.bool)
    pad[0, 3:] = True
    assert_same_function(
        module,
        lambda: module(x, key_pad=pad).out,
        lambda: naive_branched(module, x, None, pad),
    )


@pytest.mark.parametrize("ffn", ["split", "shared"])
@pytest.mark.parametrize("weights", ["simplex", "softmax", "topk"])
def test_fused_cross_attention_equals_per_branch_loop(ffn, weights):
    module = make_branched(ffn, weights, seed=3)
    x, memory, key_pad = inputs()
    assert_same_function(
        module,
        lambda: module(x, memory, key_pad=key_pad).out,
        lambda: naive_branched(module, x, memory, key_pad),
    )


@pytest.mark.parametrize("weights", ["simplex", "softmax", "topk"])
def test_weighted_decoder_self_attention_equals_per_branch_loop(weights):
    torch.manual_seed(0)
    module = (
        WeightedAttention(
            d_model=D,
            branches=M,
            weights=weights,
            topk=2,
            init="random",
            attention_dropout=0.0,
            causal=True,
        )
        .double()
        .eval()
    )
    x, _, _ = inputs()
    assert_same_function(module, lambda: module(x).out, lambda: naive_weighted(module, x))


def test_topk_uses_only_the_k_largest_alpha():
    module = make_branched("split", "topk")
    with torch.no_grad():
        module.branch_weights.alpha.copy_(torch.tensor([0.1, 0.4, 0.2, 0.3]))
    _, alpha = module.branch_weights()
    torch.testing.assert_close(alpha, torch.tensor([0, 0.4, 0, 0.3], dtype=torch.float64) / 0.7)
    x, memory, key_pad = inputs()
    # the two dropped branches cannot matter: scramble their FFNs
    out = module(x, memory, key_pad=key_pad).out
    with torch.no_grad():
        module.w1[[0, 2]].normal_()
    torch.testing.assert_close(module(x, memory, key_pad=key_pad).out, out)


@pytest.mark.parametrize("ffn", ["split", "shared"])
def test_unit_weights_recover_multihead_attention_with_one_ffn_per_head(ffn):
    """κ = α = 1 (outside the simplex): Σ_i FFN_i(head_i W^{O_i}) over multi-head heads."""
    module = make_branched(ffn, "simplex")
    with torch.no_grad():
        module.branch_weights.kappa.fill_(1.0)
        module.branch_weights.alpha.fill_(1.0)
    mha = MultiHeadAttention(d_model=D, heads=M, dropout=0.0, causal=False).double().eval()
    mha.load_state_dict({"attn.proj.weight": module.attn.proj.weight, "w_out": module.w_out})
    x, memory, key_pad = inputs()
    heads = mha(x, memory, key_pad=key_pad, need_internals=True).internals.heads  # [B,H,T,Dk]
    expected = 0.0
    for i in range(M):  # the multi-head heads, each through its own FFN, summed
        expected = expected + branch_ffn(module, i, heads[:, i] @ module.w_out[i])
    torch.testing.assert_close(
        module(x, memory, key_pad=key_pad).out, expected, rtol=1e-10, atol=1e-10
    )
    # and the head outputs summed through W^O are exactly multi-head attention (eq. 3)
    torch.testing.assert_close(
        mha(x, memory, key_pad=key_pad).out,
        sum(heads[:, i] @ module.w_out[i] for i in range(M)),
        rtol=1e-10,
        atol=1e-10,
    )


def test_internals_carry_the_weights_in_effect():
    module = make_branched("split", "softmax")
    x, memory, key_pad = inputs()
    internals = module(x, memory, key_pad=key_pad, need_internals=True).internals
    kappa, alpha = module.branch_weights()
    torch.testing.assert_close(internals.kappa, kappa)
    torch.testing.assert_close(internals.alpha, alpha)
    assert internals.probs.shape == (3, M, 5, 7)
    assert internals.values.shape == (3, M, 7, D // M)
    assert internals.heads.shape == (3, M, 5, D // M)
    # padded keys get no attention
    assert internals.probs[1, :, :, 4:].abs().max() == 0
    torch.testing.assert_close(internals.probs.sum(-1), torch.ones(3, M, 5, dtype=torch.float64))


@pytest.mark.parametrize("ffn", ["split", "shared"])
def test_fused_weights_kept_for_decoding_follow_every_parameter_update(ffn):
    module = make_branched(ffn, "simplex")
    x, memory, key_pad = inputs()
    with torch.no_grad():
        first = module(x, memory, key_pad=key_pad).out
        assert torch.equal(module(x, memory, key_pad=key_pad).out, first)
        module.w1.mul_(2.0)  # in place, as an optimizer step
        module.branch_weights.alpha.copy_(torch.tensor([0.7, 0.1, 0.1, 0.1]))
        changed = module(x, memory, key_pad=key_pad).out
        expected = naive_branched(module, x, memory, key_pad)
    assert not torch.allclose(changed, first)
    torch.testing.assert_close(changed, expected, rtol=1e-9, atol=1e-12)
    state = {k: v.clone() for k, v in module.state_dict().items()}
    state["w_out"].mul_(0.5)
    module.load_state_dict(state)
    with torch.no_grad():
        reloaded = module(x, memory, key_pad=key_pad).out
        expected = naive_branched(module, x, memory, key_pad)
    torch.testing.assert_close(reloaded, expected, rtol=1e-9, atol=1e-12)
