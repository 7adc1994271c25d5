"""The label-smoothed cross entropy equals PyTorch's, values and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from wtnmt.loss import label_smoothed_cross_entropy


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
def test_matches_torch_cross_entropy_with_label_smoothing(epsilon):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(13, 37, generator=g, dtype=torch.float64) * 3).requires_grad_()
    target = torch.randint(0, 37, (13,), generator=g)
    probe = torch.rand(13, generator=g, dtype=torch.float64)
    loss, nll = label_smoothed_cross_entropy(logits, target, epsilon=epsilon)
    (grad,) = torch.autograd.grad((loss * probe).sum(), logits)
    ref_logits = logits.detach().clone().requires_grad_()
    ref = F.cross_entropy(ref_logits, target, reduction="none", label_smoothing=epsilon)
    (ref_grad,) = torch.autograd.grad((ref * probe).sum(), ref_logits)
    torch.testing.assert_close(loss.double(), ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        nll.double(),
        F.cross_entropy(logits.detach(), target, reduction="none"),
        rtol=1e-6,
        atol=1e-6,
    )
    assert not nll.requires_grad


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match=r"expected logits \[N, V\] and target \[N\]"):
        label_smoothed_cross_entropy(
            torch.zeros(2, 3, 4), torch.zeros(2, dtype=torch.long), epsilon=0.1
        )


def test_bf16_logits_give_float32_values_and_a_bf16_gradient_close_to_float32():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(9, 50, generator=g) * 2
    target = torch.randint(0, 50, (9,), generator=g)
    low = logits.bfloat16().requires_grad_()
    loss, nll = label_smoothed_cross_entropy(low, target, epsilon=0.1)
    assert loss.dtype == nll.dtype == torch.float32
    (grad,) = torch.autograd.grad(loss.sum(), low)
    assert grad.dtype == torch.bfloat16
    exact = low.detach().float().requires_grad_()
    ref = F.cross_entropy(exact, target, reduction="none", label_smoothing=0.1)
    (ref_grad,) = torch.autograd.grad(ref.sum(), exact)
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad.float(), ref_grad, rtol=1e-2, atol=4e-3)
