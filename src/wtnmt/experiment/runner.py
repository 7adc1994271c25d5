"""`wtnmt experiment FILE`: train a grid's runs, a few at once, each in its own process; skip
the finished ones, resume the interrupted ones (what is left to do with each: ``plan``), score
each on the test split, then analyze. A run trained in a work directory (``--work-dir``)
copies its small results to where the grid puts it when it finishes, and its curve so far to
the grid's ``interrupted/`` when it is stopped before that.
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
from pathlib import Path
from typing import Any

from wtnmt.config import config_to_dict
from wtnmt.experiment.grid import Grid, RunSpec
from wtnmt.experiment.pack import (
    copy_results,
    drop_finished_curve,
    keep_interrupted_curve,
    kept_tries,
)
from wtnmt.experiment.plan import FINISHED, Task, plan_task
from wtnmt.experiment.progress import Budget, Sightings, curve_end, progress_line
from wtnmt.lifeline import PARENT_ENV
from wtnmt.runtime import EMULATED_BF16_WARNING, bf16_emulated


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


def job_payload(task: Task, grid: Grid) -> dict[str, Any]:
    """What a run's process (wtnmt.experiment.job) is told to do, as JSON."""
    spec = task.spec
    return {
        "run_dir": str(spec.run_dir),
        "preset": spec.preset,
        "overrides": list(spec.overrides),
        "train": task.train,
        "resume": task.resume,
        "evaluate": grid.evaluate if task.evaluate else None,
        "table3": (grid.analyze or {}).get("random_seeds") if task.evaluate else None,
    }


def job_argv(payload: dict[str, Any]) -> list[str]:
    """The command of a run's process: SIGINT a request to stop from its first instant
    (``wtnmt.interrupt``), so that one sent while the run still imports is never lost."""
    return [sys.executable, "-m", "wtnmt.interrupt", "wtnmt.experiment.job", json.dumps(payload)]


def _launch(task: Task, grid: Grid) -> subprocess.Popen:
    spec = task.spec
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    payload = job_payload(task, grid)
    threads = str(grid.threads)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    env[PARENT_ENV] = str(os.getpid())  # the run saves and stops if this runner is killed
    log = open(spec.run_dir / "experiment.log", "a", encoding="utf-8")
    log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {task.what}\n")
    log.flush()
    try:
        return subprocess.Popen(
            job_argv(payload),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # Ctrl-C reaches the runner, which stops each run itself
        )
    finally:
        log.close()


def copy_finished_results(spec: RunSpec, say) -> None:  # type: ignore[no-untyped-def]
    """Copy a run's small results from its work directory, saying so when a file changed;
    once it has finished, the curve an earlier stop of it kept in ``interrupted/`` goes."""
    if spec.results_dir is None or not spec.run_dir.is_dir():
        return
    if copy_results(spec):
        say(f"  {spec.name}: results copied to {spec.results_dir} (no weights)")
    dropped = drop_finished_curve(spec)
    if dropped is not None:
        say(f"  {spec.name}: {dropped[1]} removed, its curve is whole in the results")


def _keep_curve(spec: RunSpec, say) -> None:  # type: ignore[no-untyped-def]
    """A run stopped before it finished, trained in a work directory: its curve so far copied
    where the grid's results are, saying where."""
    kept = keep_interrupted_curve(spec)
    if kept is not None:
        say(f"  {spec.name}: its curve so far kept as {kept[1]} (checkpoints in {spec.run_dir})")


def _starting_over(task: Task) -> str:
    """For a run to train from its first update that the grid tried before (its work
    directory lost with a machine, say): that it starts over, and where the curves of the
    earlier tries stay."""
    tries = kept_tries(task.spec) if task.train and not task.resume else []
    if not tries:
        return ""
    listed = ", ".join(
        path.name + ("" if (end := curve_end(path)) is None else f" (to step {end[0]:,})")
        for path in tries
    )
    return (
        f" from its first update: no checkpoint in {task.spec.run_dir}; the curves of its "
        f"earlier tries stay in {tries[0].parent}: {listed}"
    )


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
            if not dry_run:
                copy_finished_results(spec, say)  # where an earlier call stopped before copying
        elif task.busy:
            outcome[spec.name] = "busy"
            say(f"  {spec.name}: {task.said}; left to it")
        else:
            tasks.append(task)
    say(
        f"{grid.path}: {len(grid.runs)} runs, {list(outcome.values()).count('done')} done, "
        f"{sum(t.train and not t.resume for t in tasks)} to train, "
        f"{sum(t.resume for t in tasks)} to resume, {sum(not t.train for t in tasks)} to score; "
        f"{grid.parallel} at once, {grid.threads} thread{'s' if grid.threads > 1 else ''} each"
    )
    for task in tasks:
        say(f"  {task.spec.name}: {task.said}{_starting_over(task)}")
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


def _scoring(task: Task, launched: float) -> bool:
    """Whether the run's process is past training, scoring its weights: a task that only
    scores, or one whose run has written ``finished.json`` since it was launched."""
    marker = task.spec.run_dir / FINISHED
    return not task.train or (marker.is_file() and marker.stat().st_mtime >= launched)


def _stop_training(  # type: ignore[no-untyped-def]
    grid: Grid,
    pending: list[Task],
    running: dict[str, Any],
    launched: dict[str, float],
    outcome: dict[str, str],
    say,
) -> None:
    """--stop-after's time has come: the runs still training are paused at a checkpoint and
    dropped from ``running``, the waiting ones not started; the runs scoring the weights they
    trained are left to finish (a minute or so: their weights may not outlast the call)."""
    scoring = [n for n, (task, _) in running.items() if _scoring(task, launched[n])]
    training = {n: running.pop(n) for n in list(running) if n not in scoring}
    _stop(training)
    for name in [*training, *(t.spec.name for t in pending)]:
        outcome[name] = "paused"
    for task, _ in training.values():
        _keep_curve(task.spec, say)
    left = f"; left to finish scoring: {', '.join(scoring)}" if scoring else ""
    say(
        f"[{time.strftime('%H:%M:%S')}] stopped as asked (--stop-after): "
        f"{len(training)} run(s) paused at a checkpoint, {len(pending)} not started{left}; "
        f"run `{grid.again}` again to go on"
    )
    pending.clear()


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
    launched: dict[str, float] = {}  # wall-clock, to compare with a file's mtime
    budgets: dict[str, Budget] = {}
    seen: Sightings = {}  # each run's first and latest (time, step) in a progress line
    shown = time.perf_counter()
    try:
        while pending or running:
            if deadline is not None and time.perf_counter() >= deadline:
                _stop_training(grid, pending, running, launched, outcome, say)
                deadline = None  # once; what is scoring goes on below
                if not running:
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
                launched[task.spec.name] = time.time()
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
                    copy_finished_results(task.spec, say)
                elif proc.returncode in (130, 143, -signal.SIGINT, -signal.SIGTERM):
                    outcome[name] = "interrupted"  # stopped at a checkpoint, from outside
                    say(
                        f"[{time.strftime('%H:%M:%S')}] {name}: interrupted; run "
                        f"`{grid.again}` again to resume it"
                    )
                    _keep_curve(task.spec, say)
                else:
                    outcome[name] = f"failed: {_last_line(task.spec.run_dir)}"
                    say(
                        f"[{time.strftime('%H:%M:%S')}] {name}: FAILED (exit {proc.returncode}): "
                        f"{_last_line(task.spec.run_dir)}; log: {task.spec.run_dir}/experiment.log"
                    )
    except KeyboardInterrupt:
        _stop(running)
        for task, _ in running.values():
            _keep_curve(task.spec, say)
        say(f"interrupted: run `{grid.again}` again to resume")
        raise
    return outcome


__all__ = ["copy_finished_results", "job_payload", "run_grid"]
