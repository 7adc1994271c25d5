"""Which network a Translator's search runs: the PyTorch model itself, the native engine over
it (decode/native, C++), or its ONNX export in ONNX Runtime (decode/onnx_engine.py); and an
ensemble's models on the engine its translator runs (decode/ensemble.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch

ENGINES = ("auto", "pytorch", "native", "onnxruntime")  # what runs the search (Translator.load)


def chosen_engine(engine: str, device: str) -> tuple[str, bool]:
    """``engine`` checked against ``device``, ``auto`` resolved (native on the CPU, else
    PyTorch), and whether it was ``auto``; a ValueError naming what is allowed."""
    if engine not in ENGINES:
        raise ValueError(f"engine: {engine!r} is not one of {', '.join(map(repr, ENGINES))}")
    auto = engine == "auto"
    if auto:
        engine = "native" if device == "cpu" else "pytorch"
    if engine != "pytorch" and device != "cpu":
        raise ValueError(f"the {engine} engine decodes on the CPU, not {device}")
    return engine, auto


def native_network(model: torch.nn.Module, *, auto: bool, say: Callable[[str], None]):  # type: ignore[no-untyped-def]
    """The native engine over ``model``; where it cannot run, NativeUnavailable, or with
    ``auto`` the model itself (the PyTorch engine), ``say`` told why."""
    from wtnmt.decode.native import NativeUnavailable
    from wtnmt.decode.native.network import NativeEngine

    try:
        network = NativeEngine(model, say=say)
        network.check_usable()
        return network
    except NativeUnavailable as e:
        if not auto:
            raise
        why = str(e).removeprefix("--engine native: ")
        say(f"--engine auto: the native engine cannot run here ({why}): decoding with the "
            "PyTorch engine")  # fmt: skip
        return model


def ensemble_network(ensemble, network):  # type: ignore[no-untyped-def]
    """What searches ``ensemble`` where ``network`` searched one model: the native engine over
    every model (its fused kernels as ``network``'s), else the ensemble's own PyTorch steps."""
    if getattr(network, "engine", None) == "native":
        from wtnmt.decode.native.network import NativeEngine

        return NativeEngine(ensemble, fused=network.fused)
    return ensemble


__all__ = ["ENGINES", "chosen_engine", "ensemble_network", "native_network"]
