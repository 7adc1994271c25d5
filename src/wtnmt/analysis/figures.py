"""The papers' figures from what runs recorded (SPEC §4), as PNG files. Each function takes
the runs' series (``RunMetrics``) or a map and a path, draws, and returns the path (None when
the runs hold nothing to draw)."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from wtnmt.analysis.metrics import RunMetrics, smooth


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, out_png: str | Path) -> Path:  # type: ignore[no-untyped-def]
    out_png = Path(out_png)
    fig.tight_layout()
    drawn = io.BytesIO()
    fig.savefig(drawn, format="png", dpi=110)
    _pyplot().close(fig)
    write_palette_png(drawn.getvalue(), out_png)
    return out_png


def write_palette_png(png: bytes, out_png: Path) -> None:
    """Write the PNG ``png`` (as Agg draws it) again with 256 palette colours: a third to two
    fifths of the file (a Fig. 3 of 0.5 MB becomes about 160 KB), small enough to commit. A
    figure of lines, text and a greyscale map has few colours but for the edges Agg smooths: on
    this toolkit's figures the mean pixel moves by about 0.1 of 255 levels and 99 in 100 by at
    most 4; only some smoothed pixels where lines of two colours cross move further."""
    from PIL import Image  # matplotlib's own dependency

    with Image.open(io.BytesIO(png)) as drawn:
        rgb = drawn.convert("RGB")
    palette = rgb.quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    palette.save(out_png, optimize=True)


def frozen_from(run: RunMetrics) -> int | None:
    """The first logged step of the freeze window (κ, α no longer trained: their learning
    rate is 0 after warm-up), or None."""
    for entry in run.train:
        if entry.get("branch_weights") and entry.get("lr_branch") == 0 and entry["step"] > 1:
            return entry["step"]
    return None


def _uniform(layers: dict[str, dict[str, list[float]]]) -> bool:
    """Whether every κ and α logged is 1/M (to the logged digits)."""
    return all(
        abs(w - 1 / len(weights)) < 1e-6
        for layer in layers.values()
        for weights in layer.values()
        for w in weights
    )


def plot_branch_weights(
    metrics: str | Path | RunMetrics, out_png: str | Path, *, window: int = 1
) -> Path | None:
    """κ and α of every branched layer over training steps (paper Fig. 3), mean-filtered over
    ``window`` logged points, the freeze window shaded. One row per layer, κ left, α right,
    one line per branch. None when the run logged no branch weights (a Transformer) or only
    κ = α = 1/M (held fixed: flat lines say nothing a table would not)."""
    run = metrics if isinstance(metrics, RunMetrics) else RunMetrics.from_file(metrics)
    entries = [e for e in run.train if e.get("branch_weights")]
    if all(_uniform(e["branch_weights"]) for e in entries):
        return None
    plt = _pyplot()
    steps = [e["step"] for e in entries]
    layers = list(entries[0]["branch_weights"])
    frozen = frozen_from(run)
    fig, axes = plt.subplots(
        len(layers), 2, figsize=(9, 1.9 * len(layers) + 0.6), sharex=True, squeeze=False
    )
    for row, layer in enumerate(layers):
        for col, name in enumerate(("kappa", "alpha")):
            ax = axes[row][col]
            series = [e["branch_weights"][layer][name] for e in entries]
            for branch in range(len(series[0])):
                values = smooth([s[branch] for s in series], window)
                ax.plot(steps, values, label=f"branch {branch + 1}")
            if frozen is not None:
                ax.axvspan(frozen, steps[-1], color="grey", alpha=0.15, lw=0)
            ax.set_ylabel(
                f"{'κ' if name == 'kappa' else 'α'}\n{layer.replace('_layers', '')}", fontsize=8
            )
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
    note = f", mean filter of {window}" if window > 1 else ""
    shaded = ", frozen window shaded" if frozen is not None else ""
    axes[0][0].set_title(f"κ (concatenation weights){note}", fontsize=9)
    axes[0][1].set_title(f"α (addition weights){shaded}", fontsize=9)
    axes[-1][0].set_xlabel("training step")
    axes[-1][1].set_xlabel("training step")
    axes[0][1].legend(fontsize=7, loc="upper right")
    return _save(fig, out_png)


def loss_pairs(run: RunMetrics) -> list[tuple[float, float]]:
    """(training loss, validation loss) at each validation: the training loss is the mean of
    the entries logged since the previous validation (one window alone is too noisy)."""
    pairs, previous = [], -1
    for v in run.valid:
        window = [e["loss"] for e in run.train if previous < e["step"] <= v["step"]]
        if window:
            pairs.append((sum(window) / len(window), v["valid_loss"]))
        previous = v["step"]
    return pairs


def plot_loss_vs_loss(runs: Sequence[RunMetrics], out_png: str | Path) -> Path | None:
    """Validation loss against training loss, one curve a run (paper Fig. 2): below another
    curve means a lower validation loss at the same training loss."""
    drawn = [(r, loss_pairs(r)) for r in runs]
    drawn = [(r, p) for r, p in drawn if p]
    if not drawn:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for run, pairs in drawn:
        ax.plot([p[0] for p in pairs], [p[1] for p in pairs], marker=".", label=run.name)
    ax.set_xlabel("training loss since the previous validation (label-smoothed)")
    ax.set_ylabel("validation loss (label-smoothed)")
    ax.invert_xaxis()  # training goes on to the right
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax.set_title("validation against training loss", fontsize=10)
    return _save(fig, out_png)


def plot_validation(runs: Sequence[RunMetrics], out_png: str | Path) -> Path | None:
    """Dev BLEU and dev loss against update steps and against seconds of updates, runs
    overlaid."""
    runs = [r for r in runs if r.valid]
    if not runs:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for run in runs:
        steps = [v["step"] for v in run.valid]
        seconds = run.valid_seconds()
        for row, key in enumerate(("valid_bleu", "valid_loss")):
            ys = [v.get(key) for v in run.valid]
            if any(y is None for y in ys):
                continue
            axes[row][0].plot(steps, ys, marker=".", label=run.name)
            axes[row][1].plot(seconds, ys, marker=".", label=run.name)
    for row, label in enumerate(("dev BLEU (greedy)", "dev loss")):
        axes[row][0].set_ylabel(label)
        for col, xlabel in enumerate(("update steps", "seconds of updates")):
            axes[row][col].set_xlabel(xlabel)
            axes[row][col].grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    return _save(fig, out_png)


def plot_steps_to_bleu(
    rows: Sequence[dict[str, Any]], target: float, out_png: str | Path
) -> Path | None:
    """Bars of the steps and seconds each run needed to reach dev BLEU ``target`` (rows:
    name, step, seconds; None where the run never reached it)."""
    reached = [r for r in rows if r["step"] is not None]
    if not reached:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.35 * len(rows) + 1.6))
    names = [r["name"] for r in rows]
    for ax, key, label in ((axes[0], "step", "update steps"), (axes[1], "seconds", "seconds")):
        values = [r[key] if r[key] is not None else 0 for r in rows]
        ax.barh(names, values, color=["C0" if r[key] is not None else "lightgrey" for r in rows])
        ax.invert_yaxis()
        ax.set_xlabel(f"{label} to dev BLEU {target:.2f}")
        ax.grid(alpha=0.3, axis="x")
        ax.tick_params(labelsize=7)
    return _save(fig, out_png)


def plot_attention(
    layers: Sequence[Any],
    source: Sequence[str],
    output: Sequence[str],
    out_png: str | Path,
    *,
    title: str = "",
) -> Path | None:
    """Per-branch cross-attention maps of one sentence, one row per decoder layer, each map
    titled with its branch's κ and α (``layers``: LayerAttention of decode.attention)."""
    if not layers:
        return None
    plt = _pyplot()
    branches = layers[0].maps.shape[0]
    size = max(2.0, 0.22 * max(len(source), len(output)) + 0.8)
    fig, axes = plt.subplots(
        len(layers), branches, figsize=(size * branches, size * len(layers)), squeeze=False
    )
    for row, layer in enumerate(layers):
        for b in range(branches):
            ax = axes[row][b]
            ax.imshow(layer.maps[b].numpy(), cmap="Greys", vmin=0, vmax=1, aspect="auto")
            head = f"layer {row + 1} branch {b + 1}"
            if layer.kappa is not None:
                head += f"\nκ {layer.kappa[b]:.2f} α {layer.alpha[b]:.2f}"
            ax.set_title(head, fontsize=7)
            ax.set_xticks(range(len(source)), source, rotation=90, fontsize=6)
            ax.set_yticks(range(len(output)), output, fontsize=6)
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, out_png)


def branch_weight_rows(table: dict[str, dict[str, list[float]]]) -> list[str]:
    """κ/α per layer as aligned text rows."""
    width = max(len(name) for name in table) if table else 10
    rows = []
    for name, w in table.items():
        kappa = " ".join(f"{x:.2f}" for x in w["kappa"])
        alpha = " ".join(f"{x:.2f}" for x in w["alpha"])
        rows.append(f"  {name:<{width}}  κ [{kappa}]  α [{alpha}]")
    return rows


__all__ = [
    "branch_weight_rows",
    "frozen_from",
    "loss_pairs",
    "plot_attention",
    "plot_branch_weights",
    "plot_loss_vs_loss",
    "plot_steps_to_bleu",
    "plot_validation",
]
