#!/usr/bin/env python3
"""Branch pruning measured: test BLEU and chrF against the branches kept, for the three
criteria of `wtnmt prune` (importance, kappa-alpha, random), with and without a fine-tune;
decoding speed (greedy and beam) and parameters at each point.

    python benchmarks/prune_sweep.py RUN --out experiments/pruning/NAME \\
        [--weights average-last10.safetensors] [--fine-tune 300] [--threads 2]

Every point is a real `wtnmt prune` output (prune_run, the command's code path), written
under --work (default: a temporary directory; weights are not kept) and decoded by the
Translator as `wtnmt translate` decodes: beam search as the run's config says (beam 5 and
fairseq's length normalization for the Multi30k presets, beam 4 for the demo) and greedy, on
the test split of the run's corpus, 2 threads, sentences sorted and batched as the Translator
batches them; each search timed three times, the median kept. Importance is measured once (one
dev pass a branch) and reused by every budget. Budgets: 4, 3, 2, 1 branches a layer, and over
the model 3/4, 1/2 and 3/8 of the branches (at least one a layer). Speeds are reported against
the unpruned model's, measured before and after the sweep (the mean of the two), since this
machine's speed drifts. The fine-tune is `wtnmt prune --fine-tune`'s, on the per-layer budgets
of --fine-tune-keep. Also reported: Spearman's ρ between κ·α and the measured importance.

Writes OUT/results.json, OUT/results.md (the table) and OUT/bleu_vs_branches.png.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from wtnmt.analysis.scoring import split_pairs  # noqa: E402
from wtnmt.decode.evaluate import score_corpus  # noqa: E402
from wtnmt.decode.translator import Translator  # noqa: E402
from wtnmt.model import count_parameters  # noqa: E402
from wtnmt.prune.criteria import importance_scores, kappa_alpha_scores, random_scores  # noqa: E402
from wtnmt.prune.run import dev_loss_of, prune_run  # noqa: E402
from wtnmt.rundir import load_run  # noqa: E402
from wtnmt.runtime import machine_line, tune_cpu_allocator  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from prune_report import plot, write_table  # noqa: E402

CRITERIA = ("importance", "kappa-alpha", "random")


def decode(
    run: Path, weights: str, sources: list[str], refs: list[str], threads: int, rounds: int = 3
) -> dict[str, Any]:
    """Scores and seconds of beam (the run's settings) and greedy search over the split."""
    torch.set_num_threads(threads)  # (as asked, whatever a fine-tune before set)
    translator = Translator.load(run, weights=weights, say=lambda m: None)
    beam = translator.config.decode.beam
    row: dict[str, Any] = {"parameters": count_parameters(translator.model)}
    for name, width in (("beam", beam), ("greedy", 1)):
        times = []
        for _ in range(rounds):
            start = time.perf_counter()
            hyps = translator.translate(sources, beam=width)
            times.append(time.perf_counter() - start)
        seconds = statistics.median(times)
        scores = score_corpus(hyps, refs)
        tokens = sum(len(ids) + 1 for ids in translator.vocab.target.encode(hyps))  # EOS counted
        row[name] = {
            "bleu": scores["bleu"],
            "chrf": scores["chrf"],
            "seconds": round(seconds, 2),
            "tokens_per_s": round(tokens / seconds, 1),
        }
    row["beam_size"] = beam
    return row


LENGTH = 24  # output tokens forced a sentence in the speed rounds


def architecture_speed(
    models: dict[str, torch.nn.Module], inputs: list[torch.Tensor], *, beam: int, rounds: int
) -> dict[str, dict[str, float]]:
    """Output tokens/s of greedy and beam search with every output forced to LENGTH tokens
    (the same work whatever the weights, as benchmarks/decode_speed.py forces it), the models
    interleaved round by round; medians, and each against the first model's."""
    from wtnmt.decode.search import beam_search, greedy_search

    speeds: dict[str, dict[str, list[float]]] = {n: {"greedy": [], "beam": []} for n in models}
    with torch.no_grad():
        for _ in range(rounds):
            for name, model in models.items():
                for search in ("greedy", "beam"):
                    start = time.perf_counter()
                    for src in inputs:
                        if search == "greedy":
                            greedy_search(model, src, min_len=LENGTH, max_len=LENGTH)
                        else:
                            beam_search(model, src, beam=beam, min_len=LENGTH, max_len=LENGTH)
                    tokens = LENGTH * sum(len(src) for src in inputs)
                    speeds[name][search].append(tokens / (time.perf_counter() - start))
    first = next(iter(models))
    out = {}
    for name, by in speeds.items():
        out[name] = {s: round(statistics.median(v), 1) for s, v in by.items()}
        for s in ("greedy", "beam"):
            ratio = statistics.median(by[s]) / statistics.median(speeds[first][s])
            out[name][f"{s}_ratio"] = round(ratio, 3)
    return out


def speed_inputs(translator: Translator, sources: list[str]) -> list[torch.Tensor]:
    """The sources as the Translator encodes them, sorted by length, 32 a batch."""
    from wtnmt.special import EOS, PAD

    ids = sorted(([*row, EOS] for row in translator.vocab.source.encode(sources)), key=len)
    batches = []
    for start in range(0, len(ids), 32):
        rows = ids[start : start + 32]
        src = torch.full((len(rows), max(map(len, rows))), PAD, dtype=torch.long)
        for r, row in enumerate(rows):
            src[r, : len(row)] = torch.tensor(row)
        batches.append(src)
    return batches


def budgets(sublayers: int, branches: int) -> list[tuple[str, int]]:
    total = sublayers * branches
    per_layer = [("keep", k) for k in range(branches, 0, -1)]
    overall = {max(sublayers, round(total * f)) for f in (3 / 4, 1 / 2, 3 / 8)}
    return per_layer + [("keep_total", n) for n in sorted(overall, reverse=True)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="where the results go")
    parser.add_argument("--work", type=Path, help="where the pruned runs go (default: temp)")
    parser.add_argument("--weights", default="model.safetensors")
    parser.add_argument("--fine-tune", type=int, default=0, metavar="STEPS")
    parser.add_argument(
        "--fine-tune-keep",
        default="3,2,1",
        help="the per-layer budgets fine-tuned, comma-separated (default 3,2,1)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1, help="the random criterion's draw")
    parser.add_argument(
        "--speed-only",
        action="store_true",
        help="time the per-layer budgets' models (pruned by importance, in --work) against "
        "the full one, outputs forced to 24 tokens, rounds interleaved; into OUT's JSON",
    )
    parser.add_argument("--rounds", type=int, default=5, help="--speed-only's rounds (median)")
    parser.add_argument(
        "--beam", type=int, help="--speed-only's beam width (default: the run's decode.beam)"
    )
    parser.add_argument(
        "--timing-rounds", type=int, default=3, help="decodes timed a point (median; 3)"
    )
    parser.add_argument(
        "--plot-only", action="store_true", help="redraw OUT's table and figure from its JSON"
    )
    args = parser.parse_args()
    tune_cpu_allocator()  # as `wtnmt prune` and `wtnmt translate` run
    if args.speed_only:
        return speed_only(args)
    if args.plot_only:
        results = json.loads((args.out / "results.json").read_text())
        write_table(results, args.out / "results.md")
        plot(results, args.out / "bleu_vs_branches.png")
        return 0
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="prune-sweep-"))
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731

    config, _, model = load_run(args.run, weights=args.weights)
    model.eval()
    sources, refs = split_pairs(args.run, "test")
    start = time.perf_counter()
    base, importance = importance_scores(model, dev_loss_of(config, args.run, model, say))
    importance_seconds = time.perf_counter() - start
    measured = {
        "importance": (importance, base),
        "kappa-alpha": (kappa_alpha_scores(model), None),
        "random": (random_scores(model, args.seed), None),
    }
    sublayers, branches = len(importance), config.model.heads
    say(f"importance measured in {importance_seconds:.0f} s (dev NLL {base:.4f})")

    full_before = decode(args.run, args.weights, sources, refs, args.threads, args.timing_rounds)
    say(f"full model: {json.dumps(full_before)}")
    rows: list[dict[str, Any]] = []
    tuned_keeps = {int(k) for k in args.fine_tune_keep.split(",") if k}
    for kind, n in budgets(sublayers, branches):
        for criterion in CRITERIA:
            if kind == "keep" and n == branches and criterion != "importance":
                continue  # every criterion keeps everything
            steps = [0]
            if args.fine_tune and kind == "keep" and n in tuned_keeps:
                steps.append(args.fine_tune)
            for fine_tune in steps:
                name = f"{criterion}-{kind}{n}-ft{fine_tune}"
                out = work / name
                if (out / "prune.json").is_file():  # made by an earlier call: reused
                    summary = json.loads((out / "prune.json").read_text())
                else:
                    if out.is_dir():  # this sweep's own, left unfinished by a stopped call
                        shutil.rmtree(out)
                    summary = prune_run(
                        args.run,
                        out,
                        criterion=criterion,
                        keep=n if kind == "keep" else None,
                        keep_total=n if kind == "keep_total" else None,
                        weights=args.weights,
                        seed=args.seed,
                        fine_tune=fine_tune,
                        log=lambda m: None,
                        measured=measured[criterion],
                    )
                row = decode(
                    out, "model.safetensors", sources, refs, args.threads, args.timing_rounds
                )
                row.update(
                    criterion=criterion,
                    budget=kind,
                    n=n,
                    fine_tune=fine_tune,
                    branches=summary["branches"]["after"],
                    removed=summary["removed"],
                )
                rows.append(row)
                say(
                    f"{name}: {row['branches']} branches, BLEU {row['beam']['bleu']} "
                    f"(greedy {row['greedy']['bleu']}), beam {row['beam']['tokens_per_s']} tok/s"
                )
    full_after = decode(args.run, args.weights, sources, refs, args.threads, args.timing_rounds)
    results = {
        "run": str(args.run),
        "weights": args.weights,
        "machine": machine_line(),
        "threads": args.threads,
        "sentences": len(sources),
        "sublayers": sublayers,
        "branches_per_sublayer": branches,
        "dev_nll": base,
        "importance_seconds": round(importance_seconds, 1),
        "spearman_kappa_alpha_importance": agreement(importance, measured["kappa-alpha"][0]),
        "scores": {
            c: {f"{side}{i}": v for (side, i), v in m[0].items()} for c, m in measured.items()
        },
        "full": {"before": full_before, "after": full_after},
        "points": rows,
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    write_table(results, args.out / "results.md")
    plot(results, args.out / "bleu_vs_branches.png")
    say(f"wrote {args.out}/results.json, results.md, bleu_vs_branches.png")
    return 0


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties)."""

    def ranks(xs: list[float]) -> torch.Tensor:
        x = torch.tensor(xs, dtype=torch.float64)
        r = torch.empty_like(x)
        r[x.argsort()] = torch.arange(len(xs), dtype=torch.float64)
        for value in x.unique():  # ties share their mean rank
            tied = x == value
            r[tied] = r[tied].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def agreement(importance: dict, kappa_alpha: dict) -> dict[str, float]:
    """How far κ·α orders the branches as their measured importance does: Spearman's ρ over
    all branches, and its mean within each sublayer."""
    keys = list(importance)
    flat_i = [v for k in keys for v in importance[k]]
    flat_k = [v for k in keys for v in kappa_alpha[k]]
    within = [spearman(importance[k], kappa_alpha[k]) for k in keys]
    mean_within = sum(within) / len(within)
    return {"all": round(spearman(flat_i, flat_k), 3), "within": round(mean_within, 3)}


def speed_only(args: argparse.Namespace) -> int:
    torch.set_num_threads(args.threads)
    results = json.loads((args.out / "results.json").read_text())
    full = Translator.load(args.run, weights=args.weights, say=lambda m: None)
    sources, _ = split_pairs(args.run, "test")
    models = {"full": full.model}
    for k in range(results["branches_per_sublayer"] - 1, 0, -1):
        models[f"keep{k}"] = Translator.load(args.work / f"importance-keep{k}-ft0").model
    inputs = speed_inputs(full, sources)
    beam = args.beam or full.config.decode.beam
    architecture_speed(models, inputs[:2], beam=beam, rounds=1)  # warm-up
    results["speed_forced"] = {
        "length": LENGTH,
        "rounds": args.rounds,
        "beam": beam,
        "tokens_per_s": architecture_speed(models, inputs, beam=beam, rounds=args.rounds),
        "parameters": {n: count_parameters(m) for n, m in models.items()},
    }
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    write_table(results, args.out / "results.md")
    print(json.dumps(results["speed_forced"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
