"""What a training run reports: log lines (stderr and train.log), one metrics.jsonl entry per
logged step and per validation, one machines.jsonl entry each time training starts or resumes,
and TensorBoard events of the same values when tensorboard is installed. Only the main process
writes."""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from wtnmt.errors import TrainingError
from wtnmt.model import branch_weight_table
from wtnmt.runtime import MACHINES, machine_description
from wtnmt.train.state import TrainState, Window


def _figure_digits(values: list[float]) -> list[float]:
    """κ, α or transparent weights to 6 decimals for metrics.jsonl, finer than any figure or
    table shows: logged every ``log_every`` updates for every layer, float32's full repr made a
    Weighted Transformer's log half as large again (a 24,000-update run of the GPU grid's
    recipe: about 0.97 MB, not 0.64)."""
    return [round(value, 6) for value in values]


def append_line(path: Path, line: str) -> None:
    """``line`` and a newline at the end of ``path``, whole or not at all: a write that fails
    (a full disk) is cut back off, so that the file never ends in half a line, and the run
    stops with one line saying why."""
    data = (line + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        size = os.fstat(fd).st_size
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as e:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise TrainingError(
                f"{path}: could not be written ({e.strerror}); the run stopped at its last "
                f"checkpoint: make room, then continue it with --resume"
            ) from None
    finally:
        os.close(fd)


def progress_bar(train, state: TrainState):  # type: ignore[no-untyped-def]
    """A tqdm bar of the run on a terminal (stderr): of seconds for a wall-clock budget (its
    estimate is then the time left), of steps otherwise; None where stderr is no terminal, or
    one too narrow to draw in (a pty of zero width drew nothing until the first validation):
    log lines with the time left then."""
    if not sys.stderr.isatty():
        return None
    try:
        width = os.get_terminal_size(sys.stderr.fileno()).columns
    except OSError:
        width = 0
    if width < 40:
        return None
    from tqdm import tqdm

    if train.max_steps is None and train.max_time is not None:
        return tqdm(
            total=round(train.max_time),
            initial=min(round(state.elapsed), round(train.max_time)),
            unit="s",
            dynamic_ncols=True,
            bar_format="{l_bar}{bar}| {n:.0f}/{total}s [{elapsed}<{remaining}{postfix}]",
        )
    if train.max_steps is None:  # epochs: no total to show
        return tqdm(initial=state.step, unit="step", dynamic_ncols=True)
    return tqdm(total=train.max_steps, initial=state.step, unit="step", dynamic_ncols=True)


def advance(bar, amount: float) -> None:  # type: ignore[no-untyped-def]
    """Move ``bar`` on, never past its total (a run bounded by max_time ends a little after
    it: tqdm then showed 102% and '<-00:00' with a warning)."""
    if bar.total is not None:
        amount = max(0.0, min(amount, bar.total - bar.n))
    if amount:
        bar.update(amount)


def time_left(state: TrainState, budget: tuple[int | None, float | None], per_step: float) -> str:
    """' | 42% | 0:12:34 left' of a run with a step or time budget, from the last window's
    seconds per update (the sooner of the two ends where it has both); '' for epochs."""
    max_steps, max_time = budget
    ends = []
    if max_steps:
        ends.append(((max_steps - state.step) * per_step, state.step / max_steps))
    if max_time:
        ends.append((max_time - state.elapsed, state.elapsed / max_time))
    if not ends:
        return ""
    seconds, done = min(ends)
    from tqdm import tqdm

    return f" | {min(done, 1.0):.0%} | {tqdm.format_interval(max(0, round(seconds)))} left"


def recorded_validations(run_dir: Path, up_to: int) -> list[tuple[float, float | None]]:
    """(dev loss, dev BLEU) of every validation ``metrics.jsonl`` records up to step
    ``up_to``, in step order (a step a resume validated again counts once, as last logged);
    nothing where the file is missing."""
    found: dict[int, tuple[float, float | None]] = {}
    try:
        lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    for line in lines:
        if '"valid_loss"' not in line:
            continue
        try:
            entry = json.loads(line)
        except ValueError:  # a line cut short by a crash
            continue
        if entry["step"] <= up_to:
            found[entry["step"]] = (entry["valid_loss"], entry.get("valid_bleu"))
    return [found[step] for step in sorted(found)]


class RunReport:
    def __init__(self, run_dir: Path, *, is_main: bool, to_stderr: bool) -> None:
        self.run_dir, self.is_main, self.to_stderr = run_dir, is_main, to_stderr
        self._tensorboard: Any = None
        self.bar: Any = None  # the progress bar on a terminal, while training shows one
        self.budget: tuple[int | None, float | None] = (None, None)  # max steps, max seconds
        self._looked_for_tensorboard = False

    @property
    def tensorboard(self) -> Any:
        """The event writer, opened at the first entry: by then the run directory has been
        checked, so a refused resume never gains a tensorboard/ folder."""
        if not self._looked_for_tensorboard:
            self._looked_for_tensorboard = True
            if importlib.util.find_spec("tensorboard") is not None:
                from torch.utils.tensorboard import SummaryWriter

                self._tensorboard = SummaryWriter(str(self.run_dir / "tensorboard"))
        return self._tensorboard

    def log(self, message: str, *, stderr: bool = True) -> None:
        if not self.is_main:
            return
        line = f"[{time.strftime('%H:%M:%S')}] {message}"
        if self.to_stderr and stderr:
            if self.bar is not None:  # above the progress bar, which stays at the bottom
                self.bar.write(line, file=sys.stderr)
            else:
                print(line, file=sys.stderr, flush=True)
        append_line(self.run_dir / "train.log", line)

    def machine(self, step: int, device: torch.device, world: int) -> None:
        """Where training starts or resumes at ``step``: the machine, in machines.jsonl and
        the log, so that a run's seconds are read against the machine that spent them (a run
        resumed elsewhere has two)."""
        if not self.is_main:
            return
        entry = {
            "step": step,
            "machine": machine_description(device),
            "threads": torch.get_num_threads(),
            "processes": world,
            "torch": torch.__version__,
        }
        append_line(self.run_dir / MACHINES, json.dumps(entry))
        threads = entry["threads"]
        self.log(
            f"machine: {entry['machine']}, {threads} thread{'s' if threads != 1 else ''}, "
            f"torch {torch.__version__}"
        )

    def record(self, entry: dict[str, Any]) -> None:
        if not self.is_main:
            return
        append_line(self.run_dir / "metrics.jsonl", json.dumps(entry))
        writer = self.tensorboard
        if writer is not None:
            for key, value in entry.items():
                if key != "step" and isinstance(value, (int, float)):
                    writer.add_scalar(key, value, entry["step"])
            writer.flush()

    def step(
        self,
        state: TrainState,
        window: Window,
        *,
        model: nn.Module,
        lr: float,
        lr_branch: float | None,
        ratio: float | None,
        world: int,
        progress: Any,
    ) -> None:
        """The entry and log line of the updates in ``window`` (the progress bar, when there
        is one, shows a short form and the line goes to train.log only)."""
        s = state
        seconds = time.perf_counter() - window.start
        loss, nll = window.loss / max(window.tokens, 1), window.nll / max(window.tokens, 1)
        entry: dict[str, Any] = {
            "step": s.step,
            "epoch": s.epoch,
            "loss": round(loss, 4),
            "nll": round(nll, 4),
            "ppl": round(math.exp(min(nll, 50)), 2),
            "lr": lr,
            **({} if lr_branch is None else {"lr_branch": lr_branch}),
            "grad_norm": round(window.grad_norm / max(window.updates, 1), 4),
            "tokens_per_s": round(window.tokens * world / max(seconds, 1e-9), 1),
            "elapsed": round(s.elapsed, 1),
            "nonfinite_skipped": s.nonfinite_total,
            "branch_weights": {
                layer: {name: _figure_digits(values) for name, values in weights.items()}
                for layer, weights in branch_weight_table(model).items()
            },
        }
        if model.transparent is not None:
            with torch.no_grad():
                transparent = model.transparent.weight.softmax(0).tolist()
            entry["transparent_weights"] = [_figure_digits(row) for row in transparent]
        if ratio is not None:
            entry["grad_ratio"] = ratio
        self.record(entry)
        text = (
            f"step {s.step} | epoch {s.epoch} | loss {loss:.3f} | nll {nll:.3f} | "
            f"ppl {entry['ppl']:.1f} | lr {lr:.2e} | "
            + ("" if lr_branch is None else f"lr κα {lr_branch:.2e} | ")
            + "gnorm "
            f"{entry['grad_norm']:.2f} | {entry['tokens_per_s']:.0f} tok/s | "
            f"{s.elapsed:.0f}s" + time_left(s, self.budget, seconds / max(window.updates, 1))
        )
        if progress is not None:
            progress.set_postfix_str(
                f"step {s.step} | loss {loss:.3f} | {entry['tokens_per_s']:.0f} tok/s"
            )
        self.log(text)


__all__ = ["RunReport", "advance", "append_line", "progress_bar", "time_left"]
