"""The command line of `wtnmt prune` (argparse only: wtnmt/cli.py imports it)."""

from __future__ import annotations

import argparse

from wtnmt.cli_args import at_least_one


def _cmd_prune(args: argparse.Namespace) -> int:
    from wtnmt.prune.command import cmd_prune

    return cmd_prune(args)


def add_prune(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "prune",
        help="remove branches of a trained Weighted Transformer (a smaller, faster model)",
        description="Write RUN without some of its branches (a head with its W^O and FFN) to "
        "a new run directory OUT, which translate, evaluate, serve, average and export read "
        "as any run. Branches are ranked by --criterion and kept up to a budget: --keep K a "
        "layer, or --keep-total N over the model (at least one a layer). --fine-tune STEPS "
        "then trains the pruned model on RUN's data.",
    )
    p.add_argument("run_dir", metavar="RUN", help="the trained Weighted Transformer run to prune")
    p.add_argument("--out", required=True, help="the new run directory (must not exist)")
    budget = p.add_mutually_exclusive_group(required=True)
    budget.add_argument("--keep", type=at_least_one, metavar="K", help="branches kept a layer")
    budget.add_argument(
        "--keep-total", type=at_least_one, metavar="N", help="branches kept over the model"
    )
    p.add_argument(
        "--criterion",
        default="importance",
        choices=["importance", "kappa-alpha", "random"],
        help="importance: the rise in dev loss when the branch alone is masked (one dev pass a "
        "branch); kappa-alpha: the learned κ·α; random: a seeded draw (default importance)",
    )
    p.add_argument("--seed", type=int, default=1, help="the draw of --criterion random (1)")
    p.add_argument(
        "--weights",
        default="model.safetensors",
        metavar="FILE",
        help="the weight file in RUN to prune, e.g. average-last10.safetensors "
        "(default model.safetensors)",
    )
    p.add_argument(
        "--fine-tune",
        type=int,
        default=0,
        metavar="STEPS",
        help="then train the pruned model for STEPS updates (default 0: none)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="train.KEY=VALUE",
        help="a training setting of the fine-tune (repeatable)",
    )
    p.add_argument("--threads", type=at_least_one, help="CPU threads (default: all)")
    p.set_defaults(func=_cmd_prune)
