"""Loopback load test of `wtnmt serve`: dynamic batching against one sentence at a time.

Starts `wtnmt serve RUN_DIR` twice on 127.0.0.1 (batching on, and `--no-batching`), then, at
each concurrency level, keeps that many single-sentence requests in flight for a bounded time
against one server and then the other (alternating, so that the machine's drift hits both):
sentences/s, p50/p99 latency, errors, and the mean batch size read from /metrics. Last, a
third server with a small queue (`--max-queue`) under the highest concurrency: requests past
the limit must get 429 and the server must stay up.

    .venv/bin/python benchmarks/serve_load.py runs/demo          # after `make demo`
    .venv/bin/python benchmarks/serve_load.py runs/demo --onnxruntime   # and that engine

``--record`` keeps the table (batching against one-by-one at each level, and what the small
queue did) for docs/BENCHMARKS.md (records.py).

Every request goes to 127.0.0.1 only; each level stops after --seconds or --max-requests.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from records import add_record_argument
from wtnmt.config import load_config
from wtnmt.runtime import machine_line


def default_input(run_dir: Path) -> Path:
    """The test split's source side that `wtnmt train` prepared for this run."""
    data = load_config(run_dir / "config.yaml").data
    return data.prepared_path() / f"test.{data.src_lang}"


class Server:
    """`wtnmt serve` in a subprocess on a free loopback port."""

    def __init__(self, run_dir: Path, *options: str) -> None:
        command = [sys.executable, "-m", "wtnmt.cli", "serve", str(run_dir), "--port", "0"]
        self.proc = subprocess.Popen(
            [*command, "--log-level", "warning", *options], stderr=subprocess.PIPE, text=True
        )
        line = self.proc.stderr.readline() if self.proc.stderr else ""
        if " at http://127.0.0.1:" not in line:
            self.proc.kill()
            raise SystemExit(f"serve_load: the server did not start: {line.strip()}")
        self.url = line.split(" at ")[1].split("/ ")[0]
        deadline = time.monotonic() + 120
        while not self._ready():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit("serve_load: the server never became ready")
            time.sleep(0.2)

    def _ready(self) -> bool:
        try:
            return httpx.get(self.url + "/ready", timeout=5).status_code == 200
        except httpx.TransportError:
            return False

    def metrics(self) -> dict[str, float]:
        wanted = ("wtnmt_batch_sentences_sum", "wtnmt_batch_sentences_count")
        values = {}
        for line in httpx.get(self.url + "/metrics").text.splitlines():
            name, _, value = line.partition(" ")
            if name in wanted:
                values[name] = float(value)
        return values

    def alive(self) -> bool:
        return self.proc.poll() is None and httpx.get(self.url + "/health").status_code == 200

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


async def load(
    url: str, sentences: list[str], *, concurrency: int, seconds: float, max_requests: int
) -> dict[str, object]:
    """``concurrency`` clients, each sending one sentence at a time, until time or count."""
    latencies: list[float] = []
    statuses: Counter[int | str] = Counter()
    sent = 0
    stop_at = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def client(c: httpx.AsyncClient) -> None:
        nonlocal sent
        while time.monotonic() < stop_at and sent < max_requests:
            text = sentences[sent % len(sentences)]
            sent += 1
            start = time.monotonic()
            try:
                r = await c.post("/v1/translate", json={"text": text})
                statuses[r.status_code] += 1
            except httpx.TransportError as e:  # no answer at all
                statuses[f"no answer ({type(e).__name__})"] += 1
            latencies.append(time.monotonic() - start)

    start = time.monotonic()
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as c:
        await asyncio.gather(*(client(c) for _ in range(concurrency)))
    elapsed = time.monotonic() - start
    latencies.sort()
    ok = statuses[200]
    return {
        "requests": len(latencies),
        "sentences_per_s": ok / elapsed,
        "p50": statistics.median(latencies),
        "p99": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "errors": {k: v for k, v in statuses.items() if k != 200},
    }


def measure(server: Server, sentences: list[str], concurrency: int, args) -> dict[str, object]:  # type: ignore[no-untyped-def]
    before = server.metrics()
    result = asyncio.run(
        load(
            server.url,
            sentences,
            concurrency=concurrency,
            seconds=args.seconds,
            max_requests=args.max_requests,
        )
    )
    after = server.metrics()
    batches = after["wtnmt_batch_sentences_count"] - before["wtnmt_batch_sentences_count"]
    batched = after["wtnmt_batch_sentences_sum"] - before["wtnmt_batch_sentences_sum"]
    result["mean_batch"] = batched / batches if batches else 0.0
    return result


def row(mode: str, concurrency: int, r: dict[str, object]) -> str:
    errors = ", ".join(f"{k}: {v}" for k, v in r["errors"].items()) or "0"  # type: ignore[union-attr]
    return (
        f"{mode:<12} {concurrency:>4} {r['requests']:>8} {r['sentences_per_s']:>10.1f} "
        f"{r['p50'] * 1000:>8.0f} {r['p99'] * 1000:>8.0f} {r['mean_batch']:>7.1f}  {errors}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", nargs="?", default="runs/demo", type=Path)
    parser.add_argument("--input", type=Path, help="sentences, one per line (default: test split)")
    parser.add_argument("--concurrency", default="1,8,32,64")
    parser.add_argument("--seconds", type=float, default=12.0, help="per level and mode")
    parser.add_argument("--max-requests", type=int, default=3000, help="per level and mode")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--overload-queue", type=int, default=16, help="queue of the 429 test")
    parser.add_argument(
        "--onnxruntime",
        action="store_true",
        help="also a batching server on `--engine onnxruntime`, in the same alternation",
    )
    add_record_argument(parser)
    args = parser.parse_args()
    print(machine_line(args.threads), flush=True)
    if not (args.run_dir / "model.safetensors").is_file():
        parser.error(f"{args.run_dir}: no trained run there (run `make demo` first)")
    source = args.input or default_input(args.run_dir)
    if not source.is_file():
        parser.error(f"{source}: no such file; give sentences with --input FILE")
    sentences = [s for s in source.read_text(encoding="utf-8").split("\n") if s.strip()]
    levels = [int(c) for c in args.concurrency.split(",")]
    threads = ("--threads", str(args.threads))

    print(
        f"serve_load: {args.run_dir}, {len(sentences):,} sentences from {source}, "
        f"{args.threads} threads, {args.seconds:g} s or {args.max_requests} requests a level"
    )
    print(
        f"{'mode':<12} {'conc':>4} {'requests':>8} {'sent/s':>10} {'p50 ms':>8} "
        f"{'p99 ms':>8} {'batch':>7}  errors"
    )
    results: dict[tuple[str, int], dict[str, object]] = {}
    with ExitStack() as stack:
        batching = Server(args.run_dir, *threads)
        stack.callback(batching.close)
        single = Server(args.run_dir, *threads, "--no-batching")
        stack.callback(single.close)
        servers = [("batching", batching), ("one-by-one", single)]
        if args.onnxruntime:
            if not (args.run_dir / "onnx" / "export.json").is_file():  # before it serves
                export = [sys.executable, "-m", "wtnmt.cli", "export", "onnx", str(args.run_dir)]
                subprocess.run(export, check=True)
            onnx = Server(args.run_dir, *threads, "--engine", "onnxruntime")
            stack.callback(onnx.close)
            servers.append(("onnxruntime", onnx))
        for concurrency in levels:
            for mode, server in servers:
                results[mode, concurrency] = r = measure(server, sentences, concurrency, args)
                print(row(mode, concurrency, r), flush=True)
    top = max(levels)
    with ExitStack() as stack:
        small = Server(
            args.run_dir, *threads, "--max-queue", str(args.overload_queue), "--max-sentences", "1"
        )
        stack.callback(small.close)
        over = measure(small, sentences, top, args)
        print(row(f"queue {args.overload_queue}", top, over))
        survived = small.alive()

    print()
    if 32 in levels:
        b, s = results["batching", 32], results["one-by-one", 32]
        ratio = b["sentences_per_s"] / s["sentences_per_s"]  # type: ignore[operator]
        print(
            f"concurrency 32: batching serves {ratio:.2f}x the sentences/s of one-by-one "
            f"(bar 3x); p99 {b['p99'] * 1000:.0f} ms (bar 2000 ms)"
        )
    if 32 in levels and args.onnxruntime:
        b, o = results["batching", 32], results["onnxruntime", 32]
        ratio = o["sentences_per_s"] / b["sentences_per_s"]  # type: ignore[operator]
        print(
            f"concurrency 32: ONNX Runtime serves {ratio:.2f}x the sentences/s of PyTorch "
            f"(both batching); p99 {o['p99'] * 1000:.0f} ms against {b['p99'] * 1000:.0f} ms"
        )
    clean = all(not results["batching", c]["errors"] for c in levels)
    print(f"errors below the queue limit: {'none' if clean else 'SOME'}")
    refused = over["errors"].get(429, 0)  # type: ignore[union-attr]
    print(
        f"past the queue limit: {refused} requests got 429, server "
        f"{'still up' if survived else 'DOWN'}"
    )
    if args.record:
        record(args, levels, results, over, survived, len(sentences))
    return 0


def record(args, levels, results, over, survived, sentences) -> None:  # type: ignore[no-untyped-def]
    """Keeps the table docs/BENCHMARKS.md shows (records.py)."""
    from records import keep

    def cells(r: dict) -> list[str]:  # type: ignore[type-arg]
        return [f"{r['sentences_per_s']:,.1f}", f"{r['p50'] * 1000:,.0f} / {r['p99'] * 1000:,.0f}"]

    rows = []
    for c in levels:
        b, s = results["batching", c], results["one-by-one", c]
        rows.append([str(c), *cells(b), f"{b['mean_batch']:.1f}", *cells(s)])
    top = max(levels)
    speed = {c: results["batching", c]["sentences_per_s"] / results["one-by-one", c]
             ["sentences_per_s"] for c in levels}  # fmt: skip
    refused = over["errors"].get(429, 0)
    note = (
        f"{args.run_dir.name}'s model, {sentences:,} sentences; each level {args.seconds:g} s or "
        f"{args.max_requests:,} requests a mode, alternating. At {top} clients batching serves "
        f"{speed[top]:.2f}× one-by-one's sentences. With a queue of {args.overload_queue} under "
        f"{top} clients, {refused:,} requests got 429 and the server "
        f"{'stayed up' if survived else 'went DOWN'}."
    )
    headers = ["concurrency", "batching sent/s", "p50 / p99 ms", "mean batch",
               "one-by-one sent/s", "p50 / p99 ms"]  # fmt: skip
    keep("serve-load", machine=machine_line(args.threads), headers=headers, rows=rows, note=note)


if __name__ == "__main__":
    sys.exit(main())
