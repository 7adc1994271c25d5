#!/usr/bin/env python3
"""The cost of one training step of every run of experiment grids, measured side by side:
the runs' models take turns on the same batches in one process, so that a ratio between two
of them does not depend on how busy the machine was (run-time throughput does).

    python benchmarks/grid_step_cost.py experiments/multi30k-ablations.yaml \
        experiments/multi30k-disagreement.yaml [--threads 1] [--rounds 20]

Each grid run (its first seed) gets a Trainer with the run's exact config, and every step goes
through the real training update (`Trainer.update`: forward, loss with any disagreement term,
backward, Adam, simplex projection). Batches: the first `--batches` of the corpus's training
split in the grid's batch size. After 3 warm-up steps each, `--rounds` rounds; in each, every
model makes one step on the same batch, in an order that rotates from round to round. Printed:
the median milliseconds a step per run, and its ratio to the reference run of its model (the
grid's first run of the same preset without overrides of its own: "weighted", "transformer").
``--profile N`` then profiles N more steps of each run (torch.profiler, the CPU and, where the
runs train on one, the GPU) and prints where the time goes: on a GPU a step of a small model
can be bound by the host's work rather than the device's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path


def profile(trainer, batches, steps: int, label: str) -> None:  # type: ignore[no-untyped-def]
    """``steps`` updates of ``trainer`` under torch.profiler: the wall time a step, the
    operators it dispatches, the device's busy time a step where it is a GPU, and the
    operators with the most host time."""
    import torch
    from torch.profiler import ProfilerActivity

    cuda = trainer.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        start = time.perf_counter()
        for i in range(steps):
            trainer.update([batches[i % len(batches)]])
        if cuda:
            torch.cuda.synchronize()
        wall = (time.perf_counter() - start) / steps
    events = prof.key_averages()
    # what paces a step bound by the host: the operators it dispatches (those called by
    # another operator, a view inside a reshape say, not counted)
    top = [
        e
        for e in prof.events()
        if e.name.startswith("aten::")
        and not (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::"))
    ]
    line = (
        f"{label}: {1000 * wall:.1f} ms a step under the profiler, "
        f"{len(top) / steps:,.0f} top-level operators a step"
    )
    if cuda:
        busy = sum(e.self_device_time_total for e in events) / 1000 / steps
        line += f", the GPU busy {busy:.1f} ms of it ({len(events)} operator kinds)"
    print(line, flush=True)
    print(events.table(sort_by="self_cpu_time_total", row_limit=15, max_name_column_width=48))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("grids", nargs="+", type=Path)
    parser.add_argument(
        "--threads", type=int, default=1, help="for every run, whatever its grid says (1)"
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument(
        "--profile", type=int, default=0, metavar="N", help="then profile N steps a run"
    )
    args = parser.parse_args()
    from wtnmt.runtime import machine_line

    print(machine_line(args.threads), flush=True)

    import torch

    from wtnmt.config import load_config
    from wtnmt.data import plan_batches
    from wtnmt.experiment.grid import load_grid
    from wtnmt.runtime import tune_cpu_allocator
    from wtnmt.train import Trainer

    torch.set_num_threads(args.threads)
    tune_cpu_allocator()
    specs = {}
    for path in args.grids:
        for spec in load_grid(path).runs:
            specs.setdefault(spec.label, spec)
    # a model's reference: its run with the fewest overrides (no `set` of its own)
    reference = {
        label: min(
            (s for s in specs.values() if s.preset == spec.preset),
            key=lambda s: len(s.overrides),
        ).label
        for label, spec in specs.items()
    }
    with tempfile.TemporaryDirectory() as tmp:
        trainers, batches = {}, None
        for label, spec in specs.items():
            # the grid's thread count is in each run's config (train.threads), and the
            # Trainer applies it: --threads must win, or every figure is at the grid's count
            config = load_config(spec.preset, [*spec.overrides, f"train.threads={args.threads}"])
            trainers[label] = Trainer(config, Path(tmp) / label, log_to_stderr=False)
            if batches is None:
                data = trainers[label].train_data
                plan = plan_batches(
                    data.src_lengths,
                    data.tgt_lengths,
                    max_tokens=config.train.max_tokens,
                    seed=1,
                    epoch=0,
                )
                batches = [data.collate(i) for i in plan.batches[: args.batches]]
        assert batches is not None
        labels = list(trainers)
        for label in labels:
            for batch in batches[:3]:
                trainers[label].update([batch])
        times: dict[str, list[float]] = {label: [] for label in labels}
        for r in range(args.rounds):
            batch = batches[r % len(batches)]
            shift = r % len(labels)
            for label in labels[shift:] + labels[:shift]:
                start = time.perf_counter()
                trainers[label].update([batch])
                times[label].append(time.perf_counter() - start)
            print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
        for label in labels if args.profile else []:
            profile(trainers[label], batches, args.profile, label)
    median = {label: 1000 * statistics.median(t) for label, t in times.items()}
    print(f"{'run':28s} {'ms/step':>8s}  ratio ({args.threads} thread(s), {args.rounds} rounds)")
    for label in labels:
        ref = reference[label]
        print(f"{label:28s} {median[label]:8.0f}  {median[label] / median[ref]:.2f} × {ref}")


if __name__ == "__main__":
    main()
