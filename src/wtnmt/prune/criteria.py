"""Which branches go: a score per branch (higher: keep), and a budget.

- ``kappa-alpha``: κ_i·α_i, the weight the trained model itself gives branch i's term
  (κ_i scales its input to FFN_i, α_i its output; κ·α alone is not the term's size, the FFN
  between them is not linear, but it is what the learned weights say).
- ``importance``: the change in dev loss (cross-entropy per target token, teacher forced)
  when branch i alone is masked (its α_i set to 0), as Michel et al. (2019, §3) measure a
  head's importance by ablating it. One dev pass per branch.
- ``random``: a seeded uniform draw: the baseline the other two must beat.

A budget keeps ``keep`` branches in every branched sublayer, or ``keep_total`` over the whole
model: every sublayer's best one first (a sublayer cannot lose all of its branches: the
residual would carry it through unchanged and its parameters would be dead), then the best of
the rest, whatever their sublayer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from wtnmt.config import ConfigError
from wtnmt.model.pruning import Sublayer, branched_sublayers, branches_masked

Scores = dict[Sublayer, list[float]]


def kappa_alpha_scores(model: nn.Module) -> Scores:
    """κ_i·α_i of every branch, as the model uses them."""
    scores = {}
    with torch.no_grad():
        for key, (_, module) in branched_sublayers(model).items():
            kappa, alpha = module.branch_weights()
            scores[key] = (kappa * alpha).tolist()
    return scores


def importance_scores(
    model: nn.Module,
    dev_loss: Callable[[], float],
    *,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> tuple[float, Scores]:
    """The dev loss of the full model, and for every branch the dev loss with that branch
    masked minus it. ``dev_loss`` evaluates ``model`` as it is now."""
    sublayers = branched_sublayers(model)
    total = sum(module.w_out.size(0) for _, module in sublayers.values())
    base = dev_loss()
    scores: Scores = {}
    done = 0
    for key, (_, module) in sublayers.items():
        scores[key] = []
        for i in range(module.w_out.size(0)):
            with branches_masked(model, {key: [i]}):
                scores[key].append(dev_loss() - base)
            done += 1
            progress(done, total)
    return base, scores


def random_scores(model: nn.Module, seed: int) -> Scores:
    """A uniform draw per branch, from a generator seeded with ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    return {
        key: torch.rand(module.w_out.size(0), generator=generator, dtype=torch.float64).tolist()
        for key, (_, module) in branched_sublayers(model).items()
    }


def _ranked(scores: Sequence[float]) -> list[int]:
    """Indices from the highest score down (ties: the lower index first)."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


def select(
    scores: Mapping[Sublayer, Sequence[float]],
    *,
    keep: int | None = None,
    keep_total: int | None = None,
) -> dict[Sublayer, list[int]]:
    """The branches kept in every sublayer (increasing indices) under the budget: ``keep``
    a sublayer, or ``keep_total`` over the model with at least one a sublayer."""
    if (keep is None) == (keep_total is None):
        raise ConfigError("give one budget: --keep (a layer) or --keep-total (the model)")
    widest = max(len(s) for s in scores.values())
    available = sum(len(s) for s in scores.values())
    if keep is not None:
        if keep < 1:
            raise ConfigError(f"--keep {keep}: a layer keeps at least one branch")
        if keep > widest:
            raise ConfigError(f"--keep {keep}: the model has at most {widest} branches a layer")
        return {k: sorted(_ranked(s)[:keep]) for k, s in scores.items()}
    assert keep_total is not None
    if keep_total < len(scores):
        raise ConfigError(
            f"--keep-total {keep_total}: below one branch a layer (the model has "
            f"{len(scores)} branched sublayers)"
        )
    if keep_total > available:
        raise ConfigError(f"--keep-total {keep_total}: the model has {available} branches")
    kept = {k: [_ranked(s)[0]] for k, s in scores.items()}
    rest = sorted(
        ((s[i], n, i) for n, (k, s) in enumerate(scores.items()) for i in _ranked(s)[1:]),
        key=lambda t: (-t[0], t[1], t[2]),
    )
    keys = list(scores)
    for _, n, i in rest[: keep_total - len(scores)]:
        kept[keys[n]].append(i)
    return {k: sorted(v) for k, v in kept.items()}


__all__ = ["Scores", "importance_scores", "kappa_alpha_scores", "random_scores", "select"]
