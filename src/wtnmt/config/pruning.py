"""What a pruned Weighted Transformer keeps, and why (``wtnmt prune``).

``model.kept_branches`` is part of the architecture: for each branched sublayer, the indices
(among the M = model.heads branches the model was trained with) of the branches still there.
A branch is a head with its W^{O_i} and, under ``branch_ffn: split``, its own FFN; a sublayer
keeping M' of them computes Σ_{i kept} α_i FFN_i(κ_i head_i W^{O_i}), κ and α as trained (not
renormalised: the pruned model is the full one with the other branches' α set to 0).

``prune`` records where the model came from and how the branches were chosen; training never
reads it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from wtnmt.config.errors import ConfigError

Criterion = Literal["kappa-alpha", "importance", "random"]


@dataclass(frozen=True)
class KeptBranches:
    """Per layer, the original indices of the branches kept, in increasing order."""

    encoder: tuple[tuple[int, ...], ...]  # encoder layer i's branched self-attention
    decoder: tuple[tuple[int, ...], ...]  # decoder layer i's branched cross-attention

    def check(self, *, encoder_layers: int, decoder_layers: int, branches: int) -> None:
        for side, layers in (("encoder", encoder_layers), ("decoder", decoder_layers)):
            kept = getattr(self, side)
            if len(kept) != layers:
                raise ConfigError(
                    f"model.kept_branches.{side} lists {len(kept)} layers; the model has "
                    f"model.{side}_layers={layers}"
                )
            for i, indices in enumerate(kept):
                key = f"model.kept_branches.{side}[{i}]={list(indices)}"
                if not indices:
                    raise ConfigError(f"{key}: a layer keeps at least one branch")
                if list(indices) != sorted(set(indices)) or not (
                    0 <= indices[0] and indices[-1] < branches
                ):
                    raise ConfigError(
                        f"{key}: expected increasing branch indices in [0, {branches}) "
                        f"(model.heads={branches})"
                    )

    def count(self) -> int:
        return sum(len(k) for k in (*self.encoder, *self.decoder))


@dataclass(frozen=True)
class PruneRecord:
    """How a pruned run was made: the run and weights pruned, the criterion, the budget
    (``keep`` branches a sublayer, or ``keep_total`` over the model), the fine-tune."""

    source: str
    weights: str = "model.safetensors"
    criterion: Criterion = "importance"
    keep: int | None = None
    keep_total: int | None = None
    seed: int = 1  # the draw of ``random``
    fine_tune_steps: int = 0

    def __post_init__(self) -> None:
        if (self.keep is None) == (self.keep_total is None):
            raise ConfigError("prune: set exactly one of prune.keep and prune.keep_total")
        for name in ("keep", "keep_total"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"prune.{name}={value} must be a positive integer")
        if self.fine_tune_steps < 0:
            raise ConfigError(f"prune.fine_tune_steps={self.fine_tune_steps} must be >= 0")


__all__ = ["Criterion", "KeptBranches", "PruneRecord"]
