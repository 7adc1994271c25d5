"""The checks the config sections make of their values, each raising :class:`ConfigError` that
names the dotted key, the value and what is allowed."""

from __future__ import annotations

import math
from typing import Any

from wtnmt.config.errors import ConfigError


def positive(obj: Any, section: str, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value <= 0:
            raise ConfigError(f"{section}.{name}={value!r} must be a positive integer")


def greater(obj: Any, section: str, low: float, *names: str, optional: bool = False) -> None:
    for name in names:
        value = getattr(obj, name)
        if optional and value is None:
            continue
        if not (math.isfinite(value) and value > low):  # NaN and inf fail too
            what = f"a finite number above {low}" + (", or null" if optional else "")
            raise ConfigError(f"{section}.{name}={value!r} must be {what}")


def probability(obj: Any, section: str, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"{section}.{name}={value!r} must be in [0, 1)")


__all__ = ["greater", "positive", "probability"]
