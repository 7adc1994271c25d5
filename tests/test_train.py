"""Training: the simplex and the freeze of κ/α, faults (NaN losses, failing validation), DDP,
overfitting, precision, validation and its metrics (resuming: test_resume.py)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from helpers import (
    overfit_run_config,
    sentence,
    tiny_run_config,
    translate,
    two_processes,
    write_pairs,
)
from wtnmt.data import ParallelData, Vocabulary
from wtnmt.decode import greedy_search
from wtnmt.errors import TrainingError
from wtnmt.model import branch_weight_table
from wtnmt.rundir import latest_checkpoint
from wtnmt.special import PAD
from wtnmt.train import Trainer

QUIET = {"log_to_stderr": False}


def test_branch_weights_stay_on_the_simplex_and_freeze_at_the_end(tmp_path):
    config = tiny_run_config(
        tmp_path,
        train={"max_steps": 8, "save_every": 1, "freeze_branch_weights": 3, "keep_checkpoints": 20},
    )
    Trainer(config, tmp_path / "run", **QUIET).run()
    states = sorted((tmp_path / "run" / "checkpoints").glob("step_*.safetensors"))
    assert len(states) == 8
    snapshots = [load_file(p) for p in states]
    for snap in snapshots:
        for name, tensor in snap.items():
            if name.endswith((".kappa", ".alpha")):
                assert (tensor >= 0).all() and abs(float(tensor.sum()) - 1) < 1e-6, name
    branch = [n for n in snapshots[0] if n.endswith((".kappa", ".alpha"))]
    assert branch
    # steps 1–5 move κ, α; steps 6–8 (the last 3) leave them exactly as they were
    assert any(not torch.equal(snapshots[3][n], snapshots[4][n]) for n in branch)
    for before, after in itertools.pairwise(snapshots[4:]):
        assert all(torch.equal(before[n], after[n]) for n in branch)
        assert not torch.equal(before["embedding.weight"], after["embedding.weight"])
    log = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    steps = [e for e in log if "loss" in e]
    assert {
        "step",
        "loss",
        "nll",
        "ppl",
        "lr",
        "lr_branch",
        "grad_norm",
        "tokens_per_s",
        "elapsed",
        "branch_weights",
    } <= set(steps[0])
    assert steps[-1]["lr_branch"] == 0.0 and steps[0]["lr_branch"] > 0


def test_a_nan_loss_is_skipped_and_counted(tmp_path, monkeypatch):
    import wtnmt.train.update as trainer_module  # where the loss of an update is computed

    real, calls = trainer_module.label_smoothed_cross_entropy, [0]

    def sometimes_nan(logits, target, *, epsilon):
        calls[0] += 1
        loss, nll = real(logits, target, epsilon=epsilon)
        return (loss * float("nan"), nll) if calls[0] == 3 else (loss, nll)

    monkeypatch.setattr(trainer_module, "label_smoothed_cross_entropy", sometimes_nan)
    config = tiny_run_config(tmp_path, train={"max_steps": 5, "valid_every": 100})
    trainer = Trainer(config, tmp_path / "run", **QUIET)
    state = trainer.run()
    assert state.step == 5 and state.nonfinite_total == 1
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    log = (tmp_path / "run" / "train.log").read_text()
    assert "non-finite" in log and "update skipped" in log
    entries = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [e["nonfinite_skipped"] for e in entries if "loss" in e][-1] == 1


def test_consecutive_nans_stop_the_run_with_a_checkpoint(tmp_path, monkeypatch):
    import wtnmt.train.update as trainer_module  # where the loss of an update is computed

    real = trainer_module.label_smoothed_cross_entropy
    monkeypatch.setattr(
        trainer_module,
        "label_smoothed_cross_entropy",
        lambda lg, tg, *, epsilon: (
            real(lg, tg, epsilon=epsilon)[0] * float("nan"),
            real(lg, tg, epsilon=epsilon)[1],
        ),
    )
    config = tiny_run_config(tmp_path, train={"max_steps": 50, "max_nonfinite": 3})
    with pytest.raises(TrainingError, match="3 non-finite updates in a row up to step 1"):
        Trainer(config, tmp_path / "run", **QUIET).run()
    assert list((tmp_path / "run" / "checkpoints").glob("*.state.pt"))


DDP_WORKER = """
import os, sys
sys.path.insert(0, {tests!r})
from pathlib import Path
import torch
from helpers import tiny_run_config
from wtnmt.train import Trainer
torch.set_num_threads(1)
config = tiny_run_config(Path({tmp!r}), n_train=300, train={{"max_steps": 4, "update_freq": 1,
    "valid_every": 100, "save_every": 100, "max_tokens": 200}})
trainer = Trainer(config, Path({run!r}), log_to_stderr=False)
trainer.run()
if int(os.environ["RANK"]) == 0:
    torch.save({{k: v for k, v in trainer.model.state_dict().items()}}, {out!r})
"""


@pytest.mark.slow
def test_ddp_with_two_processes_equals_one_process_fed_the_same_global_batches(tmp_path):
    code = DDP_WORKER.format(
        tests=str(Path(__file__).parent),
        tmp=str(tmp_path),
        run=str(tmp_path / "ddp"),
        out=str(tmp_path / "ddp.pt"),
    )
    # prepare once, so that the two ranks do not race to build the same directory
    single = tiny_run_config(
        tmp_path,
        n_train=300,
        train={
            "max_steps": 4,
            "update_freq": 2,
            "valid_every": 100,
            "save_every": 100,
            "max_tokens": 200,
        },
    )
    trainer = Trainer(single, tmp_path / "single", **QUIET)
    trainer.run()
    two_processes(code)
    ddp = torch.load(tmp_path / "ddp.pt", weights_only=True)
    one = trainer.model.state_dict()
    for name, value in one.items():
        # the same arithmetic in another order: float32 rounding only
        torch.testing.assert_close(ddp[name], value, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_tiny_weighted_model_overfits_twenty_pairs(tmp_path, precision):
    """It learns 20 pairs by heart (per-token NLL below 0.05 nats), in float32 and in bf16
    autocast, native or emulated. Greedy search must then give each pair's target exactly
    wherever the model, teacher-forced, puts more than half its probability on every target
    token (the argmax then is that token, whatever the CPU's rounding): the search is checked
    against what the model knows, not against how a given CPU's training happened to end."""
    sources = [sentence(i, 3 + i % 3) for i in range(20)]
    # bf16: autocast, the weights stay float32
    config = overfit_run_config(tmp_path, n_train=20, precision=precision)
    write_pairs(tmp_path, "train", sources)  # exactly these 20 pairs
    trainer = Trainer(config, tmp_path / "run", **QUIET)
    trainer.run()
    log = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    final_nll = [e["nll"] for e in log if "nll" in e][-1]
    assert final_nll < 0.05  # stated bar: per-token NLL below 0.05 nats
    data = ParallelData(tmp_path / "prepared", "train")
    vocab = Vocabulary(tmp_path / "prepared" / "spm.model")
    batch = data.collate(list(range(len(data))))
    model = trainer.model.eval()
    with torch.no_grad():
        probs = model(batch.src, batch.tgt_in).logits.float().softmax(-1)
    real = batch.tgt_out.ne(PAD)
    target = probs.gather(-1, batch.tgt_out.clamp_min(0)[..., None])[..., 0]
    known = (target.gt(0.5) | ~real).all(dim=1)  # every target token above one half
    # the check must have something to check: measured on AVX2, 20 pairs in float32 and 12 in
    # emulated bf16 (whose rounding leaves a few tokens near one half)
    assert int(known.sum()) >= 10, f"{int(known.sum())} of 20 pairs are known"
    outputs = [vocab.decode(h.tokens) for h in greedy_search(model, batch.src)]
    for i in known.nonzero()[:, 0].tolist():
        assert outputs[i] == translate(vocab.decode(data.src[i].tolist())), i


def test_bf16_training_follows_float32(tmp_path):
    """On any CPU, native bf16 or emulated: the same seeded run in bf16 autocast makes the
    same updates as in float32 up to bf16's rounding, so the losses stay close step by step."""
    sources = [sentence(i, 3 + i % 3) for i in range(20)]
    losses = {}
    for precision in ("fp32", "bf16"):
        work = tmp_path / precision
        work.mkdir()
        config = overfit_run_config(
            work, n_train=20, precision=precision, max_steps=30, log_every=5
        )
        write_pairs(work, "train", sources)
        Trainer(config, work / "run", **QUIET).run()
        log = [json.loads(line) for line in (work / "run" / "metrics.jsonl").open()]
        losses[precision] = [e["loss"] for e in log if "loss" in e]
    fp32, bf16 = losses["fp32"], losses["bf16"]
    assert len(fp32) == len(bf16) == 6
    assert fp32[-1] < fp32[0] - 1.0  # it learns: the comparison is not of two flat lines
    for step, (a, b) in enumerate(zip(fp32, bf16, strict=True)):
        # seen: within 0.003 nats on AVX512-BF16 and on AVX2's emulation
        assert abs(a - b) < 0.01 * a, (step, a, b)


def test_validation_reports_dev_bleu_and_can_keep_the_best_by_it(tmp_path):
    config = tiny_run_config(
        tmp_path, train={"max_steps": 6, "valid_every": 3, "best_metric": "bleu"}
    )
    Trainer(config, tmp_path / "run", **QUIET).run()
    entries = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    validations = [e for e in entries if "valid_loss" in e]
    assert len(validations) == 2
    assert all(0.0 <= e["valid_bleu"] <= 100.0 for e in validations)
    assert "BLEU" in (tmp_path / "run" / "train.log").read_text()


def test_best_by_bleu_without_a_vocabulary_is_refused(tmp_path):
    config = tiny_run_config(
        tmp_path,
        train={"max_steps": 2, "valid_every": 2, "best_metric": "bleu", "valid_bleu": False},
    )
    with pytest.raises(TrainingError, match="best_metric='bleu' needs dev BLEU"):
        Trainer(config, tmp_path / "run", **QUIET).run()


def test_tensorboard_events_hold_the_logged_scalars(tmp_path):
    """With the [tensorboard] extra, the run's tensorboard/ events hold every number of
    metrics.jsonl at its step, read back with TensorBoard's own reader."""
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    config = tiny_run_config(tmp_path, train={"max_steps": 4, "log_every": 2, "valid_every": 4})
    Trainer(config, tmp_path / "run", **QUIET).run()
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    logged = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    expected = {
        (key, entry["step"]): float(value)
        for entry in logged
        for key, value in entry.items()
        if key != "step" and isinstance(value, (int, float))  # a bool as 0 or 1
    }
    assert {"loss", "lr", "tokens_per_s", "valid_loss"} <= {k for k, _ in expected}
    read = {
        (key, event.step): event.value
        for key in events.Tags()["scalars"]
        for event in events.Scalars(key)
    }
    assert read.keys() == expected.keys()
    for where, value in expected.items():  # stored as float32
        assert read[where] == pytest.approx(value, rel=1e-6, abs=1e-30), where


def test_dev_bleu_survives_a_line_separator_inside_a_reference(tmp_path):
    # str.splitlines() also splits on U+2028, U+0085 and form feeds: the references then
    # outnumbered the dev sentences and dev BLEU silently switched off
    config = tiny_run_config(tmp_path, train={"max_steps": 3, "valid_every": 3})
    tgt = Path(config.data.valid_tgt)
    lines = tgt.read_text(encoding="utf-8").split("\n")
    lines[0] = lines[0].replace(" ", "\u2028", 1)
    lines[1] = lines[1].replace(" ", "\x0c", 1)
    tgt.write_text("\n".join(lines), encoding="utf-8")
    Trainer(config, tmp_path / "run", **QUIET).run()
    entries = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert any("valid_bleu" in e for e in entries)


def test_train_out_must_be_a_run_directory_of_its_own(tmp_path, capsys):
    from wtnmt.cli import main as cli
    from wtnmt.config import config_to_dict

    config = tiny_run_config(tmp_path)
    config_file = tmp_path / "run.yaml"
    config_file.write_text(yaml.safe_dump(config_to_dict(config)))
    (tmp_path / "notes.txt").write_text("mine")
    assert cli(["train", str(config_file), "--out", str(tmp_path / "notes.txt")]) == 2
    assert capsys.readouterr().err == (
        f"wtnmt train: error: --out {tmp_path / 'notes.txt'}: is a file; --out names the run "
        f"directory\n"
    )
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert cli(["train", str(config_file), "--out", config.data.prepared_dir]) == 2
    assert "is the prepared-data directory (data.prepared_dir)" in capsys.readouterr().err


def test_fp16_on_a_machine_without_cuda_is_refused_even_with_device_auto(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    config = tiny_run_config(tmp_path, train={"precision": "fp16", "device": "auto"})
    with pytest.raises(TrainingError, match=r"train\.precision='fp16' needs a CUDA device"):
        Trainer(config, tmp_path / "run", **QUIET)


def test_fewer_batches_than_processes_stops_with_the_cause_instead_of_looping(
    tmp_path, monkeypatch
):
    config = tiny_run_config(tmp_path, n_train=20, train={"max_tokens": 100_000})
    trainer = Trainer(config, tmp_path / "run", **QUIET)  # 20 pairs: one batch
    trainer.world = 2  # as a second DDP process would see it
    with pytest.raises(TrainingError, match=r"make 1 batches of train\.max_tokens=100000, fewer"):
        trainer.run()


@pytest.mark.slow
def test_kappa_alpha_freeze_in_a_run_bounded_by_epochs(tmp_path):
    config = tiny_run_config(
        tmp_path, train={"max_steps": None, "max_epochs": 2, "freeze_branch_weights": 3}
    )
    trainer = Trainer(config, tmp_path / "run", **QUIET)
    per_epoch = len(trainer._epoch_batches(0))
    snapshots = []
    original = trainer.update

    def update(batches, **kw):  # κ, α before each update
        snapshots.append(torch.cat([p.detach().clone() for p in trainer.branch_params]))
        return original(batches, **kw)

    trainer.update = update
    state = trainer.run()
    assert state.step == 2 * per_epoch and per_epoch > 4
    frozen = [torch.equal(a, b) for a, b in itertools.pairwise(snapshots)]
    assert not any(frozen[:-3]) and all(frozen[-2:])  # the last updates leave κ, α alone


def test_max_positions_is_checked_against_the_longest_sentence_on_load():
    from wtnmt.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"model\.max_positions=256 is less than"):
        load_config("weighted-tiny", ["data.max_tokens_per_side=300"])


def test_a_dev_sentence_longer_than_the_model_allows_is_cut_not_a_crash(tmp_path):
    config = tiny_run_config(
        tmp_path,
        train={"max_steps": 4, "valid_every": 2},
        model={"max_positions": 40},
        data={"max_tokens_per_side": 30},
    )
    long = " ".join(["alpha"] * 60)  # far over 40 pieces
    write_pairs(tmp_path, "valid", [long, *(sentence(10_000 + i, 3) for i in range(7))])
    Trainer(config, tmp_path / "run", **QUIET).run()
    summary = json.loads((tmp_path / "prepared" / "summary.json").read_text())
    assert summary["splits"]["valid"]["ids_truncated"] == 1
    assert summary["splits"]["valid"]["pairs_kept"] == 8  # the pair stays, scored as given
    entries = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert [e["step"] for e in entries if "valid_loss" in e] == [2, 4]


def test_a_failing_validation_keeps_the_training_so_far(tmp_path, monkeypatch):
    config = tiny_run_config(tmp_path, train={"max_steps": 6, "valid_every": 3})
    trainer = Trainer(config, tmp_path / "run", **QUIET)
    monkeypatch.setattr(trainer, "validate", lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        trainer.run()
    assert latest_checkpoint(tmp_path / "run" / "checkpoints")[1]["step"] == 3


def test_the_metrics_end_with_the_last_step_whatever_log_every_is(tmp_path):
    config = tiny_run_config(tmp_path, train={"max_steps": 5, "log_every": 3, "valid_every": 10})
    trainer = Trainer(config, tmp_path / "run", **QUIET)
    trainer.run()
    entries = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    logged = [e["step"] for e in entries if "loss" in e]
    assert logged == [3, 5]  # 5: the two updates after the last log line, at the stop
    final = entries[-2]["branch_weights"]  # the final κ/α are there to draw, to 6 decimals
    exact = branch_weight_table(trainer.model)
    assert final.keys() == exact.keys() and len(exact) == 4
    for layer, weights in exact.items():
        for name, values in weights.items():
            got = final[layer][name]
            assert sum(got) == pytest.approx(1.0, abs=1e-5)
            pairs = zip(got, values, strict=True)
            assert all(abs(g - v) <= 5e-7 and round(g, 6) == g for g, v in pairs)
