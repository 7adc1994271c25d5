"""What a training run carries besides weights and optimizer: its state, the log window, and
the setup helpers (device, optimizer). Ctrl-C as a flag is ``wtnmt.interrupt``."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from wtnmt.errors import TrainingError


@dataclass
class TrainState:
    """Everything besides weights and optimizer that resuming needs to continue exactly."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # planned batches of this epoch already consumed (this rank)
    elapsed: float = 0.0  # seconds of training, summed over resumed runs
    best: float | None = None
    best_step: int | None = None
    bad_validations: int = 0  # validations since patience last saw an improvement
    best_loss: float | None = None  # the lowest dev loss and highest dev BLEU so far
    best_bleu: float | None = None
    nonfinite_total: int = 0
    nonfinite_run: int = 0
    finished: str | None = None  # why the run stopped, once it has
    # the schedule a time-bounded run fitted to its measured rate (train.warmup_fraction)
    predicted_steps: int | None = None
    warmup: int | None = None
    branch_warmup: int | None = None


@dataclass
class Window:
    """Sums over the steps since the last log line."""

    loss: float = 0.0
    nll: float = 0.0
    tokens: int = 0
    grad_norm: float = 0.0
    updates: int = 0
    start: float = field(default_factory=time.perf_counter)

    def add(self, loss: float, nll: float, tokens: int, grad_norm: float) -> None:
        """One more update's sums."""
        self.loss += loss
        self.nll += nll
        self.tokens += tokens
        self.grad_norm += grad_norm
        self.updates += 1


def make_adam(groups: list[dict[str, Any]], *, betas: tuple[float, float], eps: float):  # type: ignore[no-untyped-def]
    """Adam, fused where this PyTorch build has the kernel for the device: one pass over
    each parameter instead of a dozen (12 ms instead of 40-60 ms a step for the `small`
    model on 2 CPU cores). The same update rule, deterministic like the default."""
    try:
        return torch.optim.Adam(groups, lr=0.0, betas=betas, eps=eps, fused=True)
    except (RuntimeError, TypeError):  # no fused kernel for this device or build
        return torch.optim.Adam(groups, lr=0.0, betas=betas, eps=eps)


def make_optimizer(model: nn.Module, train: Any):  # type: ignore[no-untyped-def]
    """(κ/α's learned parameters, Adam): two parameter groups, the network's and κ/α's (each
    on its own schedule); fixed κ, α (model.branch_weights: fixed) are learned in neither."""
    from wtnmt.model import BranchWeights

    branch = [p for m in model.modules() if isinstance(m, BranchWeights) for p in m.parameters()]
    ids = {id(p) for p in branch}
    learned = [p for p in branch if p.requires_grad]
    groups = [{"params": [p for p in model.parameters() if id(p) not in ids]}]
    if learned:
        groups.append({"params": learned})
    return learned, make_adam(groups, betas=train.adam_betas, eps=train.adam_eps)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise TrainingError("train.device='cuda' but no CUDA device is available")
    return torch.device(name)


__all__ = ["TrainState", "Window", "make_adam", "make_optimizer", "resolve_device"]
