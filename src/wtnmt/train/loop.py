"""The training loop: updates (each with κ/α's projection) over the epochs' batches until a
stop condition, and what follows each update (the log line, validation, checkpoints). A part of
:class:`~wtnmt.train.trainer.Trainer`, kept here so that the loop reads on its own; it uses
the trainer's model, state, config, report and the methods named in its docstring."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from wtnmt import interrupt
from wtnmt.errors import TrainingError
from wtnmt.runtime import EMULATED_BF16_WARNING, bf16_emulated
from wtnmt.train import plan
from wtnmt.train.report import advance, progress_bar
from wtnmt.train.schedule import CALIBRATION_STEPS, fitted_warmup, refit_due
from wtnmt.train.state import TrainState, Window


class TrainingLoop:
    """The loop of a Trainer, which provides: ``state``, ``tc`` (its TrainConfig),
    ``config``, ``model``, ``train_data``, ``report``, ``world``, ``is_main``,
    ``log_to_stderr``, ``run_dir``, ``ckpt_dir``, ``device``, and ``log``, ``save``,
    ``update``, ``_set_lr``, ``_frozen``, ``_step_budget``, ``_stop_reason``,
    ``_epoch_batches``, ``_validate_and_keep_best``, ``_precision_label``."""

    def _train(self) -> TrainState:
        s, tc = self.state, self.tc
        self.model.train()
        progress = None
        if self.is_main and self.log_to_stderr:
            progress = progress_bar(tc, s)  # on a terminal wide enough to draw one
        self.report.bar = progress  # log lines go above it
        self.log(
            f"training {sum(p.numel() for p in self.model.parameters()):,} parameters "
            f"on {self.device} ({self.world} process{'es' if self.world > 1 else ''}) in "
            f"{self._precision_label()}, {len(self.train_data):,} training pairs"
            + (" (forward compiled: train.compile)" if tc.compile else "")
        )
        self.report.machine(s.step, self.device, self.world)
        budget = self._step_budget()
        parameters = sum(p.numel() for p in self.model.parameters())
        self.log(plan.describe(self.config, parameters, budget))
        self._timed_from: tuple[int, float] | None = None  # (step, elapsed) after the first
        if bf16_emulated(self.precision, self.device.type):
            self.log(EMULATED_BF16_WARNING)
        self._window, self._lrs = Window(), (0.0, 0.0)
        self._fit_mark: tuple[int, float] | None = None  # (updates, seconds) at the last fit
        self.report.budget = (budget, tc.max_time)  # for the time left in each log line
        reason = self._stop_reason()
        if reason is None and self.is_main:
            self.rundir.finished_again()
        # Ctrl-C and SIGTERM stop before the next update, the first too, with a checkpoint
        handlers = interrupt.take_over()
        try:
            while reason is None:
                batches = self._epoch_batches(s.epoch)
                while reason is None and s.batch_in_epoch < len(batches):
                    if interrupt.requested():
                        raise KeyboardInterrupt
                    group = batches[s.batch_in_epoch : s.batch_in_epoch + tc.update_freq]
                    self._step(group, budget, progress)
                    reason = self._stop_reason()
                if s.batch_in_epoch >= len(batches):
                    s.epoch += 1
                    s.batch_in_epoch = 0
                    reason = reason or self._stop_reason()
        except KeyboardInterrupt:
            signal = interrupt.signal_name()  # the line analysis/runs.py reads: "interrupted at"
            self.log(f"interrupted at step {s.step} ({signal}): saving a checkpoint")
            self.save()
            self.log(
                f"resume with: wtnmt train {self.run_dir / 'config.yaml'} --out "
                f"{self.run_dir} --resume"
            )
            raise
        finally:
            interrupt.give_back(handlers)
            if progress is not None:
                progress.close()
                self.report.bar = None
        self._finish(reason)
        return s

    def _step(self, group: list, budget: int | None, progress: Any) -> None:  # type: ignore[type-arg]
        """One update (κ/α projected unless frozen) and what follows it: the counters, the log
        line, a validation and a checkpoint when they are due. A non-finite update is skipped."""
        s, tc = self.state, self.tc
        start = time.perf_counter()
        frozen = self._frozen(budget)
        self._lrs = self._set_lr(frozen, budget)
        want_ratio = tc.grad_ratio and (s.step + 1) % tc.log_every == 0
        try:
            batches = [self.train_data.collate(i) for i in group]
            result = self.update(batches, want_ratio=want_ratio, project=not frozen)
        except FloatingPointError as e:
            self._skip_nonfinite(e, len(group))
            return
        s.nonfinite_run = 0
        s.step += 1
        s.batch_in_epoch += len(group)
        s.elapsed += time.perf_counter() - start
        if self.world > 1 and tc.max_time is not None:
            s.elapsed = self._rank0_clock(s.elapsed)
        self._window.add(result.loss, result.nll, result.tokens, result.grad_norm)
        self._time_the_budget(budget)
        if tc.warmup_fraction is not None and refit_due(s.step):
            self._fit_schedule()
        if progress is not None:
            advance(progress, time.perf_counter() - start if progress.unit == "s" else 1)
        self._after_update(result.ratio, progress)

    def _time_the_budget(self, budget: int | None) -> None:
        """After the first update and ``plan.TIMED`` more, the time the budget takes here."""
        s = self.state
        if self._timed_from is None:
            self._timed_from = (s.step, s.elapsed)
        elif s.step - self._timed_from[0] == plan.TIMED:
            per_update = (s.elapsed - self._timed_from[1]) / plan.TIMED
            self.log(plan.estimate(per_update, s.step, budget, self.tc.max_time, s.elapsed))

    def _rank0_clock(self, elapsed: float) -> float:
        """Rank 0's training time, on every rank of a run bounded by max_time: all of them
        then fit the warm-up, freeze κ/α and stop at the same update (on its own clock, a rank
        could stop while the others wait for it in the next update's all-reduce)."""
        shared = torch.tensor([elapsed], dtype=torch.float64, device=self.device)
        dist.broadcast(shared, src=0)
        return float(shared)

    def _fit_schedule(self) -> None:
        """The warm-ups of a time-bounded run, from its measured rate: fitted after every one
        of the first updates (so that even a run too short, or a machine too slow, for all of
        them ends its warm-up inside), then again at 10, 20, 40 … updates from the rate since
        the last fit (the first updates are slow: allocations, kernels chosen), as long as the
        run is still inside the warm-up fitted; kept after that."""
        s, tc = self.state, self.tc
        assert tc.max_time is not None and tc.warmup_fraction is not None
        rate = None
        if s.step > CALIBRATION_STEPS:
            if self._fit_mark is None or s.warmup is None or s.step > s.warmup:
                return  # resumed, or warm-up over: the schedule stays as fitted
            steps, seconds = self._fit_mark
            rate = (s.elapsed - seconds) / (s.step - steps)
        fit = fitted_warmup(
            s.step,
            s.elapsed,
            max_time=tc.max_time,
            fraction=tc.warmup_fraction,
            seconds_an_update=rate,
        )
        self._fit_mark = (s.step, s.elapsed)
        if rate is not None and fit[1] < s.step:
            return  # the warm-up would end before this update: keep the one in use
        moved = s.warmup is not None and abs(fit[1] - s.warmup) > 0.1 * s.warmup
        s.predicted_steps, s.warmup, s.branch_warmup = fit
        if s.step == CALIBRATION_STEPS or (rate is not None and moved):
            self.log(
                f"schedule: {rate or s.elapsed / s.step:.2f} s an update, about "
                f"{s.predicted_steps:,} updates in train.max_time={tc.max_time:g} s: warm-up "
                f"{s.warmup} (train.warmup_fraction={tc.warmup_fraction:g}), κ/α warm-up "
                f"{s.branch_warmup}, κ/α frozen for the last "
                f"{tc.freeze_branch_fraction:.0%} of the time"
                + (f" (fitted again after {s.step} updates)" if rate is not None else "")
            )

    def _after_update(self, ratio: float | None, progress: Any) -> None:
        s, tc = self.state, self.tc
        if s.step % tc.log_every == 0:
            self._log_window(ratio, progress)
        if s.step % tc.valid_every == 0:
            try:
                self._validate_and_keep_best()
            except Exception:  # whatever failed, the training so far is kept
                self.save()
                raise
        if s.step % (tc.save_every or tc.valid_every) == 0:
            self.save()

    def _skip_nonfinite(self, error: FloatingPointError, batches: int) -> None:
        """A skipped update; too many in a row stop the run with a checkpoint to inspect."""
        s = self.state
        s.nonfinite_total += 1
        s.nonfinite_run += 1
        self.log(
            f"warning: step {s.step + 1}: non-finite {error}; update skipped "
            f"({s.nonfinite_run} in a row)"
        )
        s.batch_in_epoch += batches
        if s.nonfinite_run >= self.tc.max_nonfinite:
            self.save()
            raise TrainingError(
                f"{s.nonfinite_run} non-finite updates in a row up to step {s.step + 1}; "
                f"checkpoint saved in {self.ckpt_dir} for inspection (lower the learning rate "
                f"or enable clip_norm)"
            )

    def _log_window(self, ratio: float | None, progress: Any) -> None:
        lr, lr_b = self._lrs
        self.report.step(
            self.state, self._window, model=self.model, lr=lr,
            lr_branch=lr_b if self.branch_params else None, ratio=ratio,
            world=self.world, progress=progress,
        )  # fmt: skip
        self._window = Window()

    def _finish(self, reason: str | None) -> None:
        """The end of a run: its last log line, a validation of its last weights, a checkpoint."""
        s = self.state
        s.finished = reason
        if self._window.updates:  # the updates since the last log line: metrics end there
            self._log_window(None, None)
        self.log(f"stopped: {reason}")
        if s.step % self.tc.valid_every != 0 or s.best is None:
            self._validate_and_keep_best()
        self.save()


__all__ = ["TrainingLoop"]
