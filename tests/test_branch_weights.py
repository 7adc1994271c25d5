"""Oracles for κ and α as a model holds them and as test time replaces them (paper Table 3):
where the initializations land, the learned, uniform and random overrides, a sublayer at a
time, and the way back."""

from __future__ import annotations

import pytest
import torch

from test_model import V, batch, make, tiny
from wtnmt.model import (
    BranchWeights,
    branch_weight_table,
    branch_weights_overridden,
    build_model,
    named_branch_weights,
    override_branch_weights,
)


def test_random_init_lands_on_the_simplex_and_uniform_init_is_one_over_m():
    for init in ("random", "uniform"):
        model = build_model(tiny(attention="branched", branch_init=init), vocab_size=V)
        for m in model.modules():
            if isinstance(m, BranchWeights):
                for p in (m.kappa, m.alpha):
                    p = p.detach()
                    assert (p >= 0).all() and abs(float(p.sum()) - 1) < 1e-6
                    if init == "uniform":
                        torch.testing.assert_close(p, torch.full((4,), 0.25))


@pytest.mark.parametrize("mode", ["simplex", "softmax"])
def test_branch_weight_override(mode):
    model = make("weighted" if mode == "simplex" else "weighted-softmax-learned")
    learned = branch_weight_table(model)
    override_branch_weights(model, "learned")
    assert branch_weight_table(model) == learned
    override_branch_weights(model, "uniform")
    for weights in branch_weight_table(model).values():
        assert weights["kappa"] == pytest.approx([0.25] * 4)
        assert weights["alpha"] == pytest.approx([0.25] * 4)
    override_branch_weights(model, "random", seed=3)
    first = branch_weight_table(model)
    override_branch_weights(model, "random", seed=3)
    assert branch_weight_table(model) == first  # seeded
    for weights in first.values():
        assert sum(weights["kappa"]) == pytest.approx(1.0)
        assert weights["kappa"] != pytest.approx([0.25] * 4)
    assert set(first) == {
        "encoder_layers.0.self_attn",
        "encoder_layers.1.self_attn",
        "decoder_layers.0.cross_attn",
        "decoder_layers.1.cross_attn",
    }


def test_branch_weights_replaced_in_named_sublayers_alone():
    """``only`` replaces κ, α in the sublayers it names and nowhere else; a random draw there
    is the one the sublayer gets when every sublayer is replaced; a name the model does not
    have is refused, naming those it has."""
    model = make("weighted").eval()
    src, tgt = batch()
    learned, before = branch_weight_table(model), model(src, tgt).logits
    one = "encoder_layers.1.self_attn"
    for how in ("uniform", "random"):
        override_branch_weights(model, how, seed=5)
        everywhere = branch_weight_table(model)
        override_branch_weights(model, "random", seed=9)  # then back to learned, by hand
        for name, module in named_branch_weights(model).items():
            with torch.no_grad():
                module.kappa.copy_(torch.tensor(learned[name]["kappa"]))
                module.alpha.copy_(torch.tensor(learned[name]["alpha"]))
        with branch_weights_overridden(model, how, seed=5, only=[one]):
            got = branch_weight_table(model)
            assert not torch.equal(model(src, tgt).logits, before)
        assert got == {**learned, one: everywhere[one]}
        assert everywhere[one] != learned[one]
        assert branch_weight_table(model) == learned
    torch.testing.assert_close(model(src, tgt).logits, before, rtol=0, atol=0)
    refused = r"^encoder_layers\.7\.self_attn: not a branched sublayer of this model; it has "
    with pytest.raises(ValueError, match=refused + r"encoder_layers\.0\.self_attn, "):
        override_branch_weights(model, "uniform", only=["encoder_layers.7.self_attn"])
    assert branch_weight_table(model) == learned  # refused before anything changed
    with pytest.raises(ValueError, match="it has none"):
        override_branch_weights(make("transformer-post"), "uniform", only=[one])


@pytest.mark.parametrize("mode", ["simplex", "softmax"])
def test_overridden_branch_weights_come_back_after_the_block(mode):
    model = make("weighted" if mode == "simplex" else "weighted-softmax-learned").eval()
    src, tgt = batch()
    learned, before = branch_weight_table(model), model(src, tgt).logits
    with branch_weights_overridden(model, "uniform"):
        for weights in branch_weight_table(model).values():
            assert weights["kappa"] == pytest.approx([0.25] * 4)
        assert not torch.equal(model(src, tgt).logits, before)
    assert branch_weight_table(model) == learned
    with pytest.raises(RuntimeError, match="in the middle"):
        with branch_weights_overridden(model, "random", seed=1):
            raise RuntimeError("in the middle")
    assert branch_weight_table(model) == learned  # back even after an error
    torch.testing.assert_close(model(src, tgt).logits, before, rtol=0, atol=0)
