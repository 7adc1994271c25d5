"""One optimizer update: forward and backward over the update's batches (accumulated, the
loss normalised per target token over the whole update and every DDP rank), the
disagreement term, r_t when asked, clipping, a check for non-finite values, then Adam."""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from wtnmt.config import TrainConfig
from wtnmt.data import Batch
from wtnmt.disagreement import disagreement
from wtnmt.loss import label_smoothed_cross_entropy
from wtnmt.model import real_positions
from wtnmt.model.packed import weights_updated
from wtnmt.special import PAD


@dataclass(frozen=True)
class Learner:
    """What an update works with: the model (and its DDP wrapper, the same module when there
    is one process; ``forward``, what the update calls, is that wrapper or its compiled form),
    the optimizer and loss scaler, where it runs and in what precision."""

    model: nn.Module
    ddp: nn.Module
    forward: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    device: torch.device
    world: int
    config: TrainConfig
    autocast: Callable[[], AbstractContextManager]


@dataclass(frozen=True)
class UpdateResult:
    loss: float  # summed over the update's target tokens
    nll: float
    tokens: int
    grad_norm: float
    ratio: float | None  # r_t, when asked


def update(learner: Learner, batches: list[Batch], *, want_ratio: bool = False) -> UpdateResult:
    """Forward/backward over ``batches``, then one optimizer step; a FloatingPointError (and
    no step) when the loss or the gradient is not finite."""
    tokens = sum(b.target_tokens for b in batches)
    scale = learner.world / _global_tokens(tokens, learner)  # DDP averages: undo it
    dis = learner.config.disagreement
    need_internals = bool(dis.terms) and dis.weight > 0
    # kept on the device and read once after the loop: a float() per batch would make the
    # host wait for each batch's kernels before it may queue the next batch's
    losses: list[tuple[torch.Tensor, torch.Tensor]] = []
    ratio_t: torch.Tensor | None = None
    for i, batch in enumerate(batches):
        sync = i == len(batches) - 1 or learner.world == 1
        context = nullcontext() if sync else learner.ddp.no_sync()  # type: ignore[operator]
        inputs, target = teacher_forced(batch, learner.device)
        with context, learner.autocast():
            ratio_here = want_ratio and i == 0
            # r_t reads gradients at inner states, which a compiled graph does not keep
            net = learner.ddp if ratio_here else learner.forward
            out = net(**inputs, need_internals=need_internals or ratio_here)
            loss_tok, nll_tok = label_smoothed_cross_entropy(
                out.logits, target, epsilon=learner.config.label_smoothing
            )
            loss = loss_tok.sum()
            if need_internals:
                d = disagreement(out.internals, terms=dis.terms, modules=dis.modules)
                loss = loss - dis.weight * d * batch.target_tokens
            if ratio_here:
                states = out.internals.encoder_states
                for h in (states[1], states[-1]):
                    h.retain_grad()
            learner.scaler.scale(loss * scale).backward()
        if ratio_here:
            low, top = states[1].grad, states[-1].grad
            ratio_t = low.norm() / top.norm().clamp_min(1e-30)
        losses.append((loss_tok.detach().sum(), nll_tok.detach().sum()))
    loss_sum, nll_sum = 0.0, 0.0
    for loss_b, nll_b in losses:  # summed in float64 on the host, batch by batch, as before
        loss_sum += float(loss_b)
        nll_sum += float(nll_b)
    ratio = None if ratio_t is None else float(ratio_t)
    learner.scaler.unscale_(learner.optimizer)
    max_norm = learner.config.clip_norm if learner.config.clip_norm else float("inf")
    grad_norm = float(nn.utils.clip_grad_norm_(learner.model.parameters(), max_norm))
    if not (math.isfinite(loss_sum) and math.isfinite(grad_norm)):
        learner.optimizer.zero_grad(set_to_none=True)
        learner.scaler.update()
        raise FloatingPointError(f"loss {loss_sum}, gradient norm {grad_norm}")
    learner.scaler.step(learner.optimizer)
    weights_updated()  # the packed copies validation decodes with are stale now
    learner.scaler.update()
    learner.optimizer.zero_grad(set_to_none=True)
    return UpdateResult(loss_sum, nll_sum, tokens, grad_norm, ratio)


def teacher_forced(batch: Batch, device: torch.device) -> tuple[dict[str, Any], torch.Tensor]:
    """The model's teacher-forced inputs for ``batch`` on ``device`` (src, tgt_in, logits_at,
    src_padded) and the targets the logits are scored against. What depends on the data is
    found on the host, where the batch is: on a GPU the host then queues the whole forward
    and backward without waiting for the device."""
    at = real_positions(batch.tgt_out)
    inputs = {
        "src": batch.src.to(device),
        "tgt_in": batch.tgt_in.to(device),
        "logits_at": at.to(device),
        "src_padded": bool(batch.src.eq(PAD).any()),
    }
    return inputs, batch.tgt_out.flatten()[at].to(device)


def _global_tokens(tokens: int, learner: Learner) -> float:
    """The update's target tokens over every rank; no trip to the device for one process."""
    if learner.world == 1:
        return float(tokens)
    total = torch.tensor(float(tokens), device=learner.device)
    dist.all_reduce(total)
    return float(total)


__all__ = ["Learner", "UpdateResult", "teacher_forced", "update"]
