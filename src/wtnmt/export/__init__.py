"""A trained run in other engines' formats: ONNX graphs for ONNX Runtime (``onnx.py``, the
graphs themselves in ``graphs.py``), a CTranslate2 model of a Transformer (``ctranslate2.py``)
and a Hugging Face folder of a Transformer (``huggingface.py``, its card ``model_card.py``).
`wtnmt export FORMAT RUN`."""

from __future__ import annotations

import sys
from pathlib import Path


def export(
    fmt: str,
    run: str | Path,
    out: str | Path | None,
    *,
    weights: str = "model.safetensors",
    quantize: str = "none",
    force: bool = False,
) -> Path:
    """`wtnmt export`'s body: export ``run`` in format ``fmt`` (onnx, ctranslate2 or hf)."""
    from wtnmt.errors import CheckpointError

    if fmt == "hf":
        from wtnmt.export.huggingface import export_hf

        if out is None:
            raise CheckpointError("export hf: give --out DIR (a new directory)")
        if quantize != "none":
            raise CheckpointError("export hf: --quantize int8 is not a Hugging Face format")
        return export_hf(run, out, weights=weights)
    if fmt == "ctranslate2":
        from wtnmt.export.ctranslate2 import export_ctranslate2

        if out is None:
            raise CheckpointError("export ctranslate2: give --out DIR (a new directory)")
        return export_ctranslate2(run, out, weights=weights, quantize=quantize)
    from wtnmt.export.onnx import export_onnx

    return export_onnx(
        run,
        out,
        weights=weights,
        quantize=quantize,  # type: ignore[arg-type]
        force=force,
        # the stderr of now: the exporter's own chatter is hidden by redirecting sys.stderr
        say=lambda message, err=sys.stderr: print(message, file=err, flush=True),
    )


__all__ = ["export"]
