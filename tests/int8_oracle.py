"""What int8 decoding must compute, in float64: the oracle the int8 tests compare against.

The int8 engines quantise each product x·Wᵀ dynamically: weights symmetric per output channel
(scale max|w|/q), activations per call, per tensor, unsigned with a zero point (the range of
the call's values and 0 mapped onto 0…qmax), an exact integer product, then dequantised. Run
in float64 from the same float32 inputs, that product is what the kernel must give up to its
float32 rounding, on any CPU: a kernel that saturates, a wrong scale or zero point, or a weight
quantised another way is off by whole quantisation steps.

``simulated_int8(model, …)`` makes every int8 product of a model this simulation (the same
places, the same per-call grouping of rows), so whole decodings can be compared too: on a
model, agreement is decided where the simulation's own margins are known (``margins``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from wtnmt.model.packed import PackedLinear


def _round(x: Tensor) -> Tensor:
    return torch.round(x)  # half to even, as nearbyint in the default rounding mode


def quantize_activations(x: Tensor, *, qmax: int) -> tuple[Tensor, float, int]:
    """x (float64) → (q, scale, zero point): the range [min(x, 0), max(x, 0)] onto 0…qmax,
    as FBGEMM's and ONNX's dynamic quantisation choose it."""
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = (hi - lo) / qmax
    if scale == 0.0:
        scale = 0.1
    scale = float(torch.tensor(scale, dtype=torch.float32))  # kept in float32 by the kernels
    zero = int(min(max(_round(torch.tensor(-lo / scale)).item(), 0), qmax))
    q = (_round(x / scale) + zero).clamp(0, qmax)
    return q, scale, zero


def quantize_weight(weight: Tensor, *, qmax: int) -> tuple[Tensor, Tensor]:
    """weight [out, in] (float64) → (q, scale [out]): symmetric per output channel, max|w|
    onto ±qmax."""
    scale = weight.abs().amax(dim=1).clamp_min(1e-12) / qmax
    scale = scale.float().double()
    return _round(weight / scale[:, None]).clamp(-qmax, qmax), scale


@dataclass(frozen=True)
class Int8:
    """A dynamic int8 quantisation: activations onto 0…activation_qmax, weights onto
    ±weight_qmax."""

    activation_qmax: int
    weight_qmax: int


def pytorch_int8(reduce_range: bool) -> Int8:
    """FBGEMM's, as the PyTorch engine calls it: 7-bit activations where ``reduce_range``."""
    return Int8(activation_qmax=127 if reduce_range else 255, weight_qmax=127)


def onnxruntime_int8(reduce_range: bool) -> Int8:
    """ONNX Runtime's ``quantize_dynamic`` (symmetric int8 weights per channel): 7-bit weights,
    ±64, where ``reduce_range``; activations 8-bit (DynamicQuantizeLinear)."""
    return Int8(activation_qmax=255, weight_qmax=64 if reduce_range else 127)


def int8_linear(x: Tensor, weight: Tensor, bias: Tensor | None, how: Int8) -> Tensor:
    """x [..., in] · weight [out, in]ᵀ + bias through the dynamic int8 quantisation, in float64
    (the integer product is exact there: |Σ| < 2⁵³), returned in x's dtype."""
    flat = x.reshape(-1, x.size(-1)).double()
    qx, sx, zx = quantize_activations(flat, qmax=how.activation_qmax)
    qw, sw = quantize_weight(weight.double(), qmax=how.weight_qmax)
    out = ((qx - zx) @ qw.t()) * (sx * sw)
    if bias is not None:
        out = out + bias.double()
    return out.to(x.dtype).view(*x.shape[:-1], weight.size(0))


@contextlib.contextmanager
def simulated_int8(how: Int8) -> Iterator[None]:
    """Every PackedLinear switched to int8 computes ``int8_linear`` instead of its kernel."""
    original = PackedLinear.__call__

    def call(self, x, weight, bias=None, *, key=None):  # type: ignore[no-untyped-def]
        if self.int8 and not torch.is_grad_enabled():
            return int8_linear(x, weight, bias, how)
        return original(self, x, weight, bias, key=key)

    PackedLinear.__call__ = call  # type: ignore[method-assign]
    try:
        yield
    finally:
        PackedLinear.__call__ = original  # type: ignore[method-assign]


@contextlib.contextmanager
def checked_int8(how: Int8 | Callable[..., Tensor], errors: list[float]) -> Iterator[None]:
    """Every PackedLinear switched to int8 runs its kernel as it would, and each call's output
    is compared with ``int8_linear`` of that call's own input (or ``how(x, weight, bias)``):
    the largest difference, relative to the expected largest value, is appended to
    ``errors``. Compared call by call, a
    decoding is checked product by product without chaining: a value that float32 rounding
    puts on the other side of a quantisation step in one engine and not in the other (which
    then moves every later activation) is never compared against a diverged path."""
    original = PackedLinear.__call__

    def call(self, x, weight, bias=None, *, key=None):  # type: ignore[no-untyped-def]
        out = original(self, x, weight, bias, key=key)
        if self.int8 and not torch.is_grad_enabled():
            if isinstance(how, Int8):
                expected = int8_linear(x, weight, bias, how)
            else:
                expected = how(x, weight, bias)
            scale = max(expected.abs().max().item(), 1e-12)
            errors.append((out - expected).abs().max().item() / scale)
        return out

    PackedLinear.__call__ = call  # type: ignore[method-assign]
    try:
        yield
    finally:
        PackedLinear.__call__ = original  # type: ignore[method-assign]


def margins(log_probs: Tensor) -> Tensor:
    """[..., V] → [...]: how far the best token is ahead of the second."""
    top = log_probs.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


__all__ = [
    "Int8",
    "checked_int8",
    "int8_linear",
    "margins",
    "onnxruntime_int8",
    "pytorch_int8",
    "quantize_activations",
    "quantize_weight",
    "simulated_int8",
]
