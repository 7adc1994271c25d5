"""The run directory: its files, checkpoints, and the one way in for training and decoding.

Below both ``wtnmt.train`` and ``wtnmt.decode``: either may import it, it imports neither.
"""

from wtnmt.rundir.checkpoints import (
    latest_checkpoint,
    list_checkpoints,
    load_state,
    prune_checkpoints,
    save_checkpoint,
)
from wtnmt.rundir.files import atomic_write, load_weights, read_weights, save_weights
from wtnmt.rundir.run import RunDirectory, load_run

__all__ = [
    "RunDirectory",
    "atomic_write",
    "latest_checkpoint",
    "list_checkpoints",
    "load_run",
    "load_state",
    "load_weights",
    "prune_checkpoints",
    "read_weights",
    "save_checkpoint",
    "save_weights",
]
