"""Paper Table 3 over every Weighted Transformer analyzed, and over each model's seeds: the test
BLEU of the weights a run was scored with (its ``scores.json``: the best dev BLEU's, or the
mean of its last N checkpoints as a grid scores), with κ, α as learned, uniform (1/M) and
random (seeds 1…N).

Each decoding is kept in the run's ``eval/`` (``scoring.score_run``); a grid keeps them there
as soon as a run is scored, while its weights exist. Where the weights are gone (a clone of
committed results) or decoding is not asked for, a run shows the decodings it kept.

Table 3 a sublayer at a time (κ, α replaced in some sublayers, the rest as learned) is read
from the scores ``wtnmt evaluate --branch-weights-in`` kept in the same ``eval/``: nothing is
decoded for it here.
"""

from __future__ import annotations

import json
from typing import Any

from wtnmt.analysis.metrics import mean_sd
from wtnmt.analysis.runs import Run
from wtnmt.analysis.tables import Table


def learns_branch_weights(run: Run) -> bool:
    """A Weighted Transformer whose κ, α were trained (``fixed`` holds them at 1/M: uniform
    is what it has)."""
    return run.weighted and run.config.get("model", {}).get("branch_weights") != "fixed"


def _scored_with(run: Run) -> dict[str, Any]:
    """The split, beam and weights of the run's test score (the best dev BLEU's weights and
    the config's beam where it has none)."""
    test = (run.scores or {}).get("test") or {}
    return {
        "split": "test",
        "beam": test.get("beam"),
        "weights": test.get("weights", "model.safetensors"),
    }


def table3_row(run: Run, random_seeds: int, decode: bool) -> dict[str, Any]:
    """One run's row: its learned, uniform and random test BLEU (None where not decoded);
    ``random`` holds the draws found, by seed."""
    from wtnmt.analysis.scoring import kept_or_decoded

    how = _scored_with(run)
    test = (run.scores or {}).get("test") or {}
    learned = test.get("bleu")
    if learned is None:
        learned = (kept_or_decoded(run.path, decode, **how) or {}).get("bleu")
    uniform = kept_or_decoded(run.path, decode, branch_weights="uniform", **how)
    draws = {s: kept_or_decoded(run.path, decode, branch_weights="random", seed=s, **how)
             for s in range(1, random_seeds + 1)}  # fmt: skip
    return {
        "run": run.name,
        "weights": how["weights"],
        "learned": learned,
        "uniform": None if uniform is None else uniform["bleu"],
        "random": {s: d["bleu"] for s, d in draws.items() if d is not None},
    }


HEADERS = ("run", "weights", "learned", "uniform", "random", "draws", "uniform − learned",
           "random − learned")  # fmt: skip


def _spread(values: list[float]) -> str | None:
    if not values:
        return None
    mean, sd = mean_sd(values)
    return f"{mean:.2f}" + (f" ± {sd:.2f}" if len(values) > 1 else "")


def _less(value: float | None, learned: float | None) -> float | None:
    return None if value is None or learned is None else round(value - learned, 2)


def table3(runs: list[Run], random_seeds: int, decode: bool) -> Table | None:
    """Paper Table 3: a row for each run that learned κ, α and a row for each model's mean
    over its seeds (where two or more have every column); None where no run has any."""
    rows = [table3_row(r, random_seeds, decode) for r in runs
            if learns_branch_weights(r)]  # fmt: skip
    rows = [r for r in rows if r["uniform"] is not None or r["random"]]
    if not rows:
        return None
    table = Table(
        "Branch weights at test time (paper Table 3)",
        [*HEADERS],
        note=f"test BLEU of the weights each run was scored with, κ and α as learned, "
        f"replaced by 1/M, or drawn at random (seeds 1–{random_seeds}; mean ± sd over the "
        "draws found); a model's row: the mean ± sd over its seeds of each run's figure",
    )
    groups: dict[str, list[dict[str, Any]]] = {}
    by_name = {r.name: r for r in runs}
    for row in rows:
        randoms = list(row["random"].values())
        mean_random = sum(randoms) / len(randoms) if randoms else None
        row["random_mean"] = mean_random
        table.rows.append(
            [
                row["run"],
                row["weights"],
                row["learned"],
                row["uniform"],
                _spread(randoms),
                len(randoms),
                _less(row["uniform"], row["learned"]),
                _less(mean_random, row["learned"]),
            ]
        )
        groups.setdefault(by_name[row["run"]].group, []).append(row)
    for name, members in groups.items():
        whole = [m for m in members if None not in (m["learned"], m["uniform"], m["random_mean"])]
        if len(whole) < 2 or len(whole) != len(members):
            continue
        table.rows.append(
            [
                f"{name} ({len(whole)} seeds)",
                None,
                _spread([m["learned"] for m in whole]),
                _spread([m["uniform"] for m in whole]),
                _spread([m["random_mean"] for m in whole]),
                sum(len(m["random"]) for m in whole),
                _spread([m["uniform"] - m["learned"] for m in whole]),
                _spread([m["random_mean"] - m["learned"] for m in whole]),
            ]
        )
    return table


def _of_scored_test(run: Run, scores: dict[str, Any]) -> bool:
    """Whether ``scores`` (an evaluation `wtnmt evaluate` kept) decoded the run's test split
    as the run's test score did: its weights and beam, the PyTorch engine in float32, the
    run's length penalty."""
    how, decode = _scored_with(run), run.config.get("decode") or {}
    source = scores.get("source") or {}
    own_split = scores.get("run_split") == "test" or (
        source.get("split") == "test"
        and source.get("corpus") is not None
        and source.get("corpus") == (run.config.get("data") or {}).get("corpus")
    )
    alpha, form = decode.get("length_penalty", 0.6), decode.get("length_penalty_form", "gnmt")
    penalty = scores.get("length_penalty") or {"alpha": alpha, "form": form}  # older: unsaid
    return (
        own_split
        and scores.get("weights") == how["weights"]
        and (how["beam"] is None or scores.get("beam") == how["beam"])
        and scores.get("quantize", "none") == "none"
        and scores.get("engine", "pytorch") == "pytorch"
        and (penalty.get("alpha"), penalty.get("form")) == (alpha, form)
    )


def table3_by_sublayer(runs: list[Run]) -> Table | None:
    """Paper Table 3 a sublayer at a time: each evaluation of a run's scored weights on its test
    split with κ, α replaced in the named sublayers alone (`wtnmt evaluate
    --branch-weights-in`), against the run's learned score; None where no run has one."""
    table = Table(
        "Branch weights at test time, a sublayer at a time",
        ["run", "κ, α", "replaced in", "test BLEU", "− learned"],
        note="κ and α replaced (uniform, or a random draw of its seed) in the sublayers named, "
        "the rest as learned; the weights, split and decoding of each run's test score; read "
        "from what `wtnmt evaluate --branch-weights-in` kept in the run's eval/",
    )
    for run in runs:
        if not learns_branch_weights(run) or not (run.path / "eval").is_dir():
            continue
        learned = ((run.scores or {}).get("test") or {}).get("bleu")
        rows = []
        for path in (run.path / "eval").glob("*.scores.json"):
            try:
                scores = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if not isinstance(scores, dict) or not scores.get("branch_weights_in"):
                continue
            if not _of_scored_test(run, scores) or scores.get("bleu") is None:
                continue
            names = list(scores["branch_weights_in"])
            kind = scores.get("branch_weights", "?")
            kind += f" (seed {scores['seed']})" if scores.get("seed") is not None else ""
            rows.append((kind, len(names), names, scores["bleu"]))
        for kind, _, names, bleu in sorted(rows):
            table.rows.append([run.name, kind, " + ".join(names), bleu, _less(bleu, learned)])
    return table if table.rows else None


__all__ = ["learns_branch_weights", "table3", "table3_by_sublayer", "table3_row"]
