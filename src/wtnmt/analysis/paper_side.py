"""The tables of docs/RESULTS.md beside the converged answer (``wtnmt.analysis.paper``): the
tuning that chose the settings, the initialization runs, the comparisons trained far short of
convergence, and the pruning sweep."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from wtnmt.analysis.metrics import RunMetrics
from wtnmt.analysis.paper_tables import fmt, fmt_p, markdown, signed, spec_root, spread, test_bleu
from wtnmt.analysis.runs import Run
from wtnmt.analysis.stats import welch_t


def load_curves(spec: Path) -> list[tuple[str, RunMetrics]]:
    """The labelled curves of ``spec``'s ``curves`` (metrics files under experiments/)."""
    values = yaml.safe_load(spec.read_text(encoding="utf-8"))
    return [
        (
            entry["label"],
            RunMetrics.from_file(spec_root(spec) / entry["metrics"], name=entry["label"]),
        )
        for entry in values.get("curves") or []
    ]


def init_table(
    curves: list[tuple[str, RunMetrics]], steps: tuple[int, ...] = (600, 1000, 1400, 2000, 2400)
) -> str:
    """Greedy dev BLEU / dev loss of each curve at fixed updates (the initialization runs)."""
    rows = []
    for label, metrics in curves:
        at = {v["step"]: v for v in metrics.valid}
        cells = [
            f"{fmt(at[s]['valid_bleu'])} / {fmt(at[s]['valid_loss'])}" if s in at else "–"
            for s in steps
        ]
        rows.append([label, *cells])
    return markdown(["run", *(f"{s:,}" for s in steps)], rows)


def tune_table(runs: list[Run]) -> str:
    """The tuning runs on dev: greedy dev BLEU at its best validation, and beam 5 on dev of
    the best checkpoint (what chose the settings) and of the mean of the last 10."""
    rows = []
    for run in runs:
        scores = run.scores or {}
        best = run.metrics.best_valid or {}
        rows.append(
            [
                "Weighted" if run.weighted else "Transformer",
                f"{run.config['model']['dropout']:g}",
                f"{run.config['train']['peak_lr']:g}",
                f"{fmt(best.get('valid_bleu'))} ({best.get('step', 0):,})",
                fmt((scores.get("valid_best") or {}).get("bleu")),
                fmt((scores.get("valid") or {}).get("bleu")),
            ]
        )
    headers = [
        "model",
        "dropout",
        "peak lr",
        "greedy dev BLEU (update)",
        "beam 5, best checkpoint",
        "beam 5, mean of last 10",
    ]
    return markdown(headers, rows)


def load_tuning(spec: Path) -> list[Run]:
    values = yaml.safe_load(spec.read_text(encoding="utf-8"))
    return [Run.load(spec_root(spec) / path) for path in values.get("tuning") or []]


@dataclass
class Group:
    """Seeds of one setting of a short comparison, and what it is compared with."""

    question: str
    label: str
    runs: list[Run]
    against: str | None


def load_short(spec: Path) -> list[Group]:
    """``spec``'s ``short`` comparisons: each question's groups of runs."""
    values = yaml.safe_load(spec.read_text(encoding="utf-8"))
    root = spec_root(spec)
    return [
        Group(q["question"], g["label"], [Run.load(root / p) for p in g["runs"]], g.get("against"))
        for q in values.get("short") or []
        for g in q["groups"]
    ]


def short_table(groups: list[Group]) -> str:
    """The comparisons trained far short of convergence: updates, seeds, test BLEU (beam and
    weights as each run was scored), and the difference from the group named ``against``
    (Welch p where both have two seeds or more)."""
    by_name = {(g.question, g.label): g for g in groups}
    rows = []
    for group in groups:
        bleu = [test_bleu(r) for r in group.runs]
        steps = sorted({r.steps for r in group.runs})
        cells = ["–", "–"]
        base = by_name.get((group.question, group.against or ""))
        if base is not None:
            other = [test_bleu(r) for r in base.runs]
            diff = sum(bleu) / len(bleu) - sum(other) / len(other)
            cells = [f"{signed(diff)} vs {base.label}", "–"]
            if len(bleu) > 1 and len(other) > 1:
                cells[1] = fmt_p(welch_t(bleu, other)[2])
        rows.append(
            [
                group.question,
                group.label,
                "–".join(f"{s:,}" for s in (steps[0], steps[-1]) if s)
                if len(steps) > 1
                else f"{steps[0]:,}",
                str(len(bleu)),
                spread(bleu),
                *cells,
            ]
        )
    headers = ["question", "setting", "updates", "seeds", "test BLEU", "difference", "Welch p"]
    return markdown(headers, rows)


def pruning_table(spec: Path) -> str:
    """``wtnmt prune``'s sweep of the demo model: test BLEU (beam) with 3, 2 and 1 branches
    a sublayer kept, by each criterion, before and after the fine-tune."""
    values = yaml.safe_load(spec.read_text(encoding="utf-8"))
    path = values.get("pruning")
    if not path:
        return ""
    points = json.loads((spec_root(spec) / path).read_text(encoding="utf-8"))["points"]
    full = next(p["beam"]["bleu"] for p in points if p["branches"] == 32)
    rows = []
    for n in (3, 2, 1):
        cells = []
        for criterion in ("importance", "kappa-alpha", "random"):
            for tuned in (0, 300):
                found = [
                    p["beam"]["bleu"]
                    for p in points
                    if p["criterion"] == criterion
                    and p["budget"] == "keep"
                    and p["n"] == n
                    and p["fine_tune"] == tuned
                ]
                cells.append(fmt(found[0]) if found else "–")
        rows.append([f"{n} of 4 a sublayer ({8 * n} of 32)", *cells])
    headers = [
        "branches kept",
        "importance",
        "importance, fine-tuned",
        "κ·α",
        "κ·α, fine-tuned",
        "random",
        "random, fine-tuned",
    ]
    return f"Unpruned: {fmt(full)}.\n\n" + markdown(headers, rows)
