"""Eq. 1's arithmetic, softmax(QKᵀ/√Dk)·V, in one place: ``attention_core`` (batched
matmuls with the masks as additive biases), which ``attend`` (the model's attention, or
PyTorch's fused kernel where that is faster) and both decoder cache paths call."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention import SDPBackend, sdpa_kernel

from wtnmt.model.dropout import keep_scale, masked
from wtnmt.model.speed import fast_paths


def attention_core(
    q: Tensor,
    k_t: Tensor,
    v: Tensor,
    *,
    bias: Tensor | None = None,
    add_bias: Callable[[Tensor], object] | None = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """softmax(q·kᵀ + bias)·v as batched matmuls: the one place of eq. 1's arithmetic, which
    ``attend`` and both decoder cache paths call.

    q [N, T, Dk] already scaled by 1/√Dk (a copy the caller makes anyway), k_t [N, Dk, S],
    v [N, S, Dk]. ``bias`` (broadcast to the scores [N, T, S]: padding or causal masks) is
    added by the first matmul (baddbmm), not by an extra pass; ``add_bias`` edits the scores
    in place where the bias has another shape. Returns heads [N, T, Dk] and the
    probabilities [N, T, S] before dropout, whose rescaling 1/(1 − p) goes to the values.
    """
    scores = torch.bmm(q, k_t) if bias is None else torch.baddbmm(bias, q, k_t)
    if add_bias is not None:
        add_bias(scores)
    probs = scores.softmax(dim=-1)
    if dropout_p > 0:
        return torch.bmm(masked(probs, dropout_p), v * keep_scale(dropout_p)), probs
    return torch.bmm(probs, v), probs


def padding_bias(key_pad: Tensor, heads: int, dtype: torch.dtype) -> Tensor:
    """key_pad [B, S] (True at padding) → the additive bias [H·B, 1, S] of batched scores
    over H·B: 0, or −inf at padding."""
    b, s = key_pad.shape
    bias = torch.zeros(b, 1, s, dtype=dtype, device=key_pad.device)
    bias.masked_fill_(key_pad[:, None, :], float("-inf"))
    return bias.expand(heads, b, 1, s).reshape(heads * b, 1, s)


_SHORT_QUERIES = 8  # query blocks up to this length skip the fused kernel (see attend)
_CPU_SHORT_KEYS = 128  # and, on CPU without gradients, attention to up to this many keys
# On a GPU, every backend of the fused kernel but cuDNN's. cuDNN's attention builds an
# execution graph for each new shape it sees (hundreds of milliseconds of host time, cached by
# shape), and training batches and decoding change shape from one call to the next. On an H200
# a Multi30k update took 28 ms where the shapes repeated and 85-150 ms in a grid whose batches
# were new (nine runs side by side), 36 ms there without cuDNN's (two side by side); a base-size
# nn.Transformer update 488 ms against 61 (benchmarks/gpu_train_speed.py).
CUDA_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    key_pad: Tensor | None,
    causal: bool,
    dropout_p: float,
    need_probs: bool,
) -> tuple[Tensor, Tensor | None]:
    """softmax(QKᵀ/√Dk)·V for head-major inputs (eq. 1).

    q: [H, B, T, Dk], k and v: [H, B, S, Dk], key_pad: [B, S] True at padding.
    Returns heads [H, B, T, Dk] and, when ``need_probs``, the probabilities [H, B, T, S]
    before dropout. Without probabilities it runs PyTorch's fused kernel
    (scaled_dot_product_attention), except on the short query blocks of step-wise decoding
    and, on CPU without gradients, over short sources.
    """
    # The fused kernel pays a fixed cost per call that decoding's short query blocks (one new
    # token per hypothesis) do not recover: there two matmuls and a softmax measured 2× faster.
    # On CPU without gradients its blocked loops lose to the same two matmuls up to ~100 keys:
    # [4, 32, 25, 64] 361 against 599 µs, [4, 32, 60, 64] 1.3 against 1.9 ms, [4, 8, 150, 64]
    # 5.9 against 3.1 ms (2 cores). With dropout, PyTorch's CPU kernel falls back to these
    # same operations, with a dearer dropout mask than ours (model/dropout.py): on CPU they
    # run here.
    if causal and key_pad is not None:  # pragma: no cover - the model never asks for both
        raise ValueError("attend: causal attention with a key padding mask is not supported")
    # under plain_math (an export, a debugger) always the math path: eq. 1 as written. The
    # dropout first: a compiled training forward (with attention dropout) then does not
    # depend on the query length, and compiles one graph for short and long targets alike
    fused = fast_paths() and (dropout_p > 0 or q.size(-2) > _SHORT_QUERIES)
    if (
        fused
        and q.device.type == "cpu"
        and (dropout_p > 0 or (k.size(-2) <= _CPU_SHORT_KEYS and not torch.is_grad_enabled()))
    ):
        fused = False
    if not need_probs and fused:
        mask = None if key_pad is None else ~key_pad[None, :, None, :]  # [1,B,1,S] True=attend
        with sdpa_kernel(CUDA_SDPA_BACKENDS) if q.is_cuda else nullcontext():
            heads = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal
            )
        return heads, None
    # The math path, as batched matmuls over H·B: the head-split views of the projections
    # are copied once anyway (matmul would), so the copy of q carries the 1/√Dk and, under
    # dropout, the copy of v carries the dropout's 1/(1 − p). Masks are additive biases of
    # the first matmul (baddbmm), not extra passes over the scores.
    h, b, t, dk = q.shape
    s = k.size(2)
    q3 = (q * dk**-0.5).reshape(h * b, t, dk)
    k3 = k.reshape(h * b, s, dk).transpose(1, 2)
    bias = None
    if key_pad is not None:
        bias = padding_bias(key_pad, h, q.dtype)
    elif causal:
        bias = q.new_zeros(t, s).masked_fill_(
            torch.ones(t, s, dtype=torch.bool, device=q.device).triu(s - t + 1), float("-inf")
        )
    heads, probs = attention_core(
        q3, k3, v.reshape(h * b, s, dk), bias=bias, dropout_p=dropout_p
    )  # [HB, T, Dk], [HB, T, S]
    return heads.view(h, b, t, dk), probs.view(h, b, t, s) if need_probs else None


__all__ = ["attend", "attention_core", "padding_bias"]
