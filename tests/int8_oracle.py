"""What int8 decoding must compute, in float64: the oracle the int8 tests compare against.

The int8 engines quantise each product x·Wᵀ dynamically: weights symmetric per output channel
(scale max|w|/q), activations per call, per tensor, unsigned with a zero point (the range of
the call's values and 0 mapped onto 0…qmax), an exact integer product, then dequantised. Run
in float64 from the same float32 inputs, that product is what the kernel must give up to its
float32 rounding, on any CPU (and up to one step of an activation that float32 puts within
rounding of half a step: ``int8_slack``): a kernel that saturates, a wrong scale or zero
point, or a weight quantised another way is off by whole quantisation steps.

``simulated_int8(model, …)`` makes every int8 product of a model this simulation (the same
places, the same per-call grouping of rows), so whole decodings can be compared too: on a
model, agreement is decided where the simulation's own margins are known (``margins``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
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
    """weight [out, in] → (q, scale [out]) in float64: symmetric per output channel, max|w|
    onto ±qmax. Rounded as ``torch.quantize_per_channel`` rounds (ATen's quantize_val: the
    float32 weight times the float32 reciprocal of its float32 scale, in float32): a weight
    that float64 puts just past half a step, float32 may put just short of it (seen: 1 step
    of one weight, 70 in an int32 sum), and the packed weights are what the kernels multiply."""
    scale = (weight.float().abs().amax(dim=1).clamp_min(1e-12) / qmax).float()
    inverse = 1.0 / scale  # float32
    q = _round(weight.float() * inverse[:, None]).clamp(-qmax, qmax)
    return q.double(), scale.double()


@dataclass(frozen=True)
class Int8:
    """A dynamic int8 quantisation: activations onto 0…activation_qmax, weights onto
    ±weight_qmax."""

    activation_qmax: int
    weight_qmax: int


def dynamic_int8(narrow_weights: bool) -> Int8:
    """How every int8 engine quantises (PyTorch's on FBGEMM or oneDNN, model/packed.py; ONNX
    Runtime's ``quantize_dynamic``): 8-bit activations, weights ±127, or ±64 (7 bits) where
    ``narrow_weights`` (kernels without VNNI, whose 16-bit pair sums 8 bits would overflow)."""
    return Int8(activation_qmax=255, weight_qmax=64 if narrow_weights else 127)


def int8_linear(x: Tensor, weight: Tensor, bias: Tensor | None, how: Int8) -> Tensor:
    """x [..., in] · weight [out, in]ᵀ + bias through the dynamic int8 quantisation, in float64
    (the integer product is exact there: |Σ| < 2⁵³), returned in x's dtype."""
    return _int8(x, weight, bias, how)[0]


# The kernels quantise in float32 (x·(1/scale); FBGEMM's AVX2 quantiser adds the zero point
# before it rounds), so an activation within float32 rounding of half a step may go to either
# side of it: seen at 1.50000008 steps (zero point 73), which FBGEMM's AVX2 kernels round to 1
# and float64 to 2. TIE: 4 units in the last place of float32 at 255.
TIE = 2.0**-14


def int8_slack(x: Tensor, weight: Tensor, how: Int8) -> Tensor:
    """[..., out]: how far a kernel's int8 product may lie from ``int8_linear`` for float32's
    rounding of ties alone: one step of each activation within TIE of half a step, by its
    quantised weight. Zero unless an activation is that close to a tie."""
    return _int8(x, weight, None, how)[1]


def _int8(x: Tensor, weight: Tensor, bias: Tensor | None, how: Int8) -> tuple[Tensor, Tensor]:
    """(int8_linear, int8_slack) from one quantisation of x and weight."""
    flat = x.reshape(-1, x.size(-1)).double()
    qx, sx, zx = quantize_activations(flat, qmax=how.activation_qmax)
    qw, sw = quantize_weight(weight.double(), qmax=how.weight_qmax)
    out = ((qx - zx) @ qw.t()) * (sx * sw)
    if bias is not None:
        out = out + bias.double()
    steps = flat / sx
    ties = ((steps - steps.floor() - 0.5).abs() < TIE).double()
    slack = (ties @ qw.abs().t()) * (sx * sw)
    shape = (*x.shape[:-1], weight.size(0))
    return out.to(x.dtype).view(shape), slack.view(shape)


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
def checked_int8(how: Int8, errors: list[float]) -> Iterator[None]:
    """Every PackedLinear switched to int8 runs its kernel as it would, and each call's output
    is compared with ``int8_linear`` of that call's own input, beyond ``int8_slack``: the
    largest difference, relative to the expected largest value, is appended to ``errors``.
    Compared call by call, a decoding is checked product by product without chaining: a value
    that float32 rounding puts on the other side of a quantisation step in one engine and not
    in the other (which then moves every later activation) is never compared against a
    diverged path."""
    original = PackedLinear.__call__

    def call(self, x, weight, bias=None, *, key=None):  # type: ignore[no-untyped-def]
        out = original(self, x, weight, bias, key=key)
        if self.int8 and not torch.is_grad_enabled():
            expected, slack = _int8(x, weight, bias, how)
            scale = max(expected.abs().max().item(), 1e-12)
            beyond = ((out - expected).abs() - slack.to(out.dtype)).clamp_min(0)
            errors.append(beyond.max().item() / scale)
        return out

    PackedLinear.__call__ = call  # type: ignore[method-assign]
    try:
        yield
    finally:
        PackedLinear.__call__ = original  # type: ignore[method-assign]


def packed_weight_qmax(linear: PackedLinear) -> int:
    """The largest |q| of the int8 weights ``linear`` last packed: its width (127 or 64), as
    the kernels multiply them (each row's largest weight goes to ±qmax)."""
    weight, _ = torch.ops.quantized.linear_unpack(linear._packed)
    return int(weight.int_repr().abs().max())


def margins(log_probs: Tensor) -> Tensor:
    """[..., V] → [...]: how far the best token is ahead of the second."""
    top = log_probs.topk(2, dim=-1).values
    return top[..., 0] - top[..., 1]


__all__ = [
    "Int8",
    "checked_int8",
    "dynamic_int8",
    "int8_linear",
    "int8_slack",
    "margins",
    "packed_weight_qmax",
    "quantize_activations",
    "quantize_weight",
    "simulated_int8",
]
