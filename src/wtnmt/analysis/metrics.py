"""Reading what runs recorded: ``metrics.jsonl`` as training and validation series, and the
measures drawn from them (smoothing, steps and seconds to a dev BLEU, mean ± sd over seeds)."""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The entries of a metrics.jsonl in step order, as the run that survived wrote them.

    A run killed after its last checkpoint and resumed logs the lost steps again: when a
    series goes back in step, the entries of the lost continuation are dropped. Read from
    ``metrics.jsonl.gz`` where only that is kept (``wtnmt.stored``).
    """
    from wtnmt import stored

    kept: list[dict[str, Any]] = []
    last: dict[str, int] = {}  # the last step of each series
    with stored.open_lines(path) as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            entry = _entry(raw)
            if entry is None:  # a line cut by a full disk or a kill, or not ours
                print(
                    f"wtnmt: warning: {path}:{number}: not a metrics entry; skipped",
                    file=sys.stderr,
                )
                continue
            kind = _kind(entry)
            if entry["step"] <= last.get(kind, -1):  # a resume: cut the lost continuation
                first = next(
                    i for i, e in enumerate(kept) if _kind(e) == kind and e["step"] >= entry["step"]
                )
                del kept[first:]
                last = {}
                for e in kept:
                    last[_kind(e)] = e["step"]
            kept.append(entry)
            last[kind] = entry["step"]
    return kept


_NUMBERS = ("loss", "nll", "elapsed", "tokens_per_s", "valid_loss", "valid_nll", "valid_bleu")


def _entry(raw: bytes) -> dict[str, Any] | None:
    """One line of metrics.jsonl as an entry: an object with an integer step ≥ 0 and numbers
    where numbers belong; None for anything else."""
    try:
        entry = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(entry, dict):
        return None
    step = entry.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return None
    for key in _NUMBERS:
        value = entry.get(key)
        if key in entry and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return None
    return entry


def _kind(entry: dict[str, Any]) -> str:
    return "valid" if "valid_loss" in entry else "train"


@dataclass(frozen=True)
class RunMetrics:
    """One run's series: ``train`` (logged steps) and ``valid`` (validations)."""

    name: str
    train: list[dict[str, Any]]
    valid: list[dict[str, Any]]

    @classmethod
    def load(cls, run_dir: str | Path) -> RunMetrics:
        return cls.from_file(Path(run_dir) / "metrics.jsonl", name=Path(run_dir).name)

    @classmethod
    def from_file(cls, path: str | Path, *, name: str | None = None) -> RunMetrics:
        entries = read_metrics(path)
        return cls(
            name=name or Path(path).parent.name,
            train=[e for e in entries if _kind(e) == "train"],
            valid=[e for e in entries if _kind(e) == "valid"],
        )

    def elapsed_at(self, step: int) -> float:
        """Seconds of updates when ``step`` was reached: the entry's own ``elapsed``, else
        linear between the logged steps around it."""
        points = [(e["step"], e["elapsed"]) for e in self.train if "elapsed" in e]
        if not points:
            return math.nan
        points = [(0, 0.0), *points]
        for (s0, t0), (s1, t1) in itertools.pairwise(points):
            if s0 <= step <= s1:
                return t0 if s1 == s0 else t0 + (t1 - t0) * (step - s0) / (s1 - s0)
        return points[-1][1]

    def valid_seconds(self) -> list[float]:
        return [v.get("elapsed", self.elapsed_at(v["step"])) for v in self.valid]

    @property
    def best_valid(self) -> dict[str, Any] | None:
        scored = [v for v in self.valid if "valid_bleu" in v]
        return max(scored, key=lambda v: v["valid_bleu"]) if scored else None

    def steps_near_best(self, margin: float = 0.5) -> int | None:
        """The step of the first validation within ``margin`` dev BLEU of the run's own best:
        when it reached its plateau, whatever the plateau's height."""
        best = self.best_valid
        if best is None:
            return None
        return next(
            v["step"]
            for v in self.valid
            if v.get("valid_bleu", -math.inf) >= best["valid_bleu"] - margin
        )

    def tokens_per_second(self) -> float | None:
        """Median target tokens a second over the logged windows (a window with a validation
        or a checkpoint in it counts that time too; the median leaves those out)."""
        rates = sorted(e["tokens_per_s"] for e in self.train if e.get("tokens_per_s"))
        return rates[len(rates) // 2] if rates else None


def steps_to_bleu(run: RunMetrics, target: float) -> tuple[int, float] | None:
    """(step, seconds of updates) of the first validation whose dev BLEU reached ``target``;
    None if none did."""
    for v, seconds in zip(run.valid, run.valid_seconds(), strict=True):
        if v.get("valid_bleu", -math.inf) >= target:
            return v["step"], seconds
    return None


def smooth(values: list[float], window: int) -> list[float]:
    """Centred mean filter of ``window`` points (shrinking at the ends); 1 leaves them."""
    if window <= 1:
        return list(values)
    half = window // 2
    out = []
    for i in range(len(values)):
        part = values[max(0, i - half) : i + half + 1]
        out.append(sum(part) / len(part))
    return out


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return mean, sd


_SEED = re.compile(r"-s\d+$")


def group_name(run_name: str) -> str:
    """A run's model name without its seed: ``weighted-s2`` → ``weighted``."""
    return _SEED.sub("", run_name)


__all__ = [
    "RunMetrics",
    "group_name",
    "mean_sd",
    "read_metrics",
    "smooth",
    "steps_to_bleu",
]
