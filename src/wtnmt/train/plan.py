"""What a run is about to train, said before its first update, and what its budget takes on
this machine, said once a few updates are timed: a config with only a ``data:`` section
trains the paper's base model for 100,000 updates, which on a 2-core CPU is weeks, and a user
should learn that in the first minute, not the third day."""

from __future__ import annotations

from wtnmt.config import ModelConfig, RunConfig

TIMED = 5  # updates timed for the estimate, after the first (which warms the kernels up)
DAY = 86_400.0


def duration(seconds: float) -> str:
    """``3 days 4 h``, ``5 h 20 min``, ``12 min``, ``40 s``: two units at most."""
    seconds = max(0.0, seconds)
    days, rest = divmod(round(seconds), 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} day{'s' * (days != 1)} {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min" if minutes else f"{secs} s"


def describe(config: RunConfig, parameters: int, budget: int | None) -> str:
    """One line: the model a config implies (its kind, shape and parameters; a word where it
    is wtnmt's default, the paper's base model) and its budget of updates, time, patience."""
    m, t = config.model, config.train
    kind = "Weighted Transformer" if m.attention == "branched" else "Transformer"
    shape = (
        f"{m.encoder_layers}+{m.decoder_layers} layers, d_model {m.d_model}, d_ff {m.d_ff}, "
        f"{m.heads} {'branches' if m.attention == 'branched' else 'heads'}"
    )
    default = m == ModelConfig()
    limits = []
    if budget is not None:
        limits.append(f"at most {budget:,} updates")
    if t.max_time is not None:
        limits.append(f"at most {duration(t.max_time)} (train.max_time)")
    if t.patience is not None:
        limits.append(f"until {t.patience} validations bring no improvement (train.patience)")
    batch = f"{t.max_tokens:,} tokens" + (f" × {t.update_freq}" if t.update_freq > 1 else "")
    line = (
        f"plan: the {kind}"
        + (" of wtnmt's defaults (the paper's base model)" if default else "")
        + f", {shape}: {parameters:,} parameters; batches of {batch}, "
        + (", or ".join(limits) if limits else "no limit but Ctrl-C")
    )
    return line


def estimate(
    per_update: float, done: int, budget: int | None, max_time: float | None, elapsed: float
) -> str:
    """One line: the time the rest of the budget takes at ``per_update`` seconds an update
    (``done`` made, ``elapsed`` seconds spent), a warning where that is more than a day."""
    seconds, what = None, ""
    if budget is not None:
        seconds = per_update * max(0, budget - done)
        what = f"the {max(0, budget - done):,} updates left of {budget:,}"
    if max_time is not None and (seconds is None or max_time - elapsed < seconds):
        seconds, what = max_time - elapsed, "train.max_time ends the run"
    rate = f"{per_update:.3g} s an update on this machine"
    if seconds is None:
        return f"at {rate}; no step or time budget: train.patience or Ctrl-C ends the run"
    line = (
        f"at {rate}: {what} in about {duration(seconds)} (without validations; sooner where "
        f"patience stops it)"
    )
    if seconds > DAY:
        return (
            f"warning: {line}: a smaller model (`wtnmt presets`), a lower train.max_steps or a "
            f"train.max_time shortens it (Ctrl-C or SIGTERM stops with a checkpoint)"
        )
    return line


__all__ = ["DAY", "TIMED", "describe", "duration", "estimate"]
