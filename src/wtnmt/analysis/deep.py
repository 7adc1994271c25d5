"""Figures and scores of the neighbouring papers: the gradient-norm ratio r_t and the
transparent-attention weights s_{i,j} of deep encoders (Bapna et al., 2018, Fig. 1/3 and 4),
and the disagreement of attention heads per module kind and layer (Li et al., 2018, Table 4).

Each figure function returns the path and the numbers it drew, so that the report keeps them
beside the figure (and a test can hold them against what the run recorded)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from wtnmt.analysis.figures import _pyplot, _save
from wtnmt.analysis.metrics import RunMetrics


def grad_ratio_series(run: RunMetrics) -> tuple[list[int], list[float]]:
    """(steps, r_t) where the run logged r_t = ‖∂L/∂h_1‖ / ‖∂L/∂h_N‖ (train.grad_ratio)."""
    entries = [e for e in run.train if e.get("grad_ratio") is not None]
    return [e["step"] for e in entries], [e["grad_ratio"] for e in entries]


def plot_grad_ratio(
    runs: Sequence[RunMetrics], out_png: str | Path
) -> tuple[Path, dict[str, Any]] | None:
    """r_t over training, one curve a run, log scale (Bapna et al., Fig. 1 and 3)."""
    drawn = {r.name: grad_ratio_series(r) for r in runs}
    drawn = {name: series for name, series in drawn.items() if series[0]}
    if not drawn:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, (steps, ratios) in drawn.items():
        ax.plot(steps, ratios, label=name)
    ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel("r_t = ‖∂L/∂h_1‖₂ / ‖∂L/∂h_N‖₂")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    data = {name: {"steps": s, "grad_ratio": r} for name, (s, r) in drawn.items()}
    return _save(fig, out_png), data


def transparent_series(run: RunMetrics) -> tuple[list[int], list[list[list[float]]]]:
    """(steps, s) where the run logged the transparent weights s [N+1 encoder states][decoder
    layers] (each column on the simplex)."""
    entries = [e for e in run.train if e.get("transparent_weights") is not None]
    return [e["step"] for e in entries], [e["transparent_weights"] for e in entries]


def plot_transparent(run: RunMetrics, out_png: str | Path) -> tuple[Path, dict[str, Any]] | None:
    """The transparent weights s_{i,j} of a run: the last logged as a heatmap (rows: encoder
    states h_0 … h_N, columns: decoder layers), and each decoder layer's column over training
    (Bapna et al., Fig. 4)."""
    steps, series = transparent_series(run)
    if not steps:
        return None
    plt = _pyplot()
    last = series[-1]
    states, layers = len(last), len(last[0])
    fig, axes = plt.subplots(1, 1 + layers, figsize=(3.2 * (1 + layers), 3.6), squeeze=False)
    ax = axes[0][0]
    image = ax.imshow(last, cmap="viridis", vmin=0, vmax=1, aspect="auto")
    for i in range(states):
        for j in range(layers):
            ax.text(j, i, f"{last[i][j]:.2f}", ha="center", va="center", fontsize=7, color="w")
    ax.set_xticks(range(layers), [f"dec {j + 1}" for j in range(layers)], fontsize=7)
    ax.set_yticks(range(states), [f"h_{i}" for i in range(states)], fontsize=7)
    ax.set_title(f"s at step {steps[-1]}", fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.046)
    for j in range(layers):
        ax = axes[0][1 + j]
        for i in range(states):  # one colour a state, from h_0 (dark) to h_N (light)
            colour = plt.cm.viridis(i / max(states - 1, 1))
            ax.plot(steps, [s[i][j] for s in series], label=f"h_{i}", color=colour)
        ax.set_title(f"s_(·,{j + 1}) over training", fontsize=9)
        ax.set_xlabel("training step", fontsize=8)
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=6)
    return _save(fig, out_png), {"steps": steps, "last": last}


def disagreement_on(model, batches) -> dict[str, dict[str, list[float]]]:  # type: ignore[no-untyped-def]
    """Li et al.'s three disagreement terms for every module kind and layer, averaged over
    ``batches`` (eval mode, no dropout): kind → term → [per layer]."""
    import torch

    from wtnmt.disagreement import disagreement_scores

    model.eval()
    total: dict[str, dict[str, list[float]]] = {}
    with torch.no_grad():
        for batch in batches:
            out = model(batch.src, batch.tgt_in, need_internals=True)
            scores = disagreement_scores(out.internals)
            for kind, terms in scores.items():
                for term, layers in terms.items():
                    into = total.setdefault(kind, {}).setdefault(term, [0.0] * len(layers))
                    for i, value in enumerate(layers):
                        into[i] += value / len(batches)
    return total


def plot_disagreement(
    per_run: dict[str, dict[str, dict[str, list[float]]]], out_png: str | Path
) -> tuple[Path, dict[str, Any]] | None:
    """Li et al.'s disagreement per layer: one panel per term (rows) and attention kind
    (columns), one line per model (runs named ``<model>-s<seed>``, averaged over seeds)."""
    from wtnmt.analysis.metrics import group_name

    groups: dict[str, list[dict[str, dict[str, list[float]]]]] = {}
    for name, scores in per_run.items():
        groups.setdefault(group_name(name), []).append(scores)
    if not groups:
        return None
    drawn: dict[str, Any] = {}
    for group, members in groups.items():
        first = members[0]
        drawn[group] = {
            kind: {
                term: [
                    sum(m[kind][term][i] for m in members) / len(members)
                    for i in range(len(layers))
                ]
                for term, layers in terms.items()
            }
            for kind, terms in first.items()
        }
    kinds = list(next(iter(drawn.values())))
    terms = list(next(iter(drawn.values()))[kinds[0]])
    plt = _pyplot()
    fig, axes = plt.subplots(
        len(terms), len(kinds), figsize=(3.6 * len(kinds), 2.6 * len(terms)), squeeze=False
    )
    for row, term in enumerate(terms):
        for col, kind in enumerate(kinds):
            ax = axes[row][col]
            for group, scores in drawn.items():
                values = scores[kind][term]
                ax.plot(range(1, len(values) + 1), values, marker="o", label=group)
            ax.set_title(f"{term}, {kind}", fontsize=9)
            ax.set_xlabel("layer", fontsize=8)
            ax.grid(alpha=0.3)
        axes[row][0].set_ylabel("D (−1: heads agree)", fontsize=8)
    axes[0][-1].legend(fontsize=6)
    return _save(fig, out_png), drawn


def dev_batches(run_dir: Path, *, max_tokens: int = 4000, limit: int = 8):  # type: ignore[no-untyped-def]
    """The first ``limit`` batches of the run's dev split in a fixed order, from its prepared
    data (prepared again if it is not there), checked to use the run's own vocabulary."""
    from wtnmt.config import load_config
    from wtnmt.data import ParallelData, plan_batches, prepare
    from wtnmt.data.vocab import vocabularies_sha256, vocabulary_files
    from wtnmt.errors import CheckpointError

    config = load_config(run_dir / "config.yaml")
    directory = config.data.prepared_path()
    prepare(config.data, directory, log=lambda _: None)
    joint = config.data.joint_vocab
    ours = all((run_dir / name).is_file() for name in vocabulary_files(joint))
    if ours and vocabularies_sha256(run_dir, joint) != vocabularies_sha256(directory, joint):
        raise CheckpointError(f"{directory}: its vocabulary is not the one {run_dir} used")
    data = ParallelData(directory, "valid")
    plan = plan_batches(
        data.src_lengths, data.tgt_lengths, max_tokens=max_tokens, seed=0, epoch=0, shuffle=False
    )
    return [data.collate(indices) for indices in plan.batches[:limit]]


__all__ = [
    "dev_batches",
    "disagreement_on",
    "grad_ratio_series",
    "plot_disagreement",
    "plot_grad_ratio",
    "plot_transparent",
    "transparent_series",
]
