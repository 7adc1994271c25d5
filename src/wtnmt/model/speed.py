"""One switch for the speed machinery: the oneDNN products of training and the packed ones of
decoding (``packed.py``), the cheaper dropout forms (``dropout.py``) and the branch tail's
own backward (``branched.py``). Each computes what the plain PyTorch operations compute, to
rounding; turned off, the model runs the plain operations only, so that a researcher can
debug or profile the math as written.

    from wtnmt.model.speed import plain_math
    with plain_math():
        loss = model(src, tgt_in).logits ...

or ``WTNMT_PLAIN_MATH=1`` in the environment for a whole process (a training run, a test).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

_fast = os.environ.get("WTNMT_PLAIN_MATH", "").strip().lower() not in ("1", "true", "yes")


def fast_paths() -> bool:
    """Whether the speed machinery is on (the default)."""
    return _fast


@contextmanager
def plain_math() -> Iterator[None]:
    """The plain PyTorch operations only, inside the block."""
    global _fast
    before, _fast = _fast, False
    try:
        yield
    finally:
        _fast = before


__all__ = ["fast_paths", "plain_math"]
