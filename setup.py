"""Compiles the native engine (src/wtnmt/decode/native/engine.cpp) into the package when it is
built (``pip install .``, ``python -m build --no-isolation``), as torchvision and
torch-scatter compile theirs: against the PyTorch installed in the building environment, with
``torch.utils.cpp_extension.BuildExtension``. Beside the module, ``_engine.json`` records the
name it was built as (its sources, flags and PyTorch version) and that PyTorch version: at run
time wtnmt imports it only where they match, else says so and builds just in time, or decodes
with PyTorch.

Without PyTorch in the building environment (pip's default build isolation fetches only what
``[build-system]`` names) the package is built without the engine, which is then compiled on
first use as before; ``pip install --no-build-isolation .`` after installing torch compiles it
now. ``WTNMT_NATIVE_BUILD=0`` leaves it out on purpose.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

from setuptools import setup

HERE = Path(__file__).resolve().parent
NATIVE = HERE / "src" / "wtnmt" / "decode" / "native"


def _identity():  # type: ignore[no-untyped-def]
    """src/wtnmt/decode/native/identity.py, read by path (the package is not importable yet)."""
    spec = importlib.util.spec_from_file_location("wtnmt_native_identity", NATIVE / "identity.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _native() -> dict:  # type: ignore[type-arg]
    if os.environ.get("WTNMT_NATIVE_BUILD", "1") == "0":
        print("wtnmt: WTNMT_NATIVE_BUILD=0: the native engine is left out", file=sys.stderr)
        return {}
    try:
        import torch
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        print(
            "wtnmt: no PyTorch in this build environment: the native engine is compiled on "
            "first use instead (pip install --no-build-isolation . compiles it now)",
            file=sys.stderr,
        )
        return {}
    identity = _identity()
    record = {"name": identity.engine_name(torch.__version__), "torch": torch.__version__}

    class BuildWithRecord(BuildExtension):  # type: ignore[misc]
        def run(self) -> None:
            super().run()
            for ext in self.extensions:
                target = Path(self.get_ext_fullpath(ext.name)).with_name(identity.RECORD)
                target.write_text(json.dumps(record) + "\n", encoding="utf-8")

        def get_outputs(self) -> list[str]:  # the record goes into the wheel too
            outputs = super().get_outputs()
            records = [str(Path(self.get_ext_fullpath(e.name)).with_name(identity.RECORD))
                       for e in self.extensions]  # fmt: skip
            return [*outputs, *records]

    engine = CppExtension(
        name=f"wtnmt.decode.native.{identity.PACKAGED}",
        sources=[str(identity.SOURCE.relative_to(HERE))],
        extra_compile_args={"cxx": identity.FLAGS},
    )
    return {"ext_modules": [engine], "cmdclass": {"build_ext": BuildWithRecord}}


def _outside() -> dict:  # type: ignore[type-arg]
    """Build products (build/, the egg-info) in a folder of the system's temporary directory
    named after this source tree, so that ``pip install .`` leaves the tree as it found it
    (an editable install still puts the engine it compiles beside its source)."""
    digest = hashlib.sha256(str(HERE).encode()).hexdigest()[:12]
    base = Path(tempfile.gettempdir()) / f"wtnmt-build-{digest}"
    base.mkdir(parents=True, exist_ok=True)
    return {"build": {"build_base": str(base)}, "egg_info": {"egg_base": str(base)}}


setup(options=_outside(), **_native())
