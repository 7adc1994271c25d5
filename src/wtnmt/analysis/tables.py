"""The numbers of `wtnmt analyze`, as tables (a title, headers, rows of plain values) that the
report renders to Markdown and HTML and keeps in ``analysis.json``."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from wtnmt.analysis.metrics import mean_sd, steps_to_bleu
from wtnmt.analysis.runs import Run


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[Any]] = field(default_factory=list)
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"title": self.title, "headers": self.headers, "rows": self.rows, "note": self.note}


def _r(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def _p(value: float) -> float:
    """A p-value to 4 decimals, or to 2 significant digits where 4 decimals would read 0."""
    return round(value, 4) or float(f"{value:.2g}")


def _ratio(value: float | None, reference: float | None) -> float | None:
    return None if value is None or not reference else round(value / reference, 2)


def _test_weights(runs: list[Run]) -> str:
    """Which weights the runs' test scores are of, as their scores.json say."""
    averaged = {run.test("average") for run in runs if run.test("bleu") is not None}
    if len(averaged) == 1 and (n := averaged.pop()):
        return f"the mean of the last {n} checkpoints"
    if not averaged or averaged == {None}:
        return "the weights of the best dev BLEU"
    return "the weights each run's scores.json names (the best dev BLEU's or an average)"


def machines_note(runs: list[Run]) -> str:
    """What the runs trained on, as their machines.jsonl say: the one machine, or which run
    on which, since seconds then compare machines as well as models; "" where none says."""
    if not any(run.machines for run in runs):
        return ""
    on: dict[str | None, list[str]] = {}
    for run in runs:
        for machine in run.machines or (None,):
            on.setdefault(machine, []).append(run.name)
    if len(on) == 1:
        return f"trained on {next(iter(on))}"
    which = "; ".join(
        f"{', '.join(names)} on {machine}" if machine else f"{', '.join(names)}: not recorded"
        for machine, names in on.items()
    )
    verb = "may compare" if None in on else "compare"
    return f"seconds {verb} machines as well as models: {which}"


def _with(note: str, more: str) -> str:
    return f"{note}; {more}" if more else note


def runs_table(runs: list[Run]) -> Table:
    table = Table(
        "Runs",
        [
            "run",
            "budget",
            "precision",
            "steps",
            "stopped by",
            "update s",
            "ms/step",
            "tgt tok/s",
            "best dev BLEU (step)",
            "steps to best − 0.5",
            "test BLEU",
            "test chrF",
            "test BLEU lc",
        ],
        note=f"dev BLEU: greedy decoding at each validation; test: beam search with "
        f"{_test_weights(runs)}; BLEU lc: lowercased (the Multi30k literature's); "
        "stopped by: patience, or the bound of the budget reached; "
        "ms/step: seconds of updates per step; tgt tok/s: median over logged windows; "
        "steps to best − 0.5: the first validation within 0.5 dev BLEU of the run's own best",
    )
    table.note = _with(table.note, machines_note(runs))
    for run in runs:
        best = run.metrics.best_valid
        rate = run.metrics.tokens_per_second()
        table.rows.append(
            [
                run.name,
                run.budget,
                run.precision,
                run.steps,
                run.stopped_by,
                round(run.seconds),
                run.ms_per_step,
                None if rate is None else round(rate),
                None if best is None else f"{best['valid_bleu']:.2f} ({best['step']})",
                run.metrics.steps_near_best(),
                run.test("bleu"),
                run.test("chrf"),
                run.test("bleu_lc"),
            ]
        )
    return table


def _mix(values: list[str]) -> str:
    """``fp32``, or where seeds differ, how many have each: ``bf16 ×1, fp32 ×2``."""
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    if len(counts) == 1:
        return next(iter(counts))
    return ", ".join(f"{p} ×{n}" for p, n in sorted(counts.items()))


def groups_table(runs: list[Run]) -> Table:
    """Mean ± sd over the seeds of each model (runs named ``<model>-s<seed>``)."""
    table = Table(
        "Models (mean ± sd over seeds)",
        [
            "model",
            "seeds",
            "precision",
            "steps",
            "stopped by",
            "ms/step",
            "tgt tok/s",
            "best dev BLEU",
            "steps to best − 0.5",
            "test BLEU",
            "test chrF",
            "test BLEU lc",
        ],
    )
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.group, []).append(run)
    for name, members in groups.items():
        table.rows.append(
            [
                name,
                len(members),
                _mix([r.precision for r in members]),
                _spread([float(r.steps) for r in members]),
                _mix([r.stopped_by or "not recorded" for r in members]),  # a count, not a mean
                _spread([r.ms_per_step for r in members]),
                _spread([r.metrics.tokens_per_second() for r in members]),
                _spread([(r.metrics.best_valid or {}).get("valid_bleu") for r in members]),
                _spread([r.metrics.steps_near_best() for r in members]),
                _spread([r.test("bleu") for r in members]),
                _spread([r.test("chrf") for r in members]),
                _spread([r.test("bleu_lc") for r in members]),
            ]
        )
    return table


def _spread(values: list[float | None]) -> str | None:
    """``mean ± sd`` over the seeds (the mean alone for one seed: no spread to show); None
    where any seed lacks the value."""
    known = [v for v in values if v is not None]
    if len(known) != len(values) or not known:
        return None
    mean, sd = mean_sd(known)
    digits = 0 if mean > 200 else 2
    return f"{mean:.{digits}f}" + (f" ± {sd:.{digits}f}" if len(known) > 1 else "")


# compared across seeds: the test scores (sacreBLEU, lowercased, the literature's lowercased
# Moses-token BLEU and TER where scores.json has them, chrF), the best greedy dev BLEU and the
# lowest dev loss logged, and when each run reached its own plateau (where it ends against how
# soon)
_TESTED_SCORES = (
    ("bleu", "test BLEU"),
    ("bleu_lc", "test BLEU lc"),
    ("bleu_moses", "test BLEU Moses"),
    ("chrf", "chrF"),
    ("ter", "test TER"),  # lower is better; runs scored before TER was recorded: not tested
    ("best_dev_bleu", "best dev BLEU"),
    ("lowest_dev_loss", "lowest dev loss"),
    ("steps_near_best", "steps to best − 0.5"),
)


def _seed_score(run: Run, key: str) -> float | None:
    if key == "best_dev_bleu":
        return (run.metrics.best_valid or {}).get("valid_bleu")
    if key == "lowest_dev_loss":
        losses = [v["valid_loss"] for v in run.metrics.valid if "valid_loss" in v]
        return min(losses) if losses else None
    if key == "steps_near_best":
        step = run.metrics.steps_near_best()
        return None if step is None else float(step)
    return run.test(key)


def model_pairs(pairs: list[str], models: list[str], what: str) -> list[tuple[str, str]]:
    """``MODEL:BASELINE`` strings as pairs of the models named (a model is a run's name
    without its seed); a ConfigError naming ``what`` for any other."""
    from wtnmt.config import ConfigError

    found = []
    for pair in pairs:
        parts = pair.split(":") if isinstance(pair, str) else []
        if len(parts) != 2 or parts[0] == parts[1]:
            raise ConfigError(f"{what} {pair!r}: expected MODEL:BASELINE, two models' names")
        for name in parts:
            if name not in models:
                raise ConfigError(f"{what} {pair}: no model {name!r} (models: {', '.join(models)})")
        found.append((parts[0], parts[1]))
    return found


def too_few_seeds(
    runs: list[Run], pairs: Sequence[tuple[str, str]]
) -> list[tuple[str, str, int, int]]:
    """The pairs (model, baseline) with fewer than two seeds on a side, with their counts:
    one seed has no spread to test against."""
    seeds = Counter(run.group for run in runs)
    return [(m, b, seeds[m], seeds[b]) for m, b in pairs if min(seeds[m], seeds[b]) < 2]


def seeds_test_table(runs: list[Run], pairs: Sequence[tuple[str, str]] = ()) -> Table | None:
    """Each model against the first, and each of ``pairs`` (model, baseline), over their
    seeds' test scores, best dev BLEU (greedy, as logged), lowest dev loss and steps to within
    0.5 dev BLEU of their own best: the difference of the means, Welch's t-test and the exact
    permutation test. A comparison with fewer than two seeds a side is not tested (one seed
    has no spread to test against) and the note names it; None when nothing was tested and no
    pair was asked."""
    from wtnmt.analysis.stats import permutation_test, welch_t

    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.group, []).append(run)
    names = list(groups)
    compared = [(name, names[0]) for name in names[1:]]
    compared += [p for p in pairs if p not in compared]
    table = Table(
        "Across seeds: each model against the first" + ", and the pairs asked" * bool(pairs),
        [
            "model",
            "against",
            "score",
            "difference",
            "t",
            "df",
            "p (Welch)",
            "p (permutation)",
            "splits",
        ],
        note="two-sided; the permutation test is exact over every split of the pooled seeds "
        "(up to 20,000 of them), so its p cannot go below 1/splits, nor below 2/splits with as "
        "many seeds a side (0.1 at 3 + 3)",
    )
    untested = too_few_seeds(runs, compared)
    for name, baseline in compared:
        if any(u[:2] == (name, baseline) for u in untested):
            continue
        for key, label in _TESTED_SCORES:
            a = [_seed_score(r, key) for r in groups[name]]
            b = [_seed_score(r, key) for r in groups[baseline]]
            if len(a) < 2 or len(b) < 2 or None in a or None in b:
                continue
            t, df, p = welch_t(a, b)  # type: ignore[arg-type]
            table.rows.append(
                [
                    name,
                    baseline,
                    label,
                    round(sum(a) / len(a) - sum(b) / len(b), 2),  # type: ignore[arg-type]
                    round(t, 2),
                    round(df, 1),
                    _p(p),
                    _p(permutation_test(a, b)),  # type: ignore[arg-type]
                    math.comb(len(a) + len(b), len(a)),
                ]
            )
    if untested:
        table.note += "; not tested, fewer than two seeds a side: " + ", ".join(
            f"{m} against {b} ({n} + {k} seeds)" for m, b, n, k in untested
        )
    return table if table.rows or pairs else None


def steps_to_bleu_table(runs: list[Run], target: float) -> tuple[Table, list[dict[str, Any]]]:
    """Steps and seconds of updates each run took to reach dev BLEU ``target``, and each as a
    fraction of the first run's (the paper's "15–40% fewer steps")."""
    rows = []
    for run in runs:
        found = steps_to_bleu(run.metrics, target)
        rows.append(
            {
                "name": run.name,
                "step": found[0] if found else None,
                "seconds": round(found[1], 1) if found else None,
            }
        )
    first = rows[0] if rows and rows[0]["step"] else None
    table = Table(
        f"Steps and seconds to dev BLEU {target:.2f}",
        ["run", "steps", "× first run's steps", "seconds", "× first run's seconds"],
        note=_with(
            "the first validation (greedy dev BLEU) at or above the target; validations are "
            "as frequent as the runs' valid_every",
            machines_note(runs),
        ),
    )
    for row in rows:
        table.rows.append(
            [
                row["name"],
                row["step"],
                _ratio(row["step"], first and first["step"]),
                row["seconds"],
                _ratio(row["seconds"], first and first["seconds"]),
            ]
        )
    return table, rows


__all__ = ["Table", "groups_table", "machines_note", "runs_table", "steps_to_bleu_table"]
