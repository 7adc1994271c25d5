"""Training: schedules, checkpoints and the training loop."""

from wtnmt.errors import CheckpointError, TrainingError
from wtnmt.train.schedule import branch_lr, inverse_sqrt
from wtnmt.train.trainer import Trainer, TrainState

__all__ = ["CheckpointError", "TrainState", "Trainer", "TrainingError", "branch_lr", "inverse_sqrt"]
