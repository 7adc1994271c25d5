"""Who multiplies the int8 PackedLinears (model/packed.py): PyTorch's
``quantized::linear_dynamic`` unless ``int8_multiplier`` names another kernel for the work
inside it; the native engine (decode/native) runs the model's own encoder so, on its int8.h
kernel and the same packed weights."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

from torch import Tensor

Int8Multiplier = Callable[[object, Tensor, object], Tensor]  # (linear, x, packed)
_int8_multiplier: contextvars.ContextVar[Int8Multiplier | None] = contextvars.ContextVar(
    "int8_multiplier", default=None
)


@contextlib.contextmanager
def int8_multiplier(multiply: Int8Multiplier | None) -> Iterator[None]:
    """Within it (in this thread), every int8 PackedLinear multiplies by ``multiply(linear,
    x [rows, in], packed)`` instead of ``quantized::linear_dynamic(x, packed)``: the native
    engine's own kernel, on the same packed int8 weights, in the encoder (decode/native)."""
    token = _int8_multiplier.set(multiply)
    try:
        yield
    finally:
        _int8_multiplier.reset(token)


def current() -> Int8Multiplier | None:
    """The multiplier in force here (None: the library's)."""
    return _int8_multiplier.get()


__all__ = ["Int8Multiplier", "current", "int8_multiplier"]
