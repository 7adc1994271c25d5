"""Label-smoothed cross entropy (Szegedy et al., 2016; ε_ls = 0.1 in the paper, §4.1).

With q = (1 − ε)·onehot(y) + ε/V (PyTorch's ``label_smoothing`` convention):

    loss = −Σ_v q_v log p_v = (1 − ε)·nll + ε·mean_v(−log p_v)

One log-softmax serves both the loss and the plain NLL reported as perplexity. (A fused
autograd function with the closed-form gradient softmax − q measured no faster on CPU at
V = 8,000, so the plain form stays.)
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def label_smoothed_cross_entropy(
    logits: Tensor, target: Tensor, *, epsilon: float
) -> tuple[Tensor, Tensor]:
    """logits [N, V] (real target positions only), target [N] → per-token (loss, nll) [N].

    ``loss`` is differentiable; ``nll`` (for perplexity) is detached. Computed in float32
    whatever the logits' dtype.
    """
    if logits.dim() != 2 or target.shape != logits.shape[:1]:
        raise ValueError(
            f"expected logits [N, V] and target [N], got {tuple(logits.shape)} "
            f"and {tuple(target.shape)}"
        )
    lprobs = F.log_softmax(logits.float(), dim=-1)  # [N, V]
    nll = -lprobs.gather(1, target[:, None])[:, 0]  # [N]
    smooth = -lprobs.mean(dim=-1)  # [N]
    return (1.0 - epsilon) * nll + epsilon * smooth, nll.detach()
