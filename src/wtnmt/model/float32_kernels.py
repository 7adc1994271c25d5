"""Which library multiplies the float32 PackedLinears (model/packed.py) in decoding: oneDNN,
by a copy of the weight reordered into its blocked layout, or MKL, by a copy transposed to
[in, out] (``addmm``, MKL's sgemm without a transpose to make).

Each leads where the other is weak. On an AMD EPYC (Zen 4) oneDNN's took the tied output
projection of ``small`` ([32, 256] × [256, 8,000], 2 cores) in 640 µs against MKL's 1,140. On
an Intel Xeon (Sapphire Rapids) MKL, alone, at 32 rows on 1 thread, took 29 against 47 µs for
256→256 and 996 against 1,003 for the output projection (a little slower than oneDNN's at 160
rows and more, and on 2 threads), and in the native engine's whole float32 search it ran
1.06-1.10× as fast as oneDNN's, greedy and beam 5, 1 and 2 threads
(``benchmarks/float32_products.py [--search]``, docs/BENCHMARKS.md). So MKL where the CPU is
Intel's and the build has MKL, oneDNN elsewhere, as CTranslate2 picks its own (CT2_USE_MKL).
``WTNMT_FLOAT32_KERNELS=onednn|mkl`` chooses; it is read as each weight is packed (a packed
copy keeps its library), like ``WTNMT_INT8_KERNELS``. Training is not affected.
"""

from __future__ import annotations

import functools
import os

import torch
from torch import Tensor

from wtnmt.errors import EngineUnavailable
from wtnmt.runtime import cpuinfo

FLOAT32_KERNELS = ("onednn", "mkl")


@functools.cache
def cpu_vendor() -> str:
    """/proc/cpuinfo's ``vendor_id`` (``GenuineIntel``, ``AuthenticAMD``), "" where unknown."""
    return cpuinfo().get("vendor_id", "")


def default_float32_kernels(vendor: str, mkl: bool) -> str:
    """The library chosen where ``WTNMT_FLOAT32_KERNELS`` is unset: MKL on an Intel CPU with a
    build that has it (``mkl``), oneDNN otherwise."""
    return "mkl" if mkl and vendor == "GenuineIntel" else "onednn"


def float32_kernels() -> str:
    """``$WTNMT_FLOAT32_KERNELS`` (any case), or default_float32_kernels for this CPU and build.
    Raises EngineUnavailable for another name, or MKL where this build lacks it."""
    chosen = os.environ.get("WTNMT_FLOAT32_KERNELS", "").strip().lower()
    mkl = torch.backends.mkl.is_available()
    if not chosen:
        return default_float32_kernels(cpu_vendor(), mkl)
    if chosen not in FLOAT32_KERNELS:
        raise EngineUnavailable(
            f"WTNMT_FLOAT32_KERNELS={chosen!r}: float32 products run on "
            f"{' or '.join(FLOAT32_KERNELS)}"
        )
    if chosen == "mkl" and not mkl:  # pragma: no cover - other builds (aarch64)
        raise EngineUnavailable("WTNMT_FLOAT32_KERNELS='mkl': this PyTorch build has no MKL")
    return chosen


def pack_float32(weight: Tensor, rows: int, kernels: str) -> Tensor:
    """weight [out, in] → the copy ``kernels`` multiplies by: oneDNN's reordered layout
    (``rows``, the activations' rows, a hint for it) or MKL's [in, out]."""
    if kernels == "mkl":
        return weight.detach().t().contiguous()
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows)


def multiply_float32(x: Tensor, packed: Tensor, bias: Tensor | None, kernels: str) -> Tensor:
    """x [rows, in] · Wᵀ (+ bias) by the copy pack_float32 made, as the native engine
    (decode/native/products.h) multiplies by it too: the same call, the same bits."""
    if kernels == "mkl":
        return x.mm(packed) if bias is None else torch.addmm(bias, x, packed)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


__all__ = [
    "FLOAT32_KERNELS",
    "cpu_vendor",
    "default_float32_kernels",
    "float32_kernels",
    "multiply_float32",
    "pack_float32",
]
