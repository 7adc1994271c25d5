"""Learning-rate schedules of the paper (§4.1), as pure functions of the step."""

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
