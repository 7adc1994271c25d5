#!/usr/bin/env python3
"""Training speed on one GPU at the paper's base size: the Weighted Transformer and the
Transformer (presets weighted-A and transformer-A: N=6, D=512, F=2048, H=M=8, post-norm) in
bf16 autocast, against a plain `torch.nn.Transformer` of that shape (its attention goes through
PyTorch's fused scaled_dot_product_attention, with the backends PyTorch picks and with
those wtnmt keeps to on a GPU, every one but cuDNN's), side by side in one process.

    python benchmarks/gpu_train_speed.py [--seconds 60] [--max-tokens 16384] [--device cuda]

Data: random token ids (a vocabulary of 37,000 as the presets'), 40,000 pairs whose source
lengths are uniform in 5-60 and whose targets are within ±20% of them, batched as training
batches them (`--max-tokens` counts padded source + target, fairseq's --max-tokens 8192 is
16,384 here). wtnmt's models go through the real training step (Trainer.update: forward,
label-smoothed loss, backward, clipping, Adam, the simplex projection of κ and α); the floor is
the loop a user writes around `nn.Transformer` (tied embeddings, logits at every position,
`F.cross_entropy` with label smoothing, `torch.optim.Adam`), under the same autocast. The
models take turns, one step each on the same batch, in an order that rotates every round, for
``--seconds`` after ``--warmup`` rounds; each step is timed from before it starts to after the
device has finished it. Printed per model: median milliseconds a step, real target tokens
(EOS included) per second of its own steps, and its ratio to the floor's without cuDNN's
attention (the backends wtnmt's models use); ``--json`` writes them, ``--record`` keeps the
table for docs/BENCHMARKS.md (records.py; the machine: the GPU, torch, the precision, the host).
``--device cpu --tiny`` runs the same code on a small shape, to check the script without a GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from records import add_record_argument
from train_speed import Floor, take_turns

VOCAB = 37000
FLOOR = "floor, no cuDNN attention"  # the ratios' baseline: the kernels wtnmt uses
NAMES = {  # the table's names of the entries
    "weighted": "**wtnmt Weighted Transformer**",
    "transformer": "wtnmt Transformer",
    FLOOR: "`torch.nn.Transformer` loop, attention without cuDNN's kernel (floor)",
    "floor (nn.Transformer)": "`torch.nn.Transformer` loop, PyTorch's choice of attention kernel",
}


class WithoutCudnnAttention:
    """The floor with its fused attention kept to the backends wtnmt uses on a GPU
    (attention_math.CUDA_SDPA_BACKENDS): every one but cuDNN's, which builds a graph for each
    new batch shape."""

    def __init__(self, floor: Floor) -> None:
        self.floor = floor

    def update(self, batches):  # type: ignore[no-untyped-def]
        from torch.nn.attention import sdpa_kernel

        from wtnmt.model.attention_math import CUDA_SDPA_BACKENDS

        with sdpa_kernel(CUDA_SDPA_BACKENDS):
            return self.floor.update(batches)


def synthetic_data(out: Path, pairs: int, vocab: int, seed: int = 0) -> None:
    """Random ids in the prepared format: the three splits train, valid, test."""
    import numpy as np

    from wtnmt.data.dataset import write_ids

    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", pairs), ("valid", 64), ("test", 64)):
        src_len = rng.integers(5, 61, size=n)
        tgt_len = np.maximum(1, np.rint(src_len * rng.uniform(0.8, 1.2, size=n))).astype(int)
        for side, lengths in (("src", src_len), ("tgt", tgt_len)):
            write_ids(
                out / f"{split}.{side}", [rng.integers(4, vocab, size=k) for k in lengths], vocab
            )


def trainer(preset: str, args, data: Path, run: Path):  # type: ignore[no-untyped-def]
    from wtnmt.config import load_config
    from wtnmt.train import Trainer

    overrides = [
        f"train.max_tokens={args.max_tokens}",
        "train.update_freq=1",
        f"train.precision={args.precision}",
        f"train.device={args.device}",
        "train.max_steps=1000000",
        "train.max_time=null",
    ]
    if args.tiny:
        overrides += ["model.encoder_layers=1", "model.decoder_layers=1", "model.d_model=64",
                      "model.d_ff=128", "model.heads=4"]  # fmt: skip
    config = load_config(preset, overrides)
    return Trainer(config, run, log_to_stderr=False, data_dir=data, vocab_size=args.vocab)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--max-tokens", type=int, default=16384)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=int, default=10, help="untimed rounds first")
    parser.add_argument("--pairs", type=int, default=40000)
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--tiny", action="store_true", help="N=1 D=64: a check of the script")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    add_record_argument(parser)
    args = parser.parse_args()

    import torch

    from wtnmt.data import plan_batches
    from wtnmt.runtime import machine_line

    device = torch.device(args.device)
    name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else machine_line(torch.get_num_threads())
    )
    print(f"device: {name}; torch {torch.__version__}; {args.precision}", flush=True)

    def finish() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "prepared"
        synthetic_data(data, args.pairs, args.vocab)
        entries = {}
        for label, preset in (("weighted", "weighted-A"), ("transformer", "transformer-A")):
            entries[label] = trainer(preset, args, data, Path(tmp) / label)
        shape = entries["transformer"].config.model
        floors = [
            Floor(args.vocab, shape.d_model, shape.heads, shape.encoder_layers, shape.d_ff,
                  device=args.device, precision=args.precision)
            for _ in range(2)
        ]  # fmt: skip
        entries[FLOOR] = WithoutCudnnAttention(floors[0])
        entries["floor (nn.Transformer)"] = floors[1]
        params = {label: sum(p.numel() for p in entries[label].model.parameters())
                  for label in ("weighted", "transformer")}  # fmt: skip
        params[FLOOR] = params["floor (nn.Transformer)"] = sum(
            p.numel() for p in floors[1].parameters()
        )
        d = entries["weighted"].train_data
        plan = plan_batches(
            d.src_lengths, d.tgt_lengths, max_tokens=args.max_tokens, seed=1, epoch=0
        )
        batches = [d.collate(i) for i in plan.batches[:100]]
        turns = take_turns(entries, batches, args.seconds, args.warmup, finish)
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    floor = turns.rate(FLOOR)
    result = {
        "device": name,
        "torch": torch.__version__,
        "precision": args.precision,
        "max_tokens": args.max_tokens,
        "timed_rounds": turns.rounds,
        "peak_allocated_gib_all_models": peak,
        "models": {},
    }
    print(f"{turns.rounds} timed rounds of one step each, batches of {args.max_tokens} "
          f"padded source + target tokens")  # fmt: skip
    print(f"  {'model':26s} {'ms/step':>8s} {'tgt tok/s':>10s}  ×floor  parameters")
    for label in entries:
        rate, ms = turns.rate(label), 1000 * statistics.median(turns.times[label])
        count = params[label]
        result["models"][label] = {"ms_per_step": ms, "tgt_tokens_per_s": rate,
                                   "x_floor": rate / floor, "parameters": count}  # fmt: skip
        print(f"  {label:26s} {ms:8.1f} {rate:10.0f}  {rate / floor:5.2f}  {count / 1e6:.1f}M",
              flush=True)  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.record:
        from records import keep, machine_only

        host = machine_only(machine_line(torch.get_num_threads()))
        gpu = f"{name}; torch {torch.__version__}; {args.precision} (host: {host})"
        keep("gpu-train-speed", machine=gpu if device.type == "cuda" else host,
             headers=["", "ms an update", "tgt tok/s", f"× {FLOOR}"],
             rows=[[NAMES.get(label, label), f"{m['ms_per_step']:.1f}",
                    f"{m['tgt_tokens_per_s']:,.0f}", f"{m['x_floor']:.2f}"]
                   for label, m in result["models"].items()],
             note=f"{turns.rounds} timed rounds, batches of {args.max_tokens:,} padded source + "
                  "target tokens")  # fmt: skip


if __name__ == "__main__":
    main()
