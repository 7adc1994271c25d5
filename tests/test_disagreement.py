"""Disagreement terms (Li et al., 2018): the bounds they must reach, and masking."""

from __future__ import annotations

import pytest
import torch

from wtnmt.config import ModelConfig
from wtnmt.disagreement import (
    disagreement,
    disagreement_scores,
    output_disagreement,
    position_disagreement,
    subspace_disagreement,
)
from wtnmt.model import build_model
from wtnmt.special import BOS, PAD

H = 4


def identical_heads(b=2, length=5, dk=8):
    one = torch.randn(b, 1, length, dk, dtype=torch.float64)
    return one.expand(b, H, length, dk) * torch.rand(1, H, 1, 1, dtype=torch.float64).add(0.5)


def orthogonal_heads(b=2, length=5):
    # head i lives on coordinate i only: pairwise orthogonal at every position
    x = torch.zeros(b, H, length, H, dtype=torch.float64)
    for i in range(H):
        x[:, i, :, i] = torch.rand(b, length, dtype=torch.float64) + 0.1
    return x


@pytest.mark.parametrize("term", [subspace_disagreement, output_disagreement])
def test_cosine_terms_reach_their_bounds(term):
    assert float(term(identical_heads(), None)) == pytest.approx(-1.0)  # maximum similarity
    assert float(term(orthogonal_heads(), None)) == pytest.approx(-1.0 / H)  # diagonal only


def test_position_term_reaches_its_bounds():
    same = torch.zeros(2, H, 3, 5, dtype=torch.float64)
    same[..., 1] = 1.0  # every head attends to key 1
    assert float(position_disagreement(same, None)) == pytest.approx(-1.0)
    disjoint = torch.zeros(2, H, 3, 5, dtype=torch.float64)
    for i in range(H):
        disjoint[:, i, :, i] = 1.0
    assert float(position_disagreement(disjoint, None)) == pytest.approx(-1.0 / H)


@pytest.mark.parametrize(
    "term", [subspace_disagreement, output_disagreement, position_disagreement]
)
def test_masked_positions_do_not_count(term):
    x = (
        orthogonal_heads()
        if term is not position_disagreement
        else (torch.rand(2, H, 5, 5, dtype=torch.float64).softmax(-1))
    )
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, 2:] = True
    before = term(x, pad)
    garbage = x.clone()
    garbage[1, :, 2:] = garbage[1, :1, 2:]  # make the padded positions agree completely
    assert torch.equal(term(garbage, pad), before)
    assert not torch.equal(term(garbage, None), term(x, None))  # without the mask they count
    expected = torch.stack([term(x[0:1], None) * 5, term(x[1:2, :, :2], None) * 2]).sum() / 7
    torch.testing.assert_close(before, expected)


def test_model_level_disagreement_is_differentiable_and_averaged_over_modules():
    torch.manual_seed(0)
    model = build_model(
        ModelConfig(
            attention="branched", encoder_layers=2, decoder_layers=2, d_model=16, heads=4, d_ff=32
        ),
        vocab_size=30,
    ).double()
    src = torch.randint(4, 30, (2, 6))
    src[1, 4:] = PAD
    tgt = torch.randint(4, 30, (2, 5))
    tgt[:, 0] = BOS
    internals = model(src, tgt, need_internals=True).internals
    d = disagreement(internals, terms=["output"], modules=["encoder_self"])
    expected = torch.stack(
        [output_disagreement(m.heads, internals.src_pad) for m in internals.encoder_self]
    ).mean()
    torch.testing.assert_close(d.double(), expected, rtol=1e-6, atol=1e-7)
    both = disagreement(
        internals,
        terms=["output", "position"],
        modules=["encoder_self", "decoder_self", "encoder_decoder"],
    )
    assert -2.0 <= float(both.detach()) <= 0.0
    both.backward()
    assert model.encoder_layers[0].self_attn.attn.proj.weight.grad is not None
    scores = disagreement_scores(internals)
    assert set(scores) == {"encoder_self", "decoder_self", "encoder_decoder"}
    assert len(scores["encoder_decoder"]["position"]) == 2
    with pytest.raises(ValueError, match="unknown attention module kind 'encoder'"):
        disagreement(internals, terms=["output"], modules=["encoder"])
    with pytest.raises(ValueError, match="unknown disagreement term 'outputs'"):
        disagreement(internals, terms=["outputs"], modules=["encoder_self"])
