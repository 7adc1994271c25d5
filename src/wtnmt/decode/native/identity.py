"""What names a build of the native engine: its sources, its flags and the PyTorch version it
is compiled against, digested into the extension's name. Free of imports of wtnmt and torch,
so that ``setup.py`` reads it by path when it compiles the engine into the wheel, and the
engine found there is known to be of these sources and that PyTorch or not."""

from __future__ import annotations

import hashlib
from pathlib import Path

HERE = Path(__file__).parent
SOURCE = HERE / "engine.cpp"
# -O3: the attention kernels' loops vectorised. -fopenmp when compiling only: at::parallel_for
# then runs on PyTorch's own OpenMP threads (its GOMP symbols are found through libtorch_cpu,
# whatever its libgomp is called); linked to another libgomp, two thread pools would fight
FLAGS = ["-O3", "-fopenmp"]
PACKAGED = "_engine"  # the module compiled into the package (wtnmt.decode.native._engine)
RECORD = "_engine.json"  # beside it: the name it was built as, and the PyTorch it was built for


def engine_name(torch_version: str) -> str:
    """``wtnmt_native_`` and 12 hex digits of the sources (engine.cpp and its headers), the
    flags and ``torch_version``."""
    digest = hashlib.sha256(" ".join([*FLAGS, torch_version]).encode())
    sources = [*HERE.glob("*.cpp"), *HERE.glob("*.h")]  # engine.cpp and its headers
    for part in sorted(sources, key=lambda p: p.name):
        digest.update(part.name.encode() + part.read_bytes())
    return "wtnmt_native_" + digest.hexdigest()[:12]


__all__ = ["FLAGS", "PACKAGED", "RECORD", "SOURCE", "engine_name"]
