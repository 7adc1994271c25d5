"""Saving and restoring a training run's whole state: weights, optimizer, loss scaler,
schedule position, every process's random state, and what a resume is checked against (the
config and the vocabulary's hash). Functions of the trainer, as fairseq's checkpoint_utils."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from wtnmt.config import config_to_dict
from wtnmt.errors import TrainingError
from wtnmt.rundir import latest_checkpoint, load_weights, prune_checkpoints, save_checkpoint
from wtnmt.train.state import TrainState

if TYPE_CHECKING:
    from wtnmt.train.trainer import Trainer


def save_training(trainer: Trainer) -> None:
    """A checkpoint of the whole training state (every rank takes part; rank 0 writes)."""
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    every_rank = [rng]
    if trainer.world > 1:  # each rank's own dropout stream, so that a resume is exact
        every_rank = [None] * trainer.world
        dist.all_gather_object(every_rank, rng)
    if trainer.is_main:
        state = {
            "train_state": asdict(trainer.state),
            "optimizer": trainer.optimizer.state_dict(),
            "scaler": trainer.scaler.state_dict(),
            "rng": rng,
            "rng_per_rank": every_rank,
            "config": config_to_dict(trainer.config),  # what a resume is checked against
            "vocab_sha256": trainer.vocab_sha256,  # the file's bytes
            "vocabulary_sha256": trainer.vocabulary_sha256,  # its pieces: what a resume checks
        }
        try:
            save_checkpoint(trainer.ckpt_dir, trainer.state.step, trainer.model, state)
        except OSError as e:  # a full disk, a lost mount: the last checkpoint is untouched
            found = latest_checkpoint(trainer.ckpt_dir, warn=lambda _: None)
            kept = f"{found[0].name} is intact" if found else "there is no earlier one"
            raise TrainingError(
                f"cannot write the checkpoint of step {trainer.state.step} in {trainer.ckpt_dir}: "
                f"{e.strerror or e}; {kept}"
            ) from None
        best = trainer.ckpt_dir / f"step_{trainer.state.best_step or 0:07d}.state.pt"
        prune_checkpoints(trainer.ckpt_dir, trainer.tc.keep_checkpoints, protect={best})
    if trainer.world > 1:
        dist.barrier()


def resume_training(trainer: Trainer) -> None:
    """Continue exactly where the run's last complete checkpoint left off."""
    found = trainer._resume_from or latest_checkpoint(trainer.ckpt_dir, warn=trainer.log)
    if found is None:
        raise TrainingError(f"--resume: no complete checkpoint in {trainer.ckpt_dir}")
    path, state = found
    load_weights(trainer.model, path.with_name(path.name.replace(".state.pt", ".safetensors")))
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scaler.load_state_dict(state["scaler"])
    trainer.state = TrainState(**state["train_state"])
    trainer.state.finished = None
    per_rank = state.get("rng_per_rank") or [state["rng"]]
    rng = per_rank[trainer.rank] if len(per_rank) == trainer.world else state["rng"]
    if len(per_rank) != trainer.world:
        trainer.log(f"warning: saved with {len(per_rank)} processes, resumed with {trainer.world}")
    torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    trainer.log(
        f"resumed from {path.name}: step {trainer.state.step}, epoch {trainer.state.epoch}, "
        f"batch {trainer.state.batch_in_epoch}"
    )
    # train.precision: auto keeps the precision the run was trained in (fp32 was the default
    # before auto); a precision stated for the resume is used as stated
    recorded = (state.get("config") or {}).get("train", {}).get("precision")
    if trainer.tc.precision == "auto" and recorded in ("fp32", "bf16"):
        if recorded != trainer.precision:
            trainer.log(
                f"train.precision=auto: continuing in {recorded}, as the run was trained "
                f"(set train.precision to change it)"
            )
        trainer.precision = recorded


__all__ = ["resume_training", "save_training"]
