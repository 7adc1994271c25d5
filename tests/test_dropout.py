"""The CPU dropout: F.dropout's contract (drop rate, scaling, gradient, identity outside
training), with a mask drawn 16 bits an element."""

from __future__ import annotations

import pytest
import torch

from wtnmt.model.dropout import (
    Dropout,
    dropout,
    keep_mask,
    keep_scale,
    masked,
    relu_dropout,
    residual_dropout,
)


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_keep_rate_is_one_minus_p_and_elements_are_independent(p):
    torch.manual_seed(0)
    keep = keep_mask(torch.Size([400_000]), p).float()
    # binomial: 4 standard deviations of 400,000 draws is under 0.004
    assert abs(keep.mean().item() - (1 - p)) < 0.004
    # neighbours come from the same 64-bit draw: they must not be correlated
    a, b = keep[:-1] - keep.mean(), keep[1:] - keep.mean()
    assert abs((a * b).mean().item() / keep.var().item()) < 0.01


def test_kept_values_are_scaled_so_that_the_expectation_is_unchanged():
    torch.manual_seed(1)
    x = torch.full((1_000_000,), 2.0)
    y = dropout(x, 0.1)
    kept = y != 0
    scale = (y[kept] / x[kept]).unique()
    assert scale.numel() == 1  # one scale, the inverse of the exact keep probability
    assert scale.item() == pytest.approx(65536 / (65536 - round(0.1 * 65536)))
    assert y.mean().item() == pytest.approx(2.0, rel=2e-3)


def test_gradient_is_the_same_mask_and_scale():
    torch.manual_seed(2)
    x = torch.randn(7, 11, 13, requires_grad=True)
    y = dropout(x, 0.25)
    g = torch.randn_like(y)
    y.backward(g)
    ratio = torch.where(x.detach() != 0, y.detach() / x.detach(), torch.zeros(()))
    torch.testing.assert_close(x.grad, g * ratio)


def test_identity_outside_training_and_at_zero_and_reproducible_under_a_seed():
    x = torch.randn(5, 6)
    assert dropout(x, 0.3, training=False) is x
    assert dropout(x, 0.0) is x
    module = Dropout(0.3).eval()
    assert module(x) is x
    torch.manual_seed(3)
    a = dropout(x, 0.3)
    torch.manual_seed(3)
    assert torch.equal(a, dropout(x, 0.3))
    assert dropout(x, 1.0).eq(0).all()  # p = 1 drops everything, as F.dropout does


def _same_draws(fn, seed):  # type: ignore[no-untyped-def]
    torch.manual_seed(seed)
    return fn()


def test_residual_dropout_is_x_plus_dropout_with_its_gradients():
    x = torch.randn(6, 9, 16, requires_grad=True)
    y = torch.randn(6, 9, 16, requires_grad=True)
    g = torch.randn(6, 9, 16)
    fused = _same_draws(lambda: residual_dropout(x, y, 0.2), 4)
    fx, fy = torch.autograd.grad(fused, (x, y), g)
    plain = _same_draws(lambda: x + dropout(y, 0.2), 4)
    px, py = torch.autograd.grad(plain, (x, y), g)
    assert plain.ne(x).any() and plain.eq(x).any()  # some kept, some dropped
    torch.testing.assert_close(fused, plain)
    torch.testing.assert_close(fx, px)
    torch.testing.assert_close(fy, py)
    assert torch.equal(residual_dropout(x, y, 0.2, training=False), x + y)


def test_relu_dropout_is_dropout_of_relu_with_its_gradient():
    h = torch.randn(4, 50, 32)
    g = torch.randn(4, 50, 32)
    a = h.clone().requires_grad_()
    fused = _same_draws(lambda: relu_dropout(a * 1.0, 0.3), 5)
    (ga,) = torch.autograd.grad(fused, a, g)
    b = h.clone().requires_grad_()
    plain = _same_draws(lambda: dropout(torch.relu(b), 0.3), 5)
    (gb,) = torch.autograd.grad(plain, b, g)
    torch.testing.assert_close(fused, plain)
    torch.testing.assert_close(ga, gb)  # zero where h < 0 or dropped
    assert torch.equal(relu_dropout(h.clone(), 0.3, training=False), torch.relu(h))
    assert torch.equal(relu_dropout(h.clone(), 0.0), torch.relu(h))


def test_masked_times_keep_scale_is_dropout():
    x = torch.randn(300, 40)
    unscaled = _same_draws(lambda: masked(x, 0.1), 6)
    plain = _same_draws(lambda: dropout(x, 0.1), 6)
    torch.testing.assert_close(unscaled * keep_scale(0.1), plain)
    assert set(torch.unique(unscaled[x != 0] / x[x != 0]).tolist()) == {0.0, 1.0}
