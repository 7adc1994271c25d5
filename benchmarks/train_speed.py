#!/usr/bin/env python3
"""Training throughput of the `small`-shaped Weighted Transformer and Transformer, measured
as ../shared/bench/PEERS.md measured fairseq, OpenNMT-py, JoeyNMT and x-transformers.

    python benchmarks/train_speed.py [--bench-dir ../shared/bench] [--seconds 90]

Data: make_synthetic.py's corpus (20,000 pairs, pre-tokenised: its vocab.txt gives the ids,
no sentencepiece). Model: N=3 D=256 F=1024 H=M=4, dropout 0.1, tied embeddings, label
smoothing 0.1, Adam with the inverse-√ warm-up: the presets weighted-small and
transformer-small. Batches: ~4,000 tokens in the peers' sense, n × max padded length of one
side (fairseq's --max-tokens), which is max_tokens = 8192 in wtnmt's convention (padded source
+ target). Throughput: real target tokens (EOS included) per second through the real training
step (Trainer.update: forward, backward, Adam, simplex projection), after 10 warm-up steps,
over ``--seconds``, 2 threads. Each configuration runs in its own process so that its peak
RSS is its own. The last line reads
`train tgt tok/s weighted fp32: X  transformer fp32: Y  weighted bf16: Z`.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_data(bench_dir: Path, out: Path) -> int:
    """make_synthetic.py's text → the prepared format (ids from vocab.txt). Returns V."""
    raw = out / "raw"
    if not (raw / "vocab.txt").is_file():
        raw.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, str(bench_dir / "make_synthetic.py"), str(raw)],
            check=True,
            capture_output=True,
        )
    from wtnmt.data.dataset import write_ids

    tokens = [line.split("\t")[0] for line in (raw / "vocab.txt").read_text().splitlines()]
    ids = {tok: i + 4 for i, tok in enumerate(tokens)}  # 0–3: pad, bos, eos, unk
    vocab_size = len(tokens) + 4
    prepared = out / "prepared"
    prepared.mkdir(exist_ok=True)
    for ours, theirs in (("train", "train"), ("valid", "valid"), ("test", "test")):
        for side in ("src", "tgt"):
            lines = (raw / f"{theirs}.{side}").read_text().splitlines()
            write_ids(
                prepared / f"{ours}.{side}",
                [[ids[t] for t in line.split()] for line in lines],
                vocab_size,
            )
    return vocab_size


def measure(flavour: str, precision: str, data: Path, vocab: int, seconds: float) -> dict:
    import torch

    from wtnmt.config import load_config
    from wtnmt.runtime import tune_cpu_allocator
    from wtnmt.train import Trainer

    torch.set_num_threads(2)
    tune_cpu_allocator()  # as `wtnmt train` does
    config = load_config(
        f"{flavour}-small",
        [
            "train.max_tokens=8192",
            f"train.precision={precision}",
            "train.max_steps=1000000",
            "train.max_time=null",
            "train.threads=2",
            "train.device=cpu",
        ],
    )
    with tempfile.TemporaryDirectory() as run:
        trainer = Trainer(config, run, log_to_stderr=False, data_dir=data, vocab_size=vocab)
        d = trainer.train_data
        from wtnmt.data import plan_batches

        plan = plan_batches(d.src_lengths, d.tgt_lengths, max_tokens=8192, seed=1, epoch=0)
        batches = [d.collate(i) for i in plan.batches]
        step, tokens, start = 0, 0, None
        while True:
            batch = batches[step % len(batches)]
            _, _, n, _, _ = trainer.update([batch])
            step += 1
            if step == 10:
                start = time.perf_counter()
            elif step > 10:
                tokens += n
                if time.perf_counter() - start >= seconds:
                    break
        elapsed = time.perf_counter() - start
    return {
        "flavour": flavour,
        "precision": precision,
        "steps": step - 10,
        "tgt_tok_per_s": tokens / elapsed,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench-dir", type=Path, default=ROOT.parent / "shared" / "bench")
    parser.add_argument("--work", type=Path, default=ROOT / "bench-data")
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--one", nargs=2, metavar=("FLAVOUR", "PRECISION"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    vocab = build_data(args.bench_dir, args.work)
    if args.one:
        result = measure(*args.one, args.work / "prepared", vocab, args.seconds)
        print(json.dumps(result))
        return
    results = {}
    for flavour, precision in (("weighted", "fp32"), ("transformer", "fp32"), ("weighted", "bf16")):
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--bench-dir",
                str(args.bench_dir),
                "--work",
                str(args.work),
                "--seconds",
                str(args.seconds),
                "--one",
                flavour,
                precision,
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        r = json.loads(out.stdout.strip().splitlines()[-1])
        results[(flavour, precision)] = r
        print(
            f"{flavour:12s} {precision}: {r['tgt_tok_per_s']:8.0f} tgt tok/s over "
            f"{r['steps']} steps, peak RSS {r['peak_rss_gib']:.2f} GiB",
            flush=True,
        )
    w, t = results[("weighted", "fp32")], results[("transformer", "fp32")]
    print(
        f"weighted / transformer (fp32): {w['tgt_tok_per_s'] / t['tgt_tok_per_s']:.2f}x; "
        f"fairseq's figure on this kind of machine: 2338 tgt tok/s"
    )
    print(
        f"train tgt tok/s weighted fp32: {w['tgt_tok_per_s']:.0f}  transformer fp32: "
        f"{t['tgt_tok_per_s']:.0f}  weighted bf16: "
        f"{results[('weighted', 'bf16')]['tgt_tok_per_s']:.0f}"
    )


if __name__ == "__main__":
    main()
