"""The figures of docs/RESULTS.md (``wtnmt.analysis.paper --figures``), from the committed
curves of the runs each setting names."""

from __future__ import annotations

from pathlib import Path

from wtnmt.analysis.figures import _pyplot, _save
from wtnmt.analysis.metrics import mean_sd
from wtnmt.analysis.paper_tables import MODELS, Setting
from wtnmt.analysis.runs import Run

COLOURS = {"transformer": "tab:blue", "weighted": "tab:red", "fixed": "tab:green"}


def seed_band(
    runs: list[Run], key: str = "valid_bleu"
) -> tuple[list[int], list[float], list[float]]:
    """(steps, mean, sd) of ``key`` over the seeds, at every validation step two seeds or
    more logged it (a band ends where the second-to-last seed stopped)."""
    by_step: dict[int, list[float]] = {}
    for run in runs:
        for v in run.metrics.valid:
            if key in v:
                by_step.setdefault(v["step"], []).append(v[key])
    steps = sorted(s for s, values in by_step.items() if len(values) >= min(2, len(runs)))
    spreads = [mean_sd(by_step[s]) if len(by_step[s]) > 1 else (by_step[s][0], 0.0) for s in steps]
    return steps, [m for m, _ in spreads], [sd for _, sd in spreads]


def dev_bleu_bands(settings: list[Setting], out_png: Path) -> Path:
    """Greedy dev BLEU against updates, a panel a setting: each model's mean over its seeds
    with a band of ± one sd."""
    plt = _pyplot()
    columns = 2
    rows = (len(settings) + columns - 1) // columns
    fig, axes = plt.subplots(rows, columns, figsize=(9, 3.4 * rows), squeeze=False)
    for ax, setting in zip(axes.flat, settings, strict=False):
        for model, label in MODELS:
            runs = setting.runs[model]
            if not runs:
                continue
            steps, mean, sd = seed_band(runs)
            low = [m - s for m, s in zip(mean, sd, strict=True)]
            high = [m + s for m, s in zip(mean, sd, strict=True)]
            dropout = runs[0].config["model"]["dropout"]
            ax.plot(
                steps, mean, color=COLOURS[model], label=f"{label} ({len(runs)}, p={dropout:g})"
            )
            ax.fill_between(steps, low, high, color=COLOURS[model], alpha=0.2, linewidth=0)
        ax.set_title(setting.name, fontsize=9)
        ax.set_xlabel("updates")
        ax.xaxis.set_major_formatter(lambda x, _: f"{x / 1000:g}k")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
        top = max(v["valid_bleu"] for r in setting.runs["transformer"] for v in r.metrics.valid)
        ax.set_ylim(top - 20, top + 2)
    for row in axes:
        row[0].set_ylabel("dev BLEU (greedy)")
    for ax in axes.flat[len(settings) :]:
        ax.axis("off")
    return _save(fig, out_png)


FIGURES = {"dev_bleu_bands.png": dev_bleu_bands}


def make_figures(settings: list[Setting], directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    return [draw(settings, directory / name) for name, draw in FIGURES.items()]
