#!/usr/bin/env python3
"""Time one training step (forward, backward, Adam) of the Weighted Transformer against the
Transformer of the same preset, alternating them in one run (this machine is noisy, so only
ratios measured side by side mean anything).

    python benchmarks/step_time.py [--threads 2] [--steps 30] [--skip-a] [--record]

Models: the fused Weighted Transformer (the toolkit's own), the Transformer, and the unfused
reference (the paper's eq. 5–7 with a loop over branches, tests/reference.py) for scale.
Batches: preset `small` with about 4,000 padded tokens (source + target), and preset A shapes
with a short batch. The last line reads `step-time ratio weighted/transformer (small): R`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from records import add_record_argument
from wtnmt.config import load_config
from wtnmt.data.dataset import Batch
from wtnmt.loss import label_smoothed_cross_entropy
from wtnmt.model import build_model
from wtnmt.model.branched import BranchedAttention
from wtnmt.model.reference import UnfusedBranchedAttention
from wtnmt.runtime import machine_line, tune_cpu_allocator
from wtnmt.special import BOS, EOS, PAD
from wtnmt.train.state import make_adam
from wtnmt.train.update import teacher_forced


def make_batch(n: int, lo: int, hi: int, vocab: int, seed: int):
    """n sentence pairs with lengths in [lo, hi], right-padded: src [n, S], tgt_in/out [n, T]."""
    g = torch.Generator().manual_seed(seed)
    src_len = torch.randint(lo, hi + 1, (n,), generator=g)
    tgt_len = (src_len + torch.randint(-2, 3, (n,), generator=g)).clamp(min=2)
    src = torch.full((n, int(src_len.max())), PAD)
    tgt_in = torch.full((n, int(tgt_len.max()) + 1), PAD)
    tgt_out = torch.full_like(tgt_in, PAD)
    for i in range(n):
        s, t = int(src_len[i]), int(tgt_len[i])
        src[i, :s] = torch.randint(4, vocab, (s,), generator=g)
        src[i, s - 1] = EOS
        words = torch.randint(4, vocab, (t,), generator=g)
        tgt_in[i, 0] = BOS
        tgt_in[i, 1 : t + 1] = words
        tgt_out[i, :t] = words
        tgt_out[i, t] = EOS
    return src, tgt_in, tgt_out


def unfuse(model: torch.nn.Module) -> torch.nn.Module:
    """Swap every fused branched sublayer for the per-branch reference (same parameters)."""
    for module in model.modules():
        if isinstance(module, BranchedAttention):
            module.__class__ = UnfusedBranchedAttention
    return model


def step_fn(model, src, tgt_in, tgt_out):
    # the optimizer `wtnmt train` uses (fused Adam where available)
    optimizer = make_adam([{"params": list(model.parameters())}], betas=(0.9, 0.98), eps=1e-9)
    for group in optimizer.param_groups:
        group["lr"] = 1e-4

    # the model's inputs as `wtnmt train` makes them (logits at real target positions only)
    batch = Batch(src, tgt_in, tgt_out, np.arange(src.size(0)))
    inputs, target = teacher_forced(batch, torch.device("cpu"))

    def step() -> None:
        # the training loss: fused label-smoothed CE
        logits = model(**inputs).logits  # [N, V]
        loss_sum, _ = label_smoothed_cross_entropy(logits, target, epsilon=0.1)
        loss = loss_sum.sum() / target.numel()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def compare(preset: str, batch, *, steps: int, warmup: int, vocab: int) -> dict[str, float]:
    src, tgt_in, tgt_out = batch
    models = {}
    for name, flavour in [
        ("weighted", "weighted"),
        ("transformer", "transformer"),
        ("unfused", "weighted"),
    ]:
        torch.manual_seed(0)
        model = build_model(load_config(f"{flavour}-{preset}").model, vocab_size=vocab)
        models[name] = step_fn(
            unfuse(model) if name == "unfused" else model.train(), src, tgt_in, tgt_out
        )
    times: dict[str, list[float]] = {name: [] for name in models}
    for i in range(warmup + steps):
        for name, step in models.items():  # alternate: drift hits every model alike
            start = time.perf_counter()
            step()
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(t) for name, t in times.items()}
    tokens = int(src.ne(PAD).sum() + tgt_out.ne(PAD).sum())
    padded = src.numel() + tgt_in.numel()
    print(
        f"\npreset {preset}: batch {src.size(0)} pairs, {padded} padded tokens "
        f"({tokens} real), {steps} timed steps after {warmup} warm-up, median step time"
    )
    for name, t in median.items():
        print(
            f"  {name:12s} {t * 1000:8.1f} ms   {tgt_out.ne(PAD).sum() / t:8.0f} tgt tok/s   "
            f"ratio to transformer {t / median['transformer']:.2f}"
        )
    ratios = {name: t / median["transformer"] for name, t in median.items()}
    ROWS.append(
        [
            f"`{preset}` ({src.size(0)} pairs, {padded:,} padded tokens)",
            *(f"{median[name] * 1000:.1f} ms" for name in ("weighted", "transformer", "unfused")),
            f"**{ratios['weighted']:.2f}**",
        ]
    )
    return ratios


ROWS: list[list[str]] = []  # the table --record keeps, a preset a row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--skip-a", action="store_true", help="only the small preset")
    add_record_argument(parser)
    args = parser.parse_args()
    print(machine_line(args.threads), flush=True)
    torch.set_num_threads(args.threads)
    tuned = tune_cpu_allocator()  # as `wtnmt train` does
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, allocator tuned: {tuned}")
    if not args.skip_a:
        compare(
            "A",
            make_batch(8, 15, 25, 37000, seed=2),
            steps=max(args.steps // 3, 5),
            warmup=2,
            vocab=37000,
        )
    small = compare(
        "small",
        make_batch(80, 18, 26, 8000, seed=1),
        steps=args.steps,
        warmup=args.warmup,
        vocab=8000,
    )
    print(f"\nunfused reference / transformer (small): {small['unfused']:.2f}")
    print(f"step-time ratio weighted/transformer (small): {small['weighted']:.2f}")
    if args.record:
        from records import keep

        keep(
            "step-time",
            machine=machine_line(args.threads),
            headers=["preset (batch)", "Weighted Transformer", "Transformer",
                     "unfused per-branch reference", "weighted / Transformer"],
            rows=ROWS,
        )  # fmt: skip


if __name__ == "__main__":
    main()
