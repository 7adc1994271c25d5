"""Process-level settings for fast CPU training and decoding."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from pathlib import Path
from typing import Any

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_tuned = False
_ONEDNN_CACHE = 16  # primitives kept by oneDNN and by ideep (see bound_onednn_caches)


def tune_cpu_allocator() -> bool:
    """Keep large freed blocks in glibc's heap instead of returning them to the system.

    glibc serves every allocation above its mmap threshold (at most 32 MiB) with a fresh
    mmap, so each step's logits, activations and gradients of that size are page-faulted in
    anew: on a 2-core machine that made a step of the `small` model about 25% slower. This is
    the in-process equivalent of the jemalloc/tcmalloc advice of PyTorch's CPU performance
    guide. It also bounds oneDNN's caches (bound_onednn_caches).

    Returns whether the allocator setting applied (glibc on Linux only); idempotent.
    """
    global _tuned
    bound_onednn_caches()
    if _tuned:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl or another libc without mallopt
        return False
    _tuned = bool(mallopt(_M_MMAP_THRESHOLD, 1 << 30)) and bool(mallopt(_M_TRIM_THRESHOLD, 1 << 31))
    return _tuned


def bound_onednn_caches() -> None:
    """Bound oneDNN's caches, before oneDNN's first use (it reads them once): oneDNN (bf16
    matmuls on CPU, the packed linear of decoding) keeps every primitive it creates, and
    PyTorch's ideep layer a second cache of them, 1,024 of each by default, with buffers
    that for the output projection run to tens of MiB. Training meets a new matrix shape at
    nearly every step (batches differ in tokens), so bf16 training grew by about 500 MiB
    every few steps (3.45 GiB after 40 steps of the `small` model, against 1.55 GiB in
    float32). A step reuses a shape a few times only: with 16 of each, bf16 training of that
    model peaked at 1.36 GiB and its steps were 5% faster (fewer pages faulted in). A value
    already in the environment wins.
    """
    for variable in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        os.environ.setdefault(variable, str(_ONEDNN_CACHE))


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, as a container or taskset sets)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def threads_warning(threads: int | None, option: str = "--threads") -> str | None:
    """A line for ``threads`` above the cores this process may use, else None: threads that
    share a core wait on one another at every product (``--threads 1000`` on 2 cores decoded
    17× slower than 2)."""
    cores = usable_cores()
    if threads is None or threads <= cores:
        return None
    return (
        f"{option} {threads}: more than the {cores} core{'s' * (cores != 1)} this process may "
        f"use; the extra threads wait on one another and slow it down (give at most {cores})"
    )


def check_device(device: str) -> None:
    """A device this machine has, or a one-line ConfigError naming it (imports torch)."""
    import torch

    from wtnmt.config import ConfigError

    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise ConfigError(f"--device {device!r}: not a device (cpu, cuda, cuda:1, ...)") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: this machine has no CUDA device; use --device cpu")


def check_quantize(quantize: str, device: str) -> None:
    """int8 decoding is for the CPU: a one-line ConfigError for another device."""
    from wtnmt.config import ConfigError

    if quantize != "none" and device != "cpu":
        raise ConfigError(f"--quantize {quantize} decodes on the CPU only, not --device {device}")


def check_engine(engine: str, device: str) -> None:
    """ONNX Runtime runs on the CPU here: a one-line ConfigError for another device."""
    from wtnmt.config import ConfigError

    if engine not in ("pytorch", "auto") and device != "cpu":
        raise ConfigError(f"--engine {engine} decodes on the CPU only, not --device {device}")


# oneDNN's instruction sets (ONEDNN_MAX_CPU_ISA) that multiply bf16 in hardware
_ONEDNN_BF16_ISAS = ("BF16", "AMX", "FP16", "AVX10")


def _kernels_limited_below_bf16() -> bool:
    """Whether the process is told to use kernels older than the CPU's bf16 ones: ATen's
    ``ATEN_CPU_CAPABILITY`` at AVX2 or below, or oneDNN's ``ONEDNN_MAX_CPU_ISA`` (also
    ``DNNL_MAX_CPU_ISA``) naming an instruction set without bf16 (AVX2, AVX512_CORE, ...)."""
    aten = os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()
    if aten in ("default", "avx2", "zvector"):
        return True
    isa = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").upper()
    if isa and isa not in ("ALL", "DEFAULT"):
        return not any(tag in isa for tag in _ONEDNN_BF16_ISAS)
    return False


def cpuinfo(path: Path = Path("/proc/cpuinfo")) -> dict[str, str]:
    """The fields of ``path``'s first processor (``model name``, ``vendor_id``, ``flags``, or
    ``Features`` on ARM), empty where it cannot be read."""
    fields: dict[str, str] = {}
    try:
        text = path.read_text()
    except OSError:
        return fields
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_flags(path: Path = Path("/proc/cpuinfo")) -> set[str]:
    """The instruction sets ``path`` lists (``flags``, or ``Features`` on ARM)."""
    fields = cpuinfo(path)
    return set((fields.get("flags") or fields.get("Features") or "").split())


def cpu_description() -> dict[str, Any]:
    """The CPU as a figure beside a measurement needs it: its model name, the instruction
    sets that decide the kernels (AVX2, AVX-512, VNNI, bf16, AMX) and ATen's capability."""
    import torch

    model = cpuinfo().get("model name", "unknown")
    flags = cpu_flags()
    wanted = (
        "avx2",
        "avx512f",
        "avx512_vnni",
        "avx_vnni",
        "avx512_bf16",
        "amx_bf16",
        "amx_int8",
        "amx_tile",
        "bf16",
    )
    return {
        "model": model,
        "flags": [f for f in wanted if f in flags],
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
    }


def cpu_has_vnni() -> bool:
    """Whether the CPU has int8 dot products (AVX512-VNNI or AVX-VNNI). Without them x86 int8
    products saturate on 8-bit activations, so int8 weights keep to 7 bits (reduce_range)."""
    return any(f in cpu_description()["flags"] for f in ("avx512_vnni", "avx_vnni"))


# in a run directory: one entry (step, machine, threads) each time its training starts or resumes
MACHINES = "machines.jsonl"


# what holds a library's kernels below the CPU's own instruction sets (ATen's capability is
# shown as it is): MKL's, oneDNN's, FBGEMM's, and CTranslate2's in the benchmarks that time it
KERNEL_LIMITS = (
    "MKL_ENABLE_INSTRUCTIONS",
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "FBGEMM_ENABLE_INSTRUCTIONS",
    "CT2_FORCE_CPU_ISA",
)


def machine_description(device: str | Any = "cpu") -> str:
    """The machine, in a phrase: the CPU's model and the flags that decide its kernels, ATen's
    capability, the libraries' kernels held below the CPU's (KERNEL_LIMITS) and the cores; on
    a GPU (``device``), the GPU's name first."""
    import torch

    cpu = cpu_description()
    limits = "".join(f"; {k}={os.environ[k]}" for k in KERNEL_LIMITS if os.environ.get(k))
    text = (
        f"{cpu['model']} ({' '.join(cpu['flags']) or 'no AVX2'}; ATen "
        f"{cpu['aten_capability']}{limits}), {cpu['cores']} cores"
    )
    if torch.device(device).type == "cuda":
        text = f"{torch.cuda.get_device_name(device)}, host {text}"
    return text


def machine_line(threads: int | None = None) -> str:
    """One line to print beside a measurement: the machine (above), torch's version, the
    threads used and the command."""
    import torch

    used = threads if threads is not None else torch.get_num_threads()
    return (
        f"machine: {machine_description()}, torch {torch.__version__}, "
        f"{used} thread{'s' if used != 1 else ''}; command: {' '.join(sys.argv)}"
    )


@functools.cache
def cpu_has_native_bf16() -> bool:
    """Whether this process multiplies bf16 in hardware (x86 AVX512-BF16 or AMX-BF16, Arm
    BF16): read from /proc/cpuinfo's flags; False where there is none (not Linux), and where
    the kernels are limited below those instructions (ATEN_CPU_CAPABILITY=avx2,
    ONEDNN_MAX_CPU_ISA=AVX2: then bf16 is emulated, slower than float32)."""
    if _kernels_limited_below_bf16():
        return False
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            flags.update(line.partition(":")[2].split())
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def resolve_precision(precision: str, device) -> str:  # type: ignore[no-untyped-def]
    """train.precision for ``device`` (a torch.device): ``auto`` becomes bf16 where the
    hardware has it natively, else fp32; the others stay as they are."""
    if precision != "auto":
        return precision
    if device.type == "cuda":
        import torch

        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    return "bf16" if device.type == "cpu" and cpu_has_native_bf16() else "fp32"


EMULATED_BF16_WARNING = (
    "warning: train.precision bf16 on a CPU without bf16 instructions (no AVX512-BF16 or AMX): "
    "it is emulated, many times slower than float32 (22× measured on an AVX2 CPU); "
    "train.precision auto or fp32 trains at full speed here"
)


def bf16_emulated(precision: str, device_type: str) -> bool:
    """Whether ``precision`` means bf16 autocast on a CPU without bf16 instructions, where
    oneDNN emulates it: about 22× slower than float32 for transformer-m30k on a 2-core AVX2
    EPYC (benchmarks/grid_step_cost.py)."""
    return precision == "bf16" and device_type == "cpu" and not cpu_has_native_bf16()
