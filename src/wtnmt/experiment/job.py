"""One run of a grid, in a process of its own (``python -m wtnmt.experiment.job SPEC``): train
(new or resumed), then score the weights on the corpus's test split into ``scores.json`` and,
where the grid's ``analyze.random_seeds`` asks for it, paper Table 3 of a Weighted Transformer.

A process per run gives each its own threads, and a run that fails or is killed takes nothing
else with it: the runner sees its exit status and the run directory keeps its checkpoints.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from wtnmt import interrupt
from wtnmt.analysis.metrics import RunMetrics
from wtnmt.analysis.scoring import branch_weight_ablation, score_run
from wtnmt.config import load_config
from wtnmt.experiment.plan import scored, write_finished
from wtnmt.rundir import atomic_write


def training_summary(run_dir: Path) -> dict[str, Any]:
    """What the run's metrics say of its training: steps, seconds of updates, throughput,
    and the best dev BLEU with its step."""
    run = RunMetrics.load(run_dir)
    best = run.best_valid
    rate = run.tokens_per_second()
    return {
        "steps": run.train[-1]["step"] if run.train else 0,
        "train_seconds": run.train[-1]["elapsed"] if run.train else 0.0,
        "tokens_per_s": round(rate, 1) if rate else None,
        "best_valid_bleu": best["valid_bleu"] if best else None,
        "best_valid_step": best["step"] if best else None,
    }


def evaluate(run_dir: Path, spec: dict[str, Any]) -> dict[str, Any]:
    """The grid's scores of a finished run: ``{split: ...}`` of its best weights by dev, or,
    where the grid asks for ``evaluate.average: N``, of the mean of its last N checkpoints
    (as fairseq's recipes score), with the best weights' under ``<split>_best``."""
    from wtnmt.rundir import list_checkpoints
    from wtnmt.rundir.average import average_within

    split, beam = spec["evaluate"]["split"], spec["evaluate"].get("beam")
    last = spec["evaluate"].get("average")
    if not last:
        return {split: score_run(run_dir, split=split, beam=beam)}
    # a run stopped early (patience) may have saved fewer: it averages what it has, as
    # fairseq's average_checkpoints does, and the scores say how many
    kept = len(list_checkpoints(run_dir / "checkpoints"))
    averaged = average_within(run_dir, last=max(1, min(last, kept)))
    return {
        split: {
            **score_run(run_dir, split=split, beam=beam, weights=averaged["weights"]),
            "average": last,
            "checkpoints": averaged["checkpoints"],
        },
        f"{split}_best": score_run(run_dir, split=split, beam=beam),
    }


def branch_weights_at_test_time(
    run_dir: Path, spec: dict[str, Any], scores: dict[str, Any]
) -> None:
    """Paper Table 3 of a Weighted Transformer with learned κ, α: the weights it was scored
    with, with uniform and ``spec["table3"]`` random κ, α, kept in ``eval/`` with the other
    decodings. Now, while the weights exist: a GPU lent by the call or a work directory keeps
    them no longer than the run, and `wtnmt analyze` reads the kept scores."""
    model = load_config(run_dir / "config.yaml").model
    if not spec.get("table3") or model.attention != "branched" or model.branch_weights == "fixed":
        return
    split = spec["evaluate"]["split"]
    row = branch_weight_ablation(
        run_dir,
        split=split,
        beam=spec["evaluate"].get("beam"),
        weights=scores[split]["weights"],
        random_seeds=spec["table3"],
    )
    print(
        f"{run_dir.name}: {split} BLEU with uniform κ, α {row['uniform']['bleu']:.2f}, with "
        f"random ones {row['random_bleu_mean']:.2f} ± {row['random_bleu_sd']:.2f} (paper Table 3)",
        file=sys.stderr,
    )


def _scored_as_trained(run_dir: Path, asked: dict[str, Any]) -> bool:
    """Whether ``scores.json`` already holds the scores ``asked`` of the weights the run has
    now: a resume that stopped at once (another stopping rule, already met) trained nothing,
    and its scores, with what ``wtnmt evaluate`` added to them, are kept."""
    if not scored(run_dir, asked):
        return False
    recorded = json.loads((run_dir / "scores.json").read_text(encoding="utf-8"))
    return recorded.get("steps") == training_summary(run_dir)["steps"]


def main(argv: list[str]) -> int:
    from wtnmt.runtime import tune_cpu_allocator
    from wtnmt.train import Trainer

    spec = json.loads(argv[0])
    run_dir = Path(spec["run_dir"])
    tune_cpu_allocator()
    if spec["train"]:
        config = load_config(spec["preset"], spec["overrides"])
        state = Trainer(config, run_dir, resume=spec["resume"], log_to_stderr=True).run()
        write_finished(run_dir, asdict(state))
    # past training, SIGINT stops at once again; one that came since the last update (or,
    # for a run only scored, while it started) is honoured now
    asked = interrupt.requested()
    interrupt.give_back(None)
    if asked:
        raise KeyboardInterrupt
    if spec["evaluate"] and not _scored_as_trained(run_dir, spec["evaluate"]):
        scores = {"run": run_dir.name, **training_summary(run_dir), **evaluate(run_dir, spec)}
        split = spec["evaluate"]["split"]
        print(
            f"{run_dir.name}: {split} BLEU {scores[split]['bleu']:.2f} chrF "
            f"{scores[split]['chrf']:.2f} (lowercased BLEU {scores[split]['bleu_lc']:.2f}, on "
            f"lowercased Moses tokens {scores[split]['bleu_moses']:.2f})",
            file=sys.stderr,
        )
        branch_weights_at_test_time(run_dir, spec, scores)
        # last: scores.json tells the grid the run is scored, so a run stopped before its
        # Table 3 was whole (--stop-after, a signal) is scored again, not taken as done
        atomic_write(run_dir / "scores.json", (json.dumps(scores, indent=2) + "\n").encode())
    return 0


if __name__ == "__main__":  # the runner's child process; errors as the command line gives them
    from wtnmt.guard import run_guarded

    sys.exit(run_guarded("experiment", lambda: main(sys.argv[1:])))
