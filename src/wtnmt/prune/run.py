"""`wtnmt prune RUN --out DIR`: a trained Weighted Transformer without some of its branches,
written as an ordinary run directory (translate, evaluate, serve, average and the ONNX export
read it as any run), optionally fine-tuned.

The new run's config is the source's with ``model.kept_branches`` (what is left, as indices
among the trained branches) and a ``prune`` section (where it came from, the criterion and the
budget); ``prune.json`` beside it holds every branch's score, what was removed, and the
parameters before and after.

The fine-tune trains the pruned model on the source's data for ``fine_tune`` updates: a fresh
Adam, the learning rate the source run ended with as the peak (warmed up over the first tenth,
then decayed linearly to 0), κ and α kept as pruned (frozen: a projection onto the simplex
would rescale the kept branches at the first step). ``--set train.KEY=VALUE`` changes any of
that; the run's ``model.safetensors`` is then its best on dev, as for any run.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from wtnmt.config import (
    ConfigError,
    PruneRecord,
    RunConfig,
    config_from_dict,
    config_to_dict,
    parse_override,
)
from wtnmt.data.vocab import vocabularies_sha256
from wtnmt.errors import CheckpointError
from wtnmt.model import build_like, count_parameters
from wtnmt.model.pruning import branched_sublayers, prune_state, pruned_config
from wtnmt.prune.criteria import (
    Scores,
    importance_scores,
    kappa_alpha_scores,
    random_scores,
    select,
)
from wtnmt.rundir import load_run, save_weights
from wtnmt.rundir.files import atomic_write
from wtnmt.rundir.run import MARK, copy_vocabularies
from wtnmt.safe_files import file_in_the_way


def check_prunable(config: RunConfig, run: Path, criterion: str) -> None:
    """One line for a model this command cannot prune, or a criterion that cannot rank it."""
    m = config.model
    if m.attention != "branched":
        raise ConfigError(
            f"{run}: a Transformer (model.attention: multihead) has no branches: wtnmt prune "
            f"removes branches of a Weighted Transformer"
        )
    if m.branch_weights not in ("simplex", "fixed"):
        raise ConfigError(
            f"{run}: model.branch_weights={m.branch_weights!r}: wtnmt prune takes models whose "
            f"κ, α are used as stored (simplex, fixed)"
        )
    if criterion == "kappa-alpha" and m.branch_weights == "fixed":
        raise ConfigError(
            f"{run}: model.branch_weights='fixed' holds every κ·α at 1/M²: --criterion "
            f"kappa-alpha cannot rank its branches; use importance or random"
        )


def check_out(out: Path, run: Path) -> None:
    """The output is a new or empty directory, never the source run, never a model."""
    blocked = file_in_the_way(out)
    if blocked is not None:
        raise ConfigError(f"--out {out}: {blocked} is a file, not a directory")
    if out.resolve() == run.resolve():
        raise ConfigError(f"--out {out}: is the run being pruned; give a new directory")
    if _fine_tune_pending(out) is not None:
        raise ConfigError(
            f"--out {out}: holds a fine-tune of wtnmt prune that was interrupted (its "
            f"prune.json says fine_tuned: false): finish it with `{resume_command(out)}`, or "
            f"give a new directory"
        )
    if out.is_dir() and any(out.iterdir()):
        what = (
            "holds a model (model.safetensors)"
            if (out / "model.safetensors").exists()
            else ("exists and is not empty")
        )
        raise ConfigError(f"--out {out}: {what}; give a new directory")


def resume_command(out: Path) -> str:
    return f"wtnmt train {out / 'config.yaml'} --out {out} --resume"


def _fine_tune_pending(out: Path) -> dict | None:
    """The prune.json of a pruned run whose fine-tune has not finished, else None."""
    try:
        summary = json.loads((out / "prune.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) and summary.get("fine_tuned") is False else None


def mark_fine_tuned(out: Path) -> bool:
    """Training of ``out`` finished: where it is the fine-tune of a prune that was interrupted
    (resumed by `wtnmt train --resume`), its prune.json says so now. Whether it was one."""
    summary = _fine_tune_pending(out)
    if summary is None:
        return False
    summary["fine_tuned"] = True
    atomic_write(out / "prune.json", (json.dumps(summary, indent=2) + "\n").encode())
    return True


def source_learning_rate(run: Path) -> float | None:
    """The learning rate of the last update a run logged (an averaged run: its source's)."""
    averaged = run / "averaged.json"
    if not (run / "metrics.jsonl").is_file() and averaged.is_file():
        run = Path(json.loads(averaged.read_text(encoding="utf-8")).get("run", run))
    lr = None
    path = run / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(entry, dict) and isinstance(entry.get("lr"), (int, float)):
                lr = float(entry["lr"])
    return lr


def fine_tune_config(
    config: RunConfig, steps: int, *, run: Path, overrides: list[str] | tuple[str, ...]
) -> RunConfig:
    """The pruned run's config with the fine-tune's training settings, then ``overrides``."""
    values = config_to_dict(config)
    train = values["train"]
    train.update(
        max_steps=steps,
        max_epochs=None,
        max_time=None,
        warmup_fraction=None,
        lr_schedule="linear",
        warmup=max(1, steps // 10),
        freeze_branch_weights=steps,
        patience=None,
        peak_lr=source_learning_rate(run),
        threads=None,  # the process's own (`wtnmt prune --threads`), not the source run's
    )
    train["valid_every"] = min(train["valid_every"], steps)
    for text in overrides:
        keys, value = parse_override(text)
        if keys[0] != "train":
            raise ConfigError(f"--set {text!r}: the fine-tune takes train.* settings only")
        node = values
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    if values["train"]["peak_lr"] is None:
        raise ConfigError(
            f"{run}: no metrics.jsonl with the learning rate the run ended with; give the "
            f"fine-tune's with --set train.peak_lr=VALUE"
        )
    return config_from_dict(values)


def dev_loss_of(config: RunConfig, run: Path, model: torch.nn.Module, log) -> Callable[[], float]:  # type: ignore[no-untyped-def]
    """A function giving the dev cross-entropy per target token of ``model`` as it is now
    (teacher forced, no label smoothing), on the run's prepared dev split."""
    from wtnmt.data import ParallelData, prepare
    from wtnmt.data.vocab import vocabularies_sha256
    from wtnmt.train.validation import validate

    data_dir = config.data.prepared_path()
    prepare(config.data, data_dir, log=log)
    joint = config.data.joint_vocab
    if vocabularies_sha256(data_dir, joint) != vocabularies_sha256(run, joint):
        raise CheckpointError(
            f"{data_dir}: its vocabulary is not the one {run} was trained with; the dev loss "
            f"of --criterion importance needs the run's own prepared data"
        )
    dev = ParallelData(data_dir, "valid")

    def loss() -> float:
        scores = validate(
            model,
            dev,
            vocab=None,
            references=None,
            decode=config.decode,
            max_tokens=config.train.max_tokens,
            label_smoothing=0.0,
            device=torch.device("cpu"),
            autocast=nullcontext,
        )
        model.eval()
        return scores["valid_nll"]

    return loss


def branch_scores(
    criterion: str,
    model: torch.nn.Module,
    *,
    seed: int,
    make_dev_loss,
    progress,  # type: ignore[no-untyped-def]
) -> tuple[Scores, float | None]:
    """Each branch's score under ``criterion``, and the full model's dev loss (importance:
    ``make_dev_loss()`` gives the function that measures it, the data prepared)."""
    if criterion == "kappa-alpha":
        return kappa_alpha_scores(model), None
    if criterion == "random":
        return random_scores(model, seed), None
    base, scores = importance_scores(model, make_dev_loss(), progress=progress)
    return scores, base


def _table(scores: Scores) -> dict[str, list[list[float]]]:
    return {
        side: [scores[(s, i)] for s, i in sorted(scores) if s == side]
        for side in ("encoder", "decoder")
    }


def prune_run(
    run: str | Path,
    out: str | Path,
    *,
    criterion: str = "importance",
    keep: int | None = None,
    keep_total: int | None = None,
    weights: str = "model.safetensors",
    seed: int = 1,
    fine_tune: int = 0,
    overrides: list[str] | tuple[str, ...] = (),
    log: Callable[[str], None] = print,
    progress: Callable[[int, int], None] = lambda done, total: None,
    measured: tuple[Scores, float | None] | None = None,
) -> dict[str, Any]:
    """Prune ``run`` into the new run directory ``out``; returns what prune.json holds.
    ``measured``: the scores (and dev loss) ``criterion`` gave these weights already (a
    sweep over budgets measures importance once)."""
    run, out = Path(run), Path(out)
    start = time.perf_counter()
    check_out(out, run)
    config, _, model = load_run(run, weights=weights)
    check_prunable(config, run, criterion)
    record = PruneRecord(  # checks the budget's form before any work
        source=str(run),
        weights=weights,
        criterion=criterion,  # type: ignore[arg-type]
        keep=keep,
        keep_total=keep_total,
        seed=seed,
        fine_tune_steps=fine_tune,
    )
    # the fine-tune's settings (train.* only) hold, before any measuring
    tuned_train = (
        fine_tune_config(config, fine_tune, run=run, overrides=overrides).train
        if fine_tune
        else None
    )
    model.eval()
    sizes = {k: [0.0] * m.w_out.size(0) for k, (_, m) in branched_sublayers(model).items()}
    select(sizes, keep=keep, keep_total=keep_total)  # the budget fits, before any measuring
    scores, dev_loss = measured or branch_scores(
        criterion,
        model,
        seed=seed,
        make_dev_loss=lambda: dev_loss_of(config, run, model, log),
        progress=progress,
    )
    kept = select(scores, keep=keep, keep_total=keep_total)
    model_config = pruned_config(config.model, kept)
    pruned = dataclasses.replace(config, model=model_config, prune=record)
    state = prune_state(model, kept)
    small = build_like(model_config, model)
    small.load_state_dict(state)
    removed = {
        key: [i for i in range(module.w_out.size(0)) if i not in kept[key]]
        for key, (_, module) in branched_sublayers(model).items()
    }
    summary: dict[str, Any] = {
        "source": str(run),
        "weights": weights,
        "criterion": criterion,
        "keep": keep,
        "keep_total": keep_total,
        "seed": seed,
        "scores": _table(scores),
        "removed": _table(removed),  # type: ignore[arg-type]
        "kept_branches": config_to_dict(model_config)["kept_branches"],
        "branches": {
            "before": sum(len(s) for s in scores.values()),
            "after": sum(len(k) for k in kept.values()),
        },
        "parameters": {"before": count_parameters(model), "after": count_parameters(small)},
        "dev_nll_full": dev_loss,
        "fine_tune_steps": fine_tune,
    }
    if fine_tune:
        from wtnmt.train import Trainer

        tuned = dataclasses.replace(pruned, train=tuned_train)
        log(f"fine-tuning {out} for {fine_tune} updates (peak lr {tuned.train.peak_lr:g})")
        trainer = Trainer(tuned, out, initial_weights=state)
        # what was pruned is known now: kept whether or not the fine-tune is interrupted (a
        # run resumed with `wtnmt train --resume` marks it fine-tuned when it finishes)
        summary["fine_tuned"] = False
        atomic_write(out / "prune.json", (json.dumps(summary, indent=2) + "\n").encode())
        # the pruned weights as the checkpoint of update 0, before any training: a fine-tune
        # killed at any moment (SIGKILL, the OOM killer) resumes with `wtnmt train --resume`
        trainer.save()
        trainer.run()
        summary["fine_tuned"] = True
    else:
        out.mkdir(parents=True, exist_ok=True)
        import yaml

        text = yaml.safe_dump(config_to_dict(pruned), sort_keys=False)
        atomic_write(out / "config.yaml", MARK + text.encode())
        copy_vocabularies(run, out)
        vocabulary = vocabularies_sha256(out, pruned.data.joint_vocab)
        save_weights(small, out / "model.safetensors", vocabulary=vocabulary)
    summary["seconds"] = round(time.perf_counter() - start, 1)
    atomic_write(out / "prune.json", (json.dumps(summary, indent=2) + "\n").encode())
    return summary


__all__ = ["prune_run"]
