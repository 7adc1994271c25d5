"""CTranslate2 loaded as benchmarks/decode_vs_ctranslate2.py times it fairly (see its
docstring); the conversion itself is the toolkit's (``wtnmt export ctranslate2``). Import
``ctranslate2`` before ``torch``: the caller does.
"""

from __future__ import annotations

from pathlib import Path

import ctranslate2

from wtnmt.export.ctranslate2 import SPECIALS, _in_helper_thread, convert


def load_translator(path: Path, threads: int, workers: int = 1):  # type: ignore[no-untyped-def]
    """``workers`` > 1: that many batches decoded at once, on threads/workers threads each."""
    return _in_helper_thread(
        lambda: ctranslate2.Translator(
            str(path), device="cpu", inter_threads=workers, intra_threads=threads // workers
        )
    )


__all__ = ["SPECIALS", "convert", "load_translator"]
