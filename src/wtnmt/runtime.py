"""Process-level settings for fast CPU training and decoding."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_tuned = False


def tune_cpu_allocator() -> bool:
    """Keep large freed blocks in glibc's heap instead of returning them to the system.

    glibc serves every allocation above its mmap threshold (at most 32 MiB) with a fresh
    mmap, so each step's logits, activations and gradients of that size are page-faulted in
    anew: on a 2-core machine that made a step of the `small` model about 25% slower. This is
    the in-process equivalent of the jemalloc/tcmalloc advice of PyTorch's CPU performance
    guide. Returns whether it applied (glibc on Linux only); idempotent.
    """
    global _tuned
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
