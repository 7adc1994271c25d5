"""One run as `wtnmt analyze` sees it: its directory, metrics, scores, config and how its
training ended; and the names runs analyzed together go by."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from wtnmt.analysis.metrics import RunMetrics, group_name
from wtnmt.runtime import MACHINES


@dataclass(frozen=True)
class Run:
    """One run as analyze sees it: its directory, series, scores and config."""

    path: Path
    metrics: RunMetrics
    scores: dict[str, Any] | None
    config: dict[str, Any]
    label: str = ""  # the run's name among those analyzed together (default: its directory's)
    stop: str | None = None  # why its training ended (stop_reason), None where not recorded
    machines: tuple[str, ...] = ()  # what its training ran on, in order; () where not recorded

    @property
    def name(self) -> str:
        return self.label or self.path.name

    @property
    def slug(self) -> str:
        """The name as part of a file name (``a/weighted-s1`` → ``a_weighted-s1``)."""
        return self.name.replace("/", "_")

    @property
    def group(self) -> str:
        return group_name(self.name)

    @property
    def weighted(self) -> bool:
        return self.config.get("model", {}).get("attention") == "branched"

    @property
    def steps(self) -> int:
        return self.metrics.train[-1]["step"] if self.metrics.train else 0

    @property
    def seconds(self) -> float:
        return self.metrics.train[-1].get("elapsed", 0.0) if self.metrics.train else 0.0

    @property
    def ms_per_step(self) -> float | None:
        """Milliseconds of updates per step: the cost of a step on this run's machine."""
        return round(1000 * self.seconds / self.steps) if self.steps else None

    def test(self, key: str) -> float | None:
        split = (self.scores or {}).get("test")
        return None if split is None else split.get(key)

    @property
    def precision(self) -> str:
        """``train.precision`` as the run's config states it (``auto``: bf16 where the
        hardware had it natively)."""
        return str(self.config.get("train", {}).get("precision", "fp32"))

    @property
    def stopped_by(self) -> str | None:
        """What ended the training, shortly: ``patience``, or the bound reached
        (``max_steps``, ``max_time``, ``max_epochs``); None where not recorded."""
        if self.stop is None:
            return None
        if self.stop.endswith("(patience)"):
            return "patience"
        return self.stop.split("=", 1)[0] if self.stop.startswith("max_") else self.stop

    @property
    def budget(self) -> str:
        train = self.config.get("train", {})
        if train.get("max_time"):
            return f"{train['max_time']:g} s"
        if train.get("max_steps"):
            return f"{train['max_steps']} steps"
        return f"{train.get('max_epochs')} epochs"

    @classmethod
    def load(cls, path: str | Path) -> Run:
        import yaml

        path = Path(path)
        scores_path = path / "scores.json"
        scores = (
            json.loads(scores_path.read_text(encoding="utf-8")) if scores_path.is_file() else None
        )
        config = yaml.safe_load((path / "config.yaml").read_text(encoding="utf-8"))
        return cls(
            path,
            RunMetrics.load(path),
            scores,
            config or {},
            stop=stop_reason(path),
            machines=machines_of(path),
        )


def machines_of(run_dir: Path) -> tuple[str, ...]:
    """The machines a run's training ran on (its ``machines.jsonl``), each once, in order; ()
    where the run did not record them (a run trained before they were)."""
    found: dict[str, None] = {}
    path = run_dir / MACHINES
    lines = (
        path.read_text(encoding="utf-8", errors="replace").splitlines() if path.is_file() else []
    )
    for line in lines:
        try:
            machine = json.loads(line).get("machine")
        except (ValueError, AttributeError):
            continue  # a line cut short by a kill
        if isinstance(machine, str):
            found[machine] = None
    return tuple(found)


def stop_reason(run_dir: Path) -> str | None:
    """Why a run's training ended: its ``finished.json`` (a grid's run, committed with its
    results) or the last ``stopped:`` line of its ``train.log``; None where neither says, or
    where the log has resumed or been interrupted since (a run going on, or paused)."""
    marker = run_dir / "finished.json"
    if marker.is_file():
        try:
            reason = json.loads(marker.read_text(encoding="utf-8")).get("finished")
        except (ValueError, AttributeError):
            reason = None
        if isinstance(reason, str):
            return reason
    log = run_dir / "train.log"
    if not log.is_file():
        return None
    for line in reversed(log.read_text(encoding="utf-8", errors="replace").splitlines()):
        if "] stopped: " in line:
            return line.split("] stopped: ", 1)[1]
        if "] resumed from " in line or "] interrupted at step " in line:
            return None
    return None


def with_unique_names(runs: list[Run]) -> list[Run]:
    """The runs named by as many trailing parts of their paths as it takes to tell them
    apart (``A/weighted`` and ``B/weighted``, not two seeds of one ``weighted``); each run's
    metrics carry the same name, for the figures' legends."""
    import dataclasses

    depth, names = 1, [r.path.name for r in runs]
    most = max((len(r.path.parts) for r in runs), default=1)
    while len(set(names)) < len(names) and depth < most:
        depth += 1
        names = ["/".join(r.path.parts[-depth:]) for r in runs]
    if len(set(names)) < len(names):  # the same directory given twice
        twice = sorted({n for n in names if names.count(n) > 1})[0]
        from wtnmt.config import ConfigError

        raise ConfigError(f"{twice}: given twice; analyze each run once")
    return [
        dataclasses.replace(r, label=n, metrics=dataclasses.replace(r.metrics, name=n))
        for r, n in zip(runs, names, strict=True)
    ]


__all__ = ["Run", "stop_reason", "with_unique_names"]
