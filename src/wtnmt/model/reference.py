"""The paper's equations in their plain form: the branched sublayer (eq. 5–7) and the
weighted decoder self-attention computed one branch at a time, the reference the fused
modules of ``branched.py`` are tested against (``tests/test_branched.py``) and the
"unfused" baseline of the benchmarks.

Written to read like the paper, not to be fast: a Python loop over branches, explicit
softmax attention, every intermediate of eq. 5–7 built as written.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from wtnmt.model.branched import BranchedAttention, WeightedAttention


def naive_heads(
    module: BranchedAttention | WeightedAttention,
    x: Tensor,
    memory: Tensor | None,
    key_pad: Tensor | None,
    causal: bool,
) -> list[Tensor]:
    """head_i = softmax(Q W_i^Q (K W_i^K)ᵀ / √Dk) V W_i^V, one branch at a time (eq. 5)."""
    w = module.attn.proj.weight  # [3D, D]: rows are W^Q, W^K, W^V
    d = w.size(1)
    m = module.w_out.size(0)
    dk = d // m
    kv_in = x if memory is None else memory
    heads = []
    for i in range(m):
        wq = w[0 * d + i * dk : 0 * d + (i + 1) * dk]  # [Dk, D]
        wk = w[1 * d + i * dk : 1 * d + (i + 1) * dk]
        wv = w[2 * d + i * dk : 2 * d + (i + 1) * dk]
        q, k, v = x @ wq.t(), kv_in @ wk.t(), kv_in @ wv.t()  # [B, T, Dk], [B, S, Dk]
        scores = q @ k.transpose(1, 2) / math.sqrt(dk)  # [B, T, S]
        if key_pad is not None:
            scores = scores.masked_fill(key_pad[:, None, :], float("-inf"))
        if causal:
            t = scores.size(1)
            future = torch.ones(t, t, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        heads.append(scores.softmax(-1) @ v)  # [B, T, Dk]
    return heads


def branch_ffn(module: BranchedAttention, i: int, x: Tensor) -> Tensor:
    """FFN_i(x) = ReLU(x W1_i + b1_i) W2_i + b2_i (eq. 4): branch i's own FFN under
    ``branch_ffn: split``, the one shared FFN under ``shared``."""
    if module.ffn == "split":
        w1, b1, w2, b2 = module.w1[i], module.b1[i], module.w2[i], module.b2[i]
    else:
        w1, b1, w2, b2 = module.w1, module.b1, module.w2, module.b2
    return F.relu(x @ w1 + b1) @ w2 + b2


def naive_branched(
    module: BranchedAttention,
    x: Tensor,
    memory: Tensor | None = None,
    key_pad: Tensor | None = None,
    kappa: Tensor | None = None,
    alpha: Tensor | None = None,
) -> Tensor:
    """Σ_i α_i FFN_i(κ_i · head_i W^{O_i})  (eq. 6–7), with a loop over branches."""
    k_eff, a_eff = module.branch_weights()
    kappa = k_eff if kappa is None else kappa
    alpha = a_eff if alpha is None else alpha
    out = 0.0
    for i, head in enumerate(naive_heads(module, x, memory, key_pad, causal=False)):
        hbar = kappa[i] * (head @ module.w_out[i])  # [B, T, D]  eq. 6
        out = out + alpha[i] * branch_ffn(module, i, hbar)  # eq. 7
    return out  # type: ignore[return-value]


def naive_weighted(module: WeightedAttention, x: Tensor) -> Tensor:
    """Σ_i α_i κ_i head_i W^{O_i}: the decoder's 'weighted' masked self-attention."""
    kappa, alpha = module.branch_weights()
    out = 0.0
    for i, head in enumerate(naive_heads(module, x, None, None, causal=True)):
        out = out + alpha[i] * kappa[i] * (head @ module.w_out[i])
    return out  # type: ignore[return-value]


class UnfusedBranchedAttention(BranchedAttention):
    """The branched sublayer computed as the paper writes it: per-branch loop, M copies of
    the D-wide hbar_i. Same parameters as BranchedAttention; the benchmark's baseline."""

    def forward(self, x, memory=None, *, key_pad=None, cache=None, need_internals=False):  # type: ignore[no-untyped-def]
        from wtnmt.model.outputs import AttentionOutput

        heads, _ = self.attn(x, memory, key_pad=key_pad, cache=cache)  # [M, B, T, Dk]
        kappa, alpha = self.branch_weights()
        out = 0.0
        for i in range(heads.size(0)):
            hbar = kappa[i] * (heads[i] @ self.w_out[i])  # [B, T, D]
            out = out + alpha[i] * branch_ffn(self, i, hbar)
        return AttentionOutput(out=out)  # type: ignore[arg-type]
