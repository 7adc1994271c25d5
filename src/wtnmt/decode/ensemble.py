"""Ensembles: several models decoding together (fairseq's ``--path a.pt:b.pt``, Marian's
``--models``), each step's next-token distribution the weighted mean of the models'
probabilities, log P(y_t) = log Σ_m w_m P_m(y_t | y_<t, x) with Σ w_m = 1 (fairseq's
combination; equal weights unless given). The models share the vocabularies; a Weighted
Transformer and a Transformer mix freely. Search is decode/search.py's, over the ``stepper``
an ensemble makes (each model's key/value cache kept and reordered with the hypotheses), or
the native engine's (decode/native/engine.cpp: a decoder a model, the same combination).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from wtnmt.decode.search import _Stepper


class Ensemble:
    """``models`` (PyTorch, eval mode) searched as one; ``weights``: one a model, positive
    (normalised to sum to 1; None: equal)."""

    runs_on_torch = True  # (its steps are PyTorch's: the search keeps its threads)
    engine = "pytorch"
    is_ensemble = True  # (decodes in this process, never on workers; as NativeEngine's)

    def __init__(self, models: Sequence[torch.nn.Module], weights: Sequence[float] | None = None):
        if len(models) < 2:
            raise ValueError(f"an ensemble has at least 2 models, not {len(models)}")
        sizes = {int(m.embedding.weight.size(0)) for m in models}  # type: ignore[union-attr]
        if len(sizes) != 1:
            raise ValueError(f"the ensemble's models have target vocabularies of {sorted(sizes)}")
        given = [1.0] * len(models) if weights is None else list(weights)
        if len(given) != len(models):
            raise ValueError(f"{len(given)} ensemble weights for {len(models)} models")
        if not all(math.isfinite(w) and w > 0 for w in given):
            raise ValueError(f"ensemble weights {given}: each must be above 0")
        total = sum(given)
        self.models = list(models)
        self.weights = [w / total for w in given]
        self.log_weights = torch.tensor([math.log(w) for w in self.weights])
        self.max_positions = min(int(m.max_positions) for m in models)  # type: ignore[misc]
        self.pad_id = models[0].pad_id  # type: ignore[union-attr]

    @property
    def quantize(self) -> str:
        from wtnmt.model import decoding_mode

        return decoding_mode(self.models[0])  # type: ignore[no-any-return]

    def stepper(self, src: Tensor, *, steps: int, group: int) -> _EnsembleStepper:
        steppers = [_Stepper(m, src, True, steps=steps, group=group) for m in self.models]
        return _EnsembleStepper(steppers, self.log_weights.to(src.device))


def parse_weights(text: str | None, models: int) -> list[float] | None:
    """``--ensemble-weights W,W,…`` for ``models`` models (None: equal); a ValueError naming
    what is allowed."""
    if text is None:
        return None
    try:
        weights = [float(w) for w in text.split(",")]
    except ValueError:
        weights = []
    if len(weights) != models or not all(0 < w < math.inf for w in weights):
        raise ValueError(f"--ensemble-weights {text}: {models} numbers above 0, RUN's first")
    return weights


def ensemble_arguments(
    ensemble: Sequence[str] | None, weights: str | None, engine: str
) -> tuple[str, list[float] | None]:
    """--ensemble, --ensemble-weights and --engine of a command, checked together: the
    engine (an ensemble decodes on the PyTorch and native engines) and the weights; a
    ValueError naming the option otherwise."""
    if not ensemble:
        if weights is not None:
            raise ValueError("--ensemble-weights weighs an --ensemble's models: add --ensemble")
        return engine, None
    if engine not in ("auto", "pytorch", "native"):
        raise ValueError(f"--ensemble decodes on --engine native or pytorch, not {engine}")
    return engine, parse_weights(weights, 1 + len(ensemble))


def join_runs(  # type: ignore[no-untyped-def]
    translator,
    runs: Sequence[str | Path],
    weights: Sequence[float] | None = None,
    weights_file: str = "model.safetensors",
) -> Ensemble:
    """``translator``'s model and those of ``runs`` as one ``Ensemble`` (for the PyTorch
    engine's search, or the native engine's over them all); a ValueError (one line) where a
    run's vocabularies are not the translator's, or its engine is ONNX Runtime."""
    from wtnmt.data.vocab import vocabulary_sha256
    from wtnmt.model import quantize_decoding
    from wtnmt.rundir import load_run

    if translator.engine not in ("pytorch", "native"):
        raise ValueError(
            f"ensembles decode on the PyTorch and native engines, not {translator.engine}: load "
            f"with engine='native' or 'pytorch' (--engine native, pytorch)"
        )
    ours = [vocabulary_sha256(v.path) for v in (translator.vocab.source, translator.vocab.target)]
    models = [translator.model]
    for run in runs:
        _, vocab, model = load_run(run, weights=weights_file)
        theirs = [vocabulary_sha256(v.path) for v in (vocab.source, vocab.target)]
        for side, a, b in zip(("source", "target"), ours, theirs, strict=True):
            if a != b:
                raise ValueError(
                    f"{run}: its {side} vocabulary is not the first run's (an ensemble's models "
                    f"share their vocabularies)"
                )
        quantize_decoding(model, translator.quantize)
        models.append(model.to(translator.device).eval())
    return Ensemble(models, weights)


class _EnsembleStepper:
    def __init__(self, steppers: list[_Stepper], log_weights: Tensor) -> None:
        self.steppers, self.log_weights = steppers, log_weights

    def reorder(self, index: Tensor, sentences: Tensor | None) -> None:
        for stepper in self.steppers:
            stepper.reorder(index, sentences)

    def __call__(self, prefix: Tensor) -> Tensor:
        """prefix [N, t] → log Σ_m w_m P_m(next token) [N, V]."""
        each = torch.stack([stepper(prefix) for stepper in self.steppers])  # [M, N, V]
        return torch.logsumexp(each + self.log_weights[:, None, None], dim=0)


__all__ = ["Ensemble", "ensemble_arguments", "join_runs", "parse_weights"]
