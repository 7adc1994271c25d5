#!/usr/bin/env python3
"""`wtnmt prepare` at WMT scale: wall time and peak memory against the corpus size and the
number of workers.

    python benchmarks/prepare_scale.py [--sizes 250000 1000000 4000000] [--workers 1 2]
                                       [--out bench-data/prepare-scale] [--vocab-size 16000]

Corpora: Multi30k's English–German training pairs ($WTNMT_DATA/multi30k, else the user
cache), two pairs a line (about 26 words a side, like WMT's sentences), drawn with a fixed
seed; 0.5% of the lines repeat an earlier one and 0.1% have an empty side, so that cleaning
has something to count. Each (size, workers) runs `wtnmt prepare --src --tgt` in a process of
its own, timed by the wall clock, with the seconds of each step as summary.json records them.
Dev and test are Multi30k's (1,014 and 1,000 lines), so nearly all the work is the training
split's.

Memory is the peak, sampled every 0.5 s (reading smaps costs CPU time: every 20 ms it took a
third of a core), of the proportional set size (PSS) summed over the prepare process and its
workers: pages they share are counted once, so the sum is what the machine gave them all.
The main process's own peak RSS (wait4's ru_maxrss) is beside it.

Prints one row per run and, last, the ratio of 1 worker's time to 2 workers' at each size.

``--train-memory``: then the training side at the largest size: `wtnmt train` of the
`weighted-small` preset (2 threads) for one update on the prepared set (its batch plan,
memory-mapped ids, the update, the final validation and checkpoint), against the same on a
set of 10,000 pairs prepared alike; the difference of the two peak RSS is what the corpus
adds beyond the model's own memory.

``--record`` keeps the table (and the training side's peaks, with ``--train-memory``) for
docs/BENCHMARKS.md (records.py).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from records import add_record_argument  # noqa: E402


def multi30k_lines(lang: str, split: str = "train") -> list[str]:
    from wtnmt.data.corpora import CORPORA, locate

    with gzip.open(locate(CORPORA["multi30k"]) / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def make_corpus(out: Path, pairs: int, *, seed: int = 1) -> tuple[Path, Path]:
    """``pairs`` lines of two Multi30k pairs each (kept across calls: made once a size)."""
    src, tgt = out / f"train{pairs}.en", out / f"train{pairs}.de"
    if src.is_file() and tgt.is_file():
        return src, tgt
    out.mkdir(parents=True, exist_ok=True)
    en, de = multi30k_lines("en"), multi30k_lines("de")
    rng = np.random.default_rng(seed)
    chunk = 100_000
    with open(f"{src}.part", "w", encoding="utf-8") as fs, open(f"{tgt}.part", "w") as ft:
        for start in range(0, pairs, chunk):
            n = min(chunk, pairs - start)
            a, b = rng.integers(len(en), size=n), rng.integers(len(en), size=n)
            repeat = rng.random(n) < 0.005  # a line again: the first of its chunk
            empty = rng.random(n) < 0.001
            for i in range(n):
                j, k = (a[0], b[0]) if repeat[i] else (a[i], b[i])
                fs.write(f"{en[j]} {en[k]}\n")
                ft.write("\n" if empty[i] else f"{de[j]} {de[k]}\n")
    os.replace(f"{src}.part", src)
    os.replace(f"{tgt}.part", tgt)
    return src, tgt


def dev_test(out: Path) -> list[str]:
    """Multi30k's own dev and test files, as the options of `wtnmt prepare`."""
    out.mkdir(parents=True, exist_ok=True)
    args = []
    for split, theirs in (("valid", "val"), ("test", "test_2016_flickr")):
        for lang in ("en", "de"):
            text = multi30k_lines(lang, theirs)
            path = out / f"{split}.{lang}"
            path.write_text("".join(s + "\n" for s in text), encoding="utf-8")
        args += [
            f"--{split}-src",
            str(out / f"{split}.en"),
            f"--{split}-tgt",
            str(out / f"{split}.de"),
        ]
    return args


def _tree(pid: int) -> list[int]:
    """``pid`` and its descendants (the encoding workers)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in task.read_text().split()]
    return found


def _pss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_prepare(
    src: Path, tgt: Path, extra: list[str], out: Path, workers: int, vocab: int
) -> tuple[float, float, float, dict[str, float]]:
    """Seconds, peak summed PSS (GB) of the process tree, the main process's peak RSS (GB)
    and the seconds of each step of one `wtnmt prepare` in its own process."""
    shutil.rmtree(out, ignore_errors=True)
    command = [
        sys.executable, "-m", "wtnmt.cli", "prepare", "--src", str(src), "--tgt", str(tgt),
        *extra, "--src-lang", "en", "--tgt-lang", "de", "--vocab-size", str(vocab),
        "--workers", str(workers), "--out", str(out),
    ]  # fmt: skip
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak, stop = 0, threading.Event()

    def sample() -> None:
        nonlocal peak
        while not stop.wait(0.5):
            peak = max(peak, sum(_pss_kb(p) for p in _tree(process.pid)))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    err = process.stderr.read().decode() if process.stderr else ""  # until it closes
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    stop.set()
    sampler.join()
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"prepare failed:\n{err}")
    steps = json.loads((out / "summary.json").read_text())["seconds_by_step"]
    return seconds, peak / 2**20, usage.ru_maxrss / 2**20, steps  # kB → GB


def train_peak_gb(files: dict[str, str], prepared: Path, run: Path) -> float:
    """Peak RSS (GB) of `wtnmt train` giving weighted-small one update on ``prepared``."""
    import dataclasses

    import yaml

    from wtnmt.config import DataConfig, config_to_dict, load_config

    config = config_to_dict(load_config("weighted-small"))
    data = DataConfig(corpus=None, src_lang="en", tgt_lang="de", vocab_size=16_000, **files)
    config["data"] = {**dataclasses.asdict(data), "prepared_dir": str(prepared)}
    config["train"].update(max_steps=1, max_time=None, threads=2, valid_every=1000)
    path = run.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(config))
    shutil.rmtree(run, ignore_errors=True)
    command = [sys.executable, "-m", "wtnmt.cli", "train", str(path), "--out", str(run)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = process.stderr.read().decode() if process.stderr else ""
    _, status, usage = os.wait4(process.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0 or "up to date" not in err:
        sys.exit(f"train failed, or prepared its data again:\n{err}")
    return usage.ru_maxrss / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[250_000, 1_000_000, 4_000_000])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--out", type=Path, default=ROOT / "bench-data" / "prepare-scale")
    parser.add_argument("--vocab-size", type=int, default=16_000)
    parser.add_argument("--train-memory", action="store_true", help="see the docstring")
    add_record_argument(parser)
    args = parser.parse_args()
    from wtnmt.runtime import machine_line

    print(machine_line(), flush=True)
    extra = dev_test(args.out)
    times: dict[tuple[int, int], float] = {}
    rows: list[list[str]] = []
    notes = [f"A {args.vocab_size:,}-piece vocabulary"]
    head = ("pairs", "workers", "seconds", "peak PSS GB", "main RSS GB")
    print(
        " ".join(f"{h:>{w}}" for h, w in zip(head, (10, 7, 8, 11, 11), strict=True)), " steps (s)"
    )
    for size in args.sizes:
        src, tgt = make_corpus(args.out, size)
        for workers in args.workers:
            prepared = args.out / "prepared"
            seconds, pss, rss, steps = run_prepare(
                src, tgt, extra, prepared, workers, args.vocab_size
            )
            times[size, workers] = seconds
            laps = [f"{steps.get(k, 0.0):.1f}" for k in ("read", "vocabulary", "encode")]
            rows.append([f"{size:,}", str(workers), f"{seconds:.1f}", f"{pss:.2f}", *laps])
            laps = " ".join(f"{k} {v:.1f}" for k, v in steps.items())
            print(f"{size:>10,} {workers:>7} {seconds:>8.1f} {pss:>11.2f} {rss:>11.2f}  {laps}")
    if 1 in args.workers and 2 in args.workers:
        ratios = "  ".join(f"{s:,}: {times[s, 1] / times[s, 2]:.2f}x" for s in args.sizes)
        print(f"1 worker's time / 2 workers': {ratios}")
        notes.append("two workers against one: " + ", ".join(
            f"{times[s, 1] / times[s, 2]:.2f}×" for s in args.sizes) + " the speed")  # fmt: skip
    if args.train_memory:
        peaks = {}
        for size in (10_000, max(args.sizes)):
            src, tgt = make_corpus(args.out, size)
            prepared = args.out / f"prepared-{size}"
            if not (prepared / "manifest.json").is_file():
                run_prepare(src, tgt, extra, prepared, max(args.workers), args.vocab_size)
            files = {"train_src": str(src), "train_tgt": str(tgt)}
            files.update(
                zip(("valid_src", "valid_tgt", "test_src", "test_tgt"), extra[1::2], strict=True)
            )
            peaks[size] = train_peak_gb(files, prepared, args.out / f"run-{size}")
            print(f"wtnmt train, weighted-small, 1 update on {size:,} pairs: {peaks[size]:.2f} GB")
        big = max(args.sizes)
        print(f"the corpus adds {peaks[big] - peaks[10_000]:.2f} GB at {big:,} pairs")
        notes.append(f"training (`weighted-small`, one update, validation and checkpoint) "
                     f"peaked at {peaks[big]:.2f} GB on {big:,} pairs against "
                     f"{peaks[10_000]:.2f} GB on 10,000")  # fmt: skip
    if args.record:
        from records import keep

        keep("prepare-scale", machine=machine_line(), rows=rows,
             headers=["pairs", "workers", "seconds", "peak memory (GB)", "read", "vocabulary",
                      "encode"], note="; ".join(notes) + ".")  # fmt: skip


if __name__ == "__main__":
    main()
