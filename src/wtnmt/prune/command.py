"""What `wtnmt prune` does with its command line."""

from __future__ import annotations

import argparse
import sys

from wtnmt.config import ConfigError


def cmd_prune(args: argparse.Namespace) -> int:
    import torch

    from wtnmt.prune.run import prune_run
    from wtnmt.runtime import tune_cpu_allocator

    if args.fine_tune < 0:
        raise ConfigError(f"--fine-tune {args.fine_tune}: must be 0 or more updates")
    if args.set and not args.fine_tune:
        raise ConfigError("--set sets the fine-tune's training: give --fine-tune STEPS too")
    if args.threads:
        torch.set_num_threads(args.threads)
    # as `wtnmt train` does: without it a fine-tune's steps were 1.5× slower (2 cores, bf16;
    # half the time in the kernel, page-faulting each step's large tensors in anew)
    tune_cpu_allocator()
    bar = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None:
            from tqdm import tqdm

            bar = tqdm(total=total, desc="branch importance", unit="branch", leave=False)
        bar.update(done - bar.n)

    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    try:
        summary = prune_run(
            args.run_dir,
            args.out,
            criterion=args.criterion,
            keep=args.keep,
            keep_total=args.keep_total,
            weights=args.weights,
            seed=args.seed,
            fine_tune=args.fine_tune,
            overrides=args.set,
            log=say,
            progress=progress,
        )
    finally:
        if bar is not None:
            bar.close()
    branches, params = summary["branches"], summary["parameters"]
    print(
        f"{args.out}: {branches['after']} of {branches['before']} branches kept "
        f"({args.criterion}), {params['after']:,} of {params['before']:,} parameters"
        + (f", fine-tuned {args.fine_tune} updates" if args.fine_tune else "")
    )
    return 0
