"""Checkpoints: weights in safetensors, training state in a file read with weights_only=True.

A checkpoint ``step_000123`` is two files in ``checkpoints/``: ``step_000123.safetensors``
and ``step_000123.state.pt``. Each is written to a temporary file in the same directory,
fsynced, then moved into place with ``os.replace``; the state is written last and records the
weights' sha256, so a checkpoint is complete exactly when its state file loads and matches.
A run killed in the middle of writing leaves at most a temporary file, which is ignored.
"""

from __future__ import annotations

import hashlib
import io
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from wtnmt.errors import CheckpointError
from wtnmt.rundir.files import atomic_write, save_weights


def save_checkpoint(directory: Path, step: int, model: nn.Module, state: dict[str, Any]) -> Path:
    stem = directory / f"step_{step:07d}"
    vocabulary = state.get("vocabulary_sha256")
    digest = save_weights(model, stem.with_suffix(".safetensors"), vocabulary=vocabulary)
    buffer = io.BytesIO()
    torch.save({**state, "weights_sha256": digest, "step": step}, buffer)
    atomic_write(stem.with_suffix(".state.pt"), buffer.getvalue())
    return stem


def load_state(path: Path) -> dict[str, Any]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(
            f"{path}: not a checkpoint state file ({type(e).__name__}: {str(e)[:200]})"
        ) from None
    if not isinstance(state, dict) or "weights_sha256" not in state or "step" not in state:
        raise CheckpointError(f"{path}: not a wtnmt checkpoint state file")
    weights = path.with_name(path.name.replace(".state.pt", ".safetensors"))
    if not weights.is_file():
        raise CheckpointError(f"{path}: its weights file {weights.name} is missing")
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    if digest != state["weights_sha256"]:
        raise CheckpointError(f"{weights}: does not match its state file (sha256 differs)")
    return state


_STEP = re.compile(r"step_(\d+)\.state\.pt$")


def _numbered(directory: Path) -> list[tuple[int, Path]]:
    """(step, state file) of each checkpoint in ``directory``, oldest first."""
    if not directory.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in directory.iterdir() if (m := _STEP.search(p.name)))


def list_checkpoints(directory: Path) -> list[Path]:
    """State files in ``directory``, oldest first."""
    return [p for _, p in _numbered(directory)]


def latest_checkpoint(directory: Path, warn=print) -> tuple[Path, dict[str, Any]] | None:  # type: ignore[no-untyped-def]
    """The newest complete checkpoint; damaged newer ones are reported and skipped."""
    for path in reversed(list_checkpoints(directory)):
        try:
            return path, load_state(path)
        except CheckpointError as e:
            warn(f"skipping a damaged checkpoint: {e}")
    return None


def prune_checkpoints(
    directory: Path,
    keep: int,
    protect: set[Path] = frozenset(),  # type: ignore[assignment]
    every: int | None = None,
) -> None:
    """Keep the newest ``keep`` checkpoints saved on the run's cadence (every ``every`` steps;
    None: every checkpoint counts), the newest checkpoint whatever its step, and any in
    ``protect``. One off the cadence (saved where the run was interrupted, or ended) is kept
    only while it is the newest: it neither pushes a checkpoint of the cadence out nor stays
    once the run has gone on, so that a run stopped and resumed keeps the checkpoints of the
    run never stopped, and its last N average as that run's."""
    numbered = _numbered(directory)
    if not numbered:
        return
    cadence = [p for step, p in numbered if every is None or step % every == 0]
    kept = {*cadence[max(len(cadence) - keep, 0) :], numbered[-1][1], *protect}
    for _, path in numbered:
        if path in kept:
            continue
        path.unlink(missing_ok=True)
        path.with_name(path.name.replace(".state.pt", ".safetensors")).unlink(missing_ok=True)
