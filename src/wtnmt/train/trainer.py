"""`wtnmt train`: the paper's training procedure (§4.1) on prepared data.

One update = ``update_freq`` planned batches (gradient accumulation), normalised per target
token over the whole update (and over every rank under DDP), then Adam with two parameter
groups (the network on the inverse-√ schedule, κ/α on theirs), then the projection of κ and α
onto the simplex, unless they are in their final frozen window.

One update is ``train.update``; what a run writes, and how a resume is checked,
``wtnmt.rundir``; what it reports, ``train.report``; saving and restoring its state,
``train.resume``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from wtnmt.config import RunConfig
from wtnmt.data import Batch, ParallelData, plan_batches, prepare
from wtnmt.data.vocab import Vocabularies, vocabulary_files, vocabulary_hashes
from wtnmt.errors import TrainingError
from wtnmt.model import build_model, project_branch_weights
from wtnmt.rundir import RunDirectory, latest_checkpoint, save_weights
from wtnmt.runtime import bound_onednn_caches, resolve_precision
from wtnmt.train.init_from import initial_weights as fine_tune_weights
from wtnmt.train.init_from import weights_file
from wtnmt.train.loop import TrainingLoop
from wtnmt.train.precision_probe import autocast_for, precision_label
from wtnmt.train.report import RunReport, recorded_validations
from wtnmt.train.resume import precision_on_resume, restore_training, save_training
from wtnmt.train.schedule import (
    branch_weights_frozen,
    count_patience,
    learning_rates,
    replay_patience,
    run_progress,
    step_budget,
    stop_reason,
)
from wtnmt.train.state import TrainState, make_optimizer, resolve_device
from wtnmt.train.update import Learner, UpdateResult, update
from wtnmt.train.validation import valid_references, validate


class Trainer(TrainingLoop):
    def __init__(
        self,
        config: RunConfig,
        run_dir: str | Path,
        *,
        resume: bool = False,
        log_to_stderr: bool = True,
        data_dir: str | Path | None = None,
        vocab_size: int | None = None,
        initial_weights: dict[str, torch.Tensor] | None = None,
    ) -> None:
        """``data_dir`` (with ``vocab_size``) trains on a directory already in the prepared
        format, e.g. pre-tokenised benchmark data, instead of preparing ``config.data``.
        ``initial_weights``: start from these (a prune's fine-tune) rather than from
        ``train.init_from``'s or a random draw."""
        self.config, self.run_dir = config, Path(run_dir)
        self.tc = config.train
        self.rank = int(os.environ.get("RANK", 0))
        self.world = int(os.environ.get("WORLD_SIZE", 1))
        self.is_main = self.rank == 0
        self.log_to_stderr = log_to_stderr
        self.device = resolve_device(self.tc.device)
        self.precision = resolve_precision(self.tc.precision, self.device)  # auto → bf16/fp32
        if self.precision == "bf16":  # also for the Python API, which `wtnmt train` tunes
            bound_onednn_caches()
        if self.tc.precision == "fp16" and self.device.type != "cuda":
            raise TrainingError(
                f"train.precision='fp16' needs a CUDA device and training runs on "
                f"{self.device.type} (train.device={self.tc.device!r}): use bf16 or fp32"
            )
        self._owns_group = False  # whether run() is to take the process group down
        if self.world > 1 and not dist.is_initialized():
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            dist.init_process_group(backend)
            self._owns_group = True
            if self.device.type == "cuda":
                self.device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        if self.tc.threads:
            torch.set_num_threads(self.tc.threads)
        self.report = RunReport(self.run_dir, is_main=self.is_main, to_stderr=log_to_stderr)
        if self.tc.init_from is not None and not resume and initial_weights is None:
            weights_file(self.tc.init_from)  # before its vocabulary is asked for
        self._prepare_run_dir(resume, data_dir)
        joint = config.data.joint_vocab
        self.vocab = Vocabularies.found(self.data_dir, joint)
        if vocab_size is None:
            if self.vocab is None:
                missing = " and ".join(vocabulary_files(joint))
                raise TrainingError(f"{self.data_dir}: no {missing}: prepare the data first")
            vocab_size = len(self.vocab.target)
        self.train_data = ParallelData(self.data_dir, "train")
        self.valid_data = ParallelData(self.data_dir, "valid")
        torch.manual_seed(self.tc.seed)
        source_size = self.vocab.source_size if self.vocab is not None else None
        self.model = build_model(config.model, vocab_size=vocab_size, source_vocab_size=source_size)
        if initial_weights is None and not resume and self.tc.init_from is not None:
            vocabulary = vocabulary_hashes(self.vocab)["vocabulary_sha256"]
            initial_weights = fine_tune_weights(
                config, self.model, vocabulary, self.run_dir, log=self.log, write=self.is_main
            )
        if initial_weights is not None:
            self.model.load_state_dict(initial_weights)
        self.model.to(self.device)
        self.branch_params, self.optimizer = make_optimizer(self.model, self.tc)
        self.ddp: nn.Module = self.model
        if self.world > 1:
            self.ddp = nn.parallel.DistributedDataParallel(self.model)
        # what an update calls forward (train.compile: a compiled ddp, sharing its weights)
        self.forward: nn.Module = self.ddp
        if self.tc.compile:
            self.forward = torch.compile(self.ddp, dynamic=True)  # type: ignore[assignment]
        self.scaler = torch.amp.GradScaler(enabled=self.precision == "fp16")
        self.state = TrainState()
        torch.manual_seed(self.tc.seed + self.rank)  # dropout differs across ranks
        if resume:
            self._resume()
        elif (
            self.tc.precision == "auto"
            and self.precision == "bf16"
            and self.device.type == "cpu"
            and self.world == 1
        ):
            self._measure_precision()  # native bf16 is not always the faster here

    # ---------------------------------------------------------------------------------------
    # Run directory, logging, checkpoints

    def _prepare_run_dir(self, resume: bool, data_dir: str | Path | None) -> None:
        """Check the run directory, then prepare the data and write config and vocabulary.

        A resume is checked against the run's last checkpoint (model and data settings, then
        the vocabulary) before config.yaml or spm.model is written.
        """
        c = self.config.data
        self.data_dir = Path(data_dir if data_dir is not None else c.prepared_path())
        self.rundir = RunDirectory(self.run_dir)
        self.ckpt_dir = self.rundir.checkpoints
        self._resume_from: tuple[Path, dict[str, Any]] | None = None
        if self.is_main:
            self.rundir.lock()
            if resume:
                self._resume_from = self.rundir.resume_point(self.config, warn=self.log)
            else:
                self.rundir.check_new(self.config)
            if data_dir is None:
                prepare(c, self.data_dir, log=self.log)
            if self._resume_from is not None:
                self.rundir.check_vocabulary(self._resume_from[1], self.data_dir, c.joint_vocab)
                self.rundir.reopen_curve(warn=self.log)
            self.rundir.write_setup(self.config, self.data_dir)
        if self.world > 1:
            dist.barrier()

    def log(self, message: str) -> None:
        self.report.log(message)

    def record(self, entry: dict[str, Any]) -> None:
        self.report.record(entry)

    def save(self) -> None:
        save_training(
            model=self.model,
            optimizer=self.optimizer,
            scaler=self.scaler,
            state=self.state,
            config=self.config,
            precision=self.precision,
            vocabulary=vocabulary_hashes(self.vocab),
            ckpt_dir=self.ckpt_dir,
            is_main=self.is_main,
            world=self.world,
        )

    def _resume(self) -> None:
        """Continue exactly where the run's last complete checkpoint left off."""
        found = self._resume_from or latest_checkpoint(self.ckpt_dir, warn=self.log)
        if found is None:
            raise TrainingError(f"--resume: no complete checkpoint in {self.ckpt_dir}")
        resumed = restore_training(
            found,
            model=self.model,
            optimizer=self.optimizer,
            scaler=self.scaler,
            rank=self.rank,
            world=self.world,
        )
        self.state = resumed.state
        s = self.state
        if resumed.processes != self.world:
            self.log(
                f"warning: saved with {resumed.processes} processes, resumed with {self.world}"
            )
        self.log(
            f"resumed from {resumed.path.name}: step {s.step}, epoch {s.epoch}, batch "
            f"{s.batch_in_epoch}"
        )
        if resumed.stopping != (self.tc.patience_on, self.tc.best_metric):
            validations = recorded_validations(self.run_dir, s.step)
            replay_patience(s, self.tc, validations)
            self.log(
                f"train.patience_on={self.tc.patience_on} (trained with "
                f"{resumed.stopping[0]}): {s.bad_validations} of the run's "
                f"{len(validations)} validations since patience last saw an improvement"
            )
        self.precision = precision_on_resume(
            self.tc.precision, self.precision, resumed.precision, resumed.path.name, self.log
        )

    # ---------------------------------------------------------------------------------------
    # One update

    def _measure_precision(self) -> None:
        """train.precision=auto where bf16 is native: the choice kept for this CPU, PyTorch,
        thread count, model and batch size, else measured on the first batches and kept."""
        from wtnmt.config import config_to_dict
        from wtnmt.runtime import cpu_description
        from wtnmt.train.precision_probe import choose_precision, time_precisions

        def measure() -> dict[str, float]:
            batches = [self.train_data.collate(b) for b in self._epoch_batches(0)[:2]]
            return time_precisions(self.model, batches, self.device)

        parts = {
            "cpu": cpu_description(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "model": config_to_dict(self.config.model),
            "max_tokens": self.tc.max_tokens,
        }
        self.precision, said = choose_precision(parts, measure)
        self.log(said)

    def _precision_label(self) -> str:
        return precision_label(self.precision, self.tc.precision)

    def _autocast(self):  # type: ignore[no-untyped-def]
        return autocast_for(self.precision, self.device)

    def _set_lr(self, frozen: bool, budget: int | None) -> tuple[float, float]:
        s = self.state
        lr, lr_b = learning_rates(
            s.step + 1,
            self.config.model,
            self.tc,
            frozen=frozen,
            warmup=s.warmup,
            branch_warmup=s.branch_warmup,
            progress=run_progress(s.step, s.elapsed, max_steps=budget, max_time=self.tc.max_time),
            total_steps=budget or s.predicted_steps,  # the run's end in steps, where known
        )
        self.optimizer.param_groups[0]["lr"] = lr
        if len(self.optimizer.param_groups) > 1:
            self.optimizer.param_groups[1]["lr"] = lr_b
        return lr, lr_b

    def update(
        self, batches: list[Batch], *, want_ratio: bool = False, project: bool = True
    ) -> UpdateResult:
        """One optimizer update over ``batches`` (see ``train.update``), then, with
        ``project`` (κ, α not frozen), κ and α's projection onto the simplex: what a training
        step does, which the benchmarks time through this method."""
        learner = Learner(
            model=self.model,
            ddp=self.ddp,
            forward=self.forward,
            optimizer=self.optimizer,
            scaler=self.scaler,
            device=self.device,
            world=self.world,
            config=self.tc,
            autocast=self._autocast,
        )
        result = update(learner, batches, want_ratio=want_ratio)
        if project and self.config.model.branch_weights != "softmax":
            project_branch_weights(self.model)
        return result

    # ---------------------------------------------------------------------------------------
    # Validation

    def validate(self) -> dict[str, float]:
        """Dev loss, perplexity and (with references) BLEU of greedy decoding."""
        refs = None
        if self.tc.valid_bleu and self.vocab is not None:
            path = self.data_dir / f"valid.{self.config.data.tgt_lang}"
            refs = valid_references(path, expected=len(self.valid_data))
        return validate(
            self.model,
            self.valid_data,
            vocab=None if self.vocab is None else self.vocab.target,
            references=refs,
            decode=self.config.decode,
            max_tokens=self.tc.max_tokens,
            label_smoothing=self.tc.label_smoothing,
            device=self.device,
            autocast=self._autocast,
        )

    # ---------------------------------------------------------------------------------------
    # The loop

    def _epoch_batches(self, epoch: int) -> list:  # type: ignore[type-arg]
        """This rank's planned batches of ``epoch``."""
        plan = plan_batches(
            self.train_data.src_lengths,
            self.train_data.tgt_lengths,
            max_tokens=self.tc.max_tokens,
            seed=self.tc.seed,
            epoch=epoch,
        )
        batches = plan.shard(self.rank, self.world).batches
        if not batches:  # the loop would go round for ever
            raise TrainingError(
                f"{self.data_dir}: {len(self.train_data):,} training pairs make "
                f"{len(plan.batches)} batches of train.max_tokens={self.tc.max_tokens}, "
                f"fewer than the {self.world} processes"
                if self.world > 1 and len(plan.batches)
                else f"{self.data_dir}: no training batches ({len(self.train_data):,} pairs)"
            )
        return batches

    def _step_budget(self) -> int | None:
        per_epoch = None
        if self.tc.max_epochs is not None:
            per_epoch = math.ceil(len(self._epoch_batches(0)) / self.tc.update_freq)
        return step_budget(self.tc.max_steps, self.tc.max_epochs, per_epoch)

    def _frozen(self, budget: int | None) -> bool:
        return bool(self.branch_params) and branch_weights_frozen(
            self.state.step + 1,
            self.state.elapsed,
            max_steps=budget,
            max_time=self.tc.max_time,
            freeze_steps=self.tc.freeze_branch_weights,
            freeze_fraction=self.tc.freeze_branch_fraction,
        )

    def _stop_reason(self) -> str | None:
        return stop_reason(self.state, self.tc)

    def _validate_and_keep_best(self) -> None:
        scores = self.validate()
        for key, value in (("best_metric", "bleu"), ("patience_on", "loss_or_bleu")):
            if getattr(self.tc, key) == value and "valid_bleu" not in scores:
                raise TrainingError(
                    f"train.{key}={value!r} needs dev BLEU: set "
                    "train.valid_bleu=true and train on data with a vocabulary"
                )
        # the best is the lowest: loss as it is, BLEU negated
        metric = -scores["valid_bleu"] if self.tc.best_metric == "bleu" else scores["valid_loss"]
        s = self.state
        improved = s.best is None or metric < s.best
        if improved:
            s.best, s.best_step = metric, s.step
            if self.is_main:
                vocabulary = vocabulary_hashes(self.vocab)["vocabulary_sha256"]
                save_weights(self.model, self.run_dir / "model.safetensors", vocabulary=vocabulary)
        count_patience(
            s,
            self.tc,
            loss=scores["valid_loss"],
            bleu=scores.get("valid_bleu"),
            improved_best=improved,
        )
        self.record(
            {
                "step": s.step,
                "elapsed": round(s.elapsed, 1),
                **{k: round(v, 4) for k, v in scores.items()},
                "best": improved,
            }
        )
        bleu = f" | BLEU {scores['valid_bleu']:.2f}" if "valid_bleu" in scores else ""
        self.log(
            f"validation at step {s.step}: loss {scores['valid_loss']:.3f} | ppl "
            f"{scores['valid_ppl']:.2f}{bleu}{' (best)' if improved else ''}"
        )

    def run(self) -> TrainState:
        """Train until a stop condition; the run directory is let go however it ends."""
        try:
            state = self._train()
            if self._owns_group:  # every rank done before the group goes
                dist.barrier()
            return state
        finally:
            self.rundir.unlock()
            if self._owns_group and dist.is_initialized():  # not left to the exit, where a
                dist.destroy_process_group()  # rank's gloo threads could abort the process
