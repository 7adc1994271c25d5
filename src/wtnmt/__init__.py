"""wtnmt."""
