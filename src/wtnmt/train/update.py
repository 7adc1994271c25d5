"""One optimizer update: forward and backward over the update's batches (accumulated, the
loss normalised per target token over the whole update and every DDP rank), the
disagreement term, r_t when asked, clipping, a check for non-finite values, then Adam."""

from __future__ import annotations

import math
from contextlib import nullcontext
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from wtnmt.data import Batch
from wtnmt.disagreement import disagreement
from wtnmt.loss import label_smoothed_cross_entropy
from wtnmt.model.packed import weights_updated
from wtnmt.special import PAD

if TYPE_CHECKING:
    from wtnmt.train.trainer import Trainer


def update(
    trainer: Trainer, batches: list[Batch], *, want_ratio: bool = False
) -> tuple[float, float, int, float, float | None]:
    """Forward/backward over ``batches``, then one optimizer step (unless non-finite).

    Returns (loss sum, nll sum, target tokens, gradient norm, r_t or None).
    """
    tokens = sum(b.target_tokens for b in batches)
    total = torch.tensor(float(tokens), device=trainer.device)
    if trainer.world > 1:
        dist.all_reduce(total)
    scale = trainer.world / float(total)  # DDP averages over ranks: undo it, divide by tokens
    dis = trainer.tc.disagreement
    need_internals = bool(dis.terms) and dis.weight > 0
    loss_sum, nll_sum, ratio = 0.0, 0.0, None
    for i, batch in enumerate(batches):
        sync = i == len(batches) - 1 or trainer.world == 1
        context = nullcontext() if sync else trainer.ddp.no_sync()  # type: ignore[operator]
        src, tgt_in = batch.src.to(trainer.device), batch.tgt_in.to(trainer.device)
        tgt_out = batch.tgt_out.to(trainer.device)
        real = tgt_out.ne(PAD)
        with context, trainer._autocast():
            ratio_here = want_ratio and i == 0
            out = trainer.ddp(
                src, tgt_in, logits_mask=real, need_internals=need_internals or ratio_here
            )
            loss_tok, nll_tok = label_smoothed_cross_entropy(
                out.logits, tgt_out[real], epsilon=trainer.tc.label_smoothing
            )
            loss = loss_tok.sum()
            if need_internals:
                d = disagreement(out.internals, terms=dis.terms, modules=dis.modules)
                loss = loss - dis.weight * d * batch.target_tokens
            if ratio_here:
                states = out.internals.encoder_states
                for h in (states[1], states[-1]):
                    h.retain_grad()
            trainer.scaler.scale(loss * scale).backward()
        if ratio_here:
            low, top = states[1].grad, states[-1].grad
            ratio = float(low.norm() / top.norm().clamp_min(1e-30))
        loss_sum += float(loss_tok.detach().sum())
        nll_sum += float(nll_tok.sum())
    trainer.scaler.unscale_(trainer.optimizer)
    max_norm = trainer.tc.clip_norm if trainer.tc.clip_norm else float("inf")
    grad_norm = float(nn.utils.clip_grad_norm_(trainer.model.parameters(), max_norm))
    if not (math.isfinite(loss_sum) and math.isfinite(grad_norm)):
        trainer.optimizer.zero_grad(set_to_none=True)
        trainer.scaler.update()
        raise FloatingPointError(f"loss {loss_sum}, gradient norm {grad_norm}")
    trainer.scaler.step(trainer.optimizer)
    weights_updated()  # the packed copies validation decodes with are stale now
    trainer.scaler.update()
    trainer.optimizer.zero_grad(set_to_none=True)
    return loss_sum, nll_sum, tokens, grad_norm, ratio


__all__ = ["update"]
