#!/usr/bin/env python3
"""Training throughput of the `small`-shaped Weighted Transformer and Transformer against a
plain `torch.nn.Transformer` of the same shape and recipe (the floor), on the data and settings
of ../shared/bench/PEERS.md, and the peak memory of each precision.

    python benchmarks/train_speed.py [--bench-dir ../shared/bench] [--seconds 120] [--threads 2]
                                     [--plain-linear] [--record]

Data: make_synthetic.py's corpus (20,000 pairs, pre-tokenised: its vocab.txt gives the ids,
no sentencepiece). Model: N=3 D=256 F=1024 H=M=4, dropout 0.1, tied embeddings, label
smoothing 0.1, Adam (0.9, 0.98): the presets weighted-small and transformer-small. Batches:
~4,000 tokens in the peers' sense, n × max padded length of one side (fairseq's --max-tokens),
which is max_tokens = 8192 in wtnmt's convention (padded source + target).

Throughput: the models take turns, one training step each on the same batch, in an order that
rotates every round, for ``--seconds`` after ``--warmup`` (10) rounds (this machine drifts by ±20%
over minutes: only figures measured side by side compare). wtnmt's models go through the real
training step (Trainer.update: forward, backward, Adam, simplex projection); the floor is the
loop a user writes around `nn.Transformer` (logits at every position, `F.cross_entropy` with
label smoothing, `torch.optim.Adam`). Each figure is real target tokens (EOS included) per
second of its own steps, and its ratio to the floor's (PEERS.md: fairseq 1.11× the floor).
``--plain-linear`` adds each float32 model once more with ``F.linear`` (MKL) for its linear
layers instead of oneDNN's products (wtnmt.model.packed.linear), to time that choice alone.

bf16 only where the CPU has it natively (AVX512-BF16, AMX). Memory: the Weighted Transformer
in each precision and the Transformer train
``--memory-steps`` steps, each in its own process, started before anything else is built,
whose peak RSS is reset when it starts training (a forked child otherwise inherits the
parent's peak). The last line reads
`train tgt tok/s ×floor: weighted fp32 X  transformer fp32 Y  weighted bf16 Z`.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
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


class Floor:
    """The plain loop around ``torch.nn.Transformer``: sinusoidal positions, √d-scaled tied
    embeddings, post-norm, logits at every target position, label-smoothed cross-entropy."""

    def __init__(
        self,
        vocab: int,
        d: int = 256,
        heads: int = 4,
        layers: int = 3,
        ff: int = 1024,
        *,
        device: str = "cpu",
        precision: str = "fp32",
    ):
        """On ``device``; ``precision`` bf16 runs forward and loss under bf16 autocast, as
        wtnmt's bf16 does."""
        import torch
        from torch import nn

        from wtnmt.special import PAD

        torch.manual_seed(0)
        self.pad, self.d, self.device = PAD, d, torch.device(device)
        self.dtype = torch.bfloat16 if precision == "bf16" else None
        self.embed = nn.Embedding(vocab, d, padding_idx=PAD).to(self.device)
        nn.init.normal_(self.embed.weight, 0, d**-0.5)
        self.net = nn.Transformer(
            d, heads, layers, layers, ff, dropout=0.1, batch_first=True, norm_first=False
        ).to(self.device)
        position = torch.arange(1024)[:, None]
        freq = torch.exp(torch.arange(0, d, 2) * (-math.log(10000.0) / d))
        pe = torch.zeros(1024, d)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(position * freq), torch.cos(position * freq)
        self.pe = pe.to(self.device)
        self.dropout = nn.Dropout(0.1)
        params = self.parameters()
        self.optimizer = torch.optim.Adam(params, lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def parameters(self) -> list:
        return [*self.embed.parameters(), *self.net.parameters()]

    def _embed(self, ids):  # type: ignore[no-untyped-def]
        return self.dropout(self.embed(ids) * self.d**0.5 + self.pe[: ids.size(1)])

    def update(self, batches):  # type: ignore[no-untyped-def]
        import torch
        import torch.nn.functional as F

        tokens = 0
        for b in batches:
            src, tgt_in = b.src.to(self.device), b.tgt_in.to(self.device)
            tgt_out = b.tgt_out.to(self.device)
            src_pad, tgt_pad = src.eq(self.pad), tgt_in.eq(self.pad)
            n_tgt = tgt_in.size(1)
            causal = torch.ones(n_tgt, n_tgt, dtype=torch.bool, device=self.device).triu(1)
            with torch.autocast(self.device.type, self.dtype, enabled=self.dtype is not None):
                hidden = self.net(
                    self._embed(src),
                    self._embed(tgt_in),
                    tgt_mask=causal,  # True: masked
                    src_key_padding_mask=src_pad,
                    tgt_key_padding_mask=tgt_pad,
                    memory_key_padding_mask=src_pad,
                )
                logits = F.linear(hidden, self.embed.weight)
                loss = F.cross_entropy(
                    logits.view(-1, logits.size(-1)),
                    tgt_out.reshape(-1),
                    ignore_index=self.pad,
                    label_smoothing=0.1,
                    reduction="sum",
                )
            n = int(tgt_out.ne(self.pad).sum())
            (loss / n).backward()
            tokens += n
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        from wtnmt.train.update import UpdateResult

        return UpdateResult(loss=0.0, nll=0.0, tokens=tokens, grad_norm=0.0, ratio=None)


def _trainer(flavour: str, precision: str, data: Path, vocab: int, run: str, threads: int):  # type: ignore[no-untyped-def]
    from wtnmt.config import load_config
    from wtnmt.train import Trainer

    config = load_config(
        f"{flavour}-small",
        [
            "train.max_tokens=8192",
            f"train.precision={precision}",
            "train.max_steps=1000000",
            "train.max_time=null",
            f"train.threads={threads}",
            "train.device=cpu",
        ],
    )
    return Trainer(config, run, log_to_stderr=False, data_dir=data, vocab_size=vocab)


def _batches(trainer, limit: int = 200):  # type: ignore[no-untyped-def]
    from wtnmt.data import plan_batches

    d = trainer.train_data
    plan = plan_batches(d.src_lengths, d.tgt_lengths, max_tokens=8192, seed=1, epoch=0)
    return [d.collate(i) for i in plan.batches[:limit]]


class PlainLinear:
    """A trainer whose linear layers multiply through ``F.linear`` (MKL), as wtnmt's did
    before they went through oneDNN (wtnmt.model.packed.linear): the same model, step and
    batches, to time that change alone."""

    def __init__(self, trainer) -> None:  # type: ignore[no-untyped-def]
        self.trainer = trainer

    def update(self, batches):  # type: ignore[no-untyped-def]
        import torch.nn.functional as F

        from wtnmt.model import packed

        saved, packed.linear = packed.linear, F.linear
        try:
            return self.trainer.update(batches)
        finally:
            packed.linear = saved


def alternate(
    data: Path, vocab: int, seconds: float, threads: int, warmup: int = 10, plain: bool = False
) -> dict[str, float]:
    """Target tokens per second of each entry, taking turns on the same batches."""
    import torch

    from wtnmt.runtime import tune_cpu_allocator

    torch.set_num_threads(threads)
    tune_cpu_allocator()  # as `wtnmt train` does
    with tempfile.TemporaryDirectory() as tmp:
        entries = {"floor fp32": Floor(vocab)}
        for flavour, precision in (("transformer", "fp32"), ("weighted", "fp32"),
                                   *([("weighted", "bf16")] if native_bf16() else [])):  # fmt: skip
            entries[f"{flavour} {precision}"] = _trainer(
                flavour, precision, data, vocab, f"{tmp}/{flavour}-{precision}", threads
            )
        if plain:  # each fp32 model again, with F.linear
            for flavour in ("transformer", "weighted"):
                entries[f"{flavour} F.linear"] = PlainLinear(
                    _trainer(flavour, "fp32", data, vocab, f"{tmp}/{flavour}-plain", threads)
                )
        turns = take_turns(entries, _batches(entries["weighted fp32"]), seconds, warmup)
    print(f"{turns.rounds} timed rounds of one step each, {threads} threads", flush=True)
    return {name: turns.rate(name) for name in entries}


@dataclass
class Turns:
    """What ``take_turns`` timed: each entry's step times (seconds) and real target tokens."""

    times: dict[str, list[float]]
    tokens: dict[str, int]
    rounds: int

    def rate(self, name: str) -> float:
        """Target tokens a second of ``name``'s own steps."""
        return self.tokens[name] / sum(self.times[name])


def take_turns(  # type: ignore[no-untyped-def]
    entries: dict, batches: list, seconds: float, warmup: int, finish=lambda: None
) -> Turns:
    """Each entry one ``update([batch])`` a round on the same batch, in an order that rotates
    every round (the machine's drift hits all alike), for ``seconds`` after ``warmup`` untimed
    rounds. ``finish`` waits for the device (a GPU's queue) before and after each step."""
    names = list(entries)
    turns = Turns({name: [] for name in names}, dict.fromkeys(names, 0), 0)
    rounds, begin = 0, None
    while begin is None or time.perf_counter() - begin < seconds:
        batch = batches[rounds % len(batches)]
        shift = rounds % len(names)
        for name in names[shift:] + names[:shift]:
            finish()
            start = time.perf_counter()
            n = entries[name].update([batch]).tokens
            finish()
            if rounds >= warmup:
                turns.times[name].append(time.perf_counter() - start)
                turns.tokens[name] += n
        rounds += 1
        if rounds == warmup:
            begin = time.perf_counter()
    turns.rounds = rounds - warmup
    return turns


def peak_memory(flavour: str, precision: str, data: Path, vocab: int, steps: int) -> dict:
    import torch

    from wtnmt.runtime import tune_cpu_allocator

    torch.set_num_threads(2)
    tune_cpu_allocator()
    _reset_peak_rss()
    with tempfile.TemporaryDirectory() as run:
        trainer = _trainer(flavour, precision, data, vocab, run, 2)
        batches = _batches(trainer, steps)
        for step in range(steps):
            trainer.update([batches[step % len(batches)]])
    return {"peak_rss_gib": _peak_rss_kib() / 2**20}


def _reset_peak_rss() -> None:
    """Restart the peak-RSS count from the current RSS (Linux: writing 5 to clear_refs resets
    VmHWM), so that the parent's memory at fork does not count."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:  # not Linux: ru_maxrss, counted from the start
        pass


def _peak_rss_kib() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def native_bf16() -> bool:
    """Whether the CPU multiplies bf16 natively (AVX512-BF16 or AMX): elsewhere bf16 autocast is
    emulated, many times slower than float32, and the bf16 entries are left out."""
    from wtnmt.runtime import cpu_flags

    return bool({"avx512_bf16", "amx_bf16"} & set(cpu_flags()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench-dir", type=Path, default=ROOT.parent / "shared" / "bench")
    parser.add_argument("--work", type=Path, default=ROOT / "bench-data")
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=10, help="untimed rounds first")
    parser.add_argument("--memory-steps", type=int, default=40)
    parser.add_argument(
        "--plain-linear",
        action="store_true",
        help="also each fp32 model with F.linear (MKL) for its linear layers",
    )
    parser.add_argument(
        "--memory", nargs=2, metavar=("FLAVOUR", "PRECISION"), help=argparse.SUPPRESS
    )
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from records import add_record_argument, keep

    add_record_argument(parser)
    args = parser.parse_args()
    from wtnmt.runtime import machine_line

    print(machine_line(args.threads), flush=True)
    vocab = build_data(args.bench_dir, args.work)
    data = args.work / "prepared"
    if args.memory:
        print(json.dumps(peak_memory(*args.memory, data, vocab, args.memory_steps)))
        return
    # memory first: a child's peak RSS counts from its fork, so the parent must still be small
    memory = {}
    kinds = [("weighted", "fp32"), ("weighted", "bf16"), ("transformer", "fp32")]
    for flavour, precision in [k for k in kinds if k[1] == "fp32" or native_bf16()]:
        out = subprocess.run(
            [sys.executable, __file__, "--bench-dir", str(args.bench_dir), "--work",
             str(args.work), "--memory-steps", str(args.memory_steps), "--memory", flavour,
             precision],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        memory[f"{flavour} {precision}"] = json.loads(out.stdout.strip().splitlines()[-1])
    print(
        f"peak RSS over {args.memory_steps} steps, each in its own process: "
        + ", ".join(f"{name} {m['peak_rss_gib']:.2f} GiB" for name, m in memory.items())
    )
    rates = alternate(data, vocab, args.seconds, args.threads, args.warmup, args.plain_linear)
    floor = rates["floor fp32"]
    for name, rate in rates.items():
        print(f"  {name:18s} {rate:8.0f} tgt tok/s   {rate / floor:.2f}× floor", flush=True)
    print(
        "train tgt tok/s ×floor: "
        + "  ".join(
            f"{name} {rates[name] / floor:.2f}"
            for name in ("weighted fp32", "transformer fp32", "weighted bf16")
            if name in rates
        )
    )
    if args.record:
        rows = []
        for name, rate in rates.items():
            kept = memory.get(name)
            rss = f"{kept['peak_rss_gib']:.2f} GiB" if kept else "–"
            rows.append([name, f"{rate:,.0f}", f"{rate / floor:.2f}", rss])
        keep("train-speed", machine=machine_line(args.threads), rows=rows,
             headers=["model (floor: a plain torch.nn.Transformer loop)", "tgt tok/s", "× floor",
                      "peak RSS"], note=f"{args.seconds:.0f} s of alternating steps")  # fmt: skip


if __name__ == "__main__":
    main()
