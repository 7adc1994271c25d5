"""Saving and restoring a training run's whole state: weights, optimizer, loss scaler,
schedule position, every process's random state, and what a resume is checked against (the
config and the vocabulary's hash). Plain functions of the parts they touch, as fairseq's
checkpoint_utils; the trainer applies what a restore returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from wtnmt.config import RunConfig, config_to_dict
from wtnmt.errors import TrainingError
from wtnmt.rundir import latest_checkpoint, load_weights, prune_checkpoints, save_checkpoint
from wtnmt.train.state import TrainState


@dataclass(frozen=True)
class Resumed:
    """What a checkpoint gives back to continue from."""

    path: Path  # the checkpoint's state file
    state: TrainState
    precision: str | None  # the precision the run was trained in (fp32, bf16, fp16), where
    # recorded: the one in effect (what train.precision=auto chose), else the config's value
    processes: int  # how many processes saved it (each with its own random state)
    stopping: tuple[str, str]  # train.patience_on and train.best_metric it was trained with


def save_training(
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    state: TrainState,
    config: RunConfig,
    precision: str,
    vocabulary: dict[str, str | None],
    ckpt_dir: Path,
    is_main: bool,
    world: int,
) -> None:
    """A checkpoint of the whole training state (every rank takes part; rank 0 writes).
    ``precision``: the one training is in (train.precision=auto's choice, which the config
    cannot say); ``vocabulary``: the hashes a resume checks (``vocab_sha256`` of the file's
    bytes, ``vocabulary_sha256`` of its pieces)."""
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    every_rank: list[Any] = [rng]
    if world > 1:  # each rank's own dropout stream, so that a resume is exact
        every_rank = [None] * world
        dist.all_gather_object(every_rank, rng)
    if is_main:
        saved = {
            "train_state": asdict(state),
            "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict(),
            "rng": rng,
            "rng_per_rank": every_rank,
            "config": config_to_dict(config),  # what a resume is checked against
            "precision": precision,
            **vocabulary,
        }
        try:
            save_checkpoint(ckpt_dir, state.step, model, saved)
        except OSError as e:  # a full disk, a lost mount: the last checkpoint is untouched
            found = latest_checkpoint(ckpt_dir, warn=lambda _: None)
            kept = f"{found[0].name} is intact" if found else "there is no earlier one"
            raise TrainingError(
                f"cannot write the checkpoint of step {state.step} in {ckpt_dir}: "
                f"{e.strerror or e}; {kept}"
            ) from None
        best = ckpt_dir / f"step_{state.best_step or 0:07d}.state.pt"
        every = config.train.save_every or config.train.valid_every
        prune_checkpoints(ckpt_dir, config.train.keep_checkpoints, protect={best}, every=every)
    if world > 1:
        dist.barrier()


def restore_training(
    found: tuple[Path, dict[str, Any]],
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    rank: int,
    world: int,
) -> Resumed:
    """Load a checkpoint (its state file and saved dict) into the model, optimizer, scaler
    and this process's random state; the rest is returned for the trainer to apply."""
    path, saved = found
    load_weights(model, path.with_name(path.name.replace(".state.pt", ".safetensors")))
    optimizer.load_state_dict(saved["optimizer"])
    scaler.load_state_dict(saved["scaler"])
    state = TrainState(**saved["train_state"])
    state.finished = None
    per_rank = saved.get("rng_per_rank") or [saved["rng"]]
    rng = per_rank[rank] if len(per_rank) == world else saved["rng"]
    torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    trained = (saved.get("config") or {}).get("train", {})
    return Resumed(
        path=path,
        state=state,
        precision=saved.get("precision") or trained.get("precision"),
        processes=len(per_rank),
        # a checkpoint older than train.patience_on counted patience on best_metric
        stopping=(trained.get("patience_on", "best_metric"), trained.get("best_metric", "loss")),
    )


def precision_on_resume(
    asked: str, chosen: str, trained: str | None, checkpoint: str, log: Callable[[str], None]
) -> str:
    """The precision a resumed run goes on in: with train.precision ``asked`` auto, the one
    it was ``trained`` in (fp32 was the default before auto), said where that is not what
    auto ``chosen`` now; a precision stated for the resume, as stated."""
    if asked == "auto" and trained in ("fp32", "bf16"):
        if trained != chosen:
            log(
                f"train.precision=auto: continuing in {trained}, as the run was trained (set "
                f"train.precision to change it)"
            )
        return trained
    if asked == "auto" and trained in (None, "auto"):  # unsaid
        log(
            f"warning: {checkpoint} does not record the precision train.precision=auto "
            f"chose; continuing in {chosen} (set train.precision to fp32 or bf16 to choose)"
        )
    return chosen


__all__ = ["Resumed", "precision_on_resume", "restore_training", "save_training"]
