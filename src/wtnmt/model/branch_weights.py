"""κ and α: the learned branch weights of the Weighted Transformer (paper eq. 6–7).

``BranchWeights`` holds the two vectors of one branched module and turns them into the
weights in effect:

- ``simplex`` (paper): κ and α are used as stored; training projects them onto the
  probability simplex after every optimizer step (:func:`project_branch_weights`).
- ``softmax`` (the mixture-of-experts normalisation the paper mentions in §3): the stored
  vectors are logits and the weights in effect are their softmax.
- ``topk`` (gating, §4.5): as ``simplex``, but only the k branches with the largest α
  contribute, their α renormalised to sum to 1 as in sparsely-gated mixtures of experts.
- ``fixed`` (a control the paper does not run): κ = α = 1/M for the whole of training, never
  learned, so that the branched layer's other differences from a Transformer layer (one
  residual and one norm, every branch scaled by κ·α) are trained without learned weights.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Literal

import torch
from torch import Tensor, nn

from wtnmt.model.simplex import project_simplex

WeightMode = Literal["simplex", "softmax", "topk", "fixed"]
InitMode = Literal["random", "uniform"]
OverrideMode = Literal["learned", "uniform", "random"]


class BranchWeights(nn.Module):
    def __init__(self, *, branches: int, mode: WeightMode, topk: int, init: InitMode) -> None:
        super().__init__()
        self.mode = mode
        self.topk = topk
        learned = mode != "fixed"
        self.kappa = nn.Parameter(torch.empty(branches), requires_grad=learned)  # [M]
        self.alpha = nn.Parameter(torch.empty(branches), requires_grad=learned)  # [M]
        self.reset(init if learned else "uniform")

    @torch.no_grad()
    def reset(self, how: InitMode | OverrideMode, generator: torch.Generator | None = None) -> None:
        """Set κ and α to a point of the simplex: ``uniform`` 1/M, or ``random`` (uniform
        draws, normalised, §4.1). ``learned`` leaves them as they are."""
        if how == "learned":
            return
        for p in (self.kappa, self.alpha):
            if how == "uniform":
                point = torch.full_like(p, 1.0 / p.numel())
            else:
                draw = torch.rand(p.shape, generator=generator, dtype=p.dtype)
                point = (draw / draw.sum()).to(p.device)
            # under softmax the stored vector is a logit: log p has softmax p
            p.copy_(point.log() if self.mode == "softmax" else point)

    def forward(self) -> tuple[Tensor, Tensor]:
        """The weights in effect, κ and α, each [M]."""
        if self.mode == "softmax":
            return self.kappa.softmax(-1), self.alpha.softmax(-1)
        if self.mode == "topk":
            keep = torch.zeros_like(self.alpha, dtype=torch.bool)
            keep[self.alpha.topk(self.topk).indices] = True
            gated = self.alpha * keep
            return self.kappa, gated / gated.sum()
        return self.kappa, self.alpha


@torch.no_grad()
def project_branch_weights(model: nn.Module) -> int:
    """Project κ and α of every branched module of ``model`` that uses simplex weights.

    Returns how many weight vectors were projected. Call after every optimizer step.
    The vectors of one length (device, dtype) are projected together, as the rows of one
    stacked matrix: the projection is some fifteen small operations, and at Multi30k's size
    on a GPU, where the host's work paces an update, 16 vectors projected one at a time
    added 288 operations to an update's 1,757. Row by row the result is the same.
    """
    groups: dict[tuple[int, torch.device, torch.dtype], list[Tensor]] = {}
    for module in model.modules():
        if isinstance(module, BranchWeights) and module.mode not in ("softmax", "fixed"):
            for p in (module.kappa, module.alpha):
                groups.setdefault((p.numel(), p.device, p.dtype), []).append(p)
    for vectors in groups.values():
        projected = list(project_simplex(torch.stack(vectors)).unbind(0))
        torch._foreach_copy_(vectors, projected)
    return sum(len(vectors) for vectors in groups.values())


def named_branch_weights(model: nn.Module) -> dict[str, BranchWeights]:
    """The κ, α of every branched sublayer, by the sublayer's name (``encoder_layers.0.self_attn``:
    the names of :func:`branch_weight_table` and of the branch weights a run logs)."""
    return {
        name.removesuffix(".branch_weights"): module
        for name, module in model.named_modules()
        if isinstance(module, BranchWeights)
    }


def chosen_branch_weights(model: nn.Module, only: Sequence[str] | None) -> list[BranchWeights]:
    """The sublayers' κ, α named in ``only`` (all where None); a name that is not one of the
    model's branched sublayers is a ValueError naming them."""
    named = named_branch_weights(model)
    if only is None:
        return list(named.values())
    unknown = [name for name in only if name not in named]
    if unknown:
        raise ValueError(
            f"{unknown[0]}: not a branched sublayer of this model; it has "
            + (", ".join(named) or "none (a Transformer)")
        )
    return [named[name] for name in only]


@torch.no_grad()
def override_branch_weights(
    model: nn.Module, how: OverrideMode, *, seed: int = 0, only: Sequence[str] | None = None
) -> None:
    """Replace the learned κ, α of every branched module in place (paper §4.4, Table 3), or of
    the sublayers named in ``only`` alone (which layer's weights the model leans on).

    ``uniform`` sets 1/M, ``random`` draws a seeded random point of the simplex for each
    vector, ``learned`` changes nothing. A sublayer gets the same random draw whether it is
    replaced alone or with all the others. Meant for evaluation: load a fresh copy to undo.
    """
    chosen = {id(m) for m in chosen_branch_weights(model, only)}
    generator = torch.Generator().manual_seed(seed)
    for module in named_branch_weights(model).values():
        kept = [p.clone() for p in (module.kappa, module.alpha)]
        module.reset(how, generator)  # drawn for every sublayer: each keeps its own draw
        if id(module) not in chosen:
            module.kappa.copy_(kept[0])
            module.alpha.copy_(kept[1])


@contextmanager
def branch_weights_overridden(
    model: nn.Module, how: OverrideMode, *, seed: int = 0, only: Sequence[str] | None = None
) -> Iterator[None]:
    """Evaluate with ``uniform`` or ``random`` κ, α inside the block (paper Table 3), in every
    branched sublayer or in those named in ``only``; the learned values are put back on
    leaving it, even after an error."""
    modules = chosen_branch_weights(model, only)
    if how == "learned" or not modules:
        yield
        return
    with torch.no_grad():
        saved = [(m.kappa.clone(), m.alpha.clone()) for m in modules]
    override_branch_weights(model, how, seed=seed, only=only)
    try:
        yield
    finally:
        with torch.no_grad():  # in place: the version bump retires every weight derived from them
            for m, (kappa, alpha) in zip(modules, saved, strict=True):
                m.kappa.copy_(kappa)
                m.alpha.copy_(alpha)


def branch_weight_table(model: nn.Module) -> dict[str, dict[str, list[float]]]:
    """Module name → {"kappa": [...], "alpha": [...]} of the weights in effect."""
    table = {}
    with torch.no_grad():
        for name, module in named_branch_weights(model).items():
            kappa, alpha = module()
            table[name] = {"kappa": kappa.tolist(), "alpha": alpha.tolist()}
    return table


__all__ = [
    "BranchWeights",
    "branch_weight_table",
    "branch_weights_overridden",
    "chosen_branch_weights",
    "named_branch_weights",
    "override_branch_weights",
    "project_branch_weights",
]
