"""What `wtnmt experiment` does with its command line: the runner, the packing, the report
(its parser is in wtnmt/cli.py, which must not import this package: it loads torch)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

from wtnmt import stored
from wtnmt.config import ConfigError


def _results_of(spec) -> Path:  # type: ignore[no-untyped-def]
    """Where a run's results are read: where it trained, or, that gone (a work directory left
    behind), the copy of its small results."""
    if spec.results_dir is None or stored.exists(spec.run_dir / "metrics.jsonl"):
        return spec.run_dir
    return spec.results_dir


def cmd_experiment(args: argparse.Namespace) -> int:
    from wtnmt.errors import TrainingError
    from wtnmt.experiment import in_work_dir, load_grid, only_runs, plan_task, run_grid
    from wtnmt.experiment.runner import copy_finished_results

    grid = load_grid(args.grid)
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    if args.work_dir is not None:
        grid = in_work_dir(grid, Path(args.work_dir))
    everything = grid
    if args.only:
        grid = only_runs(grid, args.only)
    if args.stop_after is not None and not (0 < args.stop_after < math.inf):
        raise ConfigError(
            f"--stop-after {args.stop_after:g}: must be a number of seconds above 0 (finite)"
        )
    if args.pack_files < 1:
        raise ConfigError(f"--pack-files {args.pack_files}: must be at least 1")
    if args.pack is not None:  # refused now, not after the call's training time is spent
        from wtnmt.experiment.pack import check_pack

        check_pack(everything, Path(args.pack), max_bytes=args.pack_size, max_files=args.pack_files)
    outcome = run_grid(grid, dry_run=args.dry_run, say=say, stop_after=args.stop_after)
    if args.dry_run:
        return 0
    if args.pack is not None:
        from wtnmt.experiment.pack import pack_results

        archives = pack_results(
            everything, Path(args.pack), max_bytes=args.pack_size, max_files=args.pack_files
        )
        sizes = ", ".join(f"{a.name} {a.stat().st_size / 2**20:.1f} MiB" for a in archives)
        say(f"packed the results of {everything.path} into {args.pack}: {sizes or 'nothing'}")
    failed = {k: v for k, v in outcome.items() if v.startswith("failed")}
    stopped = {"interrupted", "paused"} & set(outcome.values())  # nothing whole to analyze
    if "interrupted" in stopped and not failed:  # stopped from outside
        say(f"some runs were interrupted: run `{grid.again}` again to resume")
        return 130
    if stopped and not failed:
        return 0  # paused as asked (--stop-after): the next call goes on
    if grid is not everything:  # the report is the grid's: it waits for, then covers, all runs
        if any(plan_task(s, everything) for s in everything.runs):
            say("the grid's other runs are not done: its report waits for them")
            grid = dataclasses.replace(grid, analyze=None)
        else:
            grid = everything
    if stopped:
        grid = dataclasses.replace(grid, analyze=None)
    if grid.analyze is not None:
        from wtnmt.analysis.report import analyze

        runs = [d for d in map(_results_of, grid.runs) if stored.exists(d / "metrics.jsonl")]
        if runs:
            a = grid.analyze
            analyze(
                runs,
                a.get("out", grid.out / f"report-{grid.path.stem}"),
                target_bleu=a.get("target_bleu"),
                window=a.get("smooth", 1),
                random_seeds=a.get("random_seeds", 3),
                sentence=a.get("attention_sentence", 0),
                decode=a.get("decode", True),
                pairs=a.get("pairs", []),
                say=say,
            )
            for spec in grid.runs:  # the report's decodings, cached in each run's eval/
                copy_finished_results(spec, say)
    if failed:
        raise TrainingError(
            f"{len(failed)} of {len(outcome)} runs failed ({', '.join(failed)}); their logs "
            f"are experiment.log in each run directory"
        )
    return 0
