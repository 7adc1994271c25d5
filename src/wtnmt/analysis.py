"""Figures drawn from a run's metrics.jsonl (SPEC §4)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_branch_weights(metrics_path: str | Path, out_png: str | Path) -> Path | None:
    """κ and α of every branched layer over training steps (paper Fig. 3) → PNG.

    One row per layer, κ on the left and α on the right, one line per branch. Returns the
    path, or None when the run logged no branch weights (a Transformer run).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = [e for e in read_metrics(metrics_path) if e.get("branch_weights")]
    if not entries:
        return None
    steps = [e["step"] for e in entries]
    layers = list(entries[0]["branch_weights"])
    fig, axes = plt.subplots(
        len(layers), 2, figsize=(9, 1.9 * len(layers) + 0.6), sharex=True, squeeze=False
    )
    for row, layer in enumerate(layers):
        for col, name in enumerate(("kappa", "alpha")):
            ax = axes[row][col]
            series = [e["branch_weights"][layer][name] for e in entries]
            for branch in range(len(series[0])):
                ax.plot(steps, [s[branch] for s in series], label=f"branch {branch + 1}")
            ax.set_ylabel(
                f"{'κ' if name == 'kappa' else 'α'}\n{layer.replace('_layers', '')}", fontsize=8
            )
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
    axes[0][0].set_title("κ (concatenation weights)")
    axes[0][1].set_title("α (addition weights)")
    axes[-1][0].set_xlabel("training step")
    axes[-1][1].set_xlabel("training step")
    axes[0][1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    out_png = Path(out_png)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


def branch_weight_rows(table: dict[str, dict[str, list[float]]]) -> list[str]:
    """κ/α per layer as aligned text rows."""
    width = max(len(name) for name in table) if table else 10
    rows = []
    for name, w in table.items():
        kappa = " ".join(f"{x:.2f}" for x in w["kappa"])
        alpha = " ".join(f"{x:.2f}" for x in w["alpha"])
        rows.append(f"  {name:<{width}}  κ [{kappa}]  α [{alpha}]")
    return rows
