"""The runner's line of the running runs: each run's step, its cap, and the time it has left."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from wtnmt.experiment.grid import RunSpec


@dataclass(frozen=True)
class Budget:
    """What bounds a run, for the time it has left: its step cap or its seconds, and whether
    patience may stop it sooner."""

    max_steps: int | None
    max_time: float | None
    patience: bool

    @classmethod
    def of(cls, spec: RunSpec) -> Budget:
        train = spec.config().train
        return cls(train.max_steps, train.max_time, train.patience is not None)


def last_step(run_dir: Path) -> tuple[int, float] | None:
    """The run's last logged step and its seconds of updates."""
    return curve_end(run_dir / "metrics.jsonl")


def curve_end(metrics: Path) -> tuple[int, float] | None:
    """The last step a curve (a run's ``metrics.jsonl``, or a copy of it) logged with its
    seconds of updates, a training entry's or a validation's (the last where a run stopped
    after a validation, between two training entries); a line cut off while being written is
    passed over. None where it logged none or cannot be read (``.gz`` read where only that is
    kept, ``wtnmt.stored``)."""
    from wtnmt import stored

    try:
        if metrics.is_file():
            with open(metrics, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
                lines = f.read().decode("utf-8", "replace").splitlines()
        else:
            lines = stored.read_bytes(metrics)[-4096:].decode("utf-8", "replace").splitlines()
    except (OSError, EOFError):
        return None
    for line in reversed(lines):
        try:
            entry = json.loads(line)
            return int(entry["step"]), float(entry["elapsed"])
        except (ValueError, KeyError, TypeError):
            continue
    return None


def _time_left(seconds: float, *, patience: bool) -> str:
    minutes = round(seconds / 60)
    if minutes < 1:
        return "under a minute left"
    span = f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"
    return f"{'at most' if patience else 'about'} {span} left"


Sightings = dict[str, tuple[float, int, float, int]]


def progress_line(spec: RunSpec, budget: Budget, seen: Sightings, now: float) -> str:
    """``name step N/CAP (S s, about T left)``: T from the pace between the runner's first
    sighting of the run's step and its sighting of the latest new one (wall time: validations
    and checkpoints count), less the time since; or from a time budget. "at most" where
    patience may stop the run sooner. ``seen`` keeps each run's (first time, first step,
    latest time, latest step)."""
    last = last_step(spec.run_dir)
    if last is None:
        return f"{spec.name} starting"
    step, elapsed = last
    since, first, at, latest = seen.setdefault(spec.name, (now, step, now, step))
    if step != latest:
        at, latest = now, step
        seen[spec.name] = (since, first, at, latest)
    cap = f"/{budget.max_steps}" if budget.max_steps else ""
    left = None
    if budget.max_steps and latest > first:
        pace = (at - since) / (latest - first)
        left = max(0.0, pace * max(0, budget.max_steps - step) - (now - at))
    elif budget.max_time:
        left = max(0.0, budget.max_time - elapsed)
    eta = "" if left is None else f", {_time_left(left, patience=budget.patience)}"
    return f"{spec.name} step {step}{cap} ({elapsed:.0f} s{eta})"


__all__ = ["Budget", "Sightings", "curve_end", "last_step", "progress_line"]
