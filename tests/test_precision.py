"""train.precision: auto trains in float32 where the CPU has no bf16 instructions, and where it
has them in whichever of float32 and bf16 a measurement of the run's own first batches finds
faster, saying what it measured; bf16 asked of a CPU that emulates it trains as asked, with a
warning from the trainer and from the experiment runner."""

from __future__ import annotations

import torch
import yaml

from helpers import tiny_run_config
from wtnmt.config import config_to_dict
from wtnmt.experiment import load_grid, run_grid
from wtnmt.train import Trainer

QUIET = {"log_to_stderr": False}


def test_precision_auto_is_bf16_where_the_hardware_has_it_and_the_log_says_which(
    tmp_path, monkeypatch
):
    from wtnmt import runtime

    cpu = torch.device("cpu")
    for native, expected in ((True, "bf16"), (False, "fp32")):
        monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda native=native: native)
        assert runtime.resolve_precision("auto", cpu) == expected
        assert runtime.resolve_precision("fp32", cpu) == "fp32"  # a stated precision stands
        assert runtime.resolve_precision("bf16", cpu) == "bf16"
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: True)
    from wtnmt.train import precision_probe

    for times, chosen, label in (
        ({"fp32": 0.4, "bf16": 0.2}, "bf16", "bf16 autocast"),
        ({"fp32": 0.2, "bf16": 0.4}, "fp32", "float32"),  # native, and still the slower
    ):
        monkeypatch.setattr(precision_probe, "time_precisions", lambda *a, t=times, **k: t)
        monkeypatch.setenv("WTNMT_CACHE_DIR", str(tmp_path / f"cache-{chosen}"))  # measured anew
        run = tmp_path / f"run-{chosen}"
        config = tiny_run_config(tmp_path, train={"precision": "auto", "max_steps": 2})
        trainer = Trainer(config, run, **QUIET)
        assert trainer.precision == chosen
        trainer.run()
        log = (run / "train.log").read_text()
        assert "float32 0.40 s" in log or "float32 0.20 s" in log
        assert f"training in {label}" in log and f"in {label} (train.precision=auto)" in log


def test_the_measurement_leaves_weights_and_random_stream_as_they_were(tmp_path, monkeypatch):
    """The real measurement (bf16 emulated here when the CPU lacks it): it picks the faster
    of what it measured, and the run trains as one that never measured."""
    from wtnmt import runtime
    from wtnmt.train import precision_probe

    config = tiny_run_config(tmp_path, train={"precision": "fp32", "max_steps": 3})
    plain = Trainer(config, tmp_path / "plain", **QUIET)
    stream = torch.get_rng_state()
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: True)
    auto = tiny_run_config(tmp_path, train={"precision": "auto", "max_steps": 3})
    measured = Trainer(auto, tmp_path / "auto", **QUIET)
    assert torch.equal(torch.get_rng_state(), stream)  # dropout draws as if never measured
    said = (tmp_path / "auto" / "train.log").read_text()
    assert "a forward and backward pass of this run's first batches took float32 " in said
    times = {k: float(said.split(f"{k} ")[1].split(" s")[0]) for k in ("float32", "bf16 autocast")}
    chosen = said.split("training in ")[1].split("\n")[0].split(" (")[0].split(";")[0]
    assert chosen in times, said
    # bf16 where it took at most MARGIN of float32's time (as logged, to 0.01 s: a tie at
    # the margin may go either way)
    bf16, fp32 = times["bf16 autocast"], precision_probe.MARGIN * times["float32"]
    if abs(bf16 - fp32) > 0.011:
        assert chosen == ("bf16 autocast" if bf16 < fp32 else "float32"), said
    weights = zip(
        plain.model.state_dict().items(), measured.model.state_dict().values(), strict=True
    )
    for (name, a), b in weights:
        assert torch.equal(a, b), name
    assert all(p.grad is None for p in measured.model.parameters())
    if measured.precision == "fp32":  # then the two runs are the same run, to the bit
        plain.run()
        measured.run()
        for a, b in zip(plain.model.parameters(), measured.model.parameters(), strict=True):
            assert torch.equal(a, b)


def test_bf16_asked_of_a_cpu_that_emulates_it_is_warned_of(tmp_path, monkeypatch):
    from wtnmt import runtime

    for native, warned in ((False, True), (True, False)):
        monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda native=native: native)
        run = tmp_path / f"run-{native}"
        config = tiny_run_config(tmp_path, train={"precision": "bf16", "max_steps": 1})
        Trainer(config, run, **QUIET).run()
        log = (run / "train.log").read_text()
        assert "in bf16 autocast," in log  # as asked: a stated precision stands
        assert ("bf16 instructions" in log and "emulated" in log) == warned


def test_a_grid_asking_bf16_of_a_cpu_that_emulates_it_is_warned_of(tmp_path, monkeypatch):
    from wtnmt import runtime

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    preset = tmp_path / "tiny.yaml"
    preset.write_text(yaml.safe_dump(config_to_dict(tiny_run_config(tmp_path))))
    grid = {
        "out": str(tmp_path / "runs"),
        "budget": {"max_steps": 2},
        "seeds": [1],
        "runs": [
            {"name": "plain", "preset": str(preset), "set": {"train.precision": "fp32"}},
            {"name": "half", "preset": str(preset), "set": {"train.precision": "bf16"}},
        ],
    }
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid, sort_keys=False))
    for native in (False, True):
        monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda native=native: native)
        said: list[str] = []
        run_grid(load_grid(path), dry_run=True, say=said.append)
        warnings = [line for line in said if "emulated" in line]
        if native:
            assert warnings == []
        else:
            assert len(warnings) == 1 and warnings[0].endswith("(half-s1)")
            assert warnings[0].startswith(f"{path}: warning: train.precision bf16")


def test_a_resumed_auto_run_keeps_what_auto_chose_and_ends_as_one_never_stopped(
    tmp_path, monkeypatch
):
    """On a CPU with native bf16 where the measurement finds float32 faster, a run stopped and
    resumed must go on in float32: the checkpoint records the choice (the config only says
    "auto", which the resume resolved to bf16 afresh: a different run, found by the kill soak
    on such a CPU). It ends with the uninterrupted run's weights, bit for bit."""
    from wtnmt import runtime
    from wtnmt.train import precision_probe

    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr(
        precision_probe, "time_precisions", lambda *a, **k: {"fp32": 0.2, "bf16": 0.4}
    )
    straight = tiny_run_config(tmp_path, train={"precision": "auto", "max_steps": 4})
    whole = Trainer(straight, tmp_path / "whole", **QUIET)
    assert whole.precision == "fp32"
    whole.run()
    half = tiny_run_config(tmp_path, train={"precision": "auto", "max_steps": 2})
    Trainer(half, tmp_path / "stopped", **QUIET).run()
    resumed = Trainer(straight, tmp_path / "stopped", resume=True, **QUIET)
    assert resumed.precision == "fp32"
    resumed.run()
    for a, b in zip(whole.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_checkpoint_of_auto_without_its_choice_is_resumed_with_a_warning(tmp_path, monkeypatch):
    """Checkpoints written before the choice was recorded: the resume says it cannot know."""
    from wtnmt.rundir import latest_checkpoint

    config = tiny_run_config(tmp_path, train={"precision": "auto", "max_steps": 2})
    Trainer(config, tmp_path / "run", **QUIET).run()
    path, _ = latest_checkpoint(tmp_path / "run" / "checkpoints", warn=lambda _: None)
    saved = torch.load(path, weights_only=False)
    del saved["precision"]
    torch.save(saved, path)
    longer = tiny_run_config(tmp_path, train={"precision": "auto", "max_steps": 3})
    Trainer(longer, tmp_path / "run", resume=True, **QUIET).run()
    assert (
        "does not record the precision train.precision=auto chose"
        in (tmp_path / "run" / "train.log").read_text()
    )


def test_auto_chooses_the_same_precision_on_the_same_machine_without_measuring_again(
    tmp_path, monkeypatch
):
    """The choice is kept for the CPU, PyTorch, threads, model and batch size: a second run
    of the same config trains in the same precision, whatever a new measurement would say,
    and says where the choice came from; another model is measured for itself; a near tie
    is float32 (bf16 must be clearly the faster); an unwritable cache still trains, saying
    the choice was not kept."""
    from wtnmt import runtime
    from wtnmt.train import precision_probe

    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: True)
    measured: list[int] = []

    def timing(result):  # type: ignore[no-untyped-def]
        def measure(*a, **k):  # type: ignore[no-untyped-def]
            measured.append(1)
            return result

        return measure

    config = tiny_run_config(tmp_path, train={"precision": "auto", "max_steps": 1})
    monkeypatch.setattr(precision_probe, "time_precisions", timing({"fp32": 0.4, "bf16": 0.2}))
    assert Trainer(config, tmp_path / "first", **QUIET).precision == "bf16"
    assert "kept in" in (tmp_path / "first" / "train.log").read_text()
    # a busy moment would now find float32 faster: the kept choice stands, unmeasured
    monkeypatch.setattr(precision_probe, "time_precisions", timing({"fp32": 0.2, "bf16": 0.4}))
    assert Trainer(config, tmp_path / "second", **QUIET).precision == "bf16"
    assert len(measured) == 1
    said = (tmp_path / "second" / "train.log").read_text()
    assert "training in bf16 autocast, as measured on this CPU" in said
    wider = tiny_run_config(
        tmp_path, model={"d_model": 64, "d_ff": 128}, train={"precision": "auto", "max_steps": 1}
    )
    assert Trainer(wider, tmp_path / "wider", **QUIET).precision == "fp32"  # measured anew
    assert len(measured) == 2
    assert precision_probe.faster({"fp32": 1.0, "bf16": 0.95})[0] == "fp32"  # a near tie
    assert precision_probe.faster({"fp32": 1.0, "bf16": 0.85})[0] == "bf16"
    blocked = tmp_path / "read-only-cache"
    blocked.write_text("a file where the cache directory would be")
    monkeypatch.setenv("WTNMT_CACHE_DIR", str(blocked))
    Trainer(config, tmp_path / "third", **QUIET)
    assert "not kept (cache unwritable)" in (tmp_path / "third" / "train.log").read_text()
