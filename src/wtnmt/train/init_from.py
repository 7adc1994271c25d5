"""`train.init_from`: a fine-tune's first weights, taken from a trained run.

Weights only (fairseq's ``--restore-file … --reset-optimizer --reset-lr-scheduler
--reset-dataloader``, Marian's ``--pretrained-model``): the optimizer, the schedule, the step
count and patience start afresh. The data is encoded with the run's own vocabulary
(``data.vocab_from``, which ``train.init_from`` sets where it is null), and the weights are
refused in one line where the vocabularies or the shapes differ, naming what differs. What the
run started from is kept in its ``init_from.json``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from wtnmt.config import ConfigError, config_to_dict, load_config
from wtnmt.config.sections import init_run
from wtnmt.data.io import DataError
from wtnmt.data.vocab import holds_joint, vocabularies_sha256, vocabulary_files
from wtnmt.errors import CheckpointError, TrainingError
from wtnmt.rundir.files import read_weights, recorded_vocabulary, tensors_sha256
from wtnmt.rundir.run import missing_weights
from wtnmt.safe_files import atomic_write

RECORD = "init_from.json"


def weights_file(init_from: str) -> Path:
    """The weights ``train.init_from`` names: a ``.safetensors`` file, or a run's
    ``model.safetensors``."""
    path = Path(init_from)
    key = f"train.init_from={init_from!r}"
    if path.suffix == ".safetensors":
        if not path.is_file():
            raise TrainingError(f"{key}: no such weights file")
        return path
    if not path.is_dir():
        raise TrainingError(f"{key}: no such run directory (or .safetensors file)")
    if not (path / "model.safetensors").is_file():
        raise TrainingError(f"{key}: {missing_weights(path, 'model.safetensors')}")
    return path / "model.safetensors"


def _model_differences(run: Path, config: Any) -> list[str]:
    """The ``model.*`` settings in which ``run``'s config.yaml differs from ``config``'s."""
    try:
        theirs = config_to_dict(load_config(run / "config.yaml").model)
    except (ConfigError, OSError):
        return []
    ours = config_to_dict(config.model)
    return [
        f"model.{k} ({theirs.get(k)!r} there, {ours.get(k)!r} here)"
        for k in sorted(set(theirs) | set(ours))
        if theirs.get(k) != ours.get(k)
    ]


def _shape_differences(tensors: dict[str, torch.Tensor], model: nn.Module) -> list[str]:
    own = model.state_dict()
    found = [f"{k} (missing there)" for k in own if k not in tensors]
    found += [f"{k} (not in this model)" for k in tensors if k not in own]
    found += [
        f"{k} ({'×'.join(map(str, tensors[k].shape))} there, "
        f"{'×'.join(map(str, own[k].shape))} here)"
        for k in own
        if k in tensors and tensors[k].shape != own[k].shape
    ]
    return found


def initial_weights(
    config: Any,
    model: nn.Module,
    vocabulary: str | None,
    run_dir: Path,
    *,
    log: Callable[[str], None],
    write: bool,
) -> dict[str, torch.Tensor]:
    """The weights ``config.train.init_from`` names, checked to fit ``model`` and the
    vocabularies of hash ``vocabulary`` (None: pre-tokenised data, unchecked); ``write``: keep
    the record in ``run_dir``."""
    init_from = config.train.init_from
    key = f"train.init_from={init_from!r}"
    path = weights_file(init_from)
    run = Path(init_run(init_from))
    try:
        tensors = read_weights(path)
        trained_on = recorded_vocabulary(path)
        if trained_on is None and (run / vocabulary_files(holds_joint(run))[0]).is_file():
            trained_on = vocabularies_sha256(run, holds_joint(run))  # weights from before it
    except (CheckpointError, DataError) as e:
        raise TrainingError(f"{key}: {e}") from None
    if vocabulary is not None and trained_on is not None and trained_on != vocabulary:
        raise TrainingError(
            f"{key}: its weights were trained with other vocabularies than this run's data "
            f"(data.vocab_from={config.data.vocab_from!r}; vocabulary hash {trained_on[:12]} "
            f"there, {vocabulary[:12]} here): leave data.vocab_from unset, or name {run}"
        )
    shapes = _shape_differences(tensors, model)
    if shapes:
        settings = _model_differences(run, config)
        said = "; ".join(shapes[:3]) + ("; …" if len(shapes) > 3 else "")
        why = f"; the model settings differ: {', '.join(settings)}" if settings else ""
        raise TrainingError(
            f"{key}: its weights do not fit this model ({said}){why}: give the model section "
            f"of {run / 'config.yaml'}"
        )
    record = {
        "init_from": init_from,
        "weights": str(path.resolve()),
        "weights_sha256": tensors_sha256(tensors),
        "vocabulary_sha256": trained_on,
        "reset": ["optimizer", "schedule", "step", "patience", "best"],
    }
    if write:
        atomic_write(run_dir / RECORD, (json.dumps(record, indent=2) + "\n").encode())
    log(
        f"fine-tuning from {path} (train.init_from): its weights, with a fresh optimizer, "
        f"schedule and step count"
    )
    return tensors
