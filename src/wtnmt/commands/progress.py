"""Progress of a command's long work, as a user sees it: a bar with rate and time left on a
terminal, a line now and then in a log, and a summary at the end."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any


def count_lines(path: str | None) -> int | None:
    """Lines of a regular file (its size known before reading it), or None: stdin, a pipe."""
    if path in (None, "-") or not Path(path).is_file():  # type: ignore[arg-type]
        return None
    count, last = 0, b""
    with open(path, "rb") as f:  # type: ignore[arg-type]
        for block in iter(lambda: f.read(1 << 20), b""):
            count += block.count(b"\n")
            last = block
    return count + (1 if last and not last.endswith(b"\n") else 0)


class Progress:
    """``done(n)`` as work is done: a tqdm bar on a terminal; elsewhere a line every
    ``every`` seconds (rate and time left where the total is known); ``close()`` says how
    much was done in how long."""

    def __init__(self, what: str, total: int | None, unit: str, *, every: float = 30.0) -> None:
        self.what, self.total, self.unit, self.every = what, total, unit, every
        self.start = self.last = time.perf_counter()
        self.count = 0
        self.bar: Any = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=what, unit=unit, dynamic_ncols=True, leave=False)

    def done(self, n: int) -> None:
        self.count += n
        if self.bar is not None:
            self.bar.update(n)
            return
        now = time.perf_counter()
        if now - self.last >= self.every:
            self.last = now
            rate = self.count / max(now - self.start, 1e-9)
            line = f"{self.what}: {self.count:,} {self.unit}s, {rate:.1f} {self.unit}s/s"
            if self.total:
                from tqdm import tqdm

                left = max(0, round((self.total - self.count) / max(rate, 1e-9)))
                line += (
                    f" ({self.count / self.total:.0%} of {self.total:,}; "
                    f"{tqdm.format_interval(left)} left)"
                )
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        seconds = time.perf_counter() - self.start
        print(
            f"{self.what}: {self.count:,} {self.unit}{'s' * (self.count != 1)} in "
            f"{seconds:.1f} s ({self.count / max(seconds, 1e-9):.1f} {self.unit}s/s)",
            file=sys.stderr,
            flush=True,
        )


__all__ = ["Progress", "count_lines"]
