"""What is left to do with each run of a grid, read from its run directory:

- no complete checkpoint: train it (a directory where a run died before its first checkpoint
  starts over, as ``wtnmt train`` allows);
- a checkpoint of a run that has not finished, or finished on another budget or patience
  rule than the grid now asks: resume it (a run the rule asked says is done stops at once);
- finished: only the scores, if they are missing.

A run directory trained with other settings than the grid asks (anything but the budget) is
refused, naming the settings: the grid never trains over someone else's run. A run trained
in a work directory (``--work-dir``) copies its small results to where the grid puts it; what
is there must be an earlier copy of the same run's, and where the work directory is gone, a
finished run's copy says it is done.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from wtnmt.config import ConfigError, config_to_dict
from wtnmt.experiment.grid import Grid, RunSpec
from wtnmt.experiment.progress import last_step
from wtnmt.rundir import RunDirectory, latest_checkpoint
from wtnmt.rundir.run import MARK, config_differences, with_defaults


@dataclass(frozen=True)
class Task:
    spec: RunSpec
    train: bool
    resume: bool
    evaluate: bool
    busy: bool = False
    step: int | None = None  # the step it resumes from, or the last another process logged

    @property
    def what(self) -> str:
        if self.busy:
            return "busy: another process is training it"
        if self.train:
            return "resume" if self.resume else "train"
        return "score"

    @property
    def said(self) -> str:
        """``what``, with where the run stands: a grid that spans sessions says it."""
        if self.step is None:
            return self.what
        return f"{self.what} ({'at' if self.busy else 'from'} step {self.step:,})"


def _recorded_config(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    data = path.read_bytes()
    if not data.startswith(MARK):
        raise ConfigError(f"{path}: not written by wtnmt; the grid will not train over it")
    return yaml.safe_load(data[len(MARK) :].decode("utf-8"))


FINISHED = "finished.json"  # written when a run has finished: committed, unlike the weights
# when a run ends: a run finished on another budget, or under another stopping rule, goes on
# from its last checkpoint (and stops at once where the rule asked now says it is done)
BUDGET = ("max_time", "max_steps", "max_epochs", "patience", "patience_on")


def plan_task(spec: RunSpec, grid: Grid, *, record: bool = False) -> Task | None:
    """What is left to do with one run (None: nothing; a busy task when another process is
    training it now: two writers would spoil it, so it is left to that one).

    A finished run is known by its last checkpoint, or, where the weights are not there (a
    clone of committed results), by its ``finished.json``; ``record`` writes that file for a
    finished run that lacks it.
    """
    if spec.run_dir.exists() and not spec.run_dir.is_dir():
        raise ConfigError(
            f"{spec.run_dir}: is a file, not a run directory; move it or rename the run"
        )
    asked = config_to_dict(spec.config())
    if spec.results_dir is not None:
        _check_results_dir(spec, asked)
        if not spec.run_dir.exists() and (spec.results_dir / FINISHED).is_file():
            # finished, and its work directory is gone: its results say what is left
            spec = dataclasses.replace(spec, run_dir=spec.results_dir, results_dir=None)
    if RunDirectory(spec.run_dir).busy():
        at = last_step(spec.run_dir)
        step = None if at is None else at[0]
        return Task(spec, train=False, resume=False, evaluate=False, busy=True, step=step)
    evaluate = grid.evaluate is not None
    found = latest_checkpoint(spec.run_dir / "checkpoints", warn=lambda _: None)
    marker = spec.run_dir / FINISHED
    if found is None and not marker.is_file():
        return Task(spec, train=True, resume=False, evaluate=evaluate)
    recorded = with_defaults(_recorded_config(spec.run_dir) or {})
    differences = run_differences(recorded, asked)
    if differences:
        raise ConfigError(
            f"{spec.run_dir}: trained with other settings than {grid.path} asks "
            f"({'; '.join(differences)}); rename the run in the grid or move the directory"
        )
    same_budget = all(recorded.get("train", {}).get(k) == asked["train"][k] for k in BUDGET)
    if found is None:  # finished, and only its small results are here
        if not same_budget:
            raise ConfigError(
                f"{spec.run_dir}: finished on another budget or stopping rule, and its "
                f"checkpoints are not here "
                f"to continue from; restore them, or rename the run in the grid"
            )
        if evaluate and not scored(spec.run_dir, grid.evaluate or {}):
            raise ConfigError(
                f"{spec.run_dir}: finished but not scored, and its weights are not here"
            )
        return None
    state = found[1]["train_state"]
    if state.get("finished") is None or not same_budget:
        return Task(spec, train=True, resume=True, evaluate=evaluate, step=int(state["step"]))
    if record and not marker.is_file():
        write_finished(spec.run_dir, state)
    if evaluate and not scored(spec.run_dir, grid.evaluate or {}):
        return Task(spec, train=False, resume=False, evaluate=True)
    return None


def _check_results_dir(spec: RunSpec, asked: dict[str, Any]) -> None:
    """Where a run trained in a work directory copies its results must hold nothing but an
    earlier copy of the same run's: not a run trained there, not another run's results."""
    results = spec.results_dir
    assert results is not None
    if results.exists() and not results.is_dir():
        raise ConfigError(f"{results}: is a file, not a run directory; move it or rename the run")
    if latest_checkpoint(results / "checkpoints", warn=lambda _: None) is not None:
        raise ConfigError(
            f"{results}: holds the checkpoints of a run trained there; go on with it "
            f"without --work-dir, or move them away"
        )
    recorded = _recorded_config(results)
    differences = [] if recorded is None else run_differences(with_defaults(recorded), asked)
    if differences:
        raise ConfigError(
            f"{results}: holds the results of a run with other settings than "
            f"{spec.name} of the grid ({'; '.join(differences)}); rename the run in the grid "
            f"or move the directory"
        )


def write_finished(run_dir: Path, state: dict[str, Any]) -> None:
    from wtnmt.rundir import atomic_write

    fields = {k: state[k] for k in ("finished", "step", "epoch", "elapsed")}
    atomic_write(run_dir / FINISHED, (json.dumps(fields, indent=2) + "\n").encode())


def run_differences(recorded: dict[str, Any], asked: dict[str, Any]) -> list[str]:
    """The settings a recorded run differs in from the run asked (its budget and thread count
    aside): where there are none, the run asked goes on from the recorded one."""
    return config_differences(recorded, asked) + _train_differences(recorded, asked)


def _train_differences(recorded: dict[str, Any], asked: dict[str, Any]) -> list[str]:
    """Training settings (config_differences compares model and data) other than the budget
    and the thread count (which change no result)."""
    skip = {*BUDGET, "threads"}
    before, after = recorded.get("train", {}), asked["train"]
    return [
        f"train.{k}: {before.get(k)!r} → {after[k]!r}"
        for k in after
        if k not in skip and before.get(k) != after[k]
    ]


def scored(run_dir: Path, evaluate: dict[str, Any]) -> bool:
    path = run_dir / "scores.json"
    if not path.is_file():
        return False
    try:
        scores = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return False
    split = evaluate.get("split", "test")
    if not isinstance(scores, dict) or not isinstance(scores.get(split), dict):
        return False
    kept = scores[split]
    return kept.get("beam") == evaluate.get("beam", kept.get("beam")) and kept.get(
        "average"
    ) == evaluate.get("average")


__all__ = [
    "BUDGET",
    "FINISHED",
    "Task",
    "plan_task",
    "run_differences",
    "scored",
    "write_finished",
]
