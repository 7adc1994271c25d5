"""Removing branches from a Weighted Transformer, and masking them (the pruning oracle).

A branched sublayer computes Σ_i α_i FFN_i(κ_i head_i W^{O_i}) (eq. 6–7). Branch i is a block
of every one of its tensors: rows i of W^Q, W^K and W^V (Dk each), W^{O_i}, under
``branch_ffn: split`` its own FFN (W1_i, b1_i, W2_i, b2_i), and κ_i, α_i. Removing it keeps
those blocks of the other branches and changes nothing else, so the pruned sublayer computes
the full one's sum without the removed terms: the full model with those branches' α_i set to
0 (:func:`branches_masked`), which is what the tests check.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Literal

import torch
from torch import Tensor, nn

from wtnmt.config import KeptBranches, ModelConfig
from wtnmt.model.branched import BranchedAttention

Side = Literal["encoder", "decoder"]
Sublayer = tuple[Side, int]  # ("encoder", i): encoder layer i's branched self-attention


def branched_sublayers(model: nn.Module) -> dict[Sublayer, tuple[str, BranchedAttention]]:
    """Every branched sublayer of a Weighted Transformer: (side, layer) → (its name in the
    state dict, the module). Encoder layers' self-attention, decoder layers' cross-attention."""
    found: dict[Sublayer, tuple[str, BranchedAttention]] = {}
    for side, attr, child in (
        ("encoder", "encoder_layers", "self_attn"),
        ("decoder", "decoder_layers", "cross_attn"),
    ):
        for i, layer in enumerate(getattr(model, attr)):
            module = getattr(layer, child)
            if isinstance(module, BranchedAttention):
                found[(side, i)] = (f"{attr}.{i}.{child}", module)  # type: ignore[index]
    return found


def _branch_slices(module: BranchedAttention, keep: Tensor) -> dict[str, Tensor]:
    """The tensors of ``module`` (names relative to it) with only the branches ``keep``."""
    m = module.w_out.size(0)
    qkv = module.attn.proj.weight  # [3·M·Dk, D]
    sliced = {
        "attn.proj.weight": qkv.view(3, m, -1, qkv.size(-1))[:, keep].reshape(-1, qkv.size(-1)),
        "w_out": module.w_out[keep],
        "branch_weights.kappa": module.branch_weights.kappa[keep],
        "branch_weights.alpha": module.branch_weights.alpha[keep],
    }
    if module.ffn == "split":  # each branch its own FFN; a shared one stays whole
        for name in ("w1", "b1", "w2", "b2"):
            sliced[name] = getattr(module, name)[keep]
    return sliced


def prune_state(model: nn.Module, keep: Mapping[Sublayer, Sequence[int]]) -> dict[str, Tensor]:
    """``model``'s weights with only the branches ``keep`` names in each branched sublayer
    (indices into the sublayer's branches as they are now, every sublayer named)."""
    sublayers = branched_sublayers(model)
    if set(keep) != set(sublayers):
        raise ValueError("prune_state: name the branches kept in every branched sublayer")
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for key, (prefix, module) in sublayers.items():
        index = torch.tensor(sorted(keep[key]), dtype=torch.long)
        for name, tensor in _branch_slices(module, index).items():
            state[f"{prefix}.{name}"] = tensor.detach().clone().contiguous()
    return state


def pruned_config(config: ModelConfig, keep: Mapping[Sublayer, Sequence[int]]) -> ModelConfig:
    """The model config of the pruned model: ``keep`` (indices among each sublayer's branches
    as they are now) written as indices among the M the model was trained with, so that a
    pruned model pruned again still names the original branches."""

    def original(side: Side, layer: int) -> list[int]:
        now = (
            range(config.heads)
            if config.kept_branches is None
            else getattr(config.kept_branches, side)[layer]
        )
        return [now[i] for i in sorted(keep[(side, layer)])]

    kept = KeptBranches(
        encoder=tuple(tuple(original("encoder", i)) for i in range(config.encoder_layers)),
        decoder=tuple(tuple(original("decoder", i)) for i in range(config.decoder_layers)),
    )
    return replace(config, kept_branches=kept)


@contextmanager
def branches_masked(model: nn.Module, masked: Mapping[Sublayer, Sequence[int]]) -> Iterator[None]:
    """Inside the block, the branches ``masked`` names contribute nothing: their α_i is 0 (κ_i
    alone would leave the FFN's biases). The trained values are put back on leaving, even after
    an error; the in-place writes retire every weight derived from them."""
    sublayers = branched_sublayers(model)
    saved = []
    with torch.no_grad():
        for key, indices in masked.items():
            if indices:
                alpha = sublayers[key][1].branch_weights.alpha
                saved.append((alpha, alpha.clone()))
                alpha[list(indices)] = 0.0
    try:
        yield
    finally:
        with torch.no_grad():
            for alpha, value in saved:
                alpha.copy_(value)


__all__ = ["branched_sublayers", "branches_masked", "prune_state", "pruned_config"]
