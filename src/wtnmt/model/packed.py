"""x·Wᵀ with W prepacked once, for inference on CPU.

MKL multiplies by a row-major [out, in] weight through its transpose; oneDNN's inner product
with the weight reordered once into its own blocked layout is markedly faster for the
skinny activations of step-wise decoding on an AMD CPU. For the tied output projection of the
``small`` preset ([N, 256] × [256, 8000]) on 2 cores of an EPYC it measured 640 µs against
1,140 µs at N = 32 and 3.5 ms against 6.4 ms at N = 160 (beam 5 × 32 sentences). On an Intel
CPU, MKL by a copy transposed once to [in, out] is the quicker: model/float32_kernels.py
chooses, per CPU.

The packed copy is kept while the weight is unchanged (an in-place update bumps its version
counter, loading another tensor changes its address) and dropped as soon as gradients are
enabled again (training). Under autocast (whose casts the packed float32 copy would not
follow), on another device or dtype, or where the build has no oneDNN, it is a plain
``F.linear``.

Training multiplies through oneDNN too (``linear``): the weight is reordered at every call,
as it changes at every step, and that still pays. On 2 CPU cores, forward and backward of
[4,000, 256] × [256, 1,024] took 40 ms against 45 ms through ``F.linear`` (MKL), the tied
output projection [4,000, 256] × [256, 8,000] 256 against 309 ms.

int8 decoding (``quantize_decoding(model, "int8")``, `wtnmt translate --quantize int8`): the
same places multiply through FBGEMM's dynamically quantised linear instead: weights int8 per
output channel (symmetric, scale max|w|/127, packed once; 7 bits, ±64, where the library's
kernels lack VNNI: ``int8_narrow_weights``), activations quantised per call (per tensor,
unsigned, 8 bits), int32 accumulation. Off unless asked for; float32 everywhere else
(attention, layer norms, the Weighted Transformer's per-branch products).
``WTNMT_INT8_KERNELS=onednn`` in the environment packs them for oneDNN's int8 kernels instead
(the same quantisation, the same results up to the order of int32 sums; and by itself where
the build has no FBGEMM, as aarch64's), which use AMX where the CPU has it and FBGEMM does not,
and AVX-VNNI where it has that without AVX-512; on an AMD CPU with AVX-512 VNNI the native
engine's int8 search ran 0.77× (greedy) and 0.88× (beam 5) as fast on them
(docs/BENCHMARKS.md). Where the CPU has VNNI the native engine multiplies the int8 values and
scales packed here in a kernel of its own (decode/native/int8.h, the same quantisation), the
encoder's through ``int8_multiplier``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
import warnings
from collections.abc import Iterator
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from wtnmt.errors import EngineUnavailable
from wtnmt.model import int8_multiplier as _multiplier
from wtnmt.model.float32_kernels import float32_kernels, multiply_float32, pack_float32
from wtnmt.model.int8_multiplier import int8_multiplier
from wtnmt.model.speed import fast_paths
from wtnmt.runtime import cpu_description


@functools.cache
def onednn_available() -> bool:
    """Whether this build runs oneDNN's prepacked linear (one tiny trial call)."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        with torch.no_grad():
            w = torch.ops.mkldnn._reorder_linear_weight(torch.ones(3, 2), 1)
            y = torch.ops.mkldnn._linear_pointwise(torch.ones(1, 2), w, None, "none", [], "")
        return bool(torch.equal(y, torch.full((1, 3), 2.0)))
    except (AttributeError, RuntimeError, NotImplementedError):  # pragma: no cover - other builds
        return False


# How many times the weights of a model in this process may have changed in place without
# their version counters knowing: fused Adam's kernel writes the parameters and bumps no
# ``Tensor._version``. Every cache of weights derived for decoding is keyed on it too.
_generation = 0


def weights_updated() -> None:
    """Retire every packed or fused copy of weights made so far: call after an optimizer
    step (or any in-place change of parameters that may leave their versions as they were)."""
    global _generation
    _generation += 1


def weights_generation() -> int:
    """The count :func:`weights_updated` keeps: part of every derived-weight cache's key."""
    return _generation


class PackedLinear:
    """Computes ``F.linear(x, weight, bias)``; on CPU in float32 without gradients, through a
    packed copy of ``weight`` [out, in] (a transposed view of an [in, out] parameter will do;
    oneDNN's layout or MKL's: float32_kernels) made on first use and kept until it changes.

    ``key`` identifies the weight's (and bias') value when they are computed from parameters
    rather than parameters themselves (fresh tensors at each computation): pass what changes
    with them.
    """

    def __init__(self) -> None:
        self._key: object = None
        self._packed: object = None
        self.int8 = False  # decode through the int8 linear (quantize_decoding)
        self.kernels = ""  # the float32 packed copy's library (float32_kernels: mkl, onednn)

    def __call__(
        self, x: Tensor, weight: Tensor, bias: Tensor | None = None, *, key: object = None
    ) -> Tensor:
        if torch.is_grad_enabled():  # training: the packed copy would only hold memory
            self._key = self._packed = None
            return linear(x, weight, bias)
        if not fast_paths():
            return F.linear(x, weight, bias)
        if not (_cpu_float32(x, weight) and (self.int8 or _float32_packs())):
            return F.linear(x, weight, bias)
        rows = max(1, x.numel() // x.size(-1))
        packed = self.prepared(weight, bias, rows=rows, key=key)
        flat = x.reshape(-1, x.size(-1))
        if self.int8:
            own = _multiplier.current()
            if own is not None:  # (another kernel on the same packed weights: int8_multiplier)
                out = own(self, flat, packed)
            else:
                out = torch.ops.quantized.linear_dynamic(flat, packed, False)  # 8-bit activations
        else:
            out = multiply_float32(flat, packed, bias, self.kernels)
        return out.view(*x.shape[:-1], out.size(-1))

    def prepared(
        self, weight: Tensor, bias: Tensor | None = None, *, rows: int = 1, key: object = None
    ) -> object:
        """The packed copy of ``weight`` this product multiplies by (packed now unless the
        one kept is of the same weights): in float32 the copy float32_kernels() multiplies by
        (``kernels`` names it; ``rows``, the activation's rows, a hint for oneDNN's), or the
        int8 weight with ``bias`` inside (pack_int8: for the library int8_kernels() names
        then, as wide as int8_narrow_weights allows it). The native engine (decode/native)
        multiplies by the same copies."""
        if key is None:
            key = (weight.data_ptr(), weight._version, weight.shape, weight.stride())
            if bias is not None:  # int8 packs the bias with the weight
                key = (*key, bias.data_ptr(), bias._version)
        key = (self.int8, _generation, key)
        if self._packed is None or self._key != key:
            if self.int8:
                bias = None if bias is None else bias.detach()
                self._packed = pack_int8(weight.detach(), bias)
            else:
                self.kernels = float32_kernels()
                self._packed = pack_float32(weight, rows, self.kernels)
            self._key = key
        return self._packed

    def __deepcopy__(self, memo: dict) -> PackedLinear:
        copy = PackedLinear()  # a copy packs its own weight when it first needs it
        copy.int8 = self.int8
        return copy

    def __getstate__(self) -> dict:
        return {"_key": None, "_packed": None, "int8": self.int8}


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)`` for training: through oneDNN (forward and the input's
    gradient; the weight's gradient is one MKL matmul) on CPU in float32, outside autocast,
    where the build has it; ``F.linear`` otherwise, and under torch.compile (whose fake
    tensors the oneDNN weight reorder does not run on)."""
    if torch.compiler.is_compiling() or not (
        fast_paths() and _cpu_float32(x, weight) and onednn_available()
    ):
        return F.linear(x, weight, bias)
    if x.dim() == 2:
        return _OneDNNLinear.apply(x, weight, bias)
    out = _OneDNNLinear.apply(x.reshape(-1, x.size(-1)), weight, bias)
    return out.view(*x.shape[:-1], out.size(-1))


def _float32_packs() -> bool:
    """Whether float32 decoding multiplies by packed copies: MKL's, or oneDNN's in a build
    that runs them (oneDNN's, cached, asked first: this is on every product's path)."""
    return onednn_available() or float32_kernels() == "mkl"


def _cpu_float32(x: Tensor, weight: Tensor) -> bool:
    """Whether x·Wᵀ is a float32 product on CPU outside autocast (bf16 training and
    validation run autocast's own matmul, whose casts a float32 copy would not follow)."""
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and not torch.is_autocast_enabled("cpu")
    )


class _OneDNNLinear(torch.autograd.Function):
    """x·Wᵀ + b for x [N, in], W [out, in] (a transposed view will do): the weight is
    reordered into oneDNN's layout for each product, Wᵀ for the input's gradient."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:  # type: ignore[override]
        x = x.contiguous()
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, x.size(0))
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor | None]:  # type: ignore[override]
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.t(), grad.size(0))
            grad_x = torch.ops.mkldnn._linear_pointwise(grad, packed, None, "none", [], "")
        if ctx.needs_input_grad[1]:
            grad_w = grad.t().mm(x)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum(0)
        return grad_x, grad_w, grad_b


INT8_KERNELS = ("fbgemm", "onednn")  # the libraries int8 products can multiply through
_engine_lock = threading.Lock()  # torch.backends.quantized.engine is one for the process


def int8_kernels() -> str:
    """The library int8 products are packed for: ``$WTNMT_INT8_KERNELS``; unset, FBGEMM where
    it multiplies in this build (x86), else oneDNN where it does (aarch64 builds, which have no
    FBGEMM), read as each weight is packed (a packed copy keeps its library). Raises
    EngineUnavailable for another name, or one this build lacks."""
    chosen = os.environ.get("WTNMT_INT8_KERNELS", "").strip().lower()
    if not chosen:
        return next((kernels for kernels in INT8_KERNELS if _multiplies(kernels)), "fbgemm")
    if chosen not in INT8_KERNELS:
        raise EngineUnavailable(
            f"WTNMT_INT8_KERNELS={chosen!r}: int8 products run on {' or '.join(INT8_KERNELS)}"
        )
    if chosen not in _quantized_engines():  # pragma: no cover - other builds
        raise EngineUnavailable(f"WTNMT_INT8_KERNELS={chosen!r}: not in this PyTorch build")
    return chosen


@functools.cache
def _quantized_engines() -> frozenset[str]:
    return frozenset(torch.backends.quantized.supported_engines)


@contextlib.contextmanager
def _quantized_engine(name: str) -> Iterator[None]:
    """PyTorch's quantised engine set to ``name`` (what linear_prepack packs for) meanwhile."""
    with _engine_lock:
        before = torch.backends.quantized.engine
        torch.backends.quantized.engine = name
        try:
            yield
        finally:
            torch.backends.quantized.engine = before


def pack_int8(
    weight: Tensor, bias: Tensor | None, kernels: str | None = None, qmax: int | None = None
) -> object:
    """weight [out, in] → the packed int8 weight (symmetric, one scale per output row: max|w|
    onto ±``qmax``, by default as int8_narrow_weights says) with its float32 bias, for
    ``kernels`` (FBGEMM or oneDNN; by default int8_kernels()). Either multiplies through
    ``quantized::linear_dynamic``, which follows the packed weight."""
    kernels = kernels or int8_kernels()
    if qmax is None:
        qmax = 64 if int8_narrow_weights(kernels) else 127
    scale = weight.abs().amax(dim=1).clamp_min(1e-12) / float(qmax)
    zero = torch.zeros(weight.size(0), dtype=torch.long)
    with warnings.catch_warnings():  # quantised tensors are how FBGEMM takes int8 weights
        warnings.simplefilter("ignore", UserWarning)
        qweight = torch.quantize_per_channel(weight.float(), scale.double(), zero, 0, torch.qint8)
        with _quantized_engine(kernels):
            return torch.ops.quantized.linear_prepack(qweight, bias)


# oneDNN's instruction sets (ONEDNN_MAX_CPU_ISA) whose u8×s8 products add pairs in 16 bits
_ONEDNN_BELOW_VNNI = ("SSE41", "AVX", "AVX2", "AVX512_CORE")
# and those that reach AVX-VNNI (VEX-encoded, 256 bits: CPUs without AVX-512, such as Intel's
# E-core Xeons) but not AVX512-VNNI; whether a higher limit reaches it is not known here
_ONEDNN_AVX_VNNI = ("AVX2_VNNI", "AVX2_VNNI_2")
# FBGEMM's (FBGEMM_ENABLE_INSTRUCTIONS, read once a process; a name it does not know is
# ignored, as is one the CPU cannot run), the same way; it has no AVX-VNNI kernels
_FBGEMM_BELOW_VNNI = ("AVX2", "AVX512", "AVX512_256")


@functools.cache
def int8_narrow_weights(kernels: str = "fbgemm") -> bool:
    """Whether int8 weights take 7 bits (±64) rather than 8. Without VNNI, x86 adds pairs of
    u8×s8 products in 16 bits, which 8-bit activations by 8-bit weights can overflow
    (2·255·127 > 32,767: FBGEMM saturates); ±64 keeps every pair inside (2·255·64 = 32,640),
    as ONNX Runtime's ``reduce_range`` does, and activations keep their 8 bits. VNNI adds them
    in 32 bits, so there both take 8: AVX512-VNNI for FBGEMM (the one PyTorch checks for), it
    or AVX-VNNI for oneDNN (``kernels="onednn"``, int8_kernels: its brgemm matmul has
    AVX-VNNI kernels, exact with 8-bit weights where its AVX2 ones saturate). On a converged
    Multi30k Transformer held to AVX2 kernels, 7-bit weights gave 40.26 BLEU (857 of 1,000
    lines as float32's), 7-bit activations 40.09 (796), float32 40.24.
    Follows what the library may run: FBGEMM held below VNNI by ``FBGEMM_ENABLE_INSTRUCTIONS``,
    oneDNN by ``ONEDNN_MAX_CPU_ISA`` (as the tests emulate older CPUs: tests/isa_ladder.py)."""
    if kernels == "onednn":
        return onednn_vnni() is None
    if "avx512_vnni" not in cpu_description()["flags"]:
        return True
    return os.environ.get("FBGEMM_ENABLE_INSTRUCTIONS", "").upper() in _FBGEMM_BELOW_VNNI


def onednn_vnni() -> Literal["avx512", "avx"] | None:
    """Which VNNI oneDNN's int8 kernels reach on this CPU under ``ONEDNN_MAX_CPU_ISA`` (or
    ``DNNL_MAX_CPU_ISA``): ``"avx512"`` (AVX512-VNNI, unless held to AVX-VNNI), ``"avx"``
    (AVX-VNNI, when unset or held there) or None (no VNNI, or held below it). The native
    engine's own int8 kernel follows it too (decode/native/network.py), as the tests emulate
    older CPUs by it."""
    flags = cpu_description()["flags"]
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or ""
    limit = limit.strip().upper()
    if limit in _ONEDNN_BELOW_VNNI:
        return None
    if "avx512_vnni" in flags and limit not in _ONEDNN_AVX_VNNI:
        return "avx512"
    if "avx_vnni" in flags and limit in (*_ONEDNN_AVX_VNNI, "", "ALL", "DEFAULT"):
        return "avx"
    return None


@functools.cache
def _multiplies(kernels: str) -> bool:
    """Whether ``kernels``' dynamically quantised linear runs in this build (one tiny trial
    call: a build may list a library its CPU cannot run)."""
    if kernels not in _quantized_engines():
        return False
    try:
        packed = pack_int8(torch.eye(4), None, kernels)  # (the product follows the packing)
        y = torch.ops.quantized.linear_dynamic(torch.ones(1, 4), packed, True)
        return bool(torch.allclose(y, torch.ones(1, 4), atol=0.05))
    except (AttributeError, RuntimeError, NotImplementedError):  # pragma: no cover - other builds
        return False


def int8_available() -> bool:
    """Whether this build can decode in int8: the library int8_kernels() names multiplies."""
    try:
        return _multiplies(int8_kernels())
    except EngineUnavailable:
        return False


def quantize_decoding(model: torch.nn.Module, mode: Literal["none", "int8"]) -> int:
    """Decode ``model`` with int8 linear layers (``"int8"``) or float32 ones (``"none"``).
    Returns the number of linear layers switched. CPU float32 only; training is unaffected
    (with gradients every layer multiplies in float32)."""
    if mode not in ("none", "int8"):
        raise ValueError(f"quantize: {mode!r} is not one of 'none', 'int8'")
    kernels = int8_kernels() if mode == "int8" else None  # (a name it does not know: now)
    if kernels is not None and not _multiplies(kernels):
        raise EngineUnavailable(
            f"int8 decoding needs PyTorch's int8 linear on FBGEMM or oneDNN; {kernels}'s does "
            f"not run in this build (its quantised engines: {sorted(_quantized_engines())})"
        )
    switched = 0
    for linear in _packed_linears(model):
        linear.int8 = mode == "int8"
        linear._packed = linear._key = None
        switched += 1
    return switched


def decoding_mode(model: torch.nn.Module) -> Literal["none", "int8"]:
    """How ``model``'s linear layers decode: ``"int8"`` once quantize_decoding switched them."""
    return "int8" if any(linear.int8 for linear in _packed_linears(model)) else "none"


def _packed_linears(model: torch.nn.Module) -> Iterator[PackedLinear]:
    """The PackedLinear of every module, as each declares them (``packed_linears()``)."""
    for module in model.modules():
        declared = getattr(module, "packed_linears", None)
        if declared is not None:
            yield from declared()


__all__ = [
    "PackedLinear",
    "decoding_mode",
    "int8_available",
    "int8_kernels",
    "int8_multiplier",
    "int8_narrow_weights",
    "linear",
    "onednn_available",
    "onednn_vnni",
    "quantize_decoding",
    "weights_generation",
    "weights_updated",
]
