"""The one error a config raises."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration key or value that is not allowed."""


__all__ = ["ConfigError"]
