"""Checkpoint averaging (as fairseq's ``average_checkpoints``): the element-wise mean of the
weights of a run's last N checkpoints, written as a new run directory that every command
decodes with (config.yaml and spm.model copied, model.safetensors the mean).

The mean of κ (or α) vectors on the simplex is on the simplex: averaging keeps a Weighted
Transformer's branch weights valid.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save

from wtnmt.config import ConfigError, TrainConfig, load_config
from wtnmt.data.vocab import holds_joint, vocabulary_files
from wtnmt.errors import CheckpointError
from wtnmt.rundir.checkpoints import list_checkpoints, load_state
from wtnmt.rundir.files import atomic_write, read_weights, recorded_vocabulary, weights_metadata
from wtnmt.rundir.run import copy_vocabularies


def average_weights(paths: list[Path]) -> dict[str, torch.Tensor]:
    """The mean of every tensor over the weight files (summed in float64, then cast back)."""
    if not paths:
        raise CheckpointError("nothing to average: no weight files given")
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for path in paths:
        tensors = read_weights(path)
        if total and set(tensors) != set(total):
            raise CheckpointError(f"{path}: its tensors are not those of {paths[0]}")
        for name, tensor in tensors.items():
            if name in total and tensor.shape != total[name].shape:
                raise CheckpointError(f"{path}: {name} has another shape than in {paths[0]}")
            dtypes[name] = tensor.dtype
            if tensor.is_floating_point():
                total[name] = total.get(name, 0) + tensor.to(torch.float64)
            else:  # integer buffers (none in wtnmt models today): the last one's
                total[name] = tensor
    return {
        name: (t / len(paths)).to(dtypes[name]) if t.is_floating_point() else t
        for name, t in total.items()
    }


def _kept_by_the_run(run_dir: Path, states: list[Path]) -> int:
    """``--last``'s default: the checkpoints the run keeps (its train.keep_checkpoints), or
    as many as it saved where that is fewer (a short run)."""
    keep = TrainConfig.keep_checkpoints
    try:
        keep = load_config(run_dir / "config.yaml").train.keep_checkpoints
    except ConfigError:
        pass  # a missing or damaged config.yaml is said once the checkpoints are read
    if not states:
        raise CheckpointError(f"{run_dir}: no checkpoints there to average")
    return min(keep, len(states))


def _last_checkpoints(run_dir: Path, last: int | None) -> list[Path]:
    """The weight files of the last ``last`` checkpoints of ``run_dir`` (None: as many as
    the run keeps), each checked."""
    states = list_checkpoints(run_dir / "checkpoints")
    if last is None:
        last = _kept_by_the_run(run_dir, states)
    if last < 1:
        raise CheckpointError(f"--last {last}: average at least 1 checkpoint")
    if len(states) < last:
        raise CheckpointError(
            f"{run_dir}: {len(states)} checkpoint{'s' * (len(states) != 1)} there, fewer than "
            f"--last {last} (train.keep_checkpoints sets how many a run keeps)"
        )
    chosen = states[-last:]
    for state in chosen:
        load_state(state)  # complete and matching its weights, or a CheckpointError
    return [s.with_name(s.name.replace(".state.pt", ".safetensors")) for s in chosen]


def _weights_file(tensors: dict[str, torch.Tensor], weights: list[Path]) -> bytes:
    """The mean's file, bound to the vocabularies its checkpoints were trained with."""
    return save(tensors, metadata=weights_metadata(tensors, recorded_vocabulary(weights[-1])))


def average_run(run_dir: str | Path, out: str | Path, *, last: int | None = None) -> dict[str, Any]:
    """Average the last ``last`` checkpoints of ``run_dir`` (None: as many as the run keeps)
    into the new run directory ``out`` (which must not exist, or be empty). Returns what was
    averaged."""
    run_dir, out = Path(run_dir), Path(out)
    weights = _last_checkpoints(run_dir, last)
    if not (run_dir / "config.yaml").is_file():
        raise CheckpointError(f"{run_dir}: no config.yaml there; is it a wtnmt run directory?")
    if not (run_dir / vocabulary_files(holds_joint(run_dir))[-1]).is_file():
        raise CheckpointError(f"{run_dir}: no vocabulary (spm.model) there")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"--out {out}: exists and is not empty; give a new directory")
    tensors = average_weights(weights)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "config.yaml", (run_dir / "config.yaml").read_bytes())
    copy_vocabularies(run_dir, out)
    atomic_write(out / "model.safetensors", _weights_file(tensors, weights))
    record = {"run": str(run_dir), "checkpoints": [w.name for w in weights]}
    atomic_write(out / "averaged.json", (json.dumps(record, indent=2) + "\n").encode())
    return record


def average_within(run_dir: str | Path, *, last: int) -> dict[str, Any]:
    """Average the last ``last`` checkpoints of ``run_dir`` into a weight file of the run
    itself, ``average-last<N>.safetensors`` (what `wtnmt experiment` scores when its grid
    asks for ``evaluate.average``). Returns the file's name and the checkpoints averaged."""
    run_dir = Path(run_dir)
    weights = _last_checkpoints(run_dir, last)
    name = f"average-last{last}.safetensors"
    atomic_write(run_dir / name, _weights_file(average_weights(weights), weights))
    return {"weights": name, "checkpoints": [w.name for w in weights]}


__all__ = ["average_run", "average_weights", "average_within"]
