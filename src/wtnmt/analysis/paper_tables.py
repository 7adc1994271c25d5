"""The tables of docs/RESULTS.md (``wtnmt.analysis.paper``), each a Markdown table made
from the committed results of the runs a setting names."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from wtnmt.analysis.metrics import mean_sd
from wtnmt.analysis.runs import Run
from wtnmt.analysis.stats import permutation_test, t_critical, welch_interval, welch_t
from wtnmt.analysis.table3 import table3_by_sublayer, table3_row

MODELS = (("transformer", "Transformer"), ("weighted", "Weighted"), ("fixed", "fixed κ, α"))
# what each model is compared with: the Weighted Transformer with the Transformer, the
# fixed-κα control with the Weighted Transformer that learns them
BASELINE = {"weighted": "transformer", "fixed": "weighted"}


@dataclass
class Setting:
    """One comparison: a machine and precision, a direction, and the runs of each model."""

    name: str
    runs: dict[str, list[Run]]
    key: str = ""  # what the prose's values call it (paper_values.py); "" where none


def spec_root(spec: Path) -> Path:
    """The repository the spec's paths start from (it lies in its docs/)."""
    return spec.resolve().parent.parent


def load_settings(spec: Path) -> list[Setting]:
    """The comparisons ``spec`` names, each run loaded from its directory."""
    values = yaml.safe_load(spec.read_text(encoding="utf-8"))
    base = spec_root(spec)
    settings = []
    for entry in values["settings"]:
        runs = {
            model: [Run.load(base / path) for path in entry.get(model) or []] for model, _ in MODELS
        }
        settings.append(Setting(entry["name"], runs, str(entry.get("key") or "")))
    return settings


# ------------------------------------------------------------------------------- formatting
def fmt(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}".replace("-", "−")


def signed(value: float, digits: int = 2) -> str:
    return ("+" if value > 0 else "") + fmt(value, digits)


def fmt_p(value: float) -> str:
    return f"{value:.2g}" if value < 0.01 else f"{value:.2f}"


def spread(values: list[float], digits: int = 2) -> str:
    if len(values) == 1:
        return fmt(values[0], digits)
    mean, sd = mean_sd(values)
    return f"{fmt(mean, digits)} ± {fmt(sd, digits)}"


def count(values: list[float]) -> str:
    """Updates, mean ± sd, to the nearest hundred (validations are 200 updates apart)."""
    if len(values) == 1:
        return f"{values[0]:,.0f}"
    mean, sd = mean_sd(values)
    return f"{mean:,.0f} ± {sd:,.0f}"


def markdown(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)])


# ----------------------------------------------------------------------------------- scores
def test_bleu(run: Run) -> float:
    value = run.test("bleu")
    if value is None:
        raise ValueError(f"{run.path}: no test BLEU in its scores.json")
    return float(value)


def near_best(run: Run) -> float | None:
    """Updates to the first validation within 0.5 dev BLEU of the run's own best."""
    step = run.metrics.steps_near_best()
    return None if step is None else float(step)


def dev_bleu_at(runs: list[Run], step: int) -> list[float]:
    """The greedy dev BLEU of each of ``runs`` that validated at ``step``."""
    return [
        v["valid_bleu"]
        for r in runs
        for v in r.metrics.valid
        if v["step"] == step and "valid_bleu" in v
    ]


def _dropout(runs: list[Run]) -> str:
    found = sorted({float(r.config["model"]["dropout"]) for r in runs})
    return " / ".join(f"{d:g}" for d in found)


def _compared(runs: list[Run], baseline: list[Run]) -> list[str]:
    """Difference of the means with its Welch 95% interval, Welch p and exact permutation p;
    with one seed on a side, the difference alone."""
    a, b = [test_bleu(r) for r in runs], [test_bleu(r) for r in baseline]
    if len(a) < 2 or len(b) < 2:
        return [signed(sum(a) / len(a) - sum(b) / len(b)) + " (one seed)", "–", "–"]
    diff, low, high = welch_interval(a, b)
    _, _, p = welch_t(a, b)
    interval = f"{signed(diff)} [{signed(low)}, {signed(high)}]"
    return [interval, fmt_p(p), fmt_p(permutation_test(a, b))]


def each_model(settings: list[Setting]):  # type: ignore[no-untyped-def]
    """(setting, model, label, runs) of every model a setting has runs of, in table order."""
    for setting in settings:
        for model, label in MODELS:
            if setting.runs[model]:
                yield setting, model, label, setting.runs[model]


def main_table(settings: list[Setting]) -> str:
    """Each setting's models: seeds, test BLEU, the difference from the baseline with its
    95% interval and tests, and how soon each settles."""
    rows = []
    for setting, model, label, runs in each_model(settings):
        bleu = [test_bleu(r) for r in runs]
        baseline = setting.runs.get(BASELINE.get(model, ""), [])
        tests = _compared(runs, baseline) if baseline else ["–", "–", "–"]
        against = {"weighted": "T", "fixed": "W"}.get(model, "")
        near = [n for n in map(near_best, runs) if n is not None]
        patience = sum(r.stopped_by == "patience" for r in runs)
        rows.append(
            [
                setting.name,
                label,
                _dropout(runs),
                str(len(runs)),
                spread(bleu),
                f"{tests[0]} vs {against}" if against else "–",
                tests[1],
                tests[2],
                count(near) if near else "–",
                f"{patience}/{len(runs)}",
            ]
        )
    headers = [
        "setting",
        "model",
        "dropout",
        "n",
        "test BLEU",
        "difference [95% CI]",
        "Welch p",
        "permutation p",
        "updates to best − 0.5",
        "at patience",
    ]
    return markdown(headers, rows)


def runs_table(settings: list[Setting]) -> str:
    """Every run: where it stopped, its best dev BLEU, when it settled, its test scores."""
    rows, shown = [], set()
    for setting in settings:
        for model, label in MODELS:
            for run in setting.runs[model]:
                if run.path in shown:  # a run two settings share: listed under the first
                    continue
                shown.add(run.path)
                best = run.metrics.best_valid or {}
                moses = run.test("bleu_moses")
                rows.append(
                    [
                        setting.name,
                        f"{label} {run.path.name.rsplit('-', 1)[-1]}",
                        f"`{run.path.parent.name}`",
                        f"{run.steps:,} ({run.stopped_by or '–'})",
                        f"{fmt(best.get('valid_bleu'))} ({best.get('step', 0):,})",
                        fmt(min((v["valid_loss"] for v in run.metrics.valid), default=None), 3),
                        count([near_best(run)]) if near_best(run) is not None else "–",
                        fmt(test_bleu(run)),
                        fmt(moses),
                        fmt(run.test("chrf")),
                    ]
                )
    headers = [
        "setting",
        "run",
        "grid",
        "updates (stopped by)",
        "best dev BLEU (update)",
        "lowest dev loss",
        "updates to best − 0.5",
        "test BLEU",
        "lc Moses-token BLEU",
        "chrF",
    ]
    return markdown(headers, rows)


def curve_table(settings: list[Setting], steps: tuple[int, ...] = (1000, 2000, 4000, 8000)) -> str:
    """Greedy dev BLEU at fixed updates, mean ± sd over seeds: how soon each model learns."""
    rows = []
    for setting, _, label, runs in each_model(settings):
        cells = []
        for step in steps:
            values = dev_bleu_at(runs, step)
            cells.append(spread(values) if len(values) == len(runs) else "–")
        rows.append([setting.name, label, *cells])
    return markdown(["setting", "model", *(f"at {s:,}" for s in steps)], rows)


def table3_table(settings: list[Setting]) -> str:
    """Paper Table 3 at convergence: each learning model's test BLEU with κ, α as learned,
    uniform (1/M) and random, mean ± sd over its seeds (random: of each seed's mean draw)."""
    rows = []
    for setting in settings:
        runs = setting.runs["weighted"]
        found = [table3_row(r, random_seeds=3, decode=False) for r in runs]
        found = [f for f in found if f["uniform"] is not None and f["random"]]
        if not found:
            continue
        learned = [f["learned"] for f in found]
        uniform = [f["uniform"] for f in found]
        random = [sum(f["random"].values()) / len(f["random"]) for f in found]
        rows.append(
            [
                setting.name,
                str(len(found)),
                spread(learned),
                spread(uniform),
                spread([u - lr for u, lr in zip(uniform, learned, strict=True)]),
                spread(random),
                spread([r - lr for r, lr in zip(random, learned, strict=True)]),
                str(sum(len(f["random"]) for f in found)),
            ]
        )
    headers = [
        "setting",
        "seeds",
        "learned",
        "uniform",
        "uniform − learned",
        "random",
        "random − learned",
        "random draws",
    ]
    return markdown(headers, rows)


def _sublayers(names: str) -> str:
    """``encoder_layers.1.self_attn + …`` → ``encoder 1`` (self-attention) or ``decoder 0``
    (cross-attention), and four of a stack at once as ``all encoder`` / ``all decoder``."""
    parts = [n.split(".")[0].replace("_layers", "") + " " + n.split(".")[1] for n in names]
    stacks = {p.split()[0] for p in parts}
    if len(parts) == 4 and len(stacks) == 1:
        return f"every {parts[0].split()[0]} layer"
    return " + ".join(parts)


def sublayer_table(settings: list[Setting]) -> str:
    """Table 3 a sublayer at a time, for the runs that have it kept: test BLEU less the
    learned model's with κ, α replaced in the sublayers of each row alone (encoder: its
    self-attention; decoder: its cross-attention), a column a run and replacement."""
    runs = [r for s in settings for r in s.runs["weighted"]]
    table = table3_by_sublayer(runs)
    if table is None:
        return ""
    columns: dict[str, dict[str, float]] = {}
    for run, kind, names, _, less in table.rows:
        columns.setdefault(f"`{run}` {kind}", {})[_sublayers(names.split(" + "))] = less
    order = sorted({row for col in columns.values() for row in col}, key=lambda r: (len(r), r))
    rows = [
        [row, *(signed(col[row]) if row in col else "–" for col in columns.values())]
        for row in order
    ]
    return markdown(["κ, α replaced in", *columns], rows)


def seeds_needed(settings: list[Setting], half_width: float = 0.5) -> str:
    """For each comparison with spread on both sides: the half-width of the 95% interval of
    the difference now, and the seeds a model that would bring it within ± ``half_width`` at
    the sds seen (Welch's interval with equal seeds a side)."""
    label = dict(MODELS)
    rows = []
    for setting in settings:
        for model, baseline in BASELINE.items():
            a = [test_bleu(r) for r in setting.runs[model]]
            b = [test_bleu(r) for r in setting.runs[baseline]]
            if len(a) < 2 or len(b) < 2:
                continue
            va, vb = mean_sd(a)[1] ** 2, mean_sd(b)[1] ** 2

            def half(n: int, va: float = va, vb: float = vb) -> float:
                if va + vb == 0:
                    return 0.0
                df = (n - 1) * (va + vb) ** 2 / (va**2 + vb**2)
                return t_critical(df) * math.sqrt((va + vb) / n)

            needed = next((n for n in range(2, 1000) if half(n) <= half_width), None)
            _, low, high = welch_interval(a, b)
            rows.append(
                [
                    setting.name,
                    f"{label[model]} vs {label[baseline]}",
                    f"{len(a)} + {len(b)}",
                    f"± {fmt((high - low) / 2)}",
                    "over 1,000" if needed is None else str(needed),
                ]
            )
    headers = ["setting", "comparison", "seeds", "95% CI ±", f"seeds a model for ± {half_width:g}"]
    return markdown(headers, rows)
