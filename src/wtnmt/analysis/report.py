"""`wtnmt analyze RUN [RUN ...]`: the figures of the papers and the tables of numbers behind
them, as PNG files, a Markdown summary (``summary.md``), an HTML report (``report.html``, the
figures linked beside it, nothing fetched) and ``analysis.json``.

Everything is read from what the runs recorded (metrics.jsonl, scores.json, config.yaml) and
their weights; nothing is retrained. What needs decoding (branch weights replaced at test
time, test BLEU at equal steps, the attention maps, the bootstrap) is cached under each run's
``eval/``; ``decode=False`` leaves it out.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wtnmt.analysis import deep, figures
from wtnmt.analysis.runs import Run, with_unique_names
from wtnmt.analysis.table3 import table3, table3_by_sublayer
from wtnmt.analysis.tables import (
    Table,
    groups_table,
    model_pairs,
    runs_table,
    seeds_test_table,
    steps_to_bleu_table,
    too_few_seeds,
)


def _best(runs: list[Run]) -> Run | None:
    """The run of the best dev BLEU (the test split is never used to choose)."""
    scored = [r for r in runs if r.metrics.best_valid is not None]
    return max(scored, key=lambda r: r.metrics.best_valid["valid_bleu"]) if scored else None  # type: ignore[index]


def equal_steps_table(runs: list[Run]) -> Table | None:
    """Test scores of every run at the fewest steps any run made: each run's checkpoint of the
    best dev BLEU among validations up to that step (a faster model is cut back to it)."""
    from wtnmt.analysis.scoring import has_score, score_run

    if len(runs) < 2:
        return None
    limit = min(r.steps for r in runs)
    table = Table(
        f"Test scores at equal update steps ({limit})",
        ["run", "checkpoint step", "dev BLEU there", "test BLEU", "test chrF", "test BLEU lc"],
        note="each run's checkpoint of the best dev BLEU up to the fewest steps any run made",
    )
    for run in runs:
        valid = [v for v in run.metrics.valid if v["step"] <= limit and "valid_bleu" in v]
        best = run.metrics.best_valid
        top = max(valid, key=lambda v: v["valid_bleu"]) if valid else None
        if top is not None and best is not None and top["step"] == best["step"]:
            if run.test("bleu") is not None:  # the run's own weights, scored already
                row = [run.test(k) for k in ("bleu", "chrf", "bleu_lc")]
                table.rows.append([run.name, top["step"], top["valid_bleu"], *row])
                continue
        chosen = None
        for v in sorted(valid, key=lambda v: -v["valid_bleu"]):
            weights = f"checkpoints/step_{v['step']:07d}.safetensors"
            if has_score(run.path, weights=weights):
                chosen = (v, weights)
                break
        if chosen is None:
            table.rows.append([run.name, None, None, None, None, None])
            continue
        v, weights = chosen
        scores = score_run(run.path, weights=weights)
        table.rows.append(
            [
                run.name,
                v["step"],
                v["valid_bleu"],
                scores["bleu"],
                scores["chrf"],
                scores["bleu_lc"],
            ]
        )
    return table


def bootstrap_table(runs: list[Run], samples: int = 1000) -> Table | None:
    """Paired bootstrap of each model's best seed (by dev BLEU) against the first model's."""
    from wtnmt.analysis.scoring import bootstrap

    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.group, []).append(run)
    best = [b for b in (_best(g) for g in groups.values()) if b is not None]
    if len(best) < 2:
        return None
    table = Table(
        f"Paired bootstrap on the test split ({samples} samples), best seeds by dev BLEU",
        ["run", "BLEU ± 95% CI", "baseline", "baseline BLEU ± 95% CI", "p"],
        note="sacreBLEU's paired bootstrap resampling (Koehn, 2004); p: the probability of "
        "the difference under the null hypothesis",
    )
    for run in best[1:]:
        r = bootstrap(run.path, best[0].path, samples=samples)
        table.rows.append(
            [
                run.name,
                f"{r['bleu']:.2f} ± {r['ci95']:.2f}",
                best[0].name,
                f"{r['baseline_bleu']:.2f} ± {r['baseline_ci95']:.2f}",
                f"{r['p_value']:.4f}",
            ]
        )
    return table


def disagreement_table(runs: list[Run]) -> tuple[Table, dict[str, Any]] | None:
    """Li et al.'s disagreement of subspace, position and output for each attention kind
    (the mean over layers; per layer in analysis.json), on the first dev batches."""
    from wtnmt.rundir import load_run

    table = Table(
        "Disagreement of attention heads (Li et al., Table 4), mean over layers",
        ["run", "attention", "subspace", "position", "output"],
        note="on the first 8 dev batches (≤ 4,000 tokens each), eval mode; each term in "
        "[−1, 0]: −1 when all heads agree, −1/H for orthogonal heads or disjoint positions; "
        "a Weighted Transformer's branches are its heads",
    )
    per_layer: dict[str, Any] = {}
    for run in runs:
        if not (run.path / "model.safetensors").is_file():
            continue
        _, _, model = load_run(run.path)
        scores = deep.disagreement_on(model, deep.dev_batches(run.path))
        per_layer[run.name] = scores
        for kind, terms in scores.items():
            means = [sum(terms[t]) / len(terms[t]) for t in ("subspace", "position", "output")]
            table.rows.append([run.name, kind, *[f"{m:.4f}" for m in means]])
    return (table, per_layer) if per_layer else None


def attention_figure(run: Run, sentence: int, out: Path) -> Path | None:
    from wtnmt.analysis.scoring import split_pairs
    from wtnmt.decode.translator import Translator

    if not (run.path / "model.safetensors").is_file():  # a clone of committed results
        return None
    translator = Translator.load(run.path)
    src, _refs = split_pairs(run.path, "test")
    if not 0 <= sentence < len(src):
        return None
    ids = translator.encode([src[sentence]])
    produced = translator.translate_ids(ids)[0][0]
    layers = translator.cross_attention(ids, [produced.ids])[0]
    return figures.plot_attention(
        layers,
        [*translator.pieces(ids[0], source=True), "</s>"],
        [*translator.pieces(produced.ids), "</s>"],
        out / f"attention-{run.slug}.png",
        title=f"{run.name}, test sentence {sentence}: {src[sentence]!r} → {produced.text!r}",
    )


REPORT_MARK = ".wtnmt-analysis"  # in every directory analyze writes into


def made_by_analyze(directory: Path) -> bool:
    """Whether ``directory`` is a report of ours: its mark, or (a report from before the
    mark) an ``analysis.json`` that analyze wrote."""
    if (directory / REPORT_MARK).is_file():
        return True
    try:
        kept = json.loads((directory / "analysis.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(kept, dict) and {"runs", "tables", "figures"} <= kept.keys()


def check_report_directory(out: Path) -> None:
    """Refuse, before any work, an ``out`` that is not ours to write into: a file, or a
    directory with files that analyze did not make (its summary.md, PNGs would replace a
    user's)."""
    from wtnmt.config import ConfigError
    from wtnmt.safe_files import file_in_the_way

    blocked = file_in_the_way(out)
    if blocked == out:
        raise ConfigError(f"--out {out}: is a file; --out names the report's directory")
    if blocked is not None:
        raise ConfigError(f"--out {out}: {blocked} is a file, not a directory")
    if out.is_dir() and any(out.iterdir()) and not made_by_analyze(out):
        raise ConfigError(
            f"--out {out}: this directory was not made by wtnmt analyze and is not empty; "
            f"refusing to write into it: give --out a new or empty directory"
        )


@dataclass
class _Report:
    """What an analysis collects: its figures (caption, file), its tables and the numbers
    behind the figures that carry them."""

    out: Path
    say: Callable[[str], None]
    pictures: list[tuple[str, Path]] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    drawn: dict[str, Any] = field(default_factory=dict)

    def draw(self, caption: str, path: Path | None) -> None:
        if path is not None:
            self.pictures.append((caption, path))
            self.say(f"  {path}")

    def draw_with_data(self, caption: str, made: tuple[Path, Any] | None) -> None:
        if made is not None:
            self.draw(caption, made[0])
            self.drawn[made[0].name] = made[1]


def analyze(
    run_dirs: list[str | Path],
    out: str | Path,
    *,
    target_bleu: float | None = None,
    window: int = 1,
    random_seeds: int = 3,
    sentence: int = 0,
    decode: bool = True,
    pairs: Sequence[str] = (),
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The papers' figures and tables of ``run_dirs`` (the first run is the reference) into
    the report directory ``out``; ``decode`` also measures what needs the weights; ``pairs``
    (``MODEL:BASELINE``) are tested across seeds beside each model against the first's.
    Test BLEU is of the tokenization ``scoring.scored_with`` sets (13a unless), recorded."""
    out = Path(out)
    check_report_directory(out)
    from wtnmt.analysis.scoring import with_test_score

    runs = with_unique_names([Run.load(p) for p in run_dirs])
    models = list(dict.fromkeys(r.group for r in runs))
    tested = model_pairs(list(pairs), models, "--pair")  # checked before anything decodes
    runs = [with_test_score(r, decode) for r in runs]
    out.mkdir(parents=True, exist_ok=True)
    (out / REPORT_MARK).write_text("written by wtnmt analyze\n", encoding="utf-8")
    report = _Report(out, say)
    say(f"analyzing {len(runs)} run{'s' * (len(runs) != 1)} → {out}")
    _draw_curves(report, runs, window)
    report.tables += [runs_table(runs), groups_table(runs)]
    across_seeds = seeds_test_table(runs, tested)
    if across_seeds is not None:
        report.tables.append(across_seeds)
    for model, baseline, n, k in too_few_seeds(runs, tested):
        say(f"--pair {model}:{baseline}: not tested, {n} + {k} seeds (a test needs two a side)")
    first_best = runs[0].metrics.best_valid if runs else None
    target = target_bleu if target_bleu is not None else (first_best or {}).get("valid_bleu")
    if target is not None:
        table, rows = steps_to_bleu_table(runs, target)
        report.tables.append(table)
        report.draw(
            "Steps and seconds to the target dev BLEU",
            figures.plot_steps_to_bleu(rows, target, out / "steps_to_bleu.png"),
        )
    branch_weights = table3(runs, random_seeds, decode)  # the kept decodings without decode
    by_sublayer = table3_by_sublayer(runs)  # what evaluate --branch-weights-in kept
    report.tables.extend(t for t in (branch_weights, by_sublayer) if t is not None)
    if decode:
        _measure_with_weights(report, runs, sentence=sentence)
    return _write(report, runs, target)


def _draw_curves(report: _Report, runs: list[Run], window: int) -> None:
    """The figures the metrics alone give: validation curves, Fig. 2, κ/α (Fig. 3), r_t and
    the transparent weights."""
    out, metrics = report.out, [r.metrics for r in runs]
    report.draw(
        "Dev BLEU and dev loss against steps and seconds",
        figures.plot_validation(metrics, out / "validation.png"),
    )
    report.draw(
        "Validation against training loss (paper Fig. 2)",
        figures.plot_loss_vs_loss(metrics, out / "loss_vs_loss.png"),
    )
    for run in runs:
        report.draw(
            f"κ and α over training, {run.name} (paper Fig. 3)",
            figures.plot_branch_weights(
                run.metrics, out / f"kappa_alpha-{run.slug}.png", window=window
            ),
        )
    report.draw_with_data(
        "Gradient-norm ratio r_t over training (Bapna et al., Fig. 1/3)",
        deep.plot_grad_ratio(metrics, out / "grad_ratio.png"),
    )
    for run in runs:
        report.draw_with_data(
            f"Transparent attention weights s, {run.name} (Bapna et al., Fig. 4)",
            deep.plot_transparent(run.metrics, out / f"transparent-{run.slug}.png"),
        )


def _measure_with_weights(report: _Report, runs: list[Run], *, sentence: int) -> None:
    """The attention maps, the disagreement scores, equal-step scores and the paired
    bootstrap: what needs the runs' weights (or their cached decodings)."""
    weighted = _best([r for r in runs if r.weighted])
    if weighted is not None:
        report.draw(
            f"Cross-attention of each branch, {weighted.name}",
            attention_figure(weighted, sentence, report.out),
        )
    scores = disagreement_table(runs)
    if scores is not None:
        report.tables.append(scores[0])
        report.drawn["disagreement"] = scores[1]
        report.draw_with_data(
            "Disagreement of attention heads per layer (Li et al., Tables 4–5)",
            deep.plot_disagreement(scores[1], report.out / "disagreement.png"),
        )
    for table in (equal_steps_table(runs), bootstrap_table(runs)):
        if table is not None:
            report.tables.append(table)


def _write(report: _Report, runs: list[Run], target: float | None) -> dict[str, Any]:
    from wtnmt.analysis.scoring import current_tokenize

    out, tables, pictures = report.out, report.tables, report.pictures
    result = {
        "runs": [str(r.path) for r in runs],
        "target_bleu": target,
        "tokenize": current_tokenize(),
        "tables": [t.as_dict() for t in tables],
        "figures": [{"caption": c, "file": p.name} for c, p in pictures],
        "data": report.drawn,
    }
    (out / "analysis.json").write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    (out / "summary.md").write_text(render_markdown(tables, pictures), encoding="utf-8")
    (out / "report.html").write_text(render_html(tables, pictures), encoding="utf-8")
    report.say(f"  {out / 'summary.md'}\n  {out / 'report.html'}")
    return result


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):  # scores and ratios to 2 decimals; counts, ms and seconds whole
        if 0 < abs(value) < 0.005:  # a p of 0.0004 is not 0.00: one significant digit
            return f"{value:.1g}"
        return f"{value:.2f}" if abs(value) < 100 else f"{value:,.0f}"
    return str(value)


def render_markdown(tables: list[Table], pictures: list[tuple[str, Path]]) -> str:
    lines = ["# wtnmt analyze", ""]
    for t in tables:
        lines += [f"## {t.title}", "", "| " + " | ".join(t.headers) + " |"]
        lines.append("|" + "---|" * len(t.headers))
        lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in t.rows]
        lines += ["", f"_{t.note}_", ""] if t.note else [""]
    for caption, path in pictures:
        lines += [f"![{caption}]({path.name})", f"_{caption}_", ""]
    return "\n".join(lines)


def render_html(tables: list[Table], pictures: list[tuple[str, Path]]) -> str:
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>wtnmt analyze</title><style>",
        "body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}",
        "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;",
        "padding:.2em .6em;text-align:right}th{background:#f4f4f4}td:first-child{text-align:left}",
        "img{max-width:100%}.note{color:#666;font-size:.9em}</style></head><body>",
        "<h1>wtnmt analyze</h1>",
    ]
    for t in tables:
        parts.append(f"<h2>{html.escape(t.title)}</h2><table><tr>")
        parts += [f"<th>{html.escape(h)}</th>" for h in t.headers]
        parts.append("</tr>")
        for row in t.rows:
            parts.append(
                "<tr>" + "".join(f"<td>{html.escape(_cell(c))}</td>" for c in row) + "</tr>"
            )
        parts.append("</table>")
        if t.note:
            parts.append(f"<p class='note'>{html.escape(t.note)}</p>")
    for caption, path in pictures:  # linked, beside the page: a copy inside it would
        # double the report's size in every repository that keeps the figures
        parts.append(
            f"<h2>{html.escape(caption)}</h2><img alt='{html.escape(caption)}' "
            f"src='{html.escape(path.name)}'>"
        )
    parts.append("</body></html>\n")
    return "\n".join(parts)


__all__ = ["analyze", "render_html", "render_markdown"]
