"""The numbers docs/RESULTS.md's and the README's prose quotes, and the words the rule gives
them, made from the same committed results as the tables (``wtnmt.analysis.paper``).

In a document a value lives between ``<!-- value:NAME -->`` and ``<!-- /value -->``, inline;
``--write`` fills it, ``--check`` (run by the tests) fails where it holds another text, so
that a new seed or a changed run cannot leave a sentence behind. NAME is
``KEY.MODEL[.PART]``: KEY a setting's ``key`` in docs/results.yaml, MODEL ``transformer``,
``weighted`` or ``fixed``; no PART: test BLEU, mean ± sd over its seeds; ``n``: its seeds;
compared with its baseline (the Weighted Transformer with the Transformer, the control with
the Weighted Transformer): ``diff``, ``low``, ``high``, ``ci`` (``[low, high]``, Welch's 95%),
``p`` (Welch), ``perm`` (exact permutation), ``lead1000`` … (the mean greedy dev BLEU less
the baseline's at Table 3's updates) and ``word``, the rule's word for the test BLEU: "ends
higher" or "ends lower" where Welch's p < 0.05 and the permutation test's p is at its least
for 3 + 3 seeds (0.10) or below 0.05 with more; else "level" where the interval lies inside
±0.5 BLEU; else "no difference shown" (RESULTS, "The rule written before the runs").

The secondary measures, reported beside the test BLEU and deciding nothing, are a table
(``secondary``): each comparison on lowercased Moses-token BLEU, chrF, the best single
checkpoint's test BLEU, the best greedy dev BLEU and the lowest dev loss.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from wtnmt.analysis.paper_tables import (
    BASELINE,
    MODELS,
    Setting,
    count,
    dev_bleu_at,
    fmt_p,
    markdown,
    near_best,
    signed,
    spread,
    test_bleu,
)
from wtnmt.analysis.runs import Run
from wtnmt.analysis.stats import permutation_test, welch_interval, welch_t

LEVEL = 0.5  # BLEU: "level" only where the 95% interval lies inside ±LEVEL


def verdict(diff: float, low: float, high: float, p: float, perm: float, seeds: int) -> str:
    """The rule's word for a difference (``seeds``: the fewer of the two sides')."""
    least = perm <= 0.1 + 1e-9 if seeds <= 3 else perm < 0.05
    if p < 0.05 and least:
        return "ends higher" if diff > 0 else "ends lower"
    if -LEVEL < low and high < LEVEL:
        return "level"
    return "no difference shown"


def values(settings: list[Setting]) -> dict[str, str]:
    """Every named value of the settings that have a ``key``, and of the runs as a whole."""
    out: dict[str, str] = _run_values(settings)
    for setting in settings:
        if not setting.key:
            continue
        for model, _ in MODELS:
            runs = setting.runs[model]
            if not runs:
                continue
            name = f"{setting.key}.{model}"
            bleu = [test_bleu(r) for r in runs]
            out[name] = spread(bleu)
            out[f"{name}.n"] = str(len(runs))
            near = [n for n in map(near_best, runs) if n is not None]
            if near:
                out[f"{name}.settle"] = count(near)
            baseline = setting.runs.get(BASELINE.get(model, ""), [])
            out |= _leads(name, runs, baseline)
            base = [test_bleu(r) for r in baseline]
            if len(bleu) < 2 or len(base) < 2:
                continue
            diff, low, high = welch_interval(bleu, base)
            _, _, p = welch_t(bleu, base)
            perm = permutation_test(bleu, base)
            out |= _secondary_values(name, runs, baseline)
            out |= {
                f"{name}.diff": signed(diff),
                f"{name}.low": signed(low),
                f"{name}.high": signed(high),
                f"{name}.ci": f"[{signed(low)}, {signed(high)}]",
                f"{name}.p": fmt_p(p),
                f"{name}.perm": fmt_p(perm),
                f"{name}.word": verdict(diff, low, high, p, perm, min(len(bleu), len(base))),
            }
    return out


STEPS = (1000, 2000, 4000, 8000)  # Table 3's (curve_table's)


def _dev_bleu_at(runs: list[Run], step: int) -> float | None:
    """The mean greedy dev BLEU of ``runs`` at ``step``; None where a seed had stopped."""
    found = dev_bleu_at(runs, step)
    return sum(found) / len(found) if found and len(found) == len(runs) else None


def _leads(name: str, runs: list[Run], baseline: list[Run]) -> dict[str, str]:
    """``NAME.lead1000`` …: the model's mean dev BLEU less its baseline's at Table 3's steps
    (where both have every seed there)."""
    out = {}
    for step in STEPS:
        a, b = _dev_bleu_at(runs, step), _dev_bleu_at(baseline, step) if baseline else None
        if a is not None and b is not None:
            out[f"{name}.lead{step}"] = signed(a - b)
    return out


def _run_values(settings: list[Setting]) -> dict[str, str]:
    """Of every CPU run counted (each once): ``cpu.update_seconds`` and ``cpu.hours`` (the
    least and most), ``cpu.machines`` (how many record their machine); of every learning
    Weighted Transformer counted: ``frozen``, the runs whose κ, α were frozen for their last
    updates (``train.freeze_branch_weights`` before ``max_steps``)."""
    runs: dict[str, tuple[str, str, Run]] = {}
    for setting in settings:
        for model, group in setting.runs.items():
            for run in group:
                runs[str(run.path)] = (setting.name, model, run)
    cpu = [r for name, _, r in runs.values() if name.startswith("CPU")]
    out = {}
    if cpu:
        per_update = [r.ms_per_step / 1000 for r in cpu if r.ms_per_step]
        hours = [r.seconds / 3600 for r in cpu]
        out["cpu.update_seconds"] = f"{min(per_update):.2f}–{max(per_update):.2f}"
        out["cpu.hours"] = f"{min(hours):.2f}–{max(hours):.2f}"
        out["cpu.machines"] = f"{sum(bool(r.machines) for r in cpu)} of {len(cpu)}"
    frozen = []
    for _, model, run in runs.values():
        train = run.config.get("train", {})
        window, cap = train.get("freeze_branch_weights") or 0, train.get("max_steps")
        if model == "weighted" and cap and run.steps > cap - window:
            frozen.append(f"`{run.path.name}` for its last {run.steps - (cap - window):,}")
    out["frozen"] = ", ".join(frozen) or "none"
    return out


# ------------------------------------------------------------------------- secondary measures
def _best_checkpoint(run: Run) -> float | None:
    best = (run.scores or {}).get("test_best")
    return None if not isinstance(best, dict) else best.get("bleu")


def _best_dev_bleu(run: Run) -> float | None:
    best = run.metrics.best_valid
    return None if best is None else float(best["valid_bleu"])


def _lowest_dev_loss(run: Run) -> float | None:
    losses = [v["valid_loss"] for v in run.metrics.valid if "valid_loss" in v]
    return min(losses) if losses else None


SECONDARY: list[tuple[str, Callable[[Run], float | None], int]] = [
    ("test BLEU (the decision's)", test_bleu, 2),
    ("lowercased Moses-token BLEU", lambda r: r.test("bleu_moses"), 2),
    ("chrF", lambda r: r.test("chrf"), 2),
    ("best single checkpoint, test BLEU", _best_checkpoint, 2),
    ("best greedy dev BLEU", _best_dev_bleu, 2),
    ("lowest dev loss (lower is better)", _lowest_dev_loss, 3),
]
SLUGS = ("test", "moses", "chrf", "best-checkpoint", "dev-bleu", "dev-loss")  # the values'


def _compared(read, runs: list[Run], baseline: list[Run]):  # type: ignore[no-untyped-def]
    """A measure ``read`` of each run, both sides: (a, b, diff, low, high, Welch p), or None
    where a side has fewer than two seeds that have it."""
    a = [v for v in map(read, runs) if v is not None]
    b = [v for v in map(read, baseline) if v is not None]
    if len(a) < 2 or len(b) < 2:
        return None
    diff, low, high = welch_interval(a, b)
    return a, b, diff, low, high, welch_t(a, b)[2]


def _secondary_values(name: str, runs: list[Run], baseline: list[Run]) -> dict[str, str]:
    """``NAME.SLUG.diff`` and ``NAME.SLUG.p`` of each secondary measure (SLUG below)."""
    out = {}
    for (_, read, digits), slug in zip(SECONDARY, SLUGS, strict=True):
        if (found := _compared(read, runs, baseline)) is not None:
            out[f"{name}.{slug}.diff"] = signed(found[2], digits)
            out[f"{name}.{slug}.p"] = fmt_p(found[5])
    return out


def secondary_table(settings: list[Setting]) -> str:
    """Each comparison of two or more seeds a side on every measure: the two means, the
    difference with Welch's 95% interval, Welch's and the permutation test's p."""
    rows = []
    for setting in settings:
        for model, label in MODELS:
            baseline = BASELINE.get(model)
            runs, base = setting.runs[model], setting.runs.get(baseline or "", [])
            other = dict(MODELS).get(baseline or "", "")
            for measure, read, digits in SECONDARY:
                if (found := _compared(read, runs, base)) is None:
                    continue
                a, b, diff, low, high, p = found
                rows.append(
                    [
                        setting.name,
                        f"{label} − {other}",
                        measure,
                        spread(a, digits),
                        spread(b, digits),
                        f"{signed(diff, digits)} [{signed(low, digits)}, {signed(high, digits)}]",
                        fmt_p(p),
                        fmt_p(permutation_test(a, b)),
                    ]
                )
    headers = ["setting", "comparison", "measure", "model", "baseline", "difference [95% CI]",
               "Welch p", "permutation p"]  # fmt: skip
    return markdown(headers, rows)


# ------------------------------------------------------------------------ the values in prose
_VALUE = re.compile(r"<!-- value:([\w.\-]+) -->(.*?)<!-- /value -->", re.DOTALL)


def fill_values(document: str, named: dict[str, str]) -> str:
    """``document`` with every value it quotes made now (an unknown name is a KeyError)."""
    return _VALUE.sub(lambda m: f"<!-- value:{m[1]} -->{named[m[1]]}<!-- /value -->", document)


def value_differences(document: str, named: dict[str, str]) -> list[str]:
    """The values ``document`` quotes that are unknown, or hold another text than now."""
    found = []
    for m in _VALUE.finditer(document):
        if m[1] not in named:
            found.append(f"value {m[1]}: no such value (names: {', '.join(sorted(named)[:6])}, …)")
        elif m[2] != named[m[1]]:
            found.append(f"value {m[1]}: the text says {m[2]!r}, the results give {named[m[1]]!r}")
    return found


__all__ = [
    "LEVEL",
    "fill_values",
    "secondary_table",
    "value_differences",
    "values",
    "verdict",
]
