"""Learning-rate schedules: the paper's (§4.1) and linear decay, as pure functions of the step."""

from __future__ import annotations


def inverse_sqrt(step: int, *, d_model: int, warmup: int, scale: float = 1.0) -> float:
    """lr = scale · D^-0.5 · min(step^-0.5, step · warmup^-1.5): every weight but κ, α."""
    step = max(step, 1)
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def branch_lr(step: int, *, d_model: int, layers: int, warmup: int, scale: float = 1.0) -> float:
    """lr = scale · (D/N)^-0.5 · min(step^-0.5, step · warmup^-1.5) for κ and α (warm-up 400:
    a tenth of the network's, and a peak √N higher to make up for their bounds)."""
    step = max(step, 1)
    return scale * (d_model / layers) ** -0.5 * min(step**-0.5, step * warmup**-1.5)


def linear_decay(
    step: int, progress: float, *, peak: float, warmup: int, warmup_progress: float
) -> float:
    """fairseq's polynomial_decay with power 1: lr rises linearly to ``peak`` over ``warmup``
    steps, then falls linearly to 0 at the end of the run. ``progress`` is how far the run is
    (0 to 1), ``warmup_progress`` how far it was when its warm-up ended."""
    step = max(step, 1)
    rest = (1.0 - progress) / (1.0 - min(warmup_progress, 0.99))
    return peak * max(0.0, min(step / warmup, 1.0, rest))


def run_progress(
    step: int, elapsed: float, *, max_steps: int | None, max_time: float | None
) -> float:
    """How far a run is towards its end (0 to 1): the larger of its steps' fraction of
    ``max_steps`` (a step budget) and its time's fraction of ``max_time``."""
    by_steps = step / max_steps if max_steps else 0.0
    by_time = elapsed / max_time if max_time else 0.0
    return min(1.0, max(by_steps, by_time))


def lr_scale(model, train, warmup: int | None = None) -> float:  # type: ignore[no-untyped-def]
    """The schedule's scale: ``train.lr_scale``, or the one whose peak is ``train.peak_lr``
    (the peak of D^-0.5 · min(step^-0.5, step · warmup^-1.5) is (D · warmup)^-0.5) at the
    warm-up in use (``warmup``, fitted, or the config's)."""
    if train.peak_lr is None:
        return train.lr_scale
    return train.peak_lr * (model.d_model * (warmup or train.warmup)) ** 0.5


def learning_rates(  # type: ignore[no-untyped-def]
    step: int,
    model,
    train,
    *,
    frozen: bool,
    warmup: int | None = None,
    branch_warmup: int | None = None,
    progress: float = 0.0,
    total_steps: int | None = None,
) -> tuple[float, float]:
    """(lr of the weights, lr of κ and α) at ``step``: the weights on ``train.lr_schedule``
    (the paper's inverse square root, or linear decay to 0 at the end of the run, which needs
    the run's ``progress`` and, where known, its ``total_steps``; the same peak either way);
    κ, α on their own schedule, or the shared one (``train.branch_schedule``), 0 inside the
    freeze window. ``warmup`` and ``branch_warmup`` replace the config's (a schedule fitted to
    the run's measured rate)."""
    warmup = warmup or train.warmup
    scale = lr_scale(model, train, warmup)
    if train.lr_schedule == "linear":
        peak = inverse_sqrt(warmup, d_model=model.d_model, warmup=warmup, scale=scale)
        warmup_progress = warmup / total_steps if total_steps else 0.0
        lr = linear_decay(step, progress, peak=peak, warmup=warmup, warmup_progress=warmup_progress)
    else:
        lr = inverse_sqrt(step, d_model=model.d_model, warmup=warmup, scale=scale)
    if frozen:
        return lr, 0.0
    if train.branch_schedule == "shared":
        return lr, lr
    return lr, branch_lr(
        step,
        d_model=model.d_model,
        layers=model.encoder_layers,
        warmup=branch_warmup or train.branch_warmup,
        scale=scale,
    )


CALIBRATION_STEPS = 5  # the first updates, after each of which the schedule is fitted again


def refit_due(step: int) -> bool:
    """Whether a time-bounded run fits its schedule again after update ``step``: after each
    of the first CALIBRATION_STEPS, then at twice, four times, eight times … that many."""
    if step <= CALIBRATION_STEPS:
        return True
    ratio, rest = divmod(step, CALIBRATION_STEPS)
    return rest == 0 and ratio & (ratio - 1) == 0


def fitted_warmup(
    steps: int,
    elapsed: float,
    *,
    max_time: float,
    fraction: float,
    seconds_an_update: float | None = None,
) -> tuple[int, int, int]:
    """(predicted updates, warm-up, κ/α warm-up) of a run bounded by ``max_time`` seconds
    that made ``steps`` updates in ``elapsed`` seconds: the warm-up ``fraction`` of the
    predicted updates, κ/α's a tenth of it (the paper's ratio), each at least 1. The rest of
    the run is predicted at ``seconds_an_update`` (the recent rate), by default the mean so far."""
    rate = seconds_an_update if seconds_an_update is not None else elapsed / max(steps, 1)
    predicted = max(steps, round(steps + (max_time - elapsed) / max(rate, 1e-9)))
    warmup = max(1, round(fraction * predicted))
    return predicted, warmup, max(1, round(warmup / 10))


def branch_weights_frozen(
    step: int,
    elapsed: float,
    *,
    max_steps: int | None,
    max_time: float | None,
    freeze_steps: int,
    freeze_fraction: float,
) -> bool:
    """Whether κ, α are frozen at ``step`` (the paper freezes them for the last 10K steps).

    With ``max_steps`` the window is its last ``freeze_steps`` steps. A run that stops by wall
    clock freezes them for the last ``freeze_fraction`` of ``max_time`` (whichever of the two
    windows opens first when both bounds are set).
    """
    by_steps = max_steps is not None and freeze_steps > 0 and step > max_steps - freeze_steps
    by_time = (
        max_time is not None
        and freeze_fraction > 0
        and elapsed >= max_time * (1.0 - freeze_fraction)
    )
    return by_steps or by_time


def step_budget(max_steps: int | None, max_epochs: int | None, per_epoch: int | None) -> int | None:
    """The updates a run may make: ``max_steps``, or what ``max_epochs`` of ``per_epoch``
    updates allow if fewer, so that κ, α freeze in either kind of run."""
    if max_epochs is None or per_epoch is None:
        return max_steps
    by_epochs = max_epochs * per_epoch
    return by_epochs if max_steps is None else min(max_steps, by_epochs)


def count_patience(state, config, *, loss: float, bleu: float | None, improved_best: bool) -> None:  # type: ignore[no-untyped-def]
    """One validation's dev ``loss`` and ``bleu`` into the patience count of ``state`` (a
    TrainState) under ``config`` (its TrainConfig): the count starts again where the
    validation improved on what ``train.patience_on`` watches (``improved_best``: it improved
    on ``train.best_metric``, which picks the best weights) and grows by one where not."""
    s = state
    better_loss = s.best_loss is None or loss < s.best_loss
    better_bleu = bleu is not None and (s.best_bleu is None or bleu > s.best_bleu)
    if better_loss:
        s.best_loss = loss
    if better_bleu:
        s.best_bleu = bleu
    improved = better_loss or better_bleu if config.patience_on == "loss_or_bleu" else improved_best
    s.bad_validations = 0 if improved else s.bad_validations + 1


def replay_patience(state, config, validations: list[tuple[float, float | None]]) -> None:  # type: ignore[no-untyped-def]
    """The patience count of ``state`` made again from a run's validations so far, (dev
    loss, dev BLEU) in order, under ``config``: for a run resumed under another stopping rule
    than it trained with, which goes on (or stops) as if it had been trained under this one."""
    state.best_loss = state.best_bleu = None
    state.bad_validations = 0
    best = None
    for loss, bleu in validations:
        metric = loss if config.best_metric == "loss" or bleu is None else -bleu
        improved = best is None or metric < best
        best = metric if improved else best
        count_patience(state, config, loss=loss, bleu=bleu, improved_best=improved)


def stop_reason(state, config) -> str | None:  # type: ignore[no-untyped-def]
    """Why a run with ``state`` (a TrainState) should stop under ``config`` (its TrainConfig),
    or None while it should go on."""
    s, tc = state, config
    if tc.max_steps is not None and s.step >= tc.max_steps:
        return f"max_steps={tc.max_steps} reached"
    if tc.max_time is not None and s.elapsed >= tc.max_time:
        return f"max_time={tc.max_time:g}s reached"
    if tc.max_epochs is not None and s.epoch >= tc.max_epochs:
        return f"max_epochs={tc.max_epochs} reached"
    if tc.patience is not None and s.bad_validations >= tc.patience:
        return f"no validation improvement in {tc.patience} validations (patience)"
    return None
