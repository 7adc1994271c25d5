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
(``torch.utils.cpp_extension``; ninja from ``pip install 'wtnmt[native]'``, found in the
environment's own bin folder whether or not it is activated), about a minute, and kept under
``TORCH_EXTENSIONS_DIR`` (default ~/.cache/torch_extensions) for later runs, which import it
without a compiler, ninja or a lock (build.py: a build killed midway never blocks the next).
Where the package was built with PyTorch at hand (``pip install .``, a wheel; setup.py), the
engine is compiled into it, ``_engine``, and used where it was built from these sources for
this PyTorch (``_engine.json``), with no compiler or cache at all; ``WTNMT_NATIVE_PACKAGED=0``
ignores it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from wtnmt.decode.native.build import (
    WAIT,
    BuildUnavailable,
    build_lock,
    import_library,
    library,
)
from wtnmt.decode.native.identity import FLAGS, PACKAGED, RECORD, SOURCE, engine_name
from wtnmt.errors import EngineUnavailable


class NativeUnavailable(EngineUnavailable):
    """The native engine cannot be built or run here (one line saying why)."""


def unavailable_reason() -> str | None:
    """Why the extension cannot be compiled here, or None when the tools are there."""
    if sys.platform == "win32":
        return "the native engine is built for Linux and macOS only"
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ({compiler!r} is not on PATH; set CXX or install g++)"
    _ninja_on_path()
    try:
        from torch.utils.cpp_extension import verify_ninja_availability

        verify_ninja_availability()
    except RuntimeError:
        return "ninja is not installed (pip install 'wtnmt[native]')"
    return None


def _ninja_on_path() -> None:
    """ninja from ``pip install 'wtnmt[native]'`` lives in this environment's bin folder,
    which is not on PATH where the environment is not activated (systemd, cron): put it
    there for torch's build, which runs ``ninja`` by name."""
    folders = [os.path.dirname(sys.executable)]
    try:
        import ninja  # type: ignore[import-not-found]

        folders.insert(0, ninja.BIN_DIR)
    except (ImportError, AttributeError):
        pass
    path = os.environ.get("PATH", "").split(os.pathsep)
    for folder in folders:
        if folder and folder not in path and (Path(folder) / "ninja").is_file():
            os.environ["PATH"] = os.pathsep.join([folder, *path])
            return


def _name() -> str:
    """The extension's name for this source and this PyTorch (identity.engine_name)."""
    import torch

    return engine_name(torch.__version__)


def built() -> bool:
    """Whether this source's extension is compiled and cached already."""
    return library(_name()).is_file()


_loaded: list[ModuleType] = []  # the extension, once loaded (a module is loaded once)


def extension(say: Callable[[str], None] | None = None) -> ModuleType:
    """The compiled engine: imported where it is built already (nothing else needed), else
    built now under a lock that dies with its holder (``say`` is told before a build, and
    while waiting for another process's). Every reason it cannot be had is NativeUnavailable
    in one line (``--engine auto`` then decodes with PyTorch)."""
    if _loaded:
        return _loaded[0]
    name = _name()
    module, why = _import_packaged(name)
    try:
        module = module or _import_built(name) or _build(name, say, why)
    except BuildUnavailable as e:
        raise NativeUnavailable(f"--engine native: {why}{e}") from None
    _loaded.append(module)
    return module


def _import_packaged(name: str, record_path: Path | None = None) -> tuple[ModuleType | None, str]:
    """The engine compiled into the package (``pip install .``, a wheel), where it was built
    as ``name`` (these sources, this PyTorch); else None and what differs ("" where the
    package has none: a checkout, or a wheel built without PyTorch at hand)."""
    record_path = record_path or Path(__file__).with_name(RECORD)
    if os.environ.get("WTNMT_NATIVE_PACKAGED") == "0" or not record_path.is_file():
        return None, ""  # 0: the just-in-time build only (the kernels' developers, tests)
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        built_as, for_torch = record["name"], record["torch"]
    except (OSError, ValueError, KeyError, TypeError):
        return None, f"{record_path} is damaged; "
    if built_as != name:
        import torch

        if for_torch != torch.__version__:
            return None, (
                f"the engine in this package was built for PyTorch {for_torch}, this is "
                f"{torch.__version__} (reinstall wtnmt built against it); "
            )
        return None, "the engine in this package is of other sources (an edited checkout); "
    import importlib

    try:
        return importlib.import_module(f"{__name__}.{PACKAGED}"), ""
    except ImportError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return None, f"the engine in this package does not load ({first}); "


def _import_built(name: str) -> ModuleType | None:
    path = library(name)
    if not path.is_file():
        return None
    try:
        return import_library(name, path)
    except (ImportError, OSError) as e:  # a damaged or foreign file: said, not rebuilt over
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise NativeUnavailable(f"--engine native: {path} does not load ({first})") from None


def _build(name: str, say: Callable[[str], None] | None, why: str = "") -> ModuleType:
    """Built just in time (``why``: what made the package's own engine unusable, said)."""
    reason = unavailable_reason()
    if reason is not None:
        raise NativeUnavailable(f"--engine native: {why}{reason}")
    from torch.utils.cpp_extension import load

    with build_lock(library(name).parent, wait=build_wait(), say=say):
        if (module := _import_built(name)) is not None:  # built by the process waited for
            return module
        if say is not None:
            say(f"{why}compiling the native engine (once: about a minute)")
        try:
            return load(name=name, sources=[str(SOURCE)], extra_cflags=FLAGS, verbose=False)
        except (RuntimeError, OSError, ImportError) as e:  # a compiler error: its first line
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise NativeUnavailable(
                f"--engine native: building {SOURCE.name} failed ({first})"
            ) from e


def build_wait() -> float:
    """Seconds to wait for another process's build: ``WTNMT_NATIVE_BUILD_WAIT``, else WAIT."""
    text = os.environ.get("WTNMT_NATIVE_BUILD_WAIT", "")
    try:
        return max(0.0, float(text)) if text else WAIT
    except ValueError:
        raise NativeUnavailable(
            f"WTNMT_NATIVE_BUILD_WAIT={text!r}: seconds to wait for another build (e.g. 600)"
        ) from None


__all__ = [
    "SOURCE",
    "NativeUnavailable",
    "build_wait",
    "built",
    "extension",
    "unavailable_reason",
]
