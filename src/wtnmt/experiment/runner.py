"""`wtnmt experiment FILE`: train a grid's runs, a few at once, each in its own process; skip
the finished ones, resume the interrupted ones, score each on the test split, then analyze.

What a run directory holds decides what is left to do with it:

- no complete checkpoint: train it (a directory where a run died before its first checkpoint
  starts over, as ``wtnmt train`` allows);
- a checkpoint of a run that has not finished, or finished on another budget or patience
  rule than the grid now asks: resume it (a run the rule asked says is done stops at once);
- finished: only the scores, if they are missing.

A run directory trained with other settings than the grid asks (anything but the budget) is
refused, naming the settings: the grid never trains over someone else's run.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from wtnmt.config import ConfigError, config_to_dict
from wtnmt.experiment.grid import Grid, RunSpec
from wtnmt.experiment.progress import Budget, progress_line
from wtnmt.rundir import RunDirectory, latest_checkpoint
from wtnmt.rundir.run import MARK, config_differences, with_defaults
from wtnmt.runtime import EMULATED_BF16_WARNING, bf16_emulated


@dataclass(frozen=True)
class Task:
    spec: RunSpec
    train: bool
    resume: bool
    evaluate: bool
    busy: bool = False

    @property
    def what(self) -> str:
        if self.busy:
            return "busy: another process is training it"
        if self.train:
            return "resume" if self.resume else "train"
        return "score"


def _recorded_config(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "config.yaml"
    if not path.is_file():
        return None
    data = path.read_bytes()
    if not data.startswith(MARK):
        raise ConfigError(f"{path}: not written by wtnmt; the grid will not train over it")
    return yaml.safe_load(data[len(MARK) :].decode("utf-8"))


FINISHED = "finished.json"  # written when a run has finished: committed, unlike the weights
# when a run ends: a run finished on another budget, or under another stopping rule, goes on
# from its last checkpoint (and stops at once where the rule asked now says it is done)
BUDGET = ("max_time", "max_steps", "max_epochs", "patience", "patience_on")


def plan_task(spec: RunSpec, grid: Grid, *, record: bool = False) -> Task | None:
    """What is left to do with one run (None: nothing; a busy task when another process is
    training it now: two writers would spoil it, so it is left to that one).

    A finished run is known by its last checkpoint, or, where the weights are not there (a
    clone of committed results), by its ``finished.json``; ``record`` writes that file for a
    finished run that lacks it.
    """
    if spec.run_dir.exists() and not spec.run_dir.is_dir():
        raise ConfigError(
            f"{spec.run_dir}: is a file, not a run directory; move it or rename the run"
        )
    if RunDirectory(spec.run_dir).busy():
        return Task(spec, train=False, resume=False, evaluate=False, busy=True)
    asked = config_to_dict(spec.config())
    evaluate = grid.evaluate is not None
    found = latest_checkpoint(spec.run_dir / "checkpoints", warn=lambda _: None)
    marker = spec.run_dir / FINISHED
    if found is None and not marker.is_file():
        return Task(spec, train=True, resume=False, evaluate=evaluate)
    recorded = with_defaults(_recorded_config(spec.run_dir) or {})
    differences = config_differences(recorded, asked) + _train_differences(recorded, asked)
    if differences:
        raise ConfigError(
            f"{spec.run_dir}: trained with other settings than {grid.path} asks "
            f"({'; '.join(differences)}); rename the run in the grid or move the directory"
        )
    same_budget = all(recorded.get("train", {}).get(k) == asked["train"][k] for k in BUDGET)
    if found is None:  # finished, and only its small results are here
        if not same_budget:
            raise ConfigError(
                f"{spec.run_dir}: finished on another budget or stopping rule, and its "
                f"checkpoints are not here "
                f"to continue from; restore them, or rename the run in the grid"
            )
        if evaluate and not scored(spec.run_dir, grid.evaluate or {}):
            raise ConfigError(
                f"{spec.run_dir}: finished but not scored, and its weights are not here"
            )
        return None
    state = found[1]["train_state"]
    if state.get("finished") is None or not same_budget:
        return Task(spec, train=True, resume=True, evaluate=evaluate)
    if record and not marker.is_file():
        write_finished(spec.run_dir, state)
    if evaluate and not scored(spec.run_dir, grid.evaluate or {}):
        return Task(spec, train=False, resume=False, evaluate=True)
    return None


def write_finished(run_dir: Path, state: dict[str, Any]) -> None:
    from wtnmt.rundir import atomic_write

    fields = {k: state[k] for k in ("finished", "step", "epoch", "elapsed")}
    atomic_write(run_dir / FINISHED, (json.dumps(fields, indent=2) + "\n").encode())


def _train_differences(recorded: dict[str, Any], asked: dict[str, Any]) -> list[str]:
    """Training settings (config_differences compares model and data) other than the budget
    and the thread count (which change no result)."""
    skip = {*BUDGET, "threads"}
    before, after = recorded.get("train", {}), asked["train"]
    return [
        f"train.{k}: {before.get(k)!r} → {after[k]!r}"
        for k in after
        if k not in skip and before.get(k) != after[k]
    ]


def scored(run_dir: Path, evaluate: dict[str, Any]) -> bool:
    path = run_dir / "scores.json"
    if not path.is_file():
        return False
    try:
        scores = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:
        return False
    split = evaluate.get("split", "test")
    if not isinstance(scores, dict) or not isinstance(scores.get(split), dict):
        return False
    kept = scores[split]
    return kept.get("beam") == evaluate.get("beam", kept.get("beam")) and kept.get(
        "average"
    ) == evaluate.get("average")


def _prepare_data(grid: Grid, tasks: list[Task], say) -> None:  # type: ignore[no-untyped-def]
    """Each corpus is prepared once here, before runs start side by side on it."""
    from wtnmt.data import prepare

    done: set[str] = set()
    for task in tasks:
        if not task.train:
            continue
        data = task.spec.config().data
        key = json.dumps(config_to_dict(data), sort_keys=True)
        if key not in done:
            done.add(key)
            prepare(data, data.prepared_path(), log=say)


def _emulated_bf16(spec: RunSpec) -> bool:
    """Whether the run would train in bf16 autocast on a CPU that emulates bf16."""
    train = spec.config().train
    if train.device != "auto":
        return bf16_emulated(train.precision, train.device.split(":")[0])
    from wtnmt.train.state import resolve_device

    return bf16_emulated(train.precision, resolve_device("auto").type)


def _launch(task: Task, grid: Grid) -> subprocess.Popen:
    spec = task.spec
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    payload = {
        "run_dir": str(spec.run_dir),
        "preset": spec.preset,
        "overrides": list(spec.overrides),
        "train": task.train,
        "resume": task.resume,
        "evaluate": grid.evaluate if task.evaluate else None,
    }
    threads = str(grid.threads)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    log = open(spec.run_dir / "experiment.log", "a", encoding="utf-8")
    log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {task.what}\n")
    log.flush()
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "wtnmt.experiment.job", json.dumps(payload)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # Ctrl-C reaches the runner, which stops each run itself
        )
    finally:
        log.close()


def _last_line(run_dir: Path) -> str:
    try:
        lines = (run_dir / "experiment.log").read_text(encoding="utf-8").splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


def run_grid(  # type: ignore[no-untyped-def]
    grid: Grid,
    *,
    dry_run: bool = False,
    say=print,
    progress_every: float = 60.0,
    stop_after: float | None = None,
) -> dict[str, str]:
    """Every run's outcome: done, busy, finished, paused, failed (with the log's last line);
    a line of the running runs' steps every ``progress_every`` seconds. ``stop_after``
    seconds from now, the runs still training are stopped at a checkpoint ("paused") and no
    other starts: the next call resumes them."""
    tasks = []
    outcome: dict[str, str] = {}
    for spec in grid.runs:
        task = plan_task(spec, grid, record=not dry_run)
        if task is None:
            outcome[spec.name] = "done"
        elif task.busy:
            outcome[spec.name] = "busy"
            say(f"  {spec.name}: {task.what}; left to it")
        else:
            tasks.append(task)
    say(
        f"{grid.path}: {len(grid.runs)} runs, {list(outcome.values()).count('done')} done, "
        f"{sum(t.train and not t.resume for t in tasks)} to train, "
        f"{sum(t.resume for t in tasks)} to resume, {sum(not t.train for t in tasks)} to score; "
        f"{grid.parallel} at once, {grid.threads} thread{'s' if grid.threads > 1 else ''} each"
    )
    for task in tasks:
        say(f"  {task.spec.name}: {task.what}")
    emulated = [t.spec.name for t in tasks if t.train and _emulated_bf16(t.spec)]
    if emulated:
        say(f"{grid.path}: {EMULATED_BF16_WARNING} ({', '.join(emulated)})")
    if dry_run:
        return {**outcome, **{t.spec.name: t.what for t in tasks}}
    deadline = None if stop_after is None else time.perf_counter() + stop_after
    _prepare_data(grid, tasks, say)
    with _signals_interrupt():
        return _run_tasks(
            grid, tasks, outcome, say=say, progress_every=progress_every, deadline=deadline
        )


@contextlib.contextmanager
def _signals_interrupt():  # type: ignore[no-untyped-def]
    """SIGTERM, and SIGINT even where the shell that started us in the background ignores
    it, interrupt the runner as Ctrl-C does: its runs are stopped at a checkpoint, never left
    training on their own."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _stop(running: dict[str, Any]) -> None:
    """Each running run saves a checkpoint at its next update and exits."""
    for _, proc in running.values():
        proc.send_signal(signal.SIGINT)
    for _, proc in running.values():
        proc.wait()


def _run_tasks(  # type: ignore[no-untyped-def]
    grid: Grid,
    tasks: list[Task],
    outcome: dict[str, str],
    *,
    say,
    progress_every: float,
    deadline: float | None = None,
) -> dict[str, str]:
    pending, running = list(tasks), {}
    started: dict[str, float] = {}
    budgets: dict[str, Budget] = {}
    seen: dict[str, tuple[float, int]] = {}  # each run's first (time, step) in a progress line
    shown = time.perf_counter()
    try:
        while pending or running:
            if deadline is not None and time.perf_counter() >= deadline:
                _stop(running)
                for name in running:
                    outcome[name] = "paused"
                for task in pending:
                    outcome[task.spec.name] = "paused"
                say(
                    f"[{time.strftime('%H:%M:%S')}] stopped as asked (--stop-after): "
                    f"{len(running)} run(s) paused at a checkpoint, {len(pending)} not started; "
                    f"run `wtnmt experiment {grid.path}` again to go on"
                )
                return outcome
            if running and time.perf_counter() - shown >= progress_every:
                shown = time.perf_counter()
                progress = ", ".join(
                    progress_line(task.spec, budgets[task.spec.name], seen, shown)
                    for task, _ in running.values()
                )
                say(f"[{time.strftime('%H:%M:%S')}] {progress}; {len(pending)} waiting")
            while pending and len(running) < grid.parallel:
                task = pending.pop(0)
                running[task.spec.name] = (task, _launch(task, grid))
                started[task.spec.name] = time.perf_counter()
                budgets[task.spec.name] = Budget.of(task.spec)
                say(f"[{time.strftime('%H:%M:%S')}] {task.spec.name}: {task.what} started")
            time.sleep(1.0)
            for name, (task, proc) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[name]
                minutes = (time.perf_counter() - started[name]) / 60
                if proc.returncode == 0:
                    outcome[name] = "finished"
                    say(f"[{time.strftime('%H:%M:%S')}] {name}: finished in {minutes:.1f} min")
                elif proc.returncode in (130, -signal.SIGINT, -signal.SIGTERM):
                    outcome[name] = "interrupted"  # stopped at a checkpoint, from outside
                    say(
                        f"[{time.strftime('%H:%M:%S')}] {name}: interrupted; run "
                        f"`wtnmt experiment {grid.path}` again to resume it"
                    )
                else:
                    outcome[name] = f"failed: {_last_line(task.spec.run_dir)}"
                    say(
                        f"[{time.strftime('%H:%M:%S')}] {name}: FAILED (exit {proc.returncode}): "
                        f"{_last_line(task.spec.run_dir)}; log: {task.spec.run_dir}/experiment.log"
                    )
    except KeyboardInterrupt:
        _stop(running)
        say(f"interrupted: run `wtnmt experiment {grid.path}` again to resume")
        raise
    return outcome


__all__ = ["Task", "plan_task", "run_grid"]
