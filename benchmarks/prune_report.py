"""The pruning sweep's report: its table (results.md) and its figure (bleu_vs_branches.png),
written from results.json by benchmarks/prune_sweep.py; run alone, it rewrites both from a
results.json already there:

    python benchmarks/prune_report.py experiments/pruning/NAME
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _speed(results: dict[str, Any], row: dict[str, Any], search: str) -> float:
    full = results["full"]
    reference = (full["before"][search]["tokens_per_s"] + full["after"][search]["tokens_per_s"]) / 2
    return row[search]["tokens_per_s"] / reference


def write_table(results: dict[str, Any], path: Path) -> None:
    full = results["full"]["before"]
    lines = [
        f"Pruning {results['run']} ({results['weights']}); test split, "
        f"{results['sentences']} sentences; {results['threads']} threads; {results['machine']}",
        "",
        f"Spearman's ρ between κ·α and measured importance: "
        f"{results['spearman_kappa_alpha_importance']['all']} over all branches, "
        f"{results['spearman_kappa_alpha_importance']['within']} within a sublayer (mean).",
        "",
        "| criterion | budget | branches | fine-tune | BLEU beam | chrF beam | BLEU greedy | "
        "parameters | beam speed | greedy speed |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| (none) | all | {results['sublayers'] * results['branches_per_sublayer']} | - | "
        f"{full['beam']['bleu']} | {full['beam']['chrf']} | {full['greedy']['bleu']} | "
        f"{full['parameters']:,} | 1.00× | 1.00× |",
    ]
    for r in results["points"]:
        budget = f"{r['n']} a layer" if r["budget"] == "keep" else f"{r['n']} in all"
        lines.append(
            f"| {r['criterion']} | {budget} | {r['branches']} | {r['fine_tune'] or '-'} | "
            f"{r['beam']['bleu']} | {r['beam']['chrf']} | {r['greedy']['bleu']} | "
            f"{r['parameters']:,} | {_speed(results, r, 'beam'):.2f}× | "
            f"{_speed(results, r, 'greedy'):.2f}× |"
        )
    forced = results.get("speed_forced")
    if forced:
        lines += [
            "",
            f"Decoding speed of the architecture alone: every output forced to "
            f"{forced['length']} tokens (the same work whatever the weights), the test "
            f"sources in batches of 32, models interleaved over {forced['rounds']} rounds, "
            f"medians; pruned by importance.",
            "",
            f"| branches a layer | parameters | greedy tok/s | beam {forced['beam']} tok/s | "
            f"greedy | beam {forced['beam']} |",
            "|---|---|---|---|---|---|",
        ]
        m = results["branches_per_sublayer"]
        for name, speed in forced["tokens_per_s"].items():
            kept = m if name == "full" else int(name.removeprefix("keep"))
            lines.append(
                f"| {kept} | {forced['parameters'][name]:,} | {speed['greedy']:,.0f} | "
                f"{speed['beam']:,.0f} | {speed['greedy_ratio']:.2f}× | "
                f"{speed['beam_ratio']:.2f}× |"
            )
    path.write_text("\n".join(lines) + "\n")


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    colours = {"importance": "tab:blue", "kappa-alpha": "tab:orange", "random": "tab:gray"}
    total = results["sublayers"] * results["branches_per_sublayer"]
    full = results["full"]["before"]["beam"]["bleu"]
    for criterion, colour in colours.items():
        for budget, fine_tune, style, marker, label in (
            ("keep", False, "-", "o", "a layer"),
            ("keep", True, "--", "s", "a layer, fine-tuned"),
            ("keep_total", False, "none", "^", "in all"),
        ):
            points = sorted(
                (r["branches"], r["beam"]["bleu"])
                for r in results["points"]
                if r["criterion"] == criterion
                and r["budget"] == budget
                and bool(r["fine_tune"]) == fine_tune
            )
            if budget == "keep" and not fine_tune and points[-1][0] < total:
                points.append((total, full))  # the unpruned model, where every line starts
            if points:
                ax.plot(
                    *zip(*points, strict=True),
                    linestyle=style,
                    marker=marker,
                    color=colour,
                    label=f"{criterion}, {label}",
                )
    ax.set_xlabel(f"branches kept (of {total})")
    ax.set_ylabel("test BLEU (beam)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="a sweep's folder, holding its results.json")
    out = parser.parse_args().out
    try:
        data = json.loads((out / "results.json").read_text())
    except (OSError, ValueError) as e:
        print(f"prune_report: {out / 'results.json'}: cannot read it ({e})", file=sys.stderr)
        return 2
    write_table(data, out / "results.md")
    plot(data, out / "bleu_vs_branches.png")
    print(f"wrote {out}/results.md, bleu_vs_branches.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
