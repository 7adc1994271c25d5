"""The native engine: greedy and beam search with the decoder step in C++ (engine.cpp).

decode_profile.py found a third of an int8 greedy step outside PyTorch's operators: Python
and its dispatch around ~250 operator calls. engine.cpp runs the search of decode/search.py
and the decoder step of model/transformer.py in C++, on the same packed weights, for every
decoder the toolkit builds (post- and pre-norm, multi-head or weighted decoder
self-attention, multi-head cross-attention with its FFN or the branched sublayer with split
or shared FFNs, pruned branches), in float32 or int8: the products through the same
operators, attention (with the branches' first FFN products) and greedy's choice of token in
its own kernels (attention.h, search_ops.h), and where the CPU has VNNI the int8 products
too (int8.h: the same quantisation of the same weights in one pass, 1.12-1.19x as fast as
FBGEMM's in decoding; network.py's ``own_int8_lanes``). The encoder and the cross-attention keys and
values, once a batch, stay the PyTorch model's.

The extension is compiled on first use with the C++ compiler the PyTorch build asks for
(``torch.utils.cpp_extension``; ninja from ``pip install 'wtnmt[native]'``), about a minute,
and kept under ``TORCH_EXTENSIONS_DIR`` (default ~/.cache/torch_extensions) for later runs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from wtnmt.errors import EngineUnavailable

SOURCE = Path(__file__).with_name("engine.cpp")
# -O3: the attention kernels' loops vectorised. -fopenmp when compiling only: at::parallel_for
# then runs on PyTorch's own OpenMP threads (its GOMP symbols are found through libtorch_cpu,
# whatever its libgomp is called); linked to another libgomp, two thread pools would fight
FLAGS = ["-O3", "-fopenmp"]


class NativeUnavailable(EngineUnavailable):
    """The native engine cannot be built or run here (one line saying why)."""


def unavailable_reason() -> str | None:
    """Why the extension cannot be compiled here, or None when the tools are there."""
    if sys.platform == "win32":
        return "the native engine is built for Linux and macOS only"
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler!r} is not on PATH; set CXX or install g++)"
    try:
        from torch.utils.cpp_extension import verify_ninja_availability

        verify_ninja_availability()
    except RuntimeError:
        return "ninja is not installed (pip install 'wtnmt[native]')"
    return None


def _name() -> str:
    """The extension's name: its source's digest in it, so that a cached build is always of
    this source (and another version of wtnmt keeps its own)."""
    digest = hashlib.sha256(" ".join(FLAGS).encode())
    for part in sorted(SOURCE.parent.glob("*.[ch]*")):  # engine.cpp and its headers
        digest.update(part.name.encode() + part.read_bytes())
    return "wtnmt_native_" + digest.hexdigest()[:12]


def built() -> bool:
    """Whether this source's extension is compiled and cached already."""
    from torch.utils.cpp_extension import _get_build_directory

    name = _name()
    return (Path(_get_build_directory(name, verbose=False)) / f"{name}.so").is_file()


_loaded: list[ModuleType] = []  # the extension, once loaded (a module is loaded once)


def extension(say: Callable[[str], None] | None = None) -> ModuleType:
    """The compiled engine (built on first use, then loaded from its cache); ``say`` is told
    before a build."""
    if _loaded:
        return _loaded[0]
    reason = unavailable_reason()
    if reason is not None:
        raise NativeUnavailable(f"--engine native: {reason}")
    from torch.utils.cpp_extension import load

    if say is not None and not built():
        say("compiling the native engine (once: about a minute)")
    try:
        module = load(name=_name(), sources=[str(SOURCE)], extra_cflags=FLAGS, verbose=False)
    except (RuntimeError, OSError, ImportError) as e:  # a compiler error: its first line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise NativeUnavailable(f"--engine native: building {SOURCE.name} failed ({first})") from e
    _loaded.append(module)
    return module


__all__ = ["SOURCE", "NativeUnavailable", "built", "extension", "unavailable_reason"]
